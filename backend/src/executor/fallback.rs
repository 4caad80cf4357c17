//! What an operation without a lowering does on a compiled device (`TRAINIUM_HOST_FALLBACK`):
//! run on the host and say so once per kind (`warn`, the default), fail naming it (`error`), or
//! run on the host silently (`allow`).

use std::str::FromStr;
use std::sync::OnceLock;

use crate::per_device::PerDevice;
use crate::{BackendError, TrainiumDevice};

/// The environment variable choosing the [`HostFallback`] policy of the `xla` and `neuron`
/// executors.
pub const HOST_FALLBACK_ENV: &str = "TRAINIUM_HOST_FALLBACK";

/// What an operation the lowering does not cover does on a compiled device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostFallback {
    /// Run it on the host, one operation at a time, and say nothing (counted in the stats).
    Allow,
    /// Run it on the host and log one WARN line per operation kind the first time.
    #[default]
    Warn,
    /// Fail the segment with an error naming the operation.
    Error,
}

impl FromStr for HostFallback {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "allow" => Ok(HostFallback::Allow),
            "warn" => Ok(HostFallback::Warn),
            "error" => Ok(HostFallback::Error),
            _ => Err("expected allow, warn or error".to_string()),
        }
    }
}

/// The policy `TRAINIUM_HOST_FALLBACK` names (read once; `warn` when unset), or the error naming
/// its bad value.
pub(crate) fn host_fallback_from_env() -> Result<HostFallback, BackendError> {
    static POLICY: OnceLock<Result<HostFallback, BackendError>> = OnceLock::new();
    POLICY
        .get_or_init(|| match std::env::var(HOST_FALLBACK_ENV) {
            Ok(value) if !value.trim().is_empty() => {
                value
                    .parse()
                    .map_err(|reason| BackendError::InvalidSetting {
                        variable: HOST_FALLBACK_ENV,
                        value,
                        reason,
                    })
            }
            _ => Ok(HostFallback::default()),
        })
        .clone()
}

/// Policies chosen for devices in code, in place of the environment's.
static CHOSEN: PerDevice<HostFallback> = PerDevice::new();

/// Makes operations without a lowering on `device` follow `policy` from now on, whatever
/// `TRAINIUM_HOST_FALLBACK` says.
pub fn set_host_fallback(device: &TrainiumDevice, policy: HostFallback) {
    CHOSEN.set(device, policy);
}

/// The policy of `device`: chosen in code, else the environment's (already validated when the
/// device opened; `warn` if it was not).
pub(crate) fn host_fallback_of(device: &TrainiumDevice) -> HostFallback {
    CHOSEN
        .get(device)
        .unwrap_or_else(|| host_fallback_from_env().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_warn_is_the_default() {
        assert_eq!("allow".parse(), Ok(HostFallback::Allow));
        assert_eq!(" error ".parse(), Ok(HostFallback::Error));
        assert_eq!("warn".parse(), Ok(HostFallback::Warn));
        assert_eq!(HostFallback::default(), HostFallback::Warn);
        assert!("never".parse::<HostFallback>().is_err());
    }
}
