use std::path::PathBuf;

use thiserror::Error;

/// Errors of the Neuron toolchain: settings, the `neuronx-cc` driver and the NEFF cache.
#[derive(Debug, Error)]
pub enum NeuronError {
    /// An environment variable or flag holds a value that cannot be used.
    #[error("invalid {name} `{value}`: {reason}")]
    InvalidSetting {
        /// The variable or flag.
        name: &'static str,
        /// The value given.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The compiler executable could not be started.
    #[error("cannot run the Neuron compiler `{executable}` (set NEURON_CC to its path): {reason}")]
    CompilerUnavailable {
        /// The executable tried.
        executable: PathBuf,
        /// The operating system's message.
        reason: String,
    },
    /// `neuronx-cc --version` did not print a version.
    #[error("`{executable} --version` printed no version: {output}")]
    CompilerVersion {
        /// The executable run.
        executable: PathBuf,
        /// What it printed.
        output: String,
    },
    /// The compiler ran and rejected the module; its output is kept in the cache entry.
    #[error("neuronx-cc failed ({status}) on {module}: `{command}`\n{log}")]
    CompileFailed {
        /// The exit status.
        status: String,
        /// The HLO module file that was compiled.
        module: PathBuf,
        /// The command line.
        command: String,
        /// Everything the compiler printed.
        log: String,
    },
    /// An earlier compile of the same module with the same flags and compiler failed.
    #[error(
        "the module in {entry} failed to compile before (add --retry_failed_compilation to NEURON_CC_FLAGS or delete the folder to try again):\n{log}"
    )]
    RememberedFailure {
        /// The cache entry's folder.
        entry: PathBuf,
        /// The remembered compiler output.
        log: String,
    },
    /// The kernel tracer could not turn a kernel request into the SDK's call.
    #[error("cannot trace {kernel} with `{command}` (set {tracer} to another tracer, or {flash}=off): {reason}", tracer = super::KERNEL_TRACER_ENV, flash = super::FLASH_ATTENTION_ENV)]
    KernelTracer {
        /// The kernel (or what was being done).
        kernel: String,
        /// The tracer's command line.
        command: String,
        /// What failed, with what the tracer printed.
        reason: String,
    },
    /// A module holds kernel requests but the compiler has no tracer for them.
    #[error("the module's kernel requests cannot be traced: {reason}")]
    UntracedKernelRequests {
        /// Why.
        reason: String,
    },
    /// A file of the cache or work folder could not be read or written.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done (`read`, `write`, `create`, `lock`, ...).
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl NeuronError {
    /// An [`NeuronError::Io`] for `action` on `path`.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            action,
            path,
            source,
        }
    }
}
