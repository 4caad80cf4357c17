//! `NRT_STATUS` return codes (`nrt_status.h`) and the check every call's result goes through.

use std::ffi::c_int;
use std::fmt;

use super::NrtError;

/// A non-success `NRT_STATUS` value (`nrt_status.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NrtStatus {
    /// `NRT_FAILURE` (1): non-specific failure.
    Failure,
    /// `NRT_INVALID` (2): invalid NEFF, instruction, DMA descriptor, or tensor name/size mismatch.
    Invalid,
    /// `NRT_INVALID_HANDLE` (3).
    InvalidHandle,
    /// `NRT_RESOURCE` (4): a resource could not be allocated.
    Resource,
    /// `NRT_TIMEOUT` (5).
    Timeout,
    /// `NRT_HW_ERROR` (6): hardware failure.
    HardwareError,
    /// `NRT_QUEUE_FULL` (7): the execution input queue is full.
    QueueFull,
    /// `NRT_LOAD_NOT_ENOUGH_NC` (9): not enough NeuronCores to load the NEFF.
    LoadNotEnoughCores,
    /// `NRT_UNSUPPORTED_NEFF_VERSION` (10).
    UnsupportedNeffVersion,
    /// `NRT_UNINITIALIZED` (13): called before `nrt_init`.
    Uninitialized,
    /// `NRT_CLOSED` (14): called after `nrt_close`.
    Closed,
    /// `NRT_EXEC_BAD_INPUT` (1002): invalid input submitted to an execution.
    ExecBadInput,
    /// `NRT_EXEC_COMPLETED_WITH_NUM_ERR` (1003): the execution produced NaN.
    ExecCompletedWithNumericalErrors,
    /// `NRT_EXEC_COMPLETED_WITH_ERR` (1004): the execution completed with other errors.
    ExecCompletedWithErrors,
    /// `NRT_EXEC_NC_BUSY` (1005): the NeuronCore is in use by another model or process.
    ExecCoreBusy,
    /// `NRT_COLL_PENDING` (1100): a collective operation is still pending.
    CollectivePending,
    /// A code this binding does not know.
    Unknown(i32),
}

impl NrtStatus {
    /// The status of a return code, `None` for `NRT_SUCCESS` (0).
    pub fn from_code(code: i32) -> Option<Self> {
        Some(match code {
            0 => return None,
            1 => Self::Failure,
            2 => Self::Invalid,
            3 => Self::InvalidHandle,
            4 => Self::Resource,
            5 => Self::Timeout,
            6 => Self::HardwareError,
            7 => Self::QueueFull,
            9 => Self::LoadNotEnoughCores,
            10 => Self::UnsupportedNeffVersion,
            13 => Self::Uninitialized,
            14 => Self::Closed,
            1002 => Self::ExecBadInput,
            1003 => Self::ExecCompletedWithNumericalErrors,
            1004 => Self::ExecCompletedWithErrors,
            1005 => Self::ExecCoreBusy,
            1100 => Self::CollectivePending,
            other => Self::Unknown(other),
        })
    }

    /// The return code, as in `nrt_status.h`.
    pub fn code(self) -> i32 {
        match self {
            Self::Failure => 1,
            Self::Invalid => 2,
            Self::InvalidHandle => 3,
            Self::Resource => 4,
            Self::Timeout => 5,
            Self::HardwareError => 6,
            Self::QueueFull => 7,
            Self::LoadNotEnoughCores => 9,
            Self::UnsupportedNeffVersion => 10,
            Self::Uninitialized => 13,
            Self::Closed => 14,
            Self::ExecBadInput => 1002,
            Self::ExecCompletedWithNumericalErrors => 1003,
            Self::ExecCompletedWithErrors => 1004,
            Self::ExecCoreBusy => 1005,
            Self::CollectivePending => 1100,
            Self::Unknown(code) => code,
        }
    }

    /// The header's name of the status.
    pub fn name(self) -> &'static str {
        match self {
            Self::Failure => "NRT_FAILURE",
            Self::Invalid => "NRT_INVALID",
            Self::InvalidHandle => "NRT_INVALID_HANDLE",
            Self::Resource => "NRT_RESOURCE",
            Self::Timeout => "NRT_TIMEOUT",
            Self::HardwareError => "NRT_HW_ERROR",
            Self::QueueFull => "NRT_QUEUE_FULL",
            Self::LoadNotEnoughCores => "NRT_LOAD_NOT_ENOUGH_NC",
            Self::UnsupportedNeffVersion => "NRT_UNSUPPORTED_NEFF_VERSION",
            Self::Uninitialized => "NRT_UNINITIALIZED",
            Self::Closed => "NRT_CLOSED",
            Self::ExecBadInput => "NRT_EXEC_BAD_INPUT",
            Self::ExecCompletedWithNumericalErrors => "NRT_EXEC_COMPLETED_WITH_NUM_ERR",
            Self::ExecCompletedWithErrors => "NRT_EXEC_COMPLETED_WITH_ERR",
            Self::ExecCoreBusy => "NRT_EXEC_NC_BUSY",
            Self::CollectivePending => "NRT_COLL_PENDING",
            Self::Unknown(_) => "unknown NRT_STATUS",
        }
    }
}

impl fmt::Display for NrtStatus {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{} ({})", self.name(), self.code())
    }
}

/// `Ok` for `NRT_SUCCESS`, otherwise [`NrtError::Status`] naming the C function `call`.
pub(crate) fn check(call: &'static str, code: c_int) -> Result<(), NrtError> {
    match NrtStatus::from_code(code) {
        None => Ok(()),
        Some(status) => Err(NrtError::Status { call, status }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_the_header_names_and_codes() {
        assert_eq!(NrtStatus::from_code(0), None);
        for code in [
            1, 2, 3, 4, 5, 6, 7, 9, 10, 13, 14, 1002, 1003, 1004, 1005, 1100,
        ] {
            let status = NrtStatus::from_code(code).unwrap();
            assert_eq!(status.code(), code);
            assert!(status.name().starts_with("NRT_"), "{status}");
        }
        assert_eq!(
            NrtStatus::from_code(1005).unwrap().name(),
            "NRT_EXEC_NC_BUSY"
        );
        assert_eq!(NrtStatus::from_code(8), Some(NrtStatus::Unknown(8)));
        let error = check("nrt_load", 9).unwrap_err().to_string();
        assert_eq!(error, "`nrt_load` failed with NRT_LOAD_NOT_ENOUGH_NC (9)");
    }
}
