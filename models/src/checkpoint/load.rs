//! Loading whatever folder a user points at: a native checkpoint, a Hugging Face folder or a
//! training run folder (its newest checkpoint).

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use tokenizers::Tokenizer;

use super::error::CheckpointError;
use super::files::{NATIVE_WEIGHTS_FILE, is_sharded};
use super::native::load_native;
use super::run_folder::{MODEL_DIR, RunFolder};
use crate::config::HlatConfig;
use crate::hf::{self, WeightDtype};
use crate::model::Hlat;

/// Loads a model from a native checkpoint, a Hugging Face folder (weights as f32) or a training
/// run folder (its newest checkpoint), detected by the files present. The tokenizer is
/// `tokenizer.json` of the model folder (for a run: of the checkpoint's `model/` folder, else of
/// the run folder), when there is one.
pub fn load_any(
    dir: &Path,
    device: &Device,
) -> Result<(HlatConfig, Hlat, Option<Tokenizer>), CheckpointError> {
    if RunFolder::is_run(dir) {
        let model_dir = model_folder(dir)?;
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

/// The model folder `dir` names: for a training run folder, its newest complete checkpoint's
/// `model/` (with the run's tokenizer); otherwise `dir` itself.
pub fn model_folder(dir: &Path) -> Result<PathBuf, CheckpointError> {
    if !RunFolder::is_run(dir) {
        return Ok(dir.to_path_buf());
    }
    let newest =
        RunFolder::new(dir)
            .newest()?
            .ok_or_else(|| CheckpointError::NoCompleteCheckpoint {
                dir: dir.to_path_buf(),
            })?;
    Ok(newest.join(MODEL_DIR))
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
    if dir.join(NATIVE_WEIGHTS_FILE).is_file() || is_sharded(dir) {
        Some(FolderKind::Native)
    } else if dir.join(hf::WEIGHTS_FILE).is_file() || dir.join(hf::INDEX_FILE).is_file() {
        Some(FolderKind::HuggingFace)
    } else {
        None
    }
}

fn load_model_folder(
    dir: &Path,
    device: &Device,
) -> Result<(HlatConfig, Hlat, Option<Tokenizer>), CheckpointError> {
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
