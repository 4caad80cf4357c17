//! Hugging Face `LlamaConfig` (`config.json`) to and from [`HlatConfig`].

use std::path::Path;

use serde_json::{Map, Value, json};

use super::dtype::WeightDtype;
use super::error::HfError;
use crate::config::{ConfigError, HlatConfig};

/// The `config.json` file name.
pub const CONFIG_FILE: &str = "config.json";

/// Reads `DIR/config.json` of a `LlamaForCausalLM` into an [`HlatConfig`].
///
/// Absent keys take transformers' `LlamaConfig` defaults. RoPE theta is read from the top-level
/// `rope_theta` or from transformers 5's `rope_parameters`. Configurations HLAT does not implement
/// (RoPE scaling, attention or MLP biases, tied embeddings, another activation or head width) are
/// errors naming the field.
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
    reader.check_supported()?;

    let hidden_size = reader.usize("hidden_size", 4096)?;
    let num_heads = reader.usize("num_attention_heads", 32)?;
    let num_kv_heads = reader
        .optional_usize("num_key_value_heads")?
        .unwrap_or(num_heads);
    if let Some(head_dim) = reader.optional_usize("head_dim")?
        && num_heads > 0
        && head_dim.checked_mul(num_heads) != Some(hidden_size)
    {
        return Err(reader.unsupported(
            "head_dim",
            format!("HLAT heads are hidden_size / num_attention_heads = {hidden_size} / {num_heads} wide"),
        ));
    }
    let config = HlatConfig {
        vocab_size: reader.usize("vocab_size", 32000)?,
        hidden_size,
        num_layers: reader.usize("num_hidden_layers", 32)?,
        num_heads,
        num_kv_heads,
        ffn_size: reader.usize("intermediate_size", 11008)?,
        max_seq_len: reader.usize("max_position_embeddings", 2048)?,
        rms_norm_eps: reader.f64("rms_norm_eps", 1e-6)?,
        rope_theta: reader.rope_theta()?,
        init_std: reader.f64("initializer_range", 0.02)?,
        bos_token_id: reader.token_id("bos_token_id")?.unwrap_or(1),
        eos_token_id: reader.token_id("eos_token_id")?.unwrap_or(2),
        pad_token_id: reader.token_id("pad_token_id")?,
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
        // vocab_size, hidden_size, rms_norm_eps, rope_theta and the token ids keep their names.
        same => same,
    }
}

/// The `config.json` transformers needs to load a model of `config` stored as `dtype`.
///
/// RoPE theta is written both at the top level (transformers 4) and under `rope_parameters`
/// (transformers 5).
pub fn hf_config_json(config: &HlatConfig, dtype: WeightDtype) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "mlp_bias": false,
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
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
        "rope_scaling": null,
        "tie_word_embeddings": false,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "pretraining_tp": 1,
        "use_cache": true,
        "dtype": dtype.torch_name(),
        "torch_dtype": dtype.torch_name(),
    })
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

    /// Rejects the features of `LlamaConfig` HLAT does not implement.
    fn check_supported(&self) -> Result<(), HfError> {
        if let Some(model_type) = self.get("model_type")
            && model_type != "llama"
        {
            return Err(self.unsupported("model_type", "only `llama` models are supported".into()));
        }
        if self.get("rope_scaling").is_some() {
            return Err(self.unsupported(
                "rope_scaling",
                "RoPE scaling is not implemented (only the default rotary embedding)".into(),
            ));
        }
        if let Some(parameters) = self.get("rope_parameters") {
            let rope_type = parameters.get("rope_type").and_then(Value::as_str);
            if !matches!(rope_type, None | Some("default")) {
                return Err(self.unsupported(
                    "rope_parameters",
                    "only `rope_type` \"default\" is implemented".into(),
                ));
            }
        }
        for field in ["attention_bias", "mlp_bias", "tie_word_embeddings"] {
            if self.get(field).is_some_and(|value| value != false) {
                let reason = match field {
                    "tie_word_embeddings" => "HLAT has an untied LM head",
                    _ => "HLAT projections have no bias",
                };
                return Err(self.unsupported(field, reason.into()));
            }
        }
        if let Some(act) = self.get("hidden_act")
            && act != "silu"
        {
            return Err(self.unsupported("hidden_act", "HLAT uses SwiGLU (`silu`)".into()));
        }
        Ok(())
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

    fn rope_theta(&self) -> Result<f64, HfError> {
        let nested = self
            .get("rope_parameters")
            .and_then(|parameters| parameters.get("rope_theta"));
        match nested {
            Some(theta) => theta
                .as_f64()
                .ok_or_else(|| self.invalid_type("rope_parameters", "a numeric `rope_theta`")),
            None => self.f64("rope_theta", 10000.0),
        }
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
