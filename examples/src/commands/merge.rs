//! `hlat merge`: merges of Hugging Face checkpoints of one architecture as mergekit 0.1.5 makes
//! them, from a configuration in mergekit's YAML layout (docs/merge.md).

use std::path::PathBuf;

use clap::Args;
use hlat::merge::{MergeConfig, merge};

/// Arguments of `hlat merge`.
#[derive(Args)]
pub struct MergeArgs {
    /// The merge configuration, in mergekit's layout: `merge_method`, `base_model`, `models` or
    /// `slices`, `parameters`, `dtype`, `out_dtype`, `tokenizer_source: base`. Model folders are
    /// read relative to the working directory, as mergekit reads them.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The new Hugging Face folder to write (an existing one is refused and left as it is).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// Runs `hlat merge`.
pub fn run(args: MergeArgs) -> anyhow::Result<()> {
    let config = MergeConfig::from_file(&args.config)?;
    let summary = merge(&config, &args.out)?;
    println!(
        "merged {} models ({}) into {}: {} tensors, {} layers, {}",
        summary.models.len(),
        config.method.name(),
        args.out.display(),
        summary.tensors,
        summary.layers,
        summary.dtype.torch_name()
    );
    Ok(())
}
