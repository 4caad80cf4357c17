//! The errors of the Neuron runtime bindings, and the record of a failed library search.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use super::{LIB_DIR_ENV, NrtStatus};

/// One place the loader looked for `libnrt`, and why it was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadAttempt {
    /// The path, or the bare file name handed to the dynamic loader.
    pub candidate: PathBuf,
    /// The loader's message.
    pub reason: String,
}

impl fmt::Display for LoadAttempt {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.candidate.is_absolute() {
            write!(formatter, "{} ({})", self.candidate.display(), self.reason)
        } else {
            write!(
                formatter,
                "{} on the dynamic loader search path ({})",
                self.candidate.display(),
                self.reason
            )
        }
    }
}

/// Errors of the Neuron runtime bindings.
#[derive(Debug, Clone, Error)]
pub enum NrtError {
    /// No candidate library could be opened.
    #[error(
        "the Neuron runtime library (libnrt) was not found; set {LIB_DIR_ENV} to the folder that holds libnrt.so.1 or install aws-neuronx-runtime-lib. Searched: {}",
        .searched.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    NotFound {
        /// Every candidate tried, in order, with the loader's message.
        searched: Vec<LoadAttempt>,
    },
    /// The library was opened but lacks a function this binding needs.
    #[error("`{library}` has no symbol `{symbol}`: it is not a compatible libnrt ({reason})")]
    MissingSymbol {
        /// The library that was opened.
        library: String,
        /// The missing function.
        symbol: &'static str,
        /// The loader's message.
        reason: String,
    },
    /// A runtime call returned a non-success status.
    #[error("`{call}` failed with {status}")]
    Status {
        /// The C function that failed.
        call: &'static str,
        /// Its status.
        status: NrtStatus,
    },
    /// A call was rejected before reaching the runtime.
    #[error("`{call}`: {reason}")]
    InvalidArgument {
        /// The C function that would have been called.
        call: &'static str,
        /// What was wrong with the arguments.
        reason: String,
    },
    /// The runtime was closed by [`NeuronRuntime::close`](super::NeuronRuntime::close).
    #[error("the Neuron runtime was closed in this process")]
    Closed,
}
