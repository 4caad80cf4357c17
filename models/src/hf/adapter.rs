//! PEFT LoRA adapter folders: `adapter_config.json` + `adapter_model.safetensors`, as
//! `PeftModel.save_pretrained` writes them and `PeftModel.from_pretrained` reads them.
//!
//! The tensors are named as PEFT names them for a `…ForCausalLM` base, without the adapter's
//! name: `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` (`[r, in]`) and
//! `….lora_B.weight` (`[out, r]`), torch's `[out, in]` layout (transposed from Burn's). The
//! configuration keeps PEFT's keys (`peft_type`, `r`, `lora_alpha`, `lora_dropout`,
//! `target_modules`, `target_parameters`, `use_rslora`, …); what this crate cannot apply (DoRA,
//! biases, per-module ranks, layer selection, `modules_to_save`, a regex `target_modules`, other
//! PEFT types) is refused by name.
//!
//! A mixture of experts is adapted as PEFT adapts transformers 5's fused experts
//! (`target_parameters` `experts.gate_up_proj` and `experts.down_proj`, PEFT's `ParamWrapper`):
//! per layer and parameter one `lora_A` `[r·E, in]`, whose rows `e·r ..` are expert `e`'s, and
//! one `lora_B` `[out, r·E]`, whose columns `k·E + e` are expert `e`'s (`gate_up_proj`'s
//! outputs are the gate's, then the up projection's). Two adapted parameters of one module nest:
//! `gate_up_proj`'s tensors are under `mlp.experts.base_layer`, `down_proj`'s under
//! `mlp.experts`; one alone is under `mlp.experts`.

use std::collections::BTreeMap;
use std::path::Path;

use burn::tensor::{DType, Device, Tensor, TensorData};
use safetensors::SafeTensors;
use serde_json::{Value, json};

use super::dtype::{WeightDtype, decode, encode};
use super::error::HfError;
use super::export::{write_json, write_safetensors_with};
use crate::lora::{ExpertAdapters, GateUpLora, LayerAdapters, Lora, LoraConfig, LoraTarget};
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
    let mut targets = targets;
    targets.extend(expert_targets(field("target_parameters")).ok_or_else(|| {
        unsupported(
            "target_parameters",
            field("target_parameters"),
            "the adaptable parameters are a mixture's experts.gate_up_proj and experts.down_proj",
        )
    })?);
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

/// The targets PEFT's `target_parameters` (`null` or a list) name: `gate_up_proj` the gate and up
/// projections, `down_proj` the down projection, of a mixture's experts (PEFT matches an entry
/// as a suffix of the parameter's name: `gate_up_proj`, `experts.gate_up_proj`,
/// `mlp.experts.gate_up_proj`); `None` for anything else.
fn expert_targets(value: &Value) -> Option<Vec<LoraTarget>> {
    let entries = match value {
        Value::Null => return Some(Vec::new()),
        Value::Array(entries) => entries,
        _ => return None,
    };
    let mut targets = Vec::new();
    for entry in entries {
        let mut names = entry.as_str()?.rsplit('.');
        let parameter = names.next()?;
        let rest: Vec<&str> = names.collect();
        if !matches!(rest.as_slice(), [] | ["experts"] | ["experts", "mlp"]) {
            return None;
        }
        match parameter {
            "gate_up_proj" => targets.extend([LoraTarget::Gate, LoraTarget::Up]),
            "down_proj" => targets.push(LoraTarget::Down),
            _ => return None,
        }
    }
    Some(targets)
}

/// The `adapter_config.json` PEFT writes for `config` on the base model `base_model`; for a
/// `mixture` of experts, the MLP targets are the experts' parameters (`target_parameters`).
pub fn adapter_config_json(config: &LoraConfig, base_model: Option<&str>, mixture: bool) -> Value {
    let targets: Vec<&str> = config
        .projection_targets(mixture)
        .map(|t| t.module_name())
        .collect();
    let mut parameters = Vec::new();
    if mixture && config.adapts_expert_gate_up() {
        parameters.push(ExpertParameter::GateUp.target());
    }
    if mixture && config.adapts_expert_down() {
        parameters.push(ExpertParameter::Down.target());
    }
    let mut config_json = json!({
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
    });
    if !parameters.is_empty() {
        config_json["target_parameters"] = json!(parameters);
    }
    config_json
}

/// A fused expert parameter PEFT adapts (`target_parameters`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExpertParameter {
    /// `experts.gate_up_proj` `[E, 2·ffn, hidden]`: the gate's outputs, then the up projection's.
    GateUp,
    /// `experts.down_proj` `[E, hidden, ffn]`.
    Down,
}

impl ExpertParameter {
    /// Its `target_parameters` entry.
    fn target(self) -> &'static str {
        match self {
            Self::GateUp => "experts.gate_up_proj",
            Self::Down => "experts.down_proj",
        }
    }

    /// The parameters `config` adapts, in the module's order (PEFT wraps them in that order).
    fn adapted(config: &LoraConfig) -> Vec<Self> {
        let mut adapted = Vec::new();
        if config.adapts_expert_gate_up() {
            adapted.push(Self::GateUp);
        }
        if config.adapts_expert_down() {
            adapted.push(Self::Down);
        }
        adapted
    }

    /// PEFT's name of `factor` (`lora_A`, `lora_B`) of this parameter's adapter in `layer`, when
    /// `adapted` are the module's adapted parameters: the first of two is wrapped innermost.
    fn tensor_name(self, layer: usize, adapted: &[Self], factor: &str) -> String {
        let module = if adapted.len() == 2 && self == adapted[0] {
            "experts.base_layer"
        } else {
            "experts"
        };
        format!("base_model.model.model.layers.{layer}.mlp.{module}.{factor}.weight")
    }

    /// The `[in, out]` of one expert's adapted projection: `hidden`, and the expert's `ffn`.
    fn shape(self, hidden: usize, ffn: usize) -> (usize, usize) {
        match self {
            Self::GateUp => (hidden, 2 * ffn),
            Self::Down => (ffn, hidden),
        }
    }
}

/// The adapters of a PEFT folder for `model` (the base the adapter applies to), in `dtype`, with
/// their configuration. Every tensor is checked (names, shapes, dtypes) before any is used.
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
    let model_config = model.config();
    let mixture = model_config.moe.as_ref();
    let adapted = ExpertParameter::adapted(&config);
    let rank = config.rank;
    let mut expected = BTreeMap::new();
    for (layer, decoder_layer) in model.layers.iter().enumerate() {
        for target in config.projection_targets(mixture.is_some()) {
            let (d_input, d_output) = shapes[&target];
            let a = peft_tensor_name(layer, target, "lora_A");
            let b = peft_tensor_name(layer, target, "lora_B");
            expected.insert(a, vec![rank, d_input]);
            expected.insert(b, vec![d_output, rank]);
        }
        let (Some(moe), Some(_)) = (mixture, &decoder_layer.moe) else {
            continue;
        };
        let experts = moe.num_experts;
        for &parameter in &adapted {
            let (d_input, d_output) =
                parameter.shape(model_config.hidden_size, moe.expert_ffn_size);
            let a = parameter.tensor_name(layer, &adapted, "lora_A");
            let b = parameter.tensor_name(layer, &adapted, "lora_B");
            expected.insert(a, vec![rank * experts, d_input]);
            expected.insert(b, vec![d_output, rank * experts]);
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
    let read = |name: &str| -> Result<Tensor<2>, HfError> {
        let shape = &expected[name];
        let view = stored.tensor(name).map_err(|_| HfError::MissingTensor {
            file: file.clone(),
            tensor: name.to_string(),
        })?;
        if view.shape() != shape.as_slice() {
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
        let mut layer_adapters = LayerAdapters::default();
        for target in config.projection_targets(mixture.is_some()) {
            let a = read(&peft_tensor_name(layer, target, "lora_A"))?;
            let b = read(&peft_tensor_name(layer, target, "lora_B"))?;
            layer_adapters
                .projections
                .push((target, Lora::from_tensors(a, b, &config)));
        }
        if let (Some(moe), Some(_)) = (mixture, &decoder_layer.moe) {
            let mut experts = vec![ExpertAdapters::default(); moe.num_experts];
            for &parameter in &adapted {
                let a = read(&parameter.tensor_name(layer, &adapted, "lora_A"))?;
                let b = read(&parameter.tensor_name(layer, &adapted, "lora_B"))?;
                for (expert, (a, b)) in experts.iter_mut().zip(per_expert(a, b, rank)) {
                    match parameter {
                        ExpertParameter::GateUp => {
                            let ffn = moe.expert_ffn_size;
                            let halves = (b.clone().narrow(1, 0, ffn), b.narrow(1, ffn, ffn));
                            expert.gate_up = Some(GateUpLora::from_tensors(a, halves, &config));
                        }
                        ExpertParameter::Down => {
                            expert.down = Some(Lora::from_tensors(a, b, &config));
                        }
                    }
                }
            }
            layer_adapters.experts = experts;
        }
        adapters.push(layer_adapters);
    }
    Ok((config, adapters))
}

/// Each expert's `A` `[in, r]` and `B` `[r, out]` from PEFT's fused factors, as read in Burn's
/// layout: `A` `[in, r·E]` (PEFT's `lora_A` `[r·E, in]` transposed: columns `e·r ..` are expert
/// `e`'s) and `B` `[r·E, out]` (PEFT's `lora_B` transposed: rows `k·E + e`).
fn per_expert(a: Tensor<2>, b: Tensor<2>, rank: usize) -> Vec<(Tensor<2>, Tensor<2>)> {
    let [rows, out] = b.dims();
    let experts = rows / rank;
    let b = b.reshape([rank, experts, out]);
    (0..experts)
        .map(|expert| {
            let a = a.clone().narrow(1, expert * rank, rank);
            let b = b.clone().narrow(1, expert, 1).reshape([rank, out]);
            (a, b)
        })
        .collect()
}

/// PEFT's fused factors in Burn's layout, `A` `[in, r·E]` and `B` `[r·E, out]`, from each expert's
/// `A` `[in, r]` and `B` `[r, out]`: the inverse of [`per_expert`].
fn fused(experts: Vec<(Tensor<2>, Tensor<2>)>) -> (Tensor<2>, Tensor<2>) {
    let (a, b): (Vec<_>, Vec<_>) = experts
        .into_iter()
        .map(|(a, b)| (a, b.unsqueeze_dim::<3>(1)))
        .unzip();
    let b = Tensor::cat(b, 1);
    let [rank, experts, out] = b.dims();
    (Tensor::cat(a, 1), b.reshape([rank * experts, out]))
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
    let mixture = model.config().moe.is_some();
    let adapted = ExpertParameter::adapted(config);
    let mut tensors: Vec<(String, TensorData)> = Vec::new();
    for (index, layer) in model.layers.iter().enumerate() {
        let missing = |tensor: String| HfError::MissingTensor {
            file: dir.to_path_buf(),
            tensor,
        };
        for target in config.projection_targets(mixture) {
            let lora = layer
                .lora(target)
                .ok_or_else(|| missing(peft_tensor_name(index, target, "lora_A")))?;
            tensors.push((
                peft_tensor_name(index, target, "lora_A"),
                lora.lora_a.val().into_data(),
            ));
            tensors.push((
                peft_tensor_name(index, target, "lora_B"),
                lora.lora_b.val().into_data(),
            ));
        }
        if layer.moe.is_none() {
            continue;
        }
        for &parameter in &adapted {
            let name = |factor| parameter.tensor_name(index, &adapted, factor);
            let experts = layer
                .experts()
                .iter()
                .map(|expert| match parameter {
                    ExpertParameter::GateUp => expert.gate_up_lora.as_ref().map(|lora| {
                        let b = Tensor::cat(vec![lora.lora_b_gate.val(), lora.lora_b_up.val()], 1);
                        (lora.lora_a.val(), b)
                    }),
                    ExpertParameter::Down => expert
                        .down_lora
                        .as_ref()
                        .map(|lora| (lora.lora_a.val(), lora.lora_b.val())),
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| missing(name("lora_A")))?;
            let (a, b) = fused(experts);
            tensors.push((name("lora_A"), a.into_data()));
            tensors.push((name("lora_B"), b.into_data()));
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
        &adapter_config_json(config, base_model, mixture),
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
