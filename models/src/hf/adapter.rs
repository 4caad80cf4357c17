//! PEFT LoRA adapter folders: `adapter_config.json` + `adapter_model.safetensors`, as
//! `PeftModel.save_pretrained` writes them and `PeftModel.from_pretrained` reads them.
//!
//! The tensors are named as PEFT names them for a `…ForCausalLM` base, without the adapter's
//! name: `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` (`[r, in]`) and
//! `….lora_B.weight` (`[out, r]`), torch's `[out, in]` layout (transposed from Burn's). The
//! configuration keeps PEFT's keys (`peft_type`, `r`, `lora_alpha`, `lora_dropout`,
//! `target_modules`, `use_rslora`, …); what this crate cannot apply (DoRA, biases, per-module
//! ranks, layer selection, `modules_to_save`, a regex `target_modules`, other PEFT types) is
//! refused by name.

use std::collections::BTreeMap;
use std::path::Path;

use burn::tensor::{DType, Device, Tensor, TensorData};
use safetensors::SafeTensors;
use serde_json::{Value, json};

use super::dtype::{WeightDtype, decode, encode};
use super::error::HfError;
use super::export::{write_json, write_safetensors_with};
use crate::lora::{LayerAdapters, Lora, LoraConfig, LoraTarget};
use crate::model::Hlat;
use crate::staging::Staging;

/// The adapter's configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// PEFT's name of a factor (`lora_A` or `lora_B`) of the adapter on `target` in layer `layer`.
pub fn peft_tensor_name(layer: usize, target: LoraTarget, factor: &str) -> String {
    format!(
        "base_model.model.model.layers.{layer}.{}.{factor}.weight",
        target.layer_path()
    )
}

/// Whether `dir` holds a PEFT adapter (its configuration file).
pub fn is_adapter(dir: &Path) -> bool {
    dir.join(ADAPTER_CONFIG_FILE).is_file()
}

/// Reads `DIR/adapter_config.json` as a [`LoraConfig`], refusing what cannot be applied.
pub fn read_adapter_config(dir: &Path) -> Result<LoraConfig, HfError> {
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(HfError::io(&path))?;
    let value: Value = serde_json::from_str(&text).map_err(|source| HfError::Json {
        path: path.clone(),
        source,
    })?;
    adapter_config_from_json(&value, &path)
}

fn adapter_config_from_json(value: &Value, path: &Path) -> Result<LoraConfig, HfError> {
    let unsupported = |field: &str, value: &Value, reason: &str| HfError::UnsupportedConfig {
        path: path.to_path_buf(),
        field: field.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let field = |name: &str| value.get(name).unwrap_or(&Value::Null);
    let peft_type = field("peft_type");
    if peft_type.as_str() != Some("LORA") {
        return Err(unsupported(
            "peft_type",
            peft_type,
            "only LoRA adapters are supported",
        ));
    }
    let rank = field("r")
        .as_u64()
        .filter(|&r| r > 0)
        .ok_or_else(|| unsupported("r", field("r"), "the rank must be a positive integer"))?;
    let alpha = field("lora_alpha")
        .as_f64()
        .ok_or_else(|| unsupported("lora_alpha", field("lora_alpha"), "must be a number"))?;
    let dropout = field("lora_dropout").as_f64().unwrap_or(0.0);
    let targets = match field("target_modules") {
        Value::Array(names) => names
            .iter()
            .map(|name| {
                name.as_str()
                    .and_then(|name| name.parse::<LoraTarget>().ok())
                    .ok_or_else(|| {
                        unsupported(
                            "target_modules",
                            name,
                            "targets are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, \
                             down_proj",
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?,
        other => {
            return Err(unsupported(
                "target_modules",
                other,
                "must be a list of module names (a regular expression is not supported)",
            ));
        }
    };
    let flag = |name: &str| field(name).as_bool().unwrap_or(false);
    if flag("use_dora") {
        return Err(unsupported(
            "use_dora",
            field("use_dora"),
            "DoRA is not supported",
        ));
    }
    if flag("fan_in_fan_out") {
        return Err(unsupported(
            "fan_in_fan_out",
            field("fan_in_fan_out"),
            "the projections are torch Linear layers",
        ));
    }
    let bias = field("bias");
    if !(bias.is_null() || bias.as_str() == Some("none")) {
        return Err(unsupported(
            "bias",
            bias,
            "adapters with biases are not supported",
        ));
    }
    for name in [
        "modules_to_save",
        "layers_to_transform",
        "layers_pattern",
        "rank_pattern",
        "alpha_pattern",
    ] {
        let value = field(name);
        let empty = match value {
            Value::Null => true,
            Value::Array(items) => items.is_empty(),
            Value::Object(items) => items.is_empty(),
            _ => false,
        };
        if !empty {
            return Err(unsupported(
                name,
                value,
                "every layer's targets must share one rank and alpha, with no extra modules",
            ));
        }
    }
    let mut targets = targets;
    targets.sort();
    targets.dedup();
    let config = LoraConfig {
        rank: rank as usize,
        alpha,
        dropout,
        targets,
        rslora: flag("use_rslora"),
    };
    config
        .validate()
        .map_err(|reason| unsupported("r", field("r"), &reason))?;
    Ok(config)
}

/// The `adapter_config.json` PEFT writes for `config` on the base model `base_model`.
pub fn adapter_config_json(config: &LoraConfig, base_model: Option<&str>) -> Value {
    let targets: Vec<&str> = config.targets.iter().map(|t| t.module_name()).collect();
    json!({
        "alpha_pattern": {},
        "auto_mapping": null,
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "layers_pattern": null,
        "layers_to_transform": null,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "modules_to_save": null,
        "peft_type": "LORA",
        "r": config.rank,
        "rank_pattern": {},
        "revision": null,
        "target_modules": targets,
        "task_type": "CAUSAL_LM",
        "use_dora": false,
        "use_rslora": config.rslora,
    })
}

/// The adapters of a PEFT folder for a model of `num_layers` layers, projections sized by
/// `model` (the base the adapter applies to), in `dtype`, with their configuration. Every
/// tensor is checked (names, shapes, dtypes) before any is used.
pub fn read_adapter(
    model: &Hlat,
    dir: &Path,
    dtype: DType,
    device: &Device,
) -> Result<(LoraConfig, Vec<LayerAdapters>), HfError> {
    let config = read_adapter_config(dir)?;
    let file = dir.join(ADAPTER_WEIGHTS_FILE);
    let bytes = std::fs::read(&file).map_err(HfError::io(&file))?;
    let stored = SafeTensors::deserialize(&bytes).map_err(|error| HfError::CorruptSafetensors {
        file: file.clone(),
        reason: error.to_string(),
    })?;
    let shapes = projection_shapes(model);
    let mut expected = BTreeMap::new();
    for (layer, decoder_layer) in model.layers.iter().enumerate() {
        for &target in config
            .targets
            .iter()
            .filter(|&&t| decoder_layer.has_projection(t))
        {
            let (d_input, d_output) = shapes[&target];
            let a = peft_tensor_name(layer, target, "lora_A");
            let b = peft_tensor_name(layer, target, "lora_B");
            expected.insert(a, vec![config.rank, d_input]);
            expected.insert(b, vec![d_output, config.rank]);
        }
    }
    for name in stored.names() {
        if !expected.contains_key(name) {
            return Err(HfError::UnexpectedTensor {
                file: file.clone(),
                tensor: name.to_string(),
            });
        }
    }
    let read = |name: &str, shape: &[usize]| -> Result<Tensor<2>, HfError> {
        let view = stored.tensor(name).map_err(|_| HfError::MissingTensor {
            file: file.clone(),
            tensor: name.to_string(),
        })?;
        if view.shape() != shape {
            return Err(HfError::ShapeMismatch {
                file: file.clone(),
                tensor: name.to_string(),
                expected: shape.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        let stored_dtype = WeightDtype::from_safetensors(view.dtype()).ok_or_else(|| {
            HfError::UnsupportedDtype {
                file: file.clone(),
                tensor: name.to_string(),
                dtype: format!("{:?}", view.dtype()),
            }
        })?;
        let data: TensorData = decode(view.data(), stored_dtype, shape, true).convert_dtype(dtype);
        Ok(Tensor::from_data(data, device))
    };
    let mut adapters = Vec::with_capacity(model.layers.len());
    for (layer, decoder_layer) in model.layers.iter().enumerate() {
        let mut layer_adapters = Vec::new();
        for &target in config
            .targets
            .iter()
            .filter(|&&t| decoder_layer.has_projection(t))
        {
            let a_name = peft_tensor_name(layer, target, "lora_A");
            let b_name = peft_tensor_name(layer, target, "lora_B");
            let a = read(&a_name, &expected[&a_name])?;
            let b = read(&b_name, &expected[&b_name])?;
            layer_adapters.push((target, Lora::from_tensors(a, b, &config)));
        }
        adapters.push(layer_adapters);
    }
    Ok((config, adapters))
}

/// `model` (frozen) with the PEFT adapter of `dir` attached, in the dtype of the model's
/// weights; returns the adapter's configuration too.
pub fn load_adapter(
    model: Hlat,
    dir: &Path,
    device: &Device,
) -> Result<(LoraConfig, Hlat), HfError> {
    let dtype = model.embed_tokens.weight.val().dtype();
    let (config, adapters) = read_adapter(&model, dir, dtype, device)?;
    log::info!(
        "adapter {}: rank {}, alpha {}, targets {}",
        dir.display(),
        config.rank,
        config.alpha,
        config
            .targets
            .iter()
            .map(|t| t.module_name())
            .collect::<Vec<_>>()
            .join(",")
    );
    Ok((config, model.with_adapters(adapters)))
}

/// Writes the adapters of `model` (whole, not split by tensor-parallel rank) to the new or
/// existing folder `dir` in PEFT's layout, `dtype` elements, with `config`'s
/// `adapter_config.json`. The folder is filled under a temporary name and renamed at the end.
pub fn save_adapter(
    model: &Hlat,
    config: &LoraConfig,
    base_model: Option<&str>,
    dtype: WeightDtype,
    dir: &Path,
) -> Result<(), HfError> {
    let staging = Staging::new(dir).map_err(HfError::io(dir))?;
    let mut tensors: Vec<(String, TensorData)> = Vec::new();
    for (index, layer) in model.layers.iter().enumerate() {
        for &target in config.targets.iter().filter(|&&t| layer.has_projection(t)) {
            let lora = layer.lora(target).ok_or_else(|| HfError::MissingTensor {
                file: dir.to_path_buf(),
                tensor: peft_tensor_name(index, target, "lora_A"),
            })?;
            tensors.push((
                peft_tensor_name(index, target, "lora_A"),
                lora.lora_a.val().into_data(),
            ));
            tensors.push((
                peft_tensor_name(index, target, "lora_B"),
                lora.lora_b.val().into_data(),
            ));
        }
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let encoded: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .into_iter()
        .map(|(name, data)| {
            let (bytes, shape) = encode(data, dtype, true);
            (name, bytes, shape)
        })
        .collect();
    let listing: Vec<(String, Vec<usize>)> = encoded
        .iter()
        .map(|(name, _, shape)| (name.clone(), shape.clone()))
        .collect();
    let weights = staging.path().join(ADAPTER_WEIGHTS_FILE);
    write_safetensors_with::<HfError>(&weights, &listing, dtype, |index| {
        Ok(encoded[index].1.clone())
    })?;
    write_json(
        &staging.path().join(ADAPTER_CONFIG_FILE),
        &adapter_config_json(config, base_model),
    )?;
    staging.commit(true).map_err(HfError::io(dir))
}

/// The `[in, out]` sizes of each adaptable projection of `model`'s configuration.
fn projection_shapes(model: &Hlat) -> BTreeMap<LoraTarget, (usize, usize)> {
    let config = model.config();
    let head_dim = config.head_dim();
    let hidden = config.hidden_size;
    let q = config.num_heads * head_dim;
    let kv = config.num_kv_heads * head_dim;
    let ffn = config.ffn_size;
    BTreeMap::from([
        (LoraTarget::Q, (hidden, q)),
        (LoraTarget::K, (hidden, kv)),
        (LoraTarget::V, (hidden, kv)),
        (LoraTarget::O, (q, hidden)),
        (LoraTarget::Gate, (hidden, ffn)),
        (LoraTarget::Up, (hidden, ffn)),
        (LoraTarget::Down, (ffn, hidden)),
    ])
}
