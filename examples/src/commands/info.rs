//! `hlat info`: print a configuration and its parameter count.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use hlat::checkpoint::{FolderKind, NATIVE_CONFIG_FILE, folder_kind};
use hlat::{ConfigError, HlatConfig};

/// Arguments of `hlat info`.
#[derive(Args)]
pub struct InfoArgs {
    /// A preset name (`hlat-7b`, `hlat-70b`, `hlat-tiny`, `hlat-test`, `bench-tiny`), an HLAT or
    /// Hugging Face `config.json`, or a model folder (native checkpoint or Hugging Face).
    pub model: String,
}

/// Runs `hlat info`.
pub fn run(args: InfoArgs) -> anyhow::Result<()> {
    let (source, config) = resolve(&args.model)?;
    println!("source: {source}");
    print!("{}", describe(&config));
    Ok(())
}

/// The configuration named by `model`, and a description of where it came from.
fn resolve(model: &str) -> anyhow::Result<(String, HlatConfig)> {
    if HlatConfig::preset_names().contains(&model) {
        return Ok((format!("preset {model}"), HlatConfig::preset(model)?));
    }
    let path = Path::new(model);
    if path.is_dir() {
        return match folder_kind(path) {
            Some(FolderKind::Native) => {
                let config = HlatConfig::load(&path.join(NATIVE_CONFIG_FILE))?;
                Ok((format!("native checkpoint {}", path.display()), config))
            }
            Some(FolderKind::HuggingFace) | None if path.join(hlat::hf::CONFIG_FILE).is_file() => {
                let config = hlat::hf::read_hf_config(path)?;
                Ok((format!("Hugging Face folder {}", path.display()), config))
            }
            _ => anyhow::bail!(
                "{}: no config.json (expected a native checkpoint or a Hugging Face folder)",
                path.display()
            ),
        };
    }
    if path.is_file() {
        // Our own JSON first; a file that is not one is read as a Hugging Face config.json.
        return match HlatConfig::load(path) {
            Ok(config) => Ok((format!("HLAT config {}", path.display()), config)),
            Err(ConfigError::Json { .. }) => {
                let config = hlat::hf::read_hf_config_file(path)?;
                Ok((format!("Hugging Face config {}", path.display()), config))
            }
            Err(error) => Err(error.into()),
        };
    }
    Err(ConfigError::UnknownPreset {
        name: model.to_string(),
    })
    .with_context(|| format!("`{model}` is neither a preset nor an existing file or folder"))
}

/// One `key: value` line per field, then the derived sizes.
fn describe(config: &HlatConfig) -> String {
    let pad = config
        .pad_token_id
        .map_or("none".to_string(), |id| id.to_string());
    let lines = [
        ("vocab_size", config.vocab_size.to_string()),
        ("hidden_size", config.hidden_size.to_string()),
        ("num_layers", config.num_layers.to_string()),
        ("num_heads", config.num_heads.to_string()),
        ("num_kv_heads", config.num_kv_heads.to_string()),
        ("head_dim", config.head_dim().to_string()),
        ("ffn_size", config.ffn_size.to_string()),
        ("max_seq_len", config.max_seq_len.to_string()),
        ("rms_norm_eps", config.rms_norm_eps.to_string()),
        ("rope_theta", config.rope_theta.to_string()),
        ("init_std", config.init_std.to_string()),
        ("bos_token_id", config.bos_token_id.to_string()),
        ("eos_token_id", config.eos_token_id.to_string()),
        ("pad_token_id", pad),
        ("parameters", config.num_params().to_string()),
        (
            "train_flops_per_token",
            format!(
                "{:.4e} (at {} tokens)",
                config.train_flops_per_token(config.max_seq_len),
                config.max_seq_len
            ),
        ),
    ];
    lines
        .iter()
        .map(|(key, value)| format!("{key}: {value}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_hf_folders_print_their_parameter_count() {
        let (_, config) = resolve("hlat-70b").unwrap();
        assert!(describe(&config).contains("\nparameters: 68976648192\n"));
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/hf-tiny-llama");
        let (source, config) = resolve(fixture).unwrap();
        assert!(source.starts_with("Hugging Face folder"), "{source}");
        assert!(describe(&config).contains("\nparameters: 230208\n"));
        assert!(resolve("hlat-13b").is_err());
    }
}
