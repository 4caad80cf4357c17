//! [`CheckpointError`]: what goes wrong reading or writing a checkpoint.

use std::path::{Path, PathBuf};

use super::run_folder::{COMPLETION_MARKER, RunFolderError};
use crate::config::ConfigError;
use crate::hf::HfError;

/// Errors of reading and writing checkpoints, and of [`super::load_any`].
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The configuration is missing or invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The burnpack file could not be written or read.
    #[error("{}: {message}", path.display())]
    Burnpack {
        /// The `model.bpk`.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The training run folder could not be read.
    #[error(transparent)]
    RunFolder(#[from] RunFolderError),
    /// The folder is a Hugging Face folder that failed to import.
    #[error(transparent)]
    Hf(#[from] HfError),
    /// The folder is a training run without a complete checkpoint yet.
    #[error(
        "{}: a training run folder without a complete checkpoint (each checkpoint is complete once its {} is written)",
        dir.display(),
        COMPLETION_MARKER
    )]
    NoCompleteCheckpoint {
        /// The run folder.
        dir: PathBuf,
    },
    /// The folder is neither a native checkpoint, a Hugging Face folder nor a training run.
    #[error(
        "{}: not a model folder (expected `model.bpk`, `tensor_parallel.json` or `pipeline_parallel.json` + `config.json`, `model.safetensors` or `model.safetensors.index.json` + `config.json`, or `checkpoints/newest`)",
        dir.display()
    )]
    NotAModel {
        /// The folder.
        dir: PathBuf,
    },
}

impl CheckpointError {
    /// The I/O error of `path`, as a function of the error.
    pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| Self::Io { path, source }
    }

    /// A burnpack file (or a shard folder) at `path` is wrong, as `message` says.
    pub(crate) fn burnpack(path: &Path, message: impl Into<String>) -> Self {
        Self::Burnpack {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }
}
