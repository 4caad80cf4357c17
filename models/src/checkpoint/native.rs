//! Native checkpoints, whole or sharded: saving a model and loading one.
//!
//! Native layout (shared by `hlat generate`, `hlat convert` and `hlat pretrain`):
//! `DIR/config.json` ([`HlatConfig`] as our JSON), `DIR/model.bpk` (burn-store burnpack) and,
//! optionally, `DIR/tokenizer.json`; or the rank and stage files of [`super::sharded`] instead of
//! `model.bpk`. A training run folder ([`super::run_folder`]) holds its checkpoints' models in
//! native layout.

use std::path::Path;

use burn::tensor::Device;
use burn_store::{BurnpackStore, ModuleSnapshot};
use tokenizers::Tokenizer;

use super::burnpack::read_burnpack;
use super::error::CheckpointError;
use super::files::{NATIVE_CONFIG_FILE, NATIVE_WEIGHTS_FILE, is_sharded};
use super::sharded::read_joined;
use crate::config::{HlatConfig, element_count};
use crate::hf;
use crate::model::Hlat;
use crate::staging::Staging;

/// Saves `model` and `config` as a native checkpoint in `dir`, replacing it if it exists.
///
/// Written to a temporary sibling folder and renamed into place: `dir` is either the old
/// checkpoint or the complete new one.
pub fn save_native(model: &Hlat, config: &HlatConfig, dir: &Path) -> Result<(), CheckpointError> {
    save_native_with_tokenizer(model, config, None, dir)
}

/// [`save_native`], also writing `tokenizer.json` when a tokenizer is given.
pub fn save_native_with_tokenizer(
    model: &Hlat,
    config: &HlatConfig,
    tokenizer: Option<&Tokenizer>,
    dir: &Path,
) -> Result<(), CheckpointError> {
    let staging = Staging::new(dir).map_err(CheckpointError::io(dir))?;
    config.save(&staging.path().join(NATIVE_CONFIG_FILE))?;
    let weights = staging.path().join(NATIVE_WEIGHTS_FILE);
    let mut store = BurnpackStore::from_file(&weights).overwrite(true);
    model
        .save_into(&mut store)
        .map_err(|error| CheckpointError::burnpack(&weights, error.to_string()))?;
    if let Some(tokenizer) = tokenizer {
        hf::save_tokenizer(tokenizer, staging.path())?;
    }
    staging.commit(true).map_err(CheckpointError::io(dir))
}

/// Loads a native checkpoint, whole or sharded by tensor-parallel rank (joined on the host); the
/// weights keep the dtype they were saved with.
pub fn load_native(dir: &Path, device: &Device) -> Result<(HlatConfig, Hlat), CheckpointError> {
    let config = HlatConfig::load(&dir.join(NATIVE_CONFIG_FILE))?;
    let (source, stored) = if is_sharded(dir) {
        (dir.to_path_buf(), read_joined(dir)?)
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
    let burnpack_error = |message: String| CheckpointError::burnpack(&source, message);
    if let Some((path, snapshot)) = stored
        .iter()
        .find(|(_, snapshot)| !device.supports_dtype(snapshot.dtype))
    {
        return Err(burnpack_error(format!(
            "tensor `{path}` is {:?}, which {device:?} does not support",
            snapshot.dtype
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
    // The parameters keep the ids of the freshly built model (as every load does): two models
    // loaded from one checkpoint are distinct parameters.
    let tensors = stored
        .into_values()
        .map(|mut tensor| {
            tensor.param_id = None;
            tensor
        })
        .collect();
    let result = model.apply(tensors, None, None, false);
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
