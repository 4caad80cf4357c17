use core::fmt;
use core::str::FromStr;

use burn_backend::backend::{Device, DeviceId, DeviceOps};

use crate::BackendError;

/// The environment variable that selects the default device (`host`, `xla:1`, `neuron:3`, ...).
pub const DEVICE_ENV: &str = "TRAINIUM_DEVICE";

/// Which executor runs the captured segments of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExecutorKind {
    /// Replays segments on the embedded `burn-flex` CPU backend: the default and the reference.
    Host,
    /// Lowers segments to XLA HLO and runs them through a PJRT plugin (`TRAINIUM_PJRT_PLUGIN`).
    Xla,
    /// Compiles the HLO with `neuronx-cc` and runs the NEFF on NeuronCores through `libnrt`.
    Neuron,
}

impl ExecutorKind {
    /// Every executor kind, in the order of their device type ids.
    pub const ALL: [ExecutorKind; 3] =
        [ExecutorKind::Host, ExecutorKind::Xla, ExecutorKind::Neuron];

    /// The name used in device strings and logs.
    pub fn name(self) -> &'static str {
        match self {
            ExecutorKind::Host => "host",
            ExecutorKind::Xla => "xla",
            ExecutorKind::Neuron => "neuron",
        }
    }

    fn type_id(self) -> u16 {
        match self {
            ExecutorKind::Host => 0,
            ExecutorKind::Xla => 1,
            ExecutorKind::Neuron => 2,
        }
    }
}

/// A Trainium device: an executor kind and an index (`host:0`, `xla:1`, `neuron:3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrainiumDevice {
    /// The executor that runs this device's segments.
    pub executor: ExecutorKind,
    /// The index of the device within its executor (PJRT device, NeuronCore).
    pub index: u16,
}

impl TrainiumDevice {
    /// The host device `host:0`.
    pub const HOST: TrainiumDevice = TrainiumDevice::new(ExecutorKind::Host, 0);

    /// A device of the given executor kind and index.
    pub const fn new(executor: ExecutorKind, index: u16) -> Self {
        Self { executor, index }
    }

    /// The `index`-th device of the `xla` executor.
    pub const fn xla(index: u16) -> Self {
        Self::new(ExecutorKind::Xla, index)
    }

    /// The `index`-th NeuronCore of the `neuron` executor.
    pub const fn neuron(index: u16) -> Self {
        Self::new(ExecutorKind::Neuron, index)
    }

    /// The device named by `TRAINIUM_DEVICE`, or `host:0` when it is unset or empty.
    pub fn from_env() -> Result<Self, BackendError> {
        match std::env::var(DEVICE_ENV) {
            Ok(value) if !value.trim().is_empty() => value.parse().map_err(|error| match error {
                BackendError::InvalidDevice { value, reason } => BackendError::InvalidDevice {
                    value,
                    reason: format!("{reason} (from {DEVICE_ENV})"),
                },
                other => other,
            }),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(Self::HOST),
            Err(std::env::VarError::NotUnicode(value)) => Err(BackendError::InvalidDevice {
                value: value.to_string_lossy().into_owned(),
                reason: format!("{DEVICE_ENV} is not valid UTF-8"),
            }),
        }
    }
}

impl Default for TrainiumDevice {
    /// The device named by `TRAINIUM_DEVICE` (`host:0` when unset).
    ///
    /// # Panics
    /// When `TRAINIUM_DEVICE` holds an invalid value: the backend never switches device silently.
    /// Use [`TrainiumDevice::from_env`] to handle the error instead.
    fn default() -> Self {
        match Self::from_env() {
            Ok(device) => device,
            Err(error) => panic!("{error}"),
        }
    }
}

impl FromStr for TrainiumDevice {
    type Err = BackendError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| BackendError::InvalidDevice {
            value: text.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = text.trim();
        let (kind, index) = match trimmed.split_once(':') {
            Some((kind, index)) => (kind, Some(index)),
            None => (trimmed, None),
        };
        let executor = ExecutorKind::ALL
            .into_iter()
            .find(|candidate| candidate.name().eq_ignore_ascii_case(kind))
            .ok_or_else(|| invalid(&format!("unknown executor `{kind}`")))?;
        let index = match index {
            None => 0,
            Some(index) => index
                .parse::<u16>()
                .map_err(|_| invalid(&format!("`{index}` is not a device index")))?,
        };
        Ok(Self::new(executor, index))
    }
}

impl fmt::Display for TrainiumDevice {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}:{}", self.executor.name(), self.index)
    }
}

impl Device for TrainiumDevice {
    fn from_id(device_id: DeviceId) -> Self {
        let executor = ExecutorKind::ALL
            .into_iter()
            .find(|kind| kind.type_id() == device_id.type_id)
            .unwrap_or(ExecutorKind::Host);
        Self::new(executor, device_id.index_id)
    }

    fn to_id(&self) -> DeviceId {
        DeviceId::new(self.executor.type_id(), self.index)
    }
}

impl DeviceOps for TrainiumDevice {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kinds_and_indices() {
        assert_eq!(
            "host".parse::<TrainiumDevice>().unwrap(),
            TrainiumDevice::HOST
        );
        assert_eq!(
            "xla:1".parse::<TrainiumDevice>().unwrap(),
            TrainiumDevice::xla(1)
        );
        assert_eq!(
            " Neuron:3 ".parse::<TrainiumDevice>().unwrap(),
            TrainiumDevice::neuron(3)
        );
        assert_eq!(TrainiumDevice::neuron(3).to_string(), "neuron:3");
    }

    #[test]
    fn rejects_unknown_values_with_the_value_in_the_message() {
        let error = "tpu:0".parse::<TrainiumDevice>().unwrap_err().to_string();
        assert!(
            error.contains("tpu:0") && error.contains("unknown executor `tpu`"),
            "{error}"
        );
        let error = "xla:x".parse::<TrainiumDevice>().unwrap_err().to_string();
        assert!(error.contains("`x` is not a device index"), "{error}");
    }

    #[test]
    fn device_ids_round_trip() {
        for device in [
            TrainiumDevice::HOST,
            TrainiumDevice::xla(2),
            TrainiumDevice::neuron(7),
        ] {
            assert_eq!(TrainiumDevice::from_id(device.to_id()), device);
        }
    }
}
