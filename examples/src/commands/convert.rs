//! `hlat convert`: between Hugging Face folders and native checkpoints, whole or sharded by
//! tensor-parallel rank (a sharded checkpoint read with `--from` is joined; `--tp N` splits the
//! output into N rank files).

use std::path::PathBuf;

use anyhow::Context;
use burn_trainium::Trainium;
use clap::Args;
use hlat::checkpoint::{load_any, save_native_with_tokenizer};
use hlat::hf::{ExportOptions, WeightDtype, export_hf, find_tokenizer, import_hf};
use hlat::sharded_checkpoint::save_split;

/// Arguments of `hlat convert`.
#[derive(Args)]
pub struct ConvertArgs {
    /// Hugging Face folder to read (`llama`, `mistral`, `qwen2` or `qwen3`).
    #[arg(long, conflicts_with = "from", required_unless_present = "from")]
    pub from_hf: Option<PathBuf>,
    /// Native checkpoint, whole or sharded by tensor-parallel rank (joined), or training run
    /// folder (its newest checkpoint), to read.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// New native checkpoint folder to write.
    #[arg(long, conflicts_with = "to_hf", required_unless_present = "to_hf")]
    pub to: Option<PathBuf>,
    /// New Hugging Face folder to write.
    #[arg(long)]
    pub to_hf: Option<PathBuf>,
    /// Write the native checkpoint as N tensor-parallel rank files, as a `hlat pretrain --tp N`
    /// run checkpoints it (1: one whole file).
    #[arg(long, value_name = "N", requires = "to", value_parser = super::ranges::at_least_one::<usize>())]
    pub tp: Option<usize>,
    /// Element type of the written weights: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: WeightDtype,
    /// Shard limit of Hugging Face output, e.g. 5GB, 500MB, 2GiB or a byte count.
    #[arg(long, default_value = "5GB", value_parser = parse_size)]
    pub max_shard_size: u64,
}

/// Runs `hlat convert`.
pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    let device = super::device_from_env()?;
    let (model, tokenizer) = match (&args.from_hf, &args.from) {
        (Some(dir), _) => {
            let (_, model) = import_hf::<Trainium>(dir, &device, args.dtype)?;
            (model, find_tokenizer(dir)?)
        }
        (None, Some(dir)) => {
            let (_, model, tokenizer) = load_any::<Trainium>(dir, &device)?;
            (model, tokenizer)
        }
        (None, None) => anyhow::bail!("give --from-hf DIR or --from DIR"),
    };
    match (&args.to, &args.to_hf) {
        (Some(out), _) => {
            anyhow::ensure!(
                !out.exists(),
                "{}: already exists; choose a new output folder",
                out.display()
            );
            match args.tp.unwrap_or(1) {
                0 => anyhow::bail!("--tp 0: the tensor-parallel degree must be at least 1"),
                1 => {
                    save_native_with_tokenizer(&model, model.config(), tokenizer.as_ref(), out)
                        .with_context(|| format!("writing {}", out.display()))?;
                    println!("wrote native checkpoint {}", out.display());
                }
                degree => {
                    save_split(&model, degree, tokenizer.as_ref(), out)
                        .with_context(|| format!("writing {}", out.display()))?;
                    println!(
                        "wrote native checkpoint {} as {degree} tensor-parallel rank files",
                        out.display()
                    );
                }
            }
        }
        (None, Some(out)) => {
            let options = ExportOptions {
                dtype: args.dtype,
                max_shard_size: args.max_shard_size,
            };
            export_hf(&model, out, &options, tokenizer.as_ref())?;
            println!("wrote Hugging Face folder {}", out.display());
        }
        (None, None) => anyhow::bail!("give --to DIR or --to-hf DIR"),
    }
    Ok(())
}

/// Parses `5GB` (10^9), `500MB`, `2GiB` (2^30), `64KB` or a plain byte count.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size like 5GB"))?;
    let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}` in `{text}`")),
    };
    let bytes = (number * scale as f64) as u64;
    if bytes == 0 {
        return Err(format!("the shard size `{text}` must be positive"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hlat::hf::DEFAULT_MAX_SHARD_SIZE;

    #[test]
    fn sizes_parse_like_transformers() {
        assert_eq!(parse_size("5GB"), Ok(DEFAULT_MAX_SHARD_SIZE));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1234"), Ok(1234));
        assert!(parse_size("5XB").is_err());
        assert!(parse_size("0").is_err());
    }
}
