//! Errors of the trainer.

use std::path::PathBuf;

/// What can go wrong while configuring, running, checkpointing or evaluating a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A file or folder could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The run folder (checkpoints, the newest pointer) could not be read or written.
    #[error(transparent)]
    RunFolder(#[from] hlat::checkpoint::run_folder::RunFolderError),
    /// A configuration file could not be parsed.
    #[error("{path}: {message}")]
    Config {
        /// The configuration file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A configuration value is out of range or inconsistent with another.
    #[error("invalid training configuration: `{field}` {message}")]
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// Too many optimizer steps in a row had a non-finite loss or gradient.
    #[error(
        "stopping at step {step}: {count} consecutive steps had a non-finite loss or gradient \
         (last loss {loss}, gradient norm {grad_norm}); lower the learning rate or check the data"
    )]
    NonFinite {
        /// The last skipped step.
        step: u64,
        /// Consecutive skipped steps.
        count: u32,
        /// The last loss.
        loss: f64,
        /// The last gradient norm.
        grad_norm: f64,
    },
    /// A checkpoint is missing a part or holds something unreadable.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The checkpoint folder or file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A checkpoint could not be written (a full disk, an unwritable folder): a fault of the
    /// machine rather than of the run's input.
    #[error("the checkpoint of step {step} could not be written: {error}")]
    CheckpointWrite {
        /// The step it was the checkpoint of.
        step: u64,
        /// What went wrong, naming the file or folder.
        #[source]
        error: Box<TrainError>,
    },
    /// The model crate failed (configuration, initialisation, loading or saving weights).
    #[error("model: {0}")]
    Model(String),
    /// The data pipeline failed.
    #[error("data: {0}")]
    Data(String),
    /// The data does not fit the model.
    #[error("{0}")]
    Mismatch(String),
    /// Reading a result from the device failed (the executor's error, which names the segment
    /// or operation).
    #[error("device: {0}")]
    Device(String),
}

impl From<burn::tensor::TensorReadError> for TrainError {
    fn from(error: burn::tensor::TensorReadError) -> Self {
        TrainError::Device(error.to_string())
    }
}

impl From<burn_backend::ExecutionError> for TrainError {
    fn from(error: burn_backend::ExecutionError) -> Self {
        TrainError::Device(error.to_string())
    }
}
