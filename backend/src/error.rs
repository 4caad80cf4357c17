use thiserror::Error;

/// Errors raised by the Trainium backend: device selection, executors and segment execution.
#[derive(Debug, Error, Clone)]
pub enum BackendError {
    /// The device string (from code or `TRAINIUM_DEVICE`) could not be parsed.
    #[error(
        "invalid Trainium device `{value}`: {reason} (expected `host`, `xla` or `neuron`, optionally followed by `:N` or `:FIRST-LAST`)"
    )]
    InvalidDevice {
        /// The text that was given.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A setting read from the environment has a value the backend cannot use.
    #[error("invalid {variable} `{value}`: {reason}")]
    InvalidSetting {
        /// The environment variable.
        variable: &'static str,
        /// The value it holds.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The executor asked for cannot run on this machine.
    #[error("the `{executor}` executor is unavailable: {reason}")]
    ExecutorUnavailable {
        /// The executor kind (`xla`, `neuron`).
        executor: &'static str,
        /// Why it cannot be used.
        reason: String,
    },
    /// An executor failed while running a segment or moving a tensor.
    #[error("the `{executor}` executor failed: {reason}")]
    Execution {
        /// The executor kind.
        executor: &'static str,
        /// The executor's message.
        reason: String,
    },
    /// An operation or data type has no support in this executor.
    #[error("unsupported by the `{executor}` executor: {what}")]
    Unsupported {
        /// The executor kind.
        executor: &'static str,
        /// What is not supported.
        what: String,
    },
    /// A tensor has no value because the segment that computes it failed (or computed it from
    /// one that did): the first failure, once for every tensor it left without a value.
    #[error("tensor {tensor} has no value: an operation it depends on failed: {cause}")]
    NotComputed {
        /// The tensor read or used.
        tensor: String,
        /// The failure that left it without a value.
        cause: String,
    },
    /// The server that makes a Trainium device a Burn device could not start or be reached.
    #[error("the Burn device server of `{device}`: {reason}")]
    Server {
        /// The device (or devices) served.
        device: String,
        /// What failed.
        reason: String,
    },
}

impl From<BackendError> for burn_backend::ExecutionError {
    fn from(error: BackendError) -> Self {
        burn_backend::ExecutionError::WithContext {
            reason: error.to_string(),
        }
    }
}

/// The message of a caught panic (`std::panic::catch_unwind`'s payload): its text, or "a panic
/// without a message". For errors that report a library's panic instead of crashing.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| {
            payload
                .downcast_ref::<&str>()
                .map(|message| message.to_string())
        })
        .unwrap_or_else(|| "a panic without a message".to_string())
}
