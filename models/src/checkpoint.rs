//! Native checkpoints, and loading whatever folder a user points at.
//!
//! Native layout (shared by `hlat generate`, `hlat convert` and `hlat pretrain`):
//! `DIR/config.json` ([`HlatConfig`] as our JSON), `DIR/model.bpk` (burn-store burnpack) and,
//! optionally, `DIR/tokenizer.json`. A training run folder ([`crate::run_folder`]) holds its
//! checkpoints' models in native layout.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn_store::{BurnpackStore, ModuleSnapshot, ModuleStore, TensorSnapshot, TensorSnapshotError};
use tokenizers::Tokenizer;

use crate::config::{ConfigError, HlatConfig, element_count};
use crate::hf::{self, HfError, WeightDtype};
use crate::model::Hlat;
use crate::run_folder::{MODEL_DIR, RunFolder, RunFolderError};
use crate::sharded_checkpoint;
use crate::staging::Staging;

/// The configuration file of a native checkpoint.
pub const NATIVE_CONFIG_FILE: &str = "config.json";
/// The weights file of a native checkpoint.
pub const NATIVE_WEIGHTS_FILE: &str = "model.bpk";

/// Errors of native checkpoints and of [`load_any`].
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
        crate::run_folder::COMPLETION_MARKER
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

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.to_path_buf();
    move |source| CheckpointError::Io { path, source }
}

/// Saves `model` and `config` as a native checkpoint in `dir`, replacing it if it exists.
///
/// Written to a temporary sibling folder and renamed into place: `dir` is either the old
/// checkpoint or the complete new one.
pub fn save_native<B: Backend>(
    model: &Hlat<B>,
    config: &HlatConfig,
    dir: &Path,
) -> Result<(), CheckpointError> {
    save_native_with_tokenizer(model, config, None, dir)
}

/// [`save_native`], also writing `tokenizer.json` when a tokenizer is given.
pub fn save_native_with_tokenizer<B: Backend>(
    model: &Hlat<B>,
    config: &HlatConfig,
    tokenizer: Option<&Tokenizer>,
    dir: &Path,
) -> Result<(), CheckpointError> {
    let staging = Staging::new(dir).map_err(io_error(dir))?;
    config.save(&staging.path().join(NATIVE_CONFIG_FILE))?;
    let weights = staging.path().join(NATIVE_WEIGHTS_FILE);
    let mut store = BurnpackStore::from_file(&weights).overwrite(true);
    model
        .save_into(&mut store)
        .map_err(|error| CheckpointError::Burnpack {
            path: weights.clone(),
            message: error.to_string(),
        })?;
    if let Some(tokenizer) = tokenizer {
        hf::save_tokenizer(tokenizer, staging.path())?;
    }
    staging.commit(true).map_err(io_error(dir))
}

/// Loads a native checkpoint, whole or sharded by tensor-parallel rank (joined on the host); the
/// weights keep the dtype they were saved with.
pub fn load_native<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(HlatConfig, Hlat<B>), CheckpointError> {
    let config = HlatConfig::load(&dir.join(NATIVE_CONFIG_FILE))?;
    let (source, stored) = if sharded_checkpoint::is_sharded(dir) {
        (dir.to_path_buf(), sharded_checkpoint::read_joined(dir)?)
    } else {
        let weights = dir.join(NATIVE_WEIGHTS_FILE);
        if !weights.is_file() {
            return Err(CheckpointError::Io {
                path: weights,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            });
        }
        let stored = read_burnpack(&weights)?;
        (weights, stored)
    };
    let burnpack_error = |message: String| CheckpointError::Burnpack {
        path: source.clone(),
        message,
    };
    if let Some((path, snapshot)) = stored
        .iter()
        .find(|(_, snapshot)| !B::supports_dtype(device, snapshot.dtype))
    {
        return Err(burnpack_error(format!(
            "tensor `{path}` is {:?}, which the {} backend does not support",
            snapshot.dtype,
            B::name(device)
        )));
    }
    // The model is built from the configuration before the weights are applied: a configuration
    // that needs more parameters than the weights hold is refused before anything is allocated.
    let stored_parameters = stored
        .values()
        .map(|snapshot| element_count(&snapshot.shape))
        .fold(0u64, u64::saturating_add);
    config.validate()?;
    if stored_parameters != config.num_params() {
        return Err(burnpack_error(format!(
            "the weights hold {stored_parameters} parameters, the configuration in {} needs {}",
            dir.join(NATIVE_CONFIG_FILE).display(),
            config.num_params()
        )));
    }
    let mut model = Hlat::new(config.clone(), device);
    let result = model.apply(stored.into_values().collect(), None, None, false);
    if let Some(error) = result.errors.first() {
        return Err(burnpack_error(error.to_string()));
    }
    if let Some((path, _)) = result.missing.first() {
        return Err(burnpack_error(format!("missing tensor `{path}`")));
    }
    if let Some(path) = result.unused.first() {
        return Err(burnpack_error(format!("unexpected tensor `{path}`")));
    }
    Ok((config, model))
}

/// The tensors of a burnpack file by parameter path (read lazily, when their data is asked for;
/// see [`length_checked`]).
pub(crate) fn read_burnpack(
    path: &Path,
) -> Result<std::collections::BTreeMap<String, TensorSnapshot>, CheckpointError> {
    let snapshots = BurnpackStore::from_file(path)
        .get_all_snapshots()
        .cloned()
        .map_err(|error| CheckpointError::Burnpack {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
    Ok(snapshots
        .into_iter()
        .map(|(name, snapshot)| (name, length_checked(snapshot)))
        .collect())
}

/// `snapshot`, whose data is checked when it is read: a burnpack entry's byte range must hold
/// exactly the bytes of its shape and dtype. Burn's backends assume so (a corrupt file would make
/// them panic); here it is an error of the load that names the tensor.
fn length_checked(snapshot: TensorSnapshot) -> TensorSnapshot {
    let expected = snapshot.data_len();
    let (dtype, shape) = (snapshot.dtype, snapshot.shape.clone());
    let name = snapshot.full_path();
    let read = snapshot.clone_data_fn();
    let checked = move || {
        let data = read()?;
        if data.dtype != dtype || data.shape != shape || data.as_bytes().len() != expected {
            return Err(TensorSnapshotError::DataError(format!(
                "tensor `{name}` holds {} bytes of {:?} {:?}; its entry says {:?} {:?}, {expected} \
                 bytes",
                data.as_bytes().len(),
                data.dtype,
                data.shape,
                dtype,
                shape
            )));
        }
        Ok(data)
    };
    TensorSnapshot::from_closure(
        std::rc::Rc::new(checked),
        snapshot.dtype,
        snapshot.shape.clone(),
        snapshot.path_stack.clone().unwrap_or_default(),
        snapshot.container_stack.clone().unwrap_or_default(),
        snapshot.tensor_id.unwrap_or_default(),
    )
}

/// Loads a model from a native checkpoint, a Hugging Face folder (weights as f32) or a training
/// run folder (its newest checkpoint), detected by the files present. The tokenizer is
/// `tokenizer.json` of the model folder (for a run: of the checkpoint's `model/` folder, else of
/// the run folder), when there is one.
pub fn load_any<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(HlatConfig, Hlat<B>, Option<Tokenizer>), CheckpointError> {
    if RunFolder::is_run(dir) {
        let newest =
            RunFolder::new(dir)
                .newest()?
                .ok_or_else(|| CheckpointError::NoCompleteCheckpoint {
                    dir: dir.to_path_buf(),
                })?;
        let model_dir = newest.join(MODEL_DIR);
        log::info!(
            "{}: newest checkpoint {}",
            dir.display(),
            model_dir.display()
        );
        let (config, model, tokenizer) = load_model_folder(&model_dir, device)?;
        let tokenizer = match tokenizer {
            Some(tokenizer) => Some(tokenizer),
            None => hf::find_tokenizer(dir)?,
        };
        return Ok((config, model, tokenizer));
    }
    load_model_folder(dir, device)
}

/// The kind of model folder `dir` is, from the files present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FolderKind {
    /// `config.json` + `model.bpk`, or `config.json` + rank or stage shards (`tensor_parallel.json`,
    /// `pipeline_parallel.json`).
    Native,
    /// `config.json` + `model.safetensors` or `model.safetensors.index.json`.
    HuggingFace,
}

/// Detects the kind of model folder, if it is one.
pub fn folder_kind(dir: &Path) -> Option<FolderKind> {
    if dir.join(NATIVE_WEIGHTS_FILE).is_file() || sharded_checkpoint::is_sharded(dir) {
        Some(FolderKind::Native)
    } else if dir.join(hf::WEIGHTS_FILE).is_file() || dir.join(hf::INDEX_FILE).is_file() {
        Some(FolderKind::HuggingFace)
    } else {
        None
    }
}

fn load_model_folder<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(HlatConfig, Hlat<B>, Option<Tokenizer>), CheckpointError> {
    let (config, model) = match folder_kind(dir) {
        Some(FolderKind::Native) => load_native(dir, device)?,
        Some(FolderKind::HuggingFace) => hf::import_hf(dir, device, WeightDtype::F32)?,
        None => {
            return Err(CheckpointError::NotAModel {
                dir: dir.to_path_buf(),
            });
        }
    };
    let tokenizer = hf::find_tokenizer(dir)?;
    Ok((config, model, tokenizer))
}
