//! The most a device gives: the largest tensor an operation may make, and the most bytes one
//! client may hold. An operation asking for more is refused before any executor allocates
//! anything, so that one client's absurd shape (a served device's clients are anyone who can
//! connect) is an error on that client's reads, not an allocation failure that aborts the
//! process and every other client's session with it.
//!
//! A client is the thread that registers operations: a served device runs each session on a
//! thread of its own, so on `hlat serve` a client is a session.

use std::sync::OnceLock;

use burn_backend::DType;

use crate::per_device::PerDevice;
use crate::{BackendError, TrainiumDevice};

/// The environment variable that sets the largest tensor of every device (unless
/// [`set_max_tensor_bytes`] sets one for a device), in bytes; unset, the machine's physical
/// memory.
pub const MAX_TENSOR_BYTES_ENV: &str = crate::settings::MAX_TENSOR_BYTES.name;

/// The largest tensors set in code ([`set_max_tensor_bytes`]).
static TENSOR_LIMITS: PerDevice<u64> = PerDevice::new();

/// The most one client may hold, set in code ([`set_max_client_bytes`]).
static CLIENT_LIMITS: PerDevice<u64> = PerDevice::new();

/// Sets the largest tensor, in bytes, an operation may make on `device` (replacing
/// `TRAINIUM_MAX_TENSOR_BYTES` for it). Takes effect at the next captured operation.
pub fn set_max_tensor_bytes(device: &TrainiumDevice, bytes: u64) {
    TENSOR_LIMITS.set(device, bytes);
}

/// Sets the most bytes of live tensors one client (one session of a served device) may hold on
/// `device` (`hlat serve --max-client-bytes`); unset, a client may hold what the device holds.
/// Takes effect at the next captured operation.
pub fn set_max_client_bytes(device: &TrainiumDevice, bytes: u64) {
    CLIENT_LIMITS.set(device, bytes);
}

/// The largest tensor `device` takes: set in code, else `TRAINIUM_MAX_TENSOR_BYTES`, else the
/// machine's physical memory.
pub(crate) fn max_tensor_bytes(device: &TrainiumDevice) -> u64 {
    // The environment was checked when the device was opened: an invalid value never reaches
    // here.
    TENSOR_LIMITS
        .get(device)
        .or_else(|| limit_from_env().ok().flatten())
        .unwrap_or_else(physical_memory)
}

/// The bytes of a tensor of `shape` and `dtype`, or `None` past 2^64.
pub(crate) fn tensor_bytes(shape: &[usize], dtype: DType) -> Option<u64> {
    shape.iter().try_fold(dtype.size() as u64, |bytes, &size| {
        bytes.checked_mul(size as u64)
    })
}

/// Why making a tensor of `shape` and `dtype` is refused on `device` (its bytes above the
/// device's largest tensor), if it is.
pub(crate) fn tensor_refusal(
    device: &TrainiumDevice,
    shape: &[usize],
    dtype: DType,
) -> Option<String> {
    let limit = max_tensor_bytes(device);
    match tensor_bytes(shape, dtype) {
        Some(bytes) if bytes <= limit => None,
        bytes => Some(format!(
            "{device}: a tensor of shape {:?} ({:?}, {}) is above the largest a tensor may be \
             here, {limit} bytes ({MAX_TENSOR_BYTES_ENV}); nothing was allocated",
            shape,
            dtype,
            bytes.map_or("more than 2^64 bytes".to_string(), |bytes| format!(
                "{bytes} bytes"
            )),
        )),
    }
}

/// Why a client holding `held` bytes on `device` may not add `more`, if it may not.
pub(crate) fn client_refusal(device: &TrainiumDevice, held: u64, more: u64) -> Option<String> {
    let limit = CLIENT_LIMITS.get(device)?;
    let total = held.saturating_add(more);
    (more > 0 && total > limit).then(|| {
        format!(
            "{device}: this client holds {held} bytes, and {more} more would make {total}, above \
             the most one client may hold here, {limit} bytes (--max-client-bytes); nothing was \
             allocated"
        )
    })
}

/// `TRAINIUM_MAX_TENSOR_BYTES` when it is set (and not blank); read once per process.
pub(crate) fn limit_from_env() -> Result<Option<u64>, BackendError> {
    static LIMIT: OnceLock<Result<Option<u64>, BackendError>> = OnceLock::new();
    LIMIT.get_or_init(read_limit_env).clone()
}

fn read_limit_env() -> Result<Option<u64>, BackendError> {
    let invalid = |value: String, reason: &str| BackendError::InvalidSetting {
        variable: MAX_TENSOR_BYTES_ENV,
        value,
        reason: reason.to_string(),
    };
    match crate::settings::MAX_TENSOR_BYTES.var() {
        Ok(value) if value.trim().is_empty() => Ok(None),
        Ok(value) => match value.trim().parse::<u64>() {
            Ok(bytes) if bytes > 0 => Ok(Some(bytes)),
            _ => Err(invalid(value, "expected a positive byte count")),
        },
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(value)) => Err(invalid(
            value.to_string_lossy().into_owned(),
            "not valid UTF-8",
        )),
    }
}

/// The machine's physical memory in bytes (`u64::MAX` where it cannot be read).
fn physical_memory() -> u64 {
    static MEMORY: OnceLock<u64> = OnceLock::new();
    *MEMORY.get_or_init(|| {
        // SAFETY: `sysconf` reads a system constant; it has no preconditions.
        let (pages, page_size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages > 0 && page_size > 0 {
            (pages as u64).saturating_mul(page_size as u64)
        } else {
            u64::MAX
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_above_the_limit_is_refused_with_its_size_and_the_limit() {
        let device = TrainiumDevice::new(crate::ExecutorKind::Host, 9);
        set_max_tensor_bytes(&device, 4096);
        assert_eq!(tensor_refusal(&device, &[32, 32], DType::F32), None);
        let refused = tensor_refusal(&device, &[32, 33], DType::F32).unwrap();
        assert!(
            refused.contains("4224 bytes") && refused.contains("4096 bytes"),
            "{refused}"
        );
        let absurd = tensor_refusal(&device, &[1 << 40, 1 << 40], DType::F32).unwrap();
        assert!(absurd.contains("more than 2^64 bytes"), "{absurd}");
        assert!(physical_memory() > 1 << 20);
    }

    #[test]
    fn a_client_above_its_limit_is_refused_with_what_it_holds_and_the_limit() {
        let device = TrainiumDevice::new(crate::ExecutorKind::Host, 10);
        assert_eq!(client_refusal(&device, u64::MAX, 1), None, "no limit set");
        set_max_client_bytes(&device, 1000);
        assert_eq!(client_refusal(&device, 600, 400), None);
        assert_eq!(
            client_refusal(&device, 2000, 0),
            None,
            "freeing is never refused"
        );
        let refused = client_refusal(&device, 600, 401).unwrap();
        assert!(
            refused.contains("600 bytes")
                && refused.contains("1001")
                && refused.contains("1000 bytes"),
            "{refused}"
        );
    }
}
