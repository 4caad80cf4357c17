//! Export of a model as a Hugging Face folder of its family (`LlamaForCausalLM`, ...).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use burn_store::burn_pack::Tensor as PackTensor;
use burn_store::{ModuleSnapshot, bridge};
use safetensors::tensor::{Metadata, TensorInfo};
use serde_json::json;
use tokenizers::Tokenizer;

use super::config::{CONFIG_FILE, hf_config_json, hf_generation_config_json};
use super::dtype::{WeightDtype, encode};
use super::error::HfError;
use super::names::{TensorSpec, tensor_specs};
use super::reader::{INDEX_FILE, WEIGHTS_FILE};
use super::tokenizer::save_tokenizer;
use crate::model::Hlat;
use crate::staging::Staging;

/// transformers' default shard limit, "5GB".
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 5_000_000_000;

/// Options of [`export_hf`].
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOptions {
    /// Element type of the written weights.
    pub dtype: WeightDtype,
    /// Shard limit in bytes: past it, weights are split into `model-0000i-of-0000n.safetensors`
    /// files listed by `model.safetensors.index.json` (a tensor larger than the limit gets a
    /// shard of its own).
    pub max_shard_size: u64,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            dtype: WeightDtype::F32,
            max_shard_size: DEFAULT_MAX_SHARD_SIZE,
        }
    }
}

/// Writes `model` to the new folder `dir` in the layout of `save_pretrained`: `config.json`,
/// `generation_config.json`, safetensors weights (sharded past `options.max_shard_size`) and,
/// when given, `tokenizer.json`.
///
/// The folder is filled under a temporary name and renamed at the end, so a failure leaves
/// nothing behind; an existing `dir` is an error.
pub fn export_hf(
    model: &Hlat,
    dir: &Path,
    options: &ExportOptions,
    tokenizer: Option<&Tokenizer>,
) -> Result<(), HfError> {
    if dir.exists() {
        return Err(HfError::OutputExists {
            path: dir.to_path_buf(),
        });
    }
    let config = model.config();
    let staging = Staging::new(dir).map_err(HfError::io(dir))?;
    let mut snapshots: HashMap<String, PackTensor> = model
        .collect(None, None, false)
        .into_iter()
        .map(|snapshot| (snapshot.name.clone(), snapshot))
        .collect();
    let element_size = options.dtype.size_bytes() as u64;
    let tensors: Vec<(TensorSpec, PackTensor)> = tensor_specs(config)
        .map(|spec| {
            let snapshot = snapshots
                .remove(&spec.burn_path)
                .ok_or_else(|| HfError::Load {
                    file: dir.to_path_buf(),
                    tensor: spec.burn_path.clone(),
                    message: "the model has no such parameter".into(),
                })?;
            Ok((spec, snapshot))
        })
        .collect::<Result<_, HfError>>()?;
    let shards = plan_shards(tensors, element_size, options.max_shard_size);

    let count = shards.len();
    let mut weight_map = BTreeMap::new();
    for (number, shard) in shards.into_iter().enumerate() {
        let file_name = if count == 1 {
            WEIGHTS_FILE.to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", number + 1)
        };
        for (spec, _) in &shard {
            weight_map.insert(spec.hf_name.clone(), file_name.clone());
        }
        write_safetensors(&staging.path().join(&file_name), &shard, options.dtype)?;
    }
    if count > 1 {
        let total_size = config.num_params() * element_size;
        let index = json!({"metadata": {"total_size": total_size}, "weight_map": weight_map});
        write_json(&staging.path().join(INDEX_FILE), &index)?;
    }
    write_json(
        &staging.path().join(CONFIG_FILE),
        &hf_config_json(config, options.dtype),
    )?;
    write_json(
        &staging.path().join("generation_config.json"),
        &hf_generation_config_json(config),
    )?;
    if let Some(tokenizer) = tokenizer {
        save_tokenizer(tokenizer, staging.path())?;
    }
    staging.commit(false).map_err(HfError::io(dir))?;
    log::info!("exported {} shard(s) to {}", count, dir.display());
    Ok(())
}

/// Splits the tensors, in order, into shards of at most `limit` bytes.
fn plan_shards(
    tensors: Vec<(TensorSpec, PackTensor)>,
    element_size: u64,
    limit: u64,
) -> Vec<Vec<(TensorSpec, PackTensor)>> {
    let mut shards: Vec<Vec<(TensorSpec, PackTensor)>> = vec![Vec::new()];
    let mut current_size = 0;
    for (spec, snapshot) in tensors {
        let size = spec.hf_shape.iter().product::<usize>() as u64 * element_size;
        let current = shards.last_mut().expect("at least one shard");
        if !current.is_empty() && current_size + size > limit {
            shards.push(Vec::new());
            current_size = 0;
        }
        current_size += size;
        shards
            .last_mut()
            .expect("at least one shard")
            .push((spec, snapshot));
    }
    shards
}

/// Writes one safetensors file, materialising one tensor at a time.
fn write_safetensors(
    path: &Path,
    tensors: &[(TensorSpec, PackTensor)],
    dtype: WeightDtype,
) -> Result<(), HfError> {
    let entries: Vec<(String, Vec<usize>)> = tensors
        .iter()
        .map(|(spec, _)| (spec.hf_name.clone(), spec.hf_shape.clone()))
        .collect();
    write_safetensors_with(path, &entries, dtype, |index| {
        let (spec, snapshot) = &tensors[index];
        let data = bridge::to_data(snapshot).map_err(|error| HfError::Load {
            file: path.to_path_buf(),
            tensor: spec.burn_path.clone(),
            message: error.to_string(),
        })?;
        let (bytes, shape) = encode(data, dtype, spec.transposed);
        if shape != spec.hf_shape {
            return Err(HfError::ShapeMismatch {
                file: path.to_path_buf(),
                tensor: spec.hf_name.clone(),
                expected: spec.hf_shape.clone(),
                found: shape,
            });
        }
        Ok(bytes)
    })
}

/// Writes one safetensors file (declaring the torch format, as transformers requires) of
/// `tensors` (name and stored shape, in order) in `dtype`, asking `bytes` for each tensor's data
/// as it is written: one tensor at a time is in memory. `bytes` may fail with its caller's own
/// error type, which the writer's errors convert into.
pub(crate) fn write_safetensors_with<E: From<HfError>>(
    path: &Path,
    tensors: &[(String, Vec<usize>)],
    dtype: WeightDtype,
    mut bytes: impl FnMut(usize) -> Result<Vec<u8>, E>,
) -> Result<(), E> {
    let element_size = dtype.size_bytes();
    let mut offset = 0;
    let infos = tensors
        .iter()
        .map(|(name, shape)| {
            let size = shape.iter().product::<usize>() * element_size;
            let info = TensorInfo {
                dtype: dtype.safetensors(),
                shape: shape.clone(),
                data_offsets: (offset, offset + size),
            };
            offset += size;
            (name.clone(), info)
        })
        .collect();
    let format = HashMap::from([("format".to_string(), "pt".to_string())]);
    let corrupt = |reason: String| HfError::CorruptSafetensors {
        file: path.to_path_buf(),
        reason,
    };
    let metadata = Metadata::new(Some(format), infos).map_err(|e| corrupt(e.to_string()))?;
    let mut header = serde_json::to_vec(&metadata).map_err(|e| corrupt(e.to_string()))?;
    header.resize(header.len().next_multiple_of(8), b' ');

    let mut out = BufWriter::new(File::create(path).map_err(HfError::io(path))?);
    out.write_all(&(header.len() as u64).to_le_bytes())
        .and_then(|()| out.write_all(&header))
        .map_err(HfError::io(path))?;
    for (index, (name, shape)) in tensors.iter().enumerate() {
        let data = bytes(index)?;
        let expected = shape.iter().product::<usize>() * element_size;
        if data.len() != expected {
            return Err(corrupt(format!(
                "tensor `{name}` has {} bytes, its shape {shape:?} needs {expected}",
                data.len()
            ))
            .into());
        }
        out.write_all(&data).map_err(HfError::io(path))?;
    }
    Ok(out.flush().map_err(HfError::io(path))?)
}

/// Writes pretty JSON.
pub(crate) fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), HfError> {
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    std::fs::write(path, text + "\n").map_err(HfError::io(path))
}
