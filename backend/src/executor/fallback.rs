//! What an operation without a lowering does on a compiled device (`TRAINIUM_HOST_FALLBACK`):
//! run on the host and say so once per kind (`warn`, the default), fail naming it (`error`), or
//! run on the host silently (`allow`).

use std::str::FromStr;
use std::sync::OnceLock;

use crate::per_device::PerDevice;
use crate::{BackendError, TrainiumDevice};

/// The environment variable choosing the [`HostFallback`] policy of the `xla` and `neuron`
/// executors.
pub const HOST_FALLBACK_ENV: &str = crate::settings::HOST_FALLBACK.name;

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
        .get_or_init(|| match crate::settings::HOST_FALLBACK.var() {
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

/// The environment variable naming operation kinds the `xla` and `neuron` executors run on the
/// host even though they have a lowering (comma-separated, as the fallback warnings and reports
/// name them: `Module::Conv2d,Float::Exp`): for bisecting a result that differs between
/// executors, and for trying the fallback policies.
pub const HOST_OPERATIONS_ENV: &str = crate::settings::HOST_OPERATIONS.name;

/// The enums' names in operation kinds (`Module::Conv2d`) and the coverage table's enum each
/// stands for.
const KIND_PREFIXES: [(&str, &str); 9] = [
    ("BaseFloat", "BaseOperationIr"),
    ("BaseInt", "BaseOperationIr"),
    ("BaseBool", "BaseOperationIr"),
    ("NumericFloat", "NumericOperationIr"),
    ("NumericInt", "NumericOperationIr"),
    ("Float", "FloatOperationIr"),
    ("Int", "IntOperationIr"),
    ("Bool", "BoolOperationIr"),
    ("Module", "ModuleOperationIr"),
];

/// The operation kinds a comma-separated list names, or why one is not a kind of Burn's IR.
pub(crate) fn parse_operation_kinds(text: &str) -> Result<Vec<String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|kind| !kind.is_empty())
        .map(|kind| {
            let known = kind.split_once("::").is_some_and(|(prefix, variant)| {
                KIND_PREFIXES.iter().any(|&(name, table)| {
                    name == prefix
                        && crate::lower::COVERAGE
                            .iter()
                            .any(|(entry, _)| *entry == format!("{table}::{variant}"))
                })
            });
            if known {
                Ok(kind.to_string())
            } else {
                Err(format!(
                    "`{kind}` is not an operation kind of Burn's IR (written as the fallback \
                     reports name them, e.g. `Module::Conv2d`)"
                ))
            }
        })
        .collect()
}

/// Whether `TRAINIUM_HOST_OPERATIONS` (read once; none when unset) names only kinds of Burn's
/// IR, or the error naming its bad value.
pub(crate) fn host_operations_from_env() -> Result<(), BackendError> {
    environment_host_operations()
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

/// `TRAINIUM_HOST_OPERATIONS`, read and parsed once.
fn environment_host_operations() -> &'static Result<Vec<String>, BackendError> {
    static KINDS: OnceLock<Result<Vec<String>, BackendError>> = OnceLock::new();
    KINDS.get_or_init(|| match crate::settings::HOST_OPERATIONS.var() {
        Ok(value) => parse_operation_kinds(&value).map_err(|reason| BackendError::InvalidSetting {
            variable: HOST_OPERATIONS_ENV,
            value,
            reason,
        }),
        Err(_) => Ok(Vec::new()),
    })
}

/// Operation kinds kept on the host per device, chosen in code.
static HOST_OPERATIONS: PerDevice<&'static [String]> = PerDevice::new();

/// Makes `device` run the operation `kinds` on the host from now on (as fallbacks, counted and
/// subject to the fallback policy), whatever `TRAINIUM_HOST_OPERATIONS` says; an empty list
/// lowers every kind again. Fails naming a kind that Burn's IR does not have.
pub fn set_host_operations(device: &TrainiumDevice, kinds: &[&str]) -> Result<(), BackendError> {
    let joined = kinds.join(",");
    let kinds = parse_operation_kinds(&joined).map_err(|reason| BackendError::InvalidSetting {
        variable: HOST_OPERATIONS_ENV,
        value: joined,
        reason,
    })?;
    // A setting lives as long as the process: the few lists a process chooses are leaked.
    HOST_OPERATIONS.set(device, Box::leak(kinds.into_boxed_slice()));
    Ok(())
}

/// The operation kinds `device` runs on the host: chosen in code, else the environment's
/// (already validated when the device opened; none if they were not). Read for every segment,
/// so nothing is copied.
pub(crate) fn host_operations_of(device: &TrainiumDevice) -> &'static [String] {
    HOST_OPERATIONS.get(device).unwrap_or_else(|| {
        environment_host_operations()
            .as_ref()
            .map_or(&[], Vec::as_slice)
    })
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

    #[test]
    fn host_operations_are_kinds_of_burns_ir() {
        assert_eq!(
            parse_operation_kinds(" Module::Conv2d, Float::Exp ,"),
            Ok(vec!["Module::Conv2d".to_string(), "Float::Exp".to_string()])
        );
        let error = parse_operation_kinds("Module::Conv9d").unwrap_err();
        assert!(error.contains("`Module::Conv9d`"), "{error}");
        assert!(parse_operation_kinds("Conv2d").is_err());
        assert!(parse_operation_kinds("Float::Conv2d").is_err());
    }
}
