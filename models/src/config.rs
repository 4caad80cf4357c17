//! [`HlatConfig`]: the architecture of an HLAT model, its presets and its derived sizes.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::model::Hlat;

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

/// The architecture of an HLAT (LLaMA-style) decoder.
///
/// Serialized as our own JSON (`config.json` of a native checkpoint); Hugging Face configurations
/// are read and written by [`crate::hf`].
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
        // hidden_size, num_heads, num_kv_heads, ffn_size.
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
];

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
    pub fn preset(name: &str) -> Result<HlatConfig, ConfigError> {
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
        Ok(HlatConfig {
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
        })
    }

    /// The names [`HlatConfig::preset`] accepts.
    pub fn preset_names() -> &'static [&'static str] {
        PRESET_NAMES
    }

    /// Width of one attention head (`hidden_size / num_heads`).
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
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
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            return invalid(
                "num_heads",
                self.num_heads.to_string(),
                &format!("does not divide hidden_size {}", self.hidden_size),
            );
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return invalid(
                "num_kv_heads",
                self.num_kv_heads.to_string(),
                &format!("does not divide num_heads {}", self.num_heads),
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            return invalid(
                "num_heads",
                self.num_heads.to_string(),
                &format!(
                    "gives an odd head width {} (rotary embeddings need an even one)",
                    self.head_dim()
                ),
            );
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
    pub fn init<B: Backend>(&self, device: &B::Device) -> Hlat<B> {
        match self.try_init(device) {
            Ok(model) => model,
            Err(error) => panic!("{error}"),
        }
    }

    /// Builds a freshly initialised model after validating the configuration.
    pub fn try_init<B: Backend>(&self, device: &B::Device) -> Result<Hlat<B>, ConfigError> {
        self.validate()?;
        Ok(Hlat::new(self.clone(), device))
    }

    /// Number of parameters, computed from the configuration without allocating:
    /// embeddings and LM head `2·V·H`, per layer `2·H² + 2·H·kv·d` (attention) `+ 3·H·F` (SwiGLU)
    /// `+ 2·H` (norms), plus the final norm `H`.
    pub fn num_params(&self) -> u64 {
        let hidden = self.hidden_size as u64;
        let kv_width = (self.num_kv_heads * self.head_dim()) as u64;
        let attention = 2 * hidden * hidden + 2 * hidden * kv_width;
        let mlp = 3 * hidden * self.ffn_size as u64;
        let per_layer = attention + mlp + 2 * hidden;
        2 * self.vocab_size as u64 * hidden + self.num_layers as u64 * per_layer + hidden
    }

    /// Training FLOPs per token for sequences of `seq_len` tokens (forward + backward), as in
    /// PaLM's MFU accounting (Chowdhery et al. 2022, appendix B):
    ///
    /// `6·N + 12·L·H·T`
    ///
    /// where `N` is the number of parameters that take part in matrix multiplications (all of
    /// [`HlatConfig::num_params`] except the input embedding table, which is a lookup), `L` the
    /// number of layers, `H` the hidden size and `T = seq_len`; the second term counts the
    /// attention score and weighted-value products (`2·2·H·T` per layer forward, times 3 for
    /// forward + backward), without discounting the causal mask.
    pub fn train_flops_per_token(&self, seq_len: usize) -> f64 {
        let matmul_params =
            (self.num_params() - (self.vocab_size * self.hidden_size) as u64) as f64;
        let attention = 12.0 * self.num_layers as f64 * self.hidden_size as f64 * seq_len as f64;
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

    /// Writes the configuration as pretty JSON (to a temporary file renamed into place).
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let io_error = |source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        };
        let text = serde_json::to_string_pretty(self).map_err(|source| ConfigError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(".tmp");
        let temporary = PathBuf::from(temporary);
        std::fs::write(&temporary, text + "\n").map_err(io_error)?;
        std::fs::rename(&temporary, path).map_err(io_error)
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
