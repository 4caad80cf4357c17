//! [`HfError`]: what can go wrong reading or writing a Hugging Face folder.

use std::path::PathBuf;

use crate::config::ConfigError;

/// Errors of Hugging Face import and export. Each names the file, and the tensor or field.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A JSON file could not be parsed.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// The configuration asks for something HLAT does not implement.
    #[error("{}: unsupported `{field}` = {value}: {reason}", path.display())]
    UnsupportedConfig {
        /// The `config.json`.
        path: PathBuf,
        /// The field.
        field: String,
        /// Its value, as JSON.
        value: String,
        /// What HLAT supports instead.
        reason: String,
    },
    /// The configuration converts to an invalid [`crate::HlatConfig`].
    #[error("{}: `{file_field}`: {source}", path.display())]
    InvalidConfig {
        /// The `config.json`.
        path: PathBuf,
        /// The field of the file the invalid value came from.
        file_field: &'static str,
        /// The validation error.
        source: ConfigError,
    },
    /// The folder has neither `model.safetensors` nor `model.safetensors.index.json`.
    #[error("{}: no `model.safetensors` or `model.safetensors.index.json`", dir.display())]
    NoWeights {
        /// The folder.
        dir: PathBuf,
    },
    /// A safetensors file is truncated or its header is invalid.
    #[error("{}: corrupt or truncated safetensors file: {reason}", file.display())]
    CorruptSafetensors {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor the model needs is absent.
    #[error("{}: missing tensor `{tensor}`", file.display())]
    MissingTensor {
        /// Where it should be (the weights file or the index).
        file: PathBuf,
        /// The Hugging Face tensor name.
        tensor: String,
    },
    /// A tensor is present that the model has no place for.
    #[error("{}: unexpected tensor `{tensor}` (not part of a LLaMA model of this configuration)", file.display())]
    UnexpectedTensor {
        /// The file holding it.
        file: PathBuf,
        /// The tensor name.
        tensor: String,
    },
    /// A tensor has the wrong shape for the configuration.
    #[error("{}: tensor `{tensor}` has shape {found:?}, the configuration needs {expected:?}", file.display())]
    ShapeMismatch {
        /// The file holding it.
        file: PathBuf,
        /// The tensor name.
        tensor: String,
        /// The shape the configuration implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor's element type is not f32, bf16 or f16.
    #[error("{}: tensor `{tensor}` has unsupported dtype {dtype} (supported: F32, BF16, F16)", file.display())]
    UnsupportedDtype {
        /// The file holding it.
        file: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Its dtype.
        dtype: String,
    },
    /// The device cannot hold weights of the requested element type.
    #[error("{backend} does not support {dtype:?} weights; import as f32 or use another device")]
    BackendDtype {
        /// The device, as its `Debug` names it (its backend and index).
        backend: String,
        /// The requested type.
        dtype: super::WeightDtype,
    },
    /// Building the model from the tensors failed.
    #[error("{}: loading tensor `{tensor}` failed: {message}", file.display())]
    Load {
        /// The folder.
        file: PathBuf,
        /// The tensor (Burn path).
        tensor: String,
        /// What failed.
        message: String,
    },
    /// `tokenizer.json` could not be read.
    #[error("{}: invalid tokenizer: {message}", path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// The tokenizers crate's message.
        message: String,
    },
    /// The export target exists already (it is never overwritten).
    #[error("{}: already exists; choose a new output folder", path.display())]
    OutputExists {
        /// The folder.
        path: PathBuf,
    },
}

impl HfError {
    /// An [`HfError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> HfError {
        let path = path.into();
        move |source| HfError::Io { path, source }
    }
}
