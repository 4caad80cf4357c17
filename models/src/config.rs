//! [`HlatConfig`]: the architecture of a LLaMA-family decoder (HLAT and today's Llama 3.x,
//! Mistral, Qwen2/2.5 and Qwen3 checkpoints), its presets and its derived sizes.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use crate::family::ModelFamily;
use crate::model::Hlat;
use crate::moe::MoeConfig;
use crate::rotary::{Llama3Scaling, RopeScaling};

/// Errors of configuration lookup, validation and (de)serialization.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The preset name is not one of [`HlatConfig::preset_names`].
    #[error("unknown preset `{name}` (known presets: {})", HlatConfig::preset_names().join(", "))]
    UnknownPreset {
        /// The name asked for.
        name: String,
    },
    /// A field has a value the model cannot be built with.
    #[error("invalid configuration: `{field}` = {value}: {reason}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// Its value, formatted.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// Reading or writing a configuration file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A configuration file is not valid JSON for [`HlatConfig`].
    #[error("{}: not an HLAT configuration: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
}

/// The architecture of a LLaMA-family decoder: HLAT (its presets), and the checkpoints of the
/// families in [`ModelFamily`], whose variations (RoPE scaling, tied embeddings, head width,
/// projection biases, per-head query/key norms, a sliding window) are fields here.
///
/// Serialized as our own JSON (`config.json` of a native checkpoint); fields added for the
/// families are left out while they keep HLAT's values, so HLAT configurations read and write as
/// before. Hugging Face configurations are read and written by [`crate::hf`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HlatConfig {
    /// Number of tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Number of decoder blocks.
    pub num_layers: usize,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Inner width of the SwiGLU feed-forward network.
    pub ffn_size: usize,
    /// Longest sequence (context) the model is used with.
    pub max_seq_len: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// Base of the rotary position embedding frequencies.
    pub rope_theta: f64,
    /// Standard deviation of the normal initialisation of every weight matrix (HLAT: 0.021).
    pub init_std: f64,
    /// Beginning-of-sequence token id.
    pub bos_token_id: u32,
    /// End-of-sequence token id (also the default stop id of generation).
    pub eos_token_id: u32,
    /// Padding token id, if the tokenizer has one.
    pub pad_token_id: Option<u32>,
    /// The checkpoint family: the `model_type` the model exports as (HLAT: `llama`).
    #[serde(default, skip_serializing_if = "ModelFamily::is_llama")]
    pub family: ModelFamily,
    /// Width of one attention head when it is not `hidden_size / num_heads` (Qwen3, Mistral
    /// NeMo); see [`HlatConfig::head_dim`].
    #[serde(default, rename = "head_dim", skip_serializing_if = "Option::is_none")]
    pub explicit_head_dim: Option<usize>,
    /// How the rotary frequencies are scaled for a longer context (transformers' `rope_type`).
    #[serde(default, skip_serializing_if = "RopeScaling::is_default")]
    pub rope_scaling: RopeScaling,
    /// Whether the LM head is the token embedding, transposed (one weight, both uses).
    #[serde(default, skip_serializing_if = "is_false")]
    pub tie_word_embeddings: bool,
    /// Biases on the query, key and value projections (Qwen2; Llama's and Qwen3's
    /// `attention_bias`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qkv_bias: bool,
    /// A bias on the attention output projection (Llama's and Qwen3's `attention_bias`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub o_proj_bias: bool,
    /// Biases on the feed-forward projections (Llama's `mlp_bias`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub mlp_bias: bool,
    /// An RMSNorm over each query and key head before the rotary embedding (Qwen3).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qk_norm: bool,
    /// Attention limited to the most recent positions (Mistral, Qwen with
    /// `use_sliding_window`); `None`: every earlier position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<SlidingWindow>,
    /// The mixture of experts of the sparse layers (Mixtral, Qwen2-MoE, Qwen3-MoE); `None`: every
    /// layer is dense.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeConfig>,
}

/// Sliding-window attention: a query sees the `size` positions ending at its own (transformers'
/// `sliding_window`), in the layers from `first_layer` on (Qwen's `max_window_layers`; 0 for
/// Mistral, whose every layer slides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlidingWindow {
    /// Positions a query sees, its own included.
    pub size: usize,
    /// The first layer that slides; the layers before it attend to every earlier position.
    pub first_layer: usize,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The largest value of a size field of [`HlatConfig`]: far beyond any trained model (HLAT-70B
/// has hidden 8192, FFN 28672, 80 layers), and small enough that every derived count (parameters,
/// FLOPs, elements of a weight) fits in 64 bits. Token ids are i32 on the device, so the
/// vocabulary has at most `i32::MAX` ids (the largest, `i32::MAX`, marks padding targets).
fn largest_size(field: &str) -> usize {
    match field {
        "vocab_size" => i32::MAX as usize,
        "num_layers" => 1 << 16,
        "max_seq_len" => 1 << 24,
        // hidden_size, num_heads, num_kv_heads, head_dim, ffn_size.
        _ => 1 << 22,
    }
}

/// The elements of a tensor of `shape`, saturating instead of overflowing (shapes read from a
/// corrupt file can be anything).
pub fn element_count(shape: &[usize]) -> u64 {
    shape
        .iter()
        .fold(1u64, |count, &size| count.saturating_mul(size as u64))
}

/// Names of the built-in presets, in the order [`HlatConfig::preset`] documents them.
const PRESET_NAMES: &[&str] = &[
    "hlat-7b",
    "hlat-70b",
    "hlat-tiny",
    "hlat-test",
    "bench-tiny",
    "llama-3.1-8b",
    "llama-3.2-1b",
    "mistral-7b",
    "qwen2.5-0.5b",
    "mixtral-8x7b",
    "qwen3-30b-a3b",
    "bench-tiny-moe",
];

/// The presets of published checkpoints' architectures (see [`HlatConfig::preset`]), as their
/// `config.json` files state them.
fn published_preset(name: &str) -> Option<HlatConfig> {
    let llama3 = |factor| {
        RopeScaling::Llama3(Llama3Scaling {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        })
    };
    let base = HlatConfig {
        init_std: 0.02,
        ..HlatConfig::hlat(128256, 4096, 32, (32, 8), 14336, 131072)
    };
    let config = match name {
        "llama-3.1-8b" => HlatConfig {
            rope_theta: 500000.0,
            rope_scaling: llama3(8.0),
            bos_token_id: 128000,
            eos_token_id: 128001,
            ..base
        },
        "llama-3.2-1b" => HlatConfig {
            hidden_size: 2048,
            num_layers: 16,
            explicit_head_dim: Some(64),
            ffn_size: 8192,
            rope_theta: 500000.0,
            rope_scaling: llama3(32.0),
            tie_word_embeddings: true,
            bos_token_id: 128000,
            eos_token_id: 128001,
            ..base
        },
        "mistral-7b" => HlatConfig {
            family: ModelFamily::Mistral,
            vocab_size: 32768,
            max_seq_len: 32768,
            rope_theta: 1e6,
            ..base
        },
        "qwen2.5-0.5b" => HlatConfig {
            family: ModelFamily::Qwen2,
            vocab_size: 151936,
            hidden_size: 896,
            num_layers: 24,
            num_heads: 14,
            num_kv_heads: 2,
            ffn_size: 4864,
            max_seq_len: 32768,
            rms_norm_eps: 1e-6,
            rope_theta: 1e6,
            tie_word_embeddings: true,
            qkv_bias: true,
            bos_token_id: 151643,
            eos_token_id: 151643,
            ..base
        },
        "mixtral-8x7b" => HlatConfig {
            family: ModelFamily::Mixtral,
            max_seq_len: 32768,
            vocab_size: 32000,
            rope_theta: 1e6,
            moe: Some(MoeConfig::routed(8, 2, 14336, 0.02)),
            ..base
        },
        // bench-tiny's sizes as a Mixtral: 8 experts of bench-tiny's FFN, 2 per token.
        "bench-tiny-moe" => HlatConfig {
            moe: Some(MoeConfig::routed(8, 2, 688, 0.02)),
            family: ModelFamily::Mixtral,
            init_std: 0.021,
            ..HlatConfig::hlat(32000, 256, 4, (4, 4), 688, 256)
        },
        "qwen3-30b-a3b" => HlatConfig {
            family: ModelFamily::Qwen3Moe,
            vocab_size: 151936,
            hidden_size: 2048,
            num_layers: 48,
            num_heads: 32,
            num_kv_heads: 4,
            explicit_head_dim: Some(128),
            ffn_size: 6144,
            max_seq_len: 40960,
            rms_norm_eps: 1e-6,
            rope_theta: 1e6,
            qk_norm: true,
            bos_token_id: 151643,
            eos_token_id: 151645,
            moe: Some(MoeConfig::routed(128, 8, 768, 0.001)),
            ..base
        },
        _ => return None,
    };
    Some(config)
}

impl HlatConfig {
    /// A built-in configuration:
    /// - `hlat-7b`: the HLAT paper's 7B model (32 layers, hidden 4096, 32 heads, FFN 11008,
    ///   vocab 32000, context 4096).
    /// - `hlat-70b`: 80 layers, hidden 8192, 64 heads / 8 KV heads, FFN 28672, context 4096.
    /// - `hlat-tiny`: the CPU default of `hlat pretrain` (vocab 512, hidden 128, 4 layers,
    ///   4 heads / 2 KV heads, FFN 352, context 256).
    /// - `hlat-test`: a very small model for unit tests (vocab 64, hidden 32, 2 layers,
    ///   4 heads / 2 KV heads, FFN 64, context 32).
    /// - `bench-tiny`: vocab 32000, hidden 256, 4 layers, 4 heads, FFN 688, context 256.
    ///
    /// and the architectures of published checkpoints (as their `config.json` describes them;
    /// import the weights with [`crate::hf::import_hf`]):
    /// - `llama-3.1-8b`: Llama 3.1 8B (vocab 128256, hidden 4096, 32 layers, 32 / 8 heads, FFN
    ///   14336, RoPE θ 500000 with `llama3` scaling ×8, context 131072).
    /// - `llama-3.2-1b`: Llama 3.2 1B (vocab 128256, hidden 2048, 16 layers, 32 / 8 heads of 64,
    ///   FFN 8192, tied embeddings, `llama3` scaling ×32, context 131072).
    /// - `mistral-7b`: Mistral 7B v0.3 (vocab 32768, hidden 4096, 32 layers, 32 / 8 heads, FFN
    ///   14336, RoPE θ 1e6, context 32768, no sliding window).
    /// - `qwen2.5-0.5b`: Qwen2.5 0.5B (vocab 151936, hidden 896, 24 layers, 14 / 2 heads, FFN
    ///   4864, q/k/v biases, tied embeddings, RoPE θ 1e6, context 32768).
    /// - `mixtral-8x7b`: Mixtral 8x7B (Mistral 7B's attention, every layer 8 experts of FFN
    ///   14336 with 2 per token, RoPE θ 1e6, context 32768; 46.7 B parameters, 12.9 B active).
    /// - `qwen3-30b-a3b`: Qwen3-30B-A3B (vocab 151936, hidden 2048, 48 layers, 32 / 4 heads of
    ///   128, q/k norms, 128 experts of FFN 768 with 8 per token renormalised, context 40960;
    ///   30.5 B parameters, 3.3 B active).
    /// - `bench-tiny-moe`: `bench-tiny` as a Mixtral (8 experts of FFN 688, 2 per token), the
    ///   benchmark of mixtures against transformers' own Mixtral module.
    pub fn preset(name: &str) -> Result<HlatConfig, ConfigError> {
        if let Some(config) = published_preset(name) {
            return Ok(config);
        }
        let (vocab, hidden, layers, heads, kv_heads, ffn, context) = match name {
            "hlat-7b" => (32000, 4096, 32, 32, 32, 11008, 4096),
            "hlat-70b" => (32000, 8192, 80, 64, 8, 28672, 4096),
            "hlat-tiny" => (512, 128, 4, 4, 2, 352, 256),
            "hlat-test" => (64, 32, 2, 4, 2, 64, 32),
            "bench-tiny" => (32000, 256, 4, 4, 4, 688, 256),
            _ => {
                return Err(ConfigError::UnknownPreset {
                    name: name.to_string(),
                });
            }
        };
        Ok(HlatConfig::hlat(
            vocab,
            hidden,
            layers,
            (heads, kv_heads),
            ffn,
            context,
        ))
    }

    /// An HLAT decoder of these sizes: untied, bias-free, default RoPE θ 1e4, RMSNorm ε 1e-5,
    /// weights normal(0, 0.021), BOS 1, EOS 2.
    fn hlat(
        vocab: usize,
        hidden: usize,
        layers: usize,
        (heads, kv_heads): (usize, usize),
        ffn: usize,
        context: usize,
    ) -> HlatConfig {
        HlatConfig {
            vocab_size: vocab,
            hidden_size: hidden,
            num_layers: layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            ffn_size: ffn,
            max_seq_len: context,
            rms_norm_eps: 1e-5,
            rope_theta: 1e4,
            init_std: 0.021,
            bos_token_id: 1,
            eos_token_id: 2,
            pad_token_id: None,
            family: ModelFamily::Llama,
            explicit_head_dim: None,
            rope_scaling: RopeScaling::Default,
            tie_word_embeddings: false,
            qkv_bias: false,
            o_proj_bias: false,
            mlp_bias: false,
            qk_norm: false,
            sliding_window: None,
            moe: None,
        }
    }

    /// The names [`HlatConfig::preset`] accepts.
    pub fn preset_names() -> &'static [&'static str] {
        PRESET_NAMES
    }

    /// Width of one attention head: the checkpoint's `head_dim` when it has one, else
    /// `hidden_size / num_heads`.
    pub fn head_dim(&self) -> usize {
        self.explicit_head_dim
            .unwrap_or(self.hidden_size / self.num_heads.max(1))
    }

    /// The sliding window of layer `layer`, if it slides.
    pub fn window_of_layer(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|window| layer >= window.first_layer)
            .map(|window| window.size)
    }

    /// Checks that a model can be built from this configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &'static str, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                field,
                value,
                reason: reason.to_string(),
            })
        };
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("ffn_size", self.ffn_size),
            ("max_seq_len", self.max_seq_len),
        ];
        for (field, value) in sizes {
            if value == 0 {
                return invalid(field, value.to_string(), "must be at least 1");
            }
            let largest = largest_size(field);
            if value > largest {
                return invalid(
                    field,
                    value.to_string(),
                    &format!("is above the largest supported value {largest}"),
                );
            }
        }
        match self.explicit_head_dim {
            None if !self.hidden_size.is_multiple_of(self.num_heads) => {
                return invalid(
                    "num_heads",
                    self.num_heads.to_string(),
                    &format!("does not divide hidden_size {}", self.hidden_size),
                );
            }
            Some(width) if width == 0 || width > largest_size("head_dim") => {
                return invalid(
                    "head_dim",
                    width.to_string(),
                    &format!(
                        "must be between 1 and {} (the width of one attention head)",
                        largest_size("head_dim")
                    ),
                );
            }
            _ => {}
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return invalid(
                "num_kv_heads",
                self.num_kv_heads.to_string(),
                &format!("does not divide num_heads {}", self.num_heads),
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            let (field, value) = match self.explicit_head_dim {
                Some(width) => ("head_dim", width),
                None => ("num_heads", self.num_heads),
            };
            return invalid(
                field,
                value.to_string(),
                &format!(
                    "gives an odd head width {} (rotary embeddings need an even one)",
                    self.head_dim()
                ),
            );
        }
        if let Some(window) = self.sliding_window
            && window.size == 0
        {
            return invalid("sliding_window", "0".into(), "must be at least 1");
        }
        if let Err((field, value, reason)) = self.rope_scaling.check() {
            return invalid(field, value, &reason);
        }
        if let Some(Err((field, value, reason))) =
            self.moe.as_ref().map(|moe| moe.check(self.num_layers))
        {
            return invalid(field, value, &reason);
        }
        if let Err((field, reason)) = self.family.check(self) {
            return invalid(field, self.family.to_string(), &reason);
        }
        let positives = [
            ("rms_norm_eps", self.rms_norm_eps),
            ("rope_theta", self.rope_theta),
            ("init_std", self.init_std),
        ];
        for (field, value) in positives {
            if !(value.is_finite() && value > 0.0) {
                return invalid(field, value.to_string(), "must be a finite positive number");
            }
        }
        let ids = [
            ("bos_token_id", Some(self.bos_token_id)),
            ("eos_token_id", Some(self.eos_token_id)),
            ("pad_token_id", self.pad_token_id),
        ];
        for (field, id) in ids {
            if let Some(id) = id
                && id as usize >= self.vocab_size
            {
                return invalid(
                    field,
                    id.to_string(),
                    &format!("is outside the vocabulary of {} tokens", self.vocab_size),
                );
            }
        }
        Ok(())
    }

    /// Builds a freshly initialised model (weights normal(0, `init_std`), norms one).
    ///
    /// # Panics
    ///
    /// If the configuration is invalid; use [`HlatConfig::try_init`] to get the error instead.
    pub fn init(&self, device: &Device) -> Hlat {
        match self.try_init(device) {
            Ok(model) => model,
            Err(error) => panic!("{error}"),
        }
    }

    /// Builds a freshly initialised model after validating the configuration.
    pub fn try_init(&self, device: &Device) -> Result<Hlat, ConfigError> {
        self.validate()?;
        Ok(Hlat::new(self.clone(), device))
    }

    /// Number of parameters, computed from the configuration without allocating: the elements
    /// of every weight [`crate::hf::tensor_specs`] lists (a tied LM head counted once). For
    /// HLAT: embeddings and LM head `2·V·H`, per layer `2·H² + 2·H·kv·d` (attention) `+ 3·H·F`
    /// (SwiGLU) `+ 2·H` (norms), plus the final norm `H`.
    pub fn num_params(&self) -> u64 {
        crate::hf::tensor_specs(self)
            .map(|spec| element_count(&spec.hf_shape))
            .fold(0u64, u64::saturating_add)
    }

    /// Parameters a token goes through: [`HlatConfig::num_params`] less, in each mixture-of-experts
    /// layer, the experts it is not routed to (`num_experts - experts_per_token` of them); a
    /// shared expert is always active. Equal to the total for a dense model.
    pub fn num_active_params(&self) -> u64 {
        let Some(moe) = &self.moe else {
            return self.num_params();
        };
        let expert = 3 * self.hidden_size as u64 * moe.expert_ffn_size as u64;
        let idle = (moe.num_experts - moe.experts_per_token) as u64 * expert;
        let sparse_layers = (0..self.num_layers)
            .filter(|&layer| moe.is_sparse(layer))
            .count() as u64;
        self.num_params()
            .saturating_sub(idle.saturating_mul(sparse_layers))
    }

    /// Training FLOPs per token for sequences of `seq_len` tokens (forward + backward), as in
    /// PaLM's MFU accounting (Chowdhery et al. 2022, appendix B):
    ///
    /// `6·N + 12·L·H·T`
    ///
    /// where `N` is the number of parameters that take part in matrix multiplications (all of
    /// [`HlatConfig::num_active_params`] except the input embedding table, which is a lookup: a
    /// mixture of experts counts the experts a token is routed to, as its model FLOPs), `L` the
    /// number of layers, `H` the width of the query heads (the hidden size, unless the checkpoint
    /// gives another head width) and `T = seq_len`; the second term counts the
    /// attention score and weighted-value products (`2·2·H·T` per layer forward, times 3 for
    /// forward + backward), without discounting the causal mask.
    pub fn train_flops_per_token(&self, seq_len: usize) -> f64 {
        // A tied embedding still takes part as the LM head.
        let lookup = if self.tie_word_embeddings {
            0
        } else {
            (self.vocab_size * self.hidden_size) as u64
        };
        let matmul_params = (self.num_active_params() - lookup) as f64;
        // The attention products span the query heads' width (the hidden size unless the
        // checkpoint gives a head width of its own).
        let width = (self.num_heads * self.head_dim()) as f64;
        let attention = 12.0 * self.num_layers as f64 * width * seq_len as f64;
        6.0 * matmul_params + attention
    }

    /// Reads a configuration written by [`HlatConfig::save`] and validates it.
    pub fn load(path: &Path) -> Result<HlatConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let config: HlatConfig =
            serde_json::from_str(&text).map_err(|source| ConfigError::Json {
                path: path.to_path_buf(),
                source,
            })?;
        config.validate()?;
        Ok(config)
    }

    /// Writes the configuration as pretty JSON ([`burn_trainium::write_atomically`]).
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let text = serde_json::to_string_pretty(self).map_err(|source| ConfigError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        burn_trainium::write_atomically(path, (text + "\n").as_bytes()).map_err(|source| {
            ConfigError::Io {
                path: path.to_path_buf(),
                source,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_of_the_paper_models() {
        assert_eq!(
            HlatConfig::preset("hlat-7b").unwrap().num_params(),
            6_738_415_616
        );
        assert_eq!(
            HlatConfig::preset("hlat-70b").unwrap().num_params(),
            68_976_648_192
        );
    }

    /// The counts transformers reports for the published checkpoints
    /// (`sum(p.numel() for p in model.parameters())`, a tied head counted once).
    #[test]
    fn parameter_counts_of_the_published_presets() {
        let counts = [
            ("llama-3.1-8b", 8_030_261_248),
            ("llama-3.2-1b", 1_235_814_400),
            ("mistral-7b", 7_248_023_552),
            ("qwen2.5-0.5b", 494_032_768),
            ("mixtral-8x7b", 46_702_792_704),
            ("qwen3-30b-a3b", 30_532_122_624),
        ];
        for (name, count) in counts {
            assert_eq!(
                HlatConfig::preset(name).unwrap().num_params(),
                count,
                "{name}"
            );
        }
    }

    /// transformers' totals less the experts a token is not routed to (its
    /// `named_parameters()` under `experts`, times `1 - k / E`), and dense models' totals.
    #[test]
    fn active_parameter_counts_of_the_mixtures() {
        let counts = [
            ("mixtral-8x7b", 12_879_925_248),
            ("qwen3-30b-a3b", 3_353_032_704),
            ("mistral-7b", 7_248_023_552),
        ];
        for (name, count) in counts {
            assert_eq!(
                HlatConfig::preset(name).unwrap().num_active_params(),
                count,
                "{name}"
            );
        }
    }

    #[test]
    fn every_preset_is_valid() {
        for name in HlatConfig::preset_names() {
            HlatConfig::preset(name).unwrap().validate().unwrap();
        }
        assert!(matches!(
            HlatConfig::preset("hlat-13b"),
            Err(ConfigError::UnknownPreset { .. })
        ));
    }

    #[test]
    fn validation_names_the_field() {
        let base = HlatConfig::preset("hlat-test").unwrap();
        type Mutation = fn(&mut HlatConfig);
        let cases: [(&str, Mutation); 9] = [
            ("num_heads", |c| c.num_heads = 5),
            ("hidden_size", |c| c.hidden_size = 1 << 40),
            ("vocab_size", |c| c.vocab_size = usize::MAX),
            ("num_layers", |c| c.num_layers = 1 << 20),
            ("max_seq_len", |c| c.max_seq_len = usize::MAX),
            ("num_kv_heads", |c| c.num_kv_heads = 3),
            ("ffn_size", |c| c.ffn_size = 0),
            ("rms_norm_eps", |c| c.rms_norm_eps = 0.0),
            ("eos_token_id", |c| c.eos_token_id = 64),
        ];
        for (field, mutate) in cases {
            let mut config = base.clone();
            mutate(&mut config);
            match config.validate() {
                Err(ConfigError::Invalid { field: found, .. }) => assert_eq!(found, field),
                other => panic!("{field}: expected an invalid-field error, got {other:?}"),
            }
        }
    }

    #[test]
    fn flops_follow_the_palm_formula() {
        let config = HlatConfig::preset("hlat-7b").unwrap();
        let n = 6_738_415_616.0 - 32000.0 * 4096.0;
        let expected = 6.0 * n + 12.0 * 32.0 * 4096.0 * 2048.0;
        assert_eq!(config.train_flops_per_token(2048), expected);
    }

    #[test]
    fn save_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let mut config = HlatConfig::preset("hlat-tiny").unwrap();
        config.pad_token_id = Some(0);
        config.save(&path).unwrap();
        assert_eq!(HlatConfig::load(&path).unwrap(), config);
    }
}
