//! Hugging Face `config.json` of the LLaMA family (`llama`, `mistral`, `qwen2`, `qwen3`) to and
//! from [`HlatConfig`].

use std::path::Path;

use serde_json::{Map, Value, json};

use super::dtype::WeightDtype;
use super::error::HfError;
use crate::config::{ConfigError, HlatConfig, SlidingWindow};
use crate::family::ModelFamily;
use crate::moe::MoeConfig;
use crate::rotary::{Llama3Scaling, RopeScaling, YarnScaling};

/// The `config.json` file name.
pub const CONFIG_FILE: &str = "config.json";

/// Reads `DIR/config.json` of a `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM` or
/// `Qwen3ForCausalLM` into an [`HlatConfig`].
///
/// Absent size keys take transformers' `LlamaConfig` defaults (published configurations state
/// them all); Qwen3's `head_dim` (128) and each family's sliding-window keys take the family's
/// own. RoPE theta and scaling are read as transformers 5 reads them: a non-null `rope_scaling`
/// first, then `rope_parameters`, then the top-level `rope_theta`. What the decoder does not implement (another
/// model type, `rope_type` `dynamic`, another activation, partial rotary embeddings, a sliding
/// window pattern other than "full, then sliding") is an error naming the file, field and value.
pub fn read_hf_config(dir: &Path) -> Result<HlatConfig, HfError> {
    read_hf_config_file(&dir.join(CONFIG_FILE))
}

/// [`read_hf_config`] for a `config.json` given by its own path.
pub fn read_hf_config_file(path: &Path) -> Result<HlatConfig, HfError> {
    let path = path.to_path_buf();
    let text = std::fs::read_to_string(&path).map_err(HfError::io(&path))?;
    let json: Value = serde_json::from_str(&text).map_err(|source| HfError::Json {
        path: path.clone(),
        source,
    })?;
    let fields = json.as_object().ok_or_else(|| HfError::UnsupportedConfig {
        path: path.clone(),
        field: "(root)".into(),
        value: short(&json),
        reason: "expected a JSON object".into(),
    })?;
    let reader = FieldReader {
        path: &path,
        fields,
    };
    let family = reader.family()?;
    reader.check_supported(family)?;

    let hidden_size = reader.usize("hidden_size", 4096)?;
    let num_heads = reader.usize("num_attention_heads", 32)?;
    let num_kv_heads = reader
        .optional_usize("num_key_value_heads")?
        .unwrap_or(num_heads);
    let num_layers = reader.usize("num_hidden_layers", 32)?;
    let max_seq_len = reader.usize("max_position_embeddings", 2048)?;
    // Qwen3's configuration class defaults to heads of 128; the others to hidden / heads.
    let head_dim = match (reader.optional_usize("head_dim")?, family) {
        (Some(width), _) => Some(width),
        (None, ModelFamily::Qwen3) => Some(128),
        (None, _) => None,
    };
    let explicit_head_dim = head_dim
        .filter(|&width| num_heads == 0 || width.checked_mul(num_heads) != Some(hidden_size));
    let attention_bias = reader.bool("attention_bias", false)?;
    let (qkv_bias, o_proj_bias) = match family {
        ModelFamily::Llama | ModelFamily::Qwen3 | ModelFamily::Qwen3Moe => {
            (attention_bias, attention_bias)
        }
        ModelFamily::Qwen2 => (true, false),
        // transformers 5 made Qwen2-MoE's query/key/value biases a setting (`qkv_bias`).
        ModelFamily::Qwen2Moe => (reader.bool("qkv_bias", true)?, false),
        ModelFamily::Mistral | ModelFamily::Mixtral => (false, false),
    };
    let ffn_size = reader.usize("intermediate_size", 11008)?;
    let (rope_theta, rope_scaling) = reader.rope(max_seq_len)?;
    let config = HlatConfig {
        vocab_size: reader.usize("vocab_size", 32000)?,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        ffn_size,
        max_seq_len,
        rms_norm_eps: reader.f64("rms_norm_eps", 1e-6)?,
        rope_theta,
        init_std: reader.f64("initializer_range", 0.02)?,
        bos_token_id: reader.token_id("bos_token_id")?.unwrap_or(1),
        eos_token_id: reader.token_id("eos_token_id")?.unwrap_or(2),
        pad_token_id: reader.token_id("pad_token_id")?,
        family,
        explicit_head_dim,
        rope_scaling,
        tie_word_embeddings: reader.bool("tie_word_embeddings", false)?,
        qkv_bias,
        o_proj_bias,
        mlp_bias: family == ModelFamily::Llama && reader.bool("mlp_bias", false)?,
        qk_norm: family.attention_family() == ModelFamily::Qwen3,
        sliding_window: reader.sliding_window(family, num_layers)?,
        moe: reader.moe(family, ffn_size)?,
    };
    config.validate().map_err(|source| HfError::InvalidConfig {
        path: path.clone(),
        file_field: match &source {
            ConfigError::Invalid { field, .. } => hf_field_name(field),
            _ => "(root)",
        },
        source,
    })?;
    Ok(config)
}

/// The `config.json` field a field of [`HlatConfig`] is read from.
fn hf_field_name(field: &'static str) -> &'static str {
    match field {
        "num_layers" => "num_hidden_layers",
        "num_heads" => "num_attention_heads",
        "num_kv_heads" => "num_key_value_heads",
        "ffn_size" => "intermediate_size",
        "max_seq_len" => "max_position_embeddings",
        "init_std" => "initializer_range",
        "qkv_bias" | "o_proj_bias" => "attention_bias",
        "num_experts" => "num_experts",
        "experts_per_token" => "num_experts_per_tok",
        "expert_ffn_size" => "moe_intermediate_size",
        "shared_expert_ffn_size" => "shared_expert_intermediate_size",
        "normalize_top_k" => "norm_topk_prob",
        "sparse_step" => "decoder_sparse_step",
        "dense_layers" => "mlp_only_layers",
        "factor"
        | "low_freq_factor"
        | "high_freq_factor"
        | "original_max_position_embeddings"
        | "beta_fast"
        | "beta_slow"
        | "attention_factor" => "rope_parameters",
        // vocab_size, hidden_size, rms_norm_eps, rope_theta and the token ids keep their names.
        same => same,
    }
}

/// The `config.json` transformers needs to load a model of `config` stored as `dtype`, with the
/// fields of the model's family ([`HlatConfig::family`]).
///
/// RoPE is written both as transformers 5 reads it (`rope_parameters`) and as older versions do
/// (top-level `rope_theta`, `rope_scaling`).
pub fn hf_config_json(config: &HlatConfig, dtype: WeightDtype) -> Value {
    let family = config.family;
    let mut rope_parameters =
        serde_json::to_value(config.rope_scaling).expect("RoPE scaling serializes to JSON");
    let rope_scaling = match config.rope_scaling {
        RopeScaling::Default => Value::Null,
        _ => rope_parameters.clone(),
    };
    rope_parameters["rope_theta"] = json!(config.rope_theta);
    let mut json = json!({
        "architectures": [family.architecture()],
        "model_type": family.model_type(),
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim(),
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.rms_norm_eps,
        "initializer_range": config.init_std,
        "rope_theta": config.rope_theta,
        "rope_parameters": rope_parameters,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "use_cache": true,
        "dtype": dtype.torch_name(),
        "torch_dtype": dtype.torch_name(),
    });
    let window = config.sliding_window;
    let family_fields = match family {
        ModelFamily::Llama => json!({
            "attention_bias": config.qkv_bias,
            "mlp_bias": config.mlp_bias,
            "pretraining_tp": 1,
        }),
        ModelFamily::Mistral | ModelFamily::Mixtral => {
            json!({"sliding_window": window.map(|window| window.size)})
        }
        ModelFamily::Qwen2 | ModelFamily::Qwen3 | ModelFamily::Qwen2Moe | ModelFamily::Qwen3Moe => {
            let mut fields = json!({
                "use_sliding_window": window.is_some(),
                "sliding_window": window.map(|window| window.size),
                // transformers' default where no layer slides.
                "max_window_layers": window.map_or(28, |window| window.first_layer),
                "layer_types": (0..config.num_layers)
                    .map(|layer| match config.window_of_layer(layer) {
                        Some(_) => "sliding_attention",
                        None => "full_attention",
                    })
                    .collect::<Vec<_>>(),
            });
            match family {
                ModelFamily::Qwen3 | ModelFamily::Qwen3Moe => {
                    fields["attention_bias"] = json!(config.qkv_bias);
                }
                ModelFamily::Qwen2Moe => {
                    fields["qkv_bias"] = json!(config.qkv_bias);
                    // Qwen2MoeConfig stores 0 when no layer slides.
                    fields["sliding_window"] = json!(window.map_or(0, |window| window.size));
                }
                _ => {}
            }
            fields
        }
    };
    let object = json.as_object_mut().expect("a JSON object");
    object.extend(family_fields.as_object().expect("a JSON object").clone());
    if let Some(moe) = &config.moe {
        object.extend(
            moe_fields(family, moe)
                .as_object()
                .expect("a JSON object")
                .clone(),
        );
    }
    if family == ModelFamily::Mixtral {
        // MixtralConfig keeps `head_dim` null unless a checkpoint gives one.
        object.insert("head_dim".into(), json!(config.explicit_head_dim));
    }
    json
}

/// The `config.json` fields of a mixture of experts, as the family's configuration class names
/// them.
fn moe_fields(family: ModelFamily, moe: &MoeConfig) -> Value {
    let mut fields = json!({
        "num_experts_per_tok": moe.experts_per_token,
        "router_aux_loss_coef": moe.router_aux_loss_coef,
        "output_router_logits": false,
    });
    let extra = match family {
        ModelFamily::Mixtral => json!({
            "num_local_experts": moe.num_experts,
            "intermediate_size": moe.expert_ffn_size,
            "router_jitter_noise": 0.0,
        }),
        _ => {
            let mut extra = json!({
                "num_experts": moe.num_experts,
                "moe_intermediate_size": moe.expert_ffn_size,
                "norm_topk_prob": moe.normalize_top_k,
                "decoder_sparse_step": moe.sparse_step,
                "mlp_only_layers": moe.dense_layers,
            });
            if let Some(width) = moe.shared_expert_ffn_size {
                extra["shared_expert_intermediate_size"] = json!(width);
            }
            if family == ModelFamily::Qwen3Moe {
                // transformers 5 saves Qwen3-MoE's count under this name; published files use
                // `num_experts`, which it maps to it.
                extra["num_local_experts"] = json!(moe.num_experts);
            }
            extra
        }
    };
    fields
        .as_object_mut()
        .expect("a JSON object")
        .extend(extra.as_object().expect("a JSON object").clone());
    fields
}

/// The `generation_config.json` matching [`hf_config_json`].
pub fn hf_generation_config_json(config: &HlatConfig) -> Value {
    json!({
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    })
}

/// Typed access to the fields of one `config.json`, with errors naming file and field.
struct FieldReader<'a> {
    path: &'a Path,
    fields: &'a Map<String, Value>,
}

impl FieldReader<'_> {
    fn get(&self, field: &str) -> Option<&Value> {
        self.fields.get(field).filter(|value| !value.is_null())
    }

    fn unsupported(&self, field: &str, reason: String) -> HfError {
        HfError::UnsupportedConfig {
            path: self.path.to_path_buf(),
            field: field.to_string(),
            value: self.get(field).map_or("null".into(), short),
            reason,
        }
    }

    /// The family of `model_type` (absent: `llama`, as older Llama files).
    fn family(&self) -> Result<ModelFamily, HfError> {
        match self.get("model_type") {
            None => Ok(ModelFamily::Llama),
            Some(Value::String(name)) => name
                .parse()
                .map_err(|known| self.unsupported("model_type", known)),
            Some(_) => Err(self.invalid_type("model_type", "a string")),
        }
    }

    /// Rejects the features of the families' configurations the decoder does not implement.
    fn check_supported(&self, family: ModelFamily) -> Result<(), HfError> {
        if let Some(act) = self.get("hidden_act")
            && act != "silu"
        {
            return Err(self.unsupported("hidden_act", "the decoder uses SwiGLU (`silu`)".into()));
        }
        if let Some(factor) = self.get("partial_rotary_factor")
            && factor.as_f64() != Some(1.0)
        {
            return Err(self.unsupported(
                "partial_rotary_factor",
                "rotary embeddings cover whole heads".into(),
            ));
        }
        for field in ["num_experts", "num_local_experts"] {
            if !family.is_mixture()
                && self
                    .get(field)
                    .is_some_and(|count| count.as_u64() != Some(0))
            {
                return Err(self.unsupported(
                    field,
                    format!(
                        "a `{family}` model is dense; mixtures of experts are read as `mixtral`, \
                         `qwen2_moe` or `qwen3_moe`"
                    ),
                ));
            }
        }
        // Routers of other kinds (DeepSeek's sigmoid scores, grouped top-k) are other models.
        for (field, expected) in [("scoring_func", "softmax"), ("topk_method", "greedy")] {
            if let Some(value) = self.get(field)
                && value.as_str() != Some(expected)
            {
                return Err(self.unsupported(
                    field,
                    format!("the router takes a softmax and a plain top-k (`{expected}`)"),
                ));
            }
        }
        if let Some(noise) = self.get("router_jitter_noise")
            && noise.as_f64() != Some(0.0)
        {
            return Err(self.unsupported(
                "router_jitter_noise",
                "the router takes its inputs as they are (0.0)".into(),
            ));
        }
        Ok(())
    }

    /// The mixture of experts of a `mixtral`, `qwen2_moe` or `qwen3_moe` configuration (each
    /// absent key takes the family's configuration class default); `None` for a dense family.
    /// `ffn_size` is `intermediate_size`: Mixtral's experts' width.
    fn moe(&self, family: ModelFamily, ffn_size: usize) -> Result<Option<MoeConfig>, HfError> {
        let (experts, per_token, width, normalize, shared) = match family {
            ModelFamily::Mixtral => (8, 2, ffn_size, true, None),
            ModelFamily::Qwen2Moe => (60, 4, 1408, false, Some(5632)),
            ModelFamily::Qwen3Moe => (128, 8, 768, false, None),
            _ => return Ok(None),
        };
        // transformers 5 saves Qwen3-MoE's count as `num_local_experts`, older versions and the
        // published files as `num_experts`.
        let experts = match (
            self.optional_usize("num_experts")?,
            self.optional_usize("num_local_experts")?,
        ) {
            (Some(count), _) | (None, Some(count)) => count,
            (None, None) => experts,
        };
        let dense_layers = match self.get("mlp_only_layers") {
            None => Vec::new(),
            Some(Value::Array(layers)) => layers
                .iter()
                .map(|layer| layer.as_u64().map(|layer| layer as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.invalid_type("mlp_only_layers", "a list of layer indices"))?,
            Some(_) => return Err(self.invalid_type("mlp_only_layers", "a list")),
        };
        let mixtral = family == ModelFamily::Mixtral;
        Ok(Some(MoeConfig {
            num_experts: experts,
            experts_per_token: self.usize("num_experts_per_tok", per_token)?,
            expert_ffn_size: if mixtral {
                width
            } else {
                self.usize("moe_intermediate_size", width)?
            },
            normalize_top_k: mixtral || self.bool("norm_topk_prob", normalize)?,
            shared_expert_ffn_size: match shared {
                Some(width) => Some(self.usize("shared_expert_intermediate_size", width)?),
                None => None,
            },
            sparse_step: if mixtral {
                1
            } else {
                self.usize("decoder_sparse_step", 1)?
            },
            dense_layers,
            router_aux_loss_coef: self.f64("router_aux_loss_coef", 0.001)?,
        }))
    }

    /// RoPE theta and scaling, from `rope_parameters` (transformers 5) or the top-level
    /// `rope_theta` and `rope_scaling` (older files). `context` is `max_position_embeddings`,
    /// YaRN's pretrained context when it names none.
    fn rope(&self, context: usize) -> Result<(f64, RopeScaling), HfError> {
        // transformers 5 takes a non-null `rope_scaling` over `rope_parameters` (a YaRN block
        // added to a saved configuration, as Qwen documents), and reads theta from either.
        let object = |field: &'static str| match self.get(field) {
            None => Ok(None),
            Some(Value::Object(parameters)) => Ok(Some((field, parameters))),
            Some(_) => Err(self.invalid_type(field, "an object")),
        };
        let scaling = object("rope_scaling")?;
        let saved = object("rope_parameters")?;
        let (field, parameters) = match scaling.or(saved) {
            Some((field, parameters)) => (field, Some(parameters)),
            None => ("rope_parameters", None),
        };
        let nested = |name: &str| {
            parameters
                .and_then(|parameters| parameters.get(name))
                .filter(|value| !value.is_null())
        };
        let theta = match nested("rope_theta").or_else(|| {
            saved
                .and_then(|(_, parameters)| parameters.get("rope_theta"))
                .filter(|value| !value.is_null())
        }) {
            Some(theta) => theta.as_f64().ok_or_else(|| {
                self.nested_error(field, "rope_theta", theta, "expected a number")
            })?,
            None => self.f64("rope_theta", 10000.0)?,
        };
        let number = |name: &str, default: Option<f64>| {
            self.nested_value(
                field,
                name,
                nested(name),
                default,
                Value::as_f64,
                "a number",
            )
        };
        let optional = |name: &str| nested(name).map(|_| number(name, None)).transpose();
        let whole = |name: &str, default: Option<usize>| {
            let integer = |value: &Value| value.as_u64().map(|v| v as usize);
            let expected = "a non-negative integer";
            self.nested_value(field, name, nested(name), default, integer, expected)
        };
        let rope_type = nested("rope_type").or_else(|| nested("type"));
        let scaling = match rope_type.map(|value| (value, value.as_str())) {
            None | Some((_, Some("default"))) => RopeScaling::Default,
            Some((_, Some("linear"))) => RopeScaling::Linear {
                factor: number("factor", None)?,
            },
            Some((_, Some("llama3"))) => RopeScaling::Llama3(Llama3Scaling {
                factor: number("factor", None)?,
                low_freq_factor: number("low_freq_factor", None)?,
                high_freq_factor: number("high_freq_factor", None)?,
                original_max_position_embeddings: whole("original_max_position_embeddings", None)?,
            }),
            Some((_, Some("yarn"))) => RopeScaling::Yarn(YarnScaling {
                factor: number("factor", None)?,
                original_max_position_embeddings: whole(
                    "original_max_position_embeddings",
                    Some(context),
                )?,
                beta_fast: number("beta_fast", Some(32.0))?,
                beta_slow: number("beta_slow", Some(1.0))?,
                attention_factor: optional("attention_factor")?,
                mscale: optional("mscale")?,
                mscale_all_dim: optional("mscale_all_dim")?,
                truncate: self.nested_value(
                    field,
                    "truncate",
                    nested("truncate"),
                    Some(true),
                    Value::as_bool,
                    "true or false",
                )?,
            }),
            Some((value, _)) => {
                return Err(self.nested_error(
                    field,
                    "rope_type",
                    value,
                    "supported RoPE types are default, linear, llama3 and yarn",
                ));
            }
        };
        Ok((theta, scaling))
    }

    /// The sliding window: Mistral's `sliding_window` (every layer; transformers' default 4096
    /// when the key is absent, none when it is null), Qwen's when `use_sliding_window` is true
    /// (from layer `max_window_layers` on, or as `layer_types` lists). Llama has none.
    fn sliding_window(
        &self,
        family: ModelFamily,
        layers: usize,
    ) -> Result<Option<SlidingWindow>, HfError> {
        if family == ModelFamily::Qwen2Moe && self.bool("use_sliding_window", false)? {
            return Err(self.unsupported(
                "use_sliding_window",
                "Qwen2-MoE's windows (every other layer below `max_window_layers`) are not \
                 supported"
                    .into(),
            ));
        }
        let slides = match family {
            ModelFamily::Llama => false,
            ModelFamily::Mistral | ModelFamily::Mixtral => true,
            ModelFamily::Qwen2
            | ModelFamily::Qwen3
            | ModelFamily::Qwen2Moe
            | ModelFamily::Qwen3Moe => self.bool("use_sliding_window", false)?,
        };
        // A null window is none (every layer attends fully), an absent one transformers' default
        // (Mistral's 4096, Mixtral's none).
        let size = match self.fields.get("sliding_window") {
            _ if !slides => None,
            None if family == ModelFamily::Mixtral => None,
            None => Some(4096),
            Some(_) => self.optional_usize("sliding_window")?,
        };
        let Some(size) = size else {
            return Ok(None);
        };
        let first_layer = match family {
            ModelFamily::Mistral | ModelFamily::Mixtral => 0,
            _ => self.usize("max_window_layers", 28)?,
        };
        let first_layer = match self.get("layer_types") {
            None => first_layer,
            Some(Value::Array(types)) => {
                let sliding: Vec<bool> = types
                    .iter()
                    .map(|kind| kind == "sliding_attention")
                    .collect();
                let first = sliding.iter().position(|&slides| slides).unwrap_or(layers);
                let known = types
                    .iter()
                    .all(|kind| kind == "sliding_attention" || kind == "full_attention");
                if !known || types.len() != layers || sliding[first..].contains(&false) {
                    return Err(self.unsupported(
                        "layer_types",
                        format!(
                            "expected {layers} entries, `full_attention` layers then \
                             `sliding_attention` ones"
                        ),
                    ));
                }
                first
            }
            Some(_) => return Err(self.invalid_type("layer_types", "a list")),
        };
        Ok((first_layer < layers).then_some(SlidingWindow { size, first_layer }))
    }

    /// The field `name` of the object `field`, whose value is `value`: read by `convert`, or
    /// `default` when absent; an error naming `field.name` when it is absent without a default
    /// or is not `expected`.
    fn nested_value<T>(
        &self,
        field: &str,
        name: &str,
        value: Option<&Value>,
        default: Option<T>,
        convert: impl Fn(&Value) -> Option<T>,
        expected: &str,
    ) -> Result<T, HfError> {
        match (value, default) {
            (Some(value), _) => convert(value).ok_or_else(|| {
                self.nested_error(field, name, value, &format!("expected {expected}"))
            }),
            (None, Some(default)) => Ok(default),
            (None, None) => {
                Err(self.nested_error(field, name, &Value::Null, "this RoPE type needs it"))
            }
        }
    }

    /// An error about `name` inside the object `field` (`rope_parameters.rope_type`).
    fn nested_error(&self, field: &str, name: &str, value: &Value, reason: &str) -> HfError {
        HfError::UnsupportedConfig {
            path: self.path.to_path_buf(),
            field: format!("{field}.{name}"),
            value: short(value),
            reason: reason.to_string(),
        }
    }

    fn bool(&self, field: &str, default: bool) -> Result<bool, HfError> {
        self.get(field)
            .map(|value| {
                value
                    .as_bool()
                    .ok_or_else(|| self.invalid_type(field, "true or false"))
            })
            .unwrap_or(Ok(default))
    }

    fn invalid_type(&self, field: &str, expected: &str) -> HfError {
        self.unsupported(field, format!("expected {expected}"))
    }

    fn optional_usize(&self, field: &str) -> Result<Option<usize>, HfError> {
        self.get(field)
            .map(|value| {
                value
                    .as_u64()
                    .map(|v| v as usize)
                    .ok_or_else(|| self.invalid_type(field, "a non-negative integer"))
            })
            .transpose()
    }

    fn usize(&self, field: &str, default: usize) -> Result<usize, HfError> {
        Ok(self.optional_usize(field)?.unwrap_or(default))
    }

    fn f64(&self, field: &str, default: f64) -> Result<f64, HfError> {
        self.get(field)
            .map(|value| {
                value
                    .as_f64()
                    .ok_or_else(|| self.invalid_type(field, "a number"))
            })
            .unwrap_or(Ok(default))
    }

    /// A token id; a list (several EOS ids) keeps its first entry.
    fn token_id(&self, field: &str) -> Result<Option<u32>, HfError> {
        let Some(value) = self.get(field) else {
            return Ok(None);
        };
        let id = match value {
            Value::Array(ids) => {
                log::warn!(
                    "{}: `{field}` lists {} ids; HLAT keeps the first",
                    self.path.display(),
                    ids.len()
                );
                ids.first().and_then(Value::as_u64)
            }
            other => other.as_u64(),
        };
        id.map(|id| Some(id as u32))
            .ok_or_else(|| self.invalid_type(field, "a token id"))
    }
}

/// A JSON value formatted for an error message.
fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(120) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
