use std::path::PathBuf;

use thiserror::Error;

/// Errors of the PJRT bindings: loading a plugin, or a call the plugin refused.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PjrtError {
    /// The shared library could not be opened (missing file, not a shared library, ...).
    #[error("cannot load the PJRT plugin `{path}`: {reason}")]
    Load {
        /// The path that was given.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The plugin's API lacks something this crate needs.
    #[error("the PJRT plugin `{path}` is not usable: {reason}")]
    Incompatible {
        /// The path of the plugin.
        path: PathBuf,
        /// What is missing (version, function).
        reason: String,
    },
    /// A PJRT function returned an error.
    #[error("PJRT {function} failed ({code}): {message}")]
    Call {
        /// The PJRT function, e.g. `PJRT_Client_Compile`.
        function: &'static str,
        /// The status code name, e.g. `INVALID_ARGUMENT`.
        code: &'static str,
        /// The plugin's message.
        message: String,
    },
    /// The caller passed something the bindings refuse before calling the plugin.
    #[error("invalid PJRT request: {0}")]
    InvalidRequest(String),
}

/// The name of a `PJRT_Error_Code` (absl status codes).
pub(crate) fn code_name(code: i32) -> &'static str {
    match code {
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "UNKNOWN_CODE",
    }
}
