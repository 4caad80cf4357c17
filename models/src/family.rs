//! [`ModelFamily`]: the Hugging Face model types the decoder imports and exports.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::config::HlatConfig;

/// A LLaMA-family checkpoint type (transformers' `model_type`). The families share one decoder;
/// each fixes which of [`HlatConfig`]'s variations its `config.json` can express.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelFamily {
    /// `LlamaForCausalLM`: Llama 2 and 3.x, HLAT, TinyLlama, SmolLM. Biases on every attention
    /// projection (`attention_bias`) or every MLP projection (`mlp_bias`).
    #[default]
    Llama,
    /// `MistralForCausalLM`: bias-free, with an optional sliding window on every layer.
    Mistral,
    /// `Qwen2ForCausalLM` (Qwen2 and Qwen2.5): biases on the query, key and value projections.
    Qwen2,
    /// `Qwen3ForCausalLM`: per-head RMSNorm on queries and keys, an explicit head width.
    Qwen3,
    /// `MixtralForCausalLM`: Mistral's attention, every layer a mixture of experts whose chosen
    /// probabilities are renormalised.
    Mixtral,
    /// `Qwen2MoeForCausalLM` (Qwen1.5-MoE, Qwen2-MoE): Qwen2's attention, mixtures with a shared
    /// expert behind a sigmoid gate, dense layers where `mlp_only_layers` or
    /// `decoder_sparse_step` say.
    Qwen2Moe,
    /// `Qwen3MoeForCausalLM` (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention and mixtures.
    Qwen3Moe,
}

impl ModelFamily {
    /// Every family, in the order the README lists them.
    pub const ALL: [ModelFamily; 7] = [
        ModelFamily::Llama,
        ModelFamily::Mistral,
        ModelFamily::Qwen2,
        ModelFamily::Qwen3,
        ModelFamily::Mixtral,
        ModelFamily::Qwen2Moe,
        ModelFamily::Qwen3Moe,
    ];

    /// transformers' `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            ModelFamily::Llama => "llama",
            ModelFamily::Mistral => "mistral",
            ModelFamily::Qwen2 => "qwen2",
            ModelFamily::Qwen3 => "qwen3",
            ModelFamily::Mixtral => "mixtral",
            ModelFamily::Qwen2Moe => "qwen2_moe",
            ModelFamily::Qwen3Moe => "qwen3_moe",
        }
    }

    /// transformers' class of the causal language model (`architectures` in `config.json`).
    pub fn architecture(self) -> &'static str {
        match self {
            ModelFamily::Llama => "LlamaForCausalLM",
            ModelFamily::Mistral => "MistralForCausalLM",
            ModelFamily::Qwen2 => "Qwen2ForCausalLM",
            ModelFamily::Qwen3 => "Qwen3ForCausalLM",
            ModelFamily::Mixtral => "MixtralForCausalLM",
            ModelFamily::Qwen2Moe => "Qwen2MoeForCausalLM",
            ModelFamily::Qwen3Moe => "Qwen3MoeForCausalLM",
        }
    }

    /// The dense family whose attention and norms this family shares (itself when dense).
    pub fn attention_family(self) -> ModelFamily {
        match self {
            ModelFamily::Mixtral => ModelFamily::Mistral,
            ModelFamily::Qwen2Moe => ModelFamily::Qwen2,
            ModelFamily::Qwen3Moe => ModelFamily::Qwen3,
            dense => dense,
        }
    }

    /// Whether the family's models are mixtures of experts.
    pub fn is_mixture(self) -> bool {
        self.attention_family() != self
    }

    /// Whether this is [`ModelFamily::Llama`] (the default, left out of native configurations).
    pub fn is_llama(&self) -> bool {
        *self == ModelFamily::Llama
    }

    /// Checks that the family's `config.json` can express `config`: `Err((field, reason))`
    /// names the first field it cannot.
    pub(crate) fn check(self, config: &HlatConfig) -> Result<(), (&'static str, String)> {
        let refuse = |field: &'static str, what: &str| {
            Err((field, format!("a {self} model cannot have {what}")))
        };
        match (&config.moe, self.is_mixture()) {
            (None, true) => return refuse("moe", "dense layers only (it is a mixture of experts)"),
            (Some(_), false) => return refuse("moe", "a mixture of experts"),
            (Some(moe), true) => {
                if self != ModelFamily::Qwen2Moe && moe.shared_expert_ffn_size.is_some() {
                    return refuse("shared_expert_ffn_size", "a shared expert");
                }
                if self == ModelFamily::Qwen2Moe && moe.shared_expert_ffn_size.is_none() {
                    return refuse("shared_expert_ffn_size", "mixtures without a shared expert");
                }
                if self == ModelFamily::Mixtral && !moe.normalize_top_k {
                    return refuse("normalize_top_k", "unnormalised routing weights");
                }
                if self == ModelFamily::Mixtral
                    && (moe.sparse_step != 1 || !moe.dense_layers.is_empty())
                {
                    return refuse("dense_layers", "dense layers");
                }
            }
            (None, false) => {}
        }
        if config.mlp_bias && self.is_mixture() {
            return refuse("mlp_bias", "MLP biases");
        }
        let family = self.attention_family();
        let refuse = |field: &'static str, what: &str| {
            Err((field, format!("a {self} model cannot have {what}")))
        };
        let biased_attention = config.qkv_bias || config.o_proj_bias;
        match family {
            ModelFamily::Llama | ModelFamily::Qwen3 if config.qkv_bias != config.o_proj_bias => {
                refuse(
                    "qkv_bias",
                    "biases on some attention projections only (`attention_bias` covers q, k, v and o)",
                )
            }
            ModelFamily::Llama if config.qk_norm => refuse("qk_norm", "query/key norms"),
            ModelFamily::Llama if config.sliding_window.is_some() => {
                refuse("sliding_window", "a sliding window")
            }
            ModelFamily::Mistral if biased_attention || config.mlp_bias => {
                refuse("qkv_bias", "projection biases")
            }
            ModelFamily::Mistral if config.qk_norm => refuse("qk_norm", "query/key norms"),
            ModelFamily::Mistral
                if config
                    .sliding_window
                    .is_some_and(|window| window.first_layer != 0) =>
            {
                refuse(
                    "sliding_window",
                    "full-attention layers before its sliding ones",
                )
            }
            ModelFamily::Qwen2
                if (!config.qkv_bias && self == ModelFamily::Qwen2) || config.o_proj_bias =>
            {
                refuse(
                    "qkv_bias",
                    "other biases than on the query, key and value projections",
                )
            }
            ModelFamily::Qwen2 | ModelFamily::Qwen3 if config.mlp_bias => {
                refuse("mlp_bias", "MLP biases")
            }
            ModelFamily::Qwen2 if config.qk_norm => refuse("qk_norm", "query/key norms"),
            ModelFamily::Qwen3 if !config.qk_norm => {
                refuse("qk_norm", "queries and keys without their norms")
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for ModelFamily {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.model_type())
    }
}

impl FromStr for ModelFamily {
    type Err = String;

    /// Parses transformers' `model_type`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ModelFamily::ALL
            .into_iter()
            .find(|family| family.model_type() == text)
            .ok_or_else(|| {
                let known: Vec<_> = ModelFamily::ALL.iter().map(|f| f.model_type()).collect();
                format!("expected one of {}", known.join(", "))
            })
    }
}
