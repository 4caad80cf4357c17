//! Import of a Hugging Face folder of the LLaMA family.

use std::path::Path;
use std::sync::Arc;

use burn::tensor::Device;
use burn_store::burn_pack::Tensor as PackTensor;
use burn_store::{ModuleSnapshot, bridge};

use super::config::read_hf_config;
use super::dtype::{WeightDtype, decode};
use super::error::HfError;
use super::names::{TensorSpec, is_derived_buffer, tensor_specs};
use super::reader::Weights;
use crate::config::HlatConfig;
use crate::model::Hlat;

/// Imports the model of `DIR` (`config.json` + safetensors, single or sharded) with its weights
/// converted to `dtype`.
///
/// Every tensor name, shape and dtype is checked before any data is read; the data is then read
/// tensor by tensor from the memory-mapped files straight into the model.
pub fn import_hf(
    dir: &Path,
    device: &Device,
    dtype: WeightDtype,
) -> Result<(HlatConfig, Hlat), HfError> {
    if !device.supports_dtype(dtype.burn()) {
        return Err(HfError::BackendDtype {
            backend: format!("{device:?}"),
            dtype,
        });
    }
    let config = read_hf_config(dir)?;
    let weights = Arc::new(Weights::open(dir)?);
    let specs = check_tensors(&weights, tensor_specs(&config), config.tie_word_embeddings)?;

    let snapshots = specs
        .into_iter()
        .map(|spec| snapshot(&weights, spec, dtype))
        .collect();
    let mut model = Hlat::new(config.clone(), device);
    let result = model.apply(snapshots, None, None, false);
    let failure = result
        .errors
        .first()
        .map(|error| (String::new(), error.to_string()))
        .or_else(|| {
            result
                .missing
                .first()
                .map(|(path, _)| (path.clone(), "no weight was provided".to_string()))
        })
        .or_else(|| {
            result
                .unused
                .first()
                .map(|path| (path.clone(), "the model has no such parameter".to_string()))
        });
    if let Some((tensor, message)) = failure {
        return Err(HfError::Load {
            file: weights.listing.clone(),
            tensor,
            message,
        });
    }
    log::info!(
        "imported {} ({} parameters) as {:?}",
        dir.display(),
        config.num_params(),
        dtype
    );
    Ok((config, model))
}

/// Checks names, shapes and dtypes of the stored tensors against `specs` and returns them. The
/// specs are taken one at a time and the first missing tensor stops the check, so what is kept
/// is bounded by the tensors the files hold, whatever the configuration asks for. A `tied`
/// model's stored `lm_head.weight` (some exporters write the copy) is skipped, as transformers
/// skips it.
fn check_tensors(
    weights: &Weights,
    specs: impl Iterator<Item = TensorSpec>,
    tied: bool,
) -> Result<Vec<TensorSpec>, HfError> {
    let mut found = Vec::new();
    for spec in specs {
        let Some(located) = weights.tensors.get(&spec.hf_name) else {
            return Err(HfError::MissingTensor {
                file: weights.listing.clone(),
                tensor: spec.hf_name,
            });
        };
        let file = || weights.file_of(&spec.hf_name).to_path_buf();
        if located.info.shape != spec.hf_shape {
            return Err(HfError::ShapeMismatch {
                file: file(),
                tensor: spec.hf_name.clone(),
                expected: spec.hf_shape.clone(),
                found: located.info.shape.clone(),
            });
        }
        if WeightDtype::from_safetensors(located.info.dtype).is_none() {
            return Err(HfError::UnsupportedDtype {
                file: file(),
                tensor: spec.hf_name.clone(),
                dtype: format!("{:?}", located.info.dtype),
            });
        }
        found.push(spec);
    }
    let expected: std::collections::HashSet<&str> =
        found.iter().map(|spec| spec.hf_name.as_str()).collect();
    for name in weights.tensors.keys() {
        if is_derived_buffer(name) {
            log::debug!("skipping {name}: recomputed from the configuration");
        } else if tied && name == "lm_head.weight" {
            log::debug!("skipping {name}: the LM head is tied to the embedding");
        } else if !expected.contains(name.as_str()) {
            return Err(HfError::UnexpectedTensor {
                file: weights.file_of(name).to_path_buf(),
                tensor: name.clone(),
            });
        }
    }
    Ok(found)
}

/// A lazy snapshot that decodes, transposes and converts one stored tensor when applied. It
/// carries no parameter id: the model keeps its own (safetensors have none).
fn snapshot(weights: &Arc<Weights>, spec: TensorSpec, dtype: WeightDtype) -> PackTensor {
    let stored = WeightDtype::from_safetensors(weights.tensors[&spec.hf_name].info.dtype)
        .expect("dtypes are checked before snapshots are built");
    let mut burn_shape = spec.hf_shape.clone();
    if spec.transposed {
        burn_shape.reverse();
    }
    let name = spec.burn_path.clone();
    let weights = Arc::clone(weights);
    let read = move || {
        let data = decode(
            weights.bytes(&spec.hf_name),
            stored,
            &spec.hf_shape,
            spec.transposed,
        );
        Ok(data.convert_dtype(dtype.burn()))
    };
    bridge::deferred(name, dtype.burn(), burn_shape.into(), None, read)
}
