use core::fmt;
use core::str::FromStr;

use burn_backend::backend::{Device, DeviceId, DeviceOps};
use burn_backend::{BoolStore, DType, DeviceSettings};

use crate::BackendError;

/// The environment variable that selects the default device (`host`, `xla:1`, `neuron:3`, ...).
pub const DEVICE_ENV: &str = crate::settings::DEVICE.name;

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

/// A Trainium device: an executor kind, the index of its first device, and how many devices
/// (replicas) it stands for: `host:0`, `xla:1`, `neuron:3`, or `xla:0-3` for the first four
/// devices of the `xla` executor as one replicated device.
///
/// A replicated device runs every captured segment as one program on each of its replicas (one
/// compile, one launch with one argument list per replica). Its tensors hold one buffer per
/// replica; the collectives of [`crate::collective`] combine them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrainiumDevice {
    /// The executor that runs this device's segments.
    pub executor: ExecutorKind,
    /// The index of the (first) device within its executor (PJRT device, NeuronCore).
    pub index: u16,
    /// How many consecutive devices of the executor this device stands for (at least 1).
    pub replicas: u16,
}

/// The most replicas one device can stand for (the device id keeps 14 bits for the count).
pub const MAX_REPLICAS: u16 = 1 << 14;

impl TrainiumDevice {
    /// The host device `host:0`.
    pub const HOST: TrainiumDevice = TrainiumDevice::new(ExecutorKind::Host, 0);

    /// A single device of the given executor kind and index.
    pub const fn new(executor: ExecutorKind, index: u16) -> Self {
        Self {
            executor,
            index,
            replicas: 1,
        }
    }

    /// The `index`-th device of the `xla` executor.
    pub const fn xla(index: u16) -> Self {
        Self::new(ExecutorKind::Xla, index)
    }

    /// The `index`-th NeuronCore of the `neuron` executor.
    pub const fn neuron(index: u16) -> Self {
        Self::new(ExecutorKind::Neuron, index)
    }

    /// The first `replicas` devices of `executor` as one replicated device (`xla:0-3` for
    /// `replicated(ExecutorKind::Xla, 4)`).
    ///
    /// # Panics
    /// When `replicas` is 0 or above [`MAX_REPLICAS`].
    pub fn replicated(executor: ExecutorKind, replicas: u16) -> Self {
        Self::new(executor, 0).with_replicas(replicas)
    }

    /// This device's first device, standing for `replicas` consecutive devices.
    ///
    /// # Panics
    /// When `replicas` is 0 or above [`MAX_REPLICAS`].
    pub fn with_replicas(self, replicas: u16) -> Self {
        assert!(
            (1..=MAX_REPLICAS).contains(&replicas),
            "a device stands for 1 to {MAX_REPLICAS} replicas, not {replicas}"
        );
        Self { replicas, ..self }
    }

    /// The single device that holds replica `replica` of this device.
    pub fn replica(&self, replica: u16) -> Self {
        assert!(replica < self.replicas, "{self} has no replica {replica}");
        Self::new(self.executor, self.index + replica)
    }

    /// The device named by `TRAINIUM_DEVICE`, or `host:0` when it is unset or empty.
    pub fn from_env() -> Result<Self, BackendError> {
        match crate::settings::DEVICE.var() {
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
        let (first, replicas) = match index {
            None => (0, 1),
            Some(range) => {
                let number = |text: &str| {
                    text.trim()
                        .parse::<u16>()
                        .map_err(|_| invalid(&format!("`{text}` is not a device index")))
                };
                match range.split_once('-') {
                    None => (number(range)?, 1),
                    Some((first, last)) => {
                        let (first, last) = (number(first)?, number(last)?);
                        if last < first {
                            return Err(invalid(&format!(
                                "the range `{range}` ends before it starts"
                            )));
                        }
                        let replicas = last - first + 1;
                        if replicas > MAX_REPLICAS {
                            return Err(invalid(&format!(
                                "the range `{range}` holds more than {MAX_REPLICAS} devices"
                            )));
                        }
                        (first, replicas)
                    }
                }
            }
        };
        Ok(Self::new(executor, first).with_replicas(replicas))
    }
}

impl fmt::Display for TrainiumDevice {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}:{}", self.executor.name(), self.index)?;
        if self.replicas > 1 {
            let last = u32::from(self.index) + u32::from(self.replicas) - 1;
            write!(formatter, "-{last}")?;
        }
        Ok(())
    }
}

impl Device for TrainiumDevice {
    fn from_id(device_id: DeviceId) -> Self {
        // The low two bits name the executor, the others hold the replica count minus one.
        let executor = ExecutorKind::ALL
            .into_iter()
            .find(|kind| kind.type_id() == device_id.type_id & 0b11)
            .unwrap_or(ExecutorKind::Host);
        Self::new(executor, device_id.index_id).with_replicas((device_id.type_id >> 2) + 1)
    }

    fn to_id(&self) -> DeviceId {
        DeviceId::new(
            self.executor.type_id() | ((self.replicas - 1) << 2),
            self.index,
        )
    }
}

impl DeviceOps for TrainiumDevice {
    /// f32 floats, i32 integers and native bools, what every executor computes in unless told
    /// otherwise.
    fn defaults(&self) -> DeviceSettings {
        DeviceSettings::with_dtypes(DType::F32, DType::I32, DType::Bool(BoolStore::Native))
    }
}

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
    fn ranges_name_replicated_devices() {
        let device = "xla:0-3".parse::<TrainiumDevice>().unwrap();
        assert_eq!(device, TrainiumDevice::replicated(ExecutorKind::Xla, 4));
        assert_eq!(device.to_string(), "xla:0-3");
        assert_eq!(device.replica(2), TrainiumDevice::xla(2));
        assert_eq!(
            "host:2-3".parse::<TrainiumDevice>().unwrap(),
            TrainiumDevice::new(ExecutorKind::Host, 2).with_replicas(2)
        );
        assert_eq!(
            "xla:1-1".parse::<TrainiumDevice>().unwrap(),
            TrainiumDevice::xla(1)
        );
        let error = "xla:3-1".parse::<TrainiumDevice>().unwrap_err().to_string();
        assert!(error.contains("ends before it starts"), "{error}");
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
            TrainiumDevice::replicated(ExecutorKind::Xla, 4),
            TrainiumDevice::neuron(8).with_replicas(8),
            TrainiumDevice::HOST.with_replicas(MAX_REPLICAS),
        ] {
            assert_eq!(TrainiumDevice::from_id(device.to_id()), device);
        }
    }
}
