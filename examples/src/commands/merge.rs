//! `hlat merge`: mergekit-style merges of Hugging Face checkpoints of one architecture, from a
//! configuration in mergekit's YAML layout.

use std::path::PathBuf;

use clap::Args;
use hlat::merge::{MergeConfig, merge};

/// Arguments of `hlat merge`.
#[derive(Args)]
pub struct MergeArgs {
    /// The merge configuration (mergekit's layout: `merge_method`, `base_model`, `models` with
    /// `parameters`, `dtype`). Model folders are read relative to the working directory.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The new Hugging Face folder to write.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// Runs `hlat merge`.
pub fn run(args: MergeArgs) -> anyhow::Result<()> {
    let config = MergeConfig::from_file(&args.config)?;
    let summary = merge(&config, &args.out)?;
    println!(
        "merged {} models ({:?}) into {}: {} tensors, {}",
        summary.models.len(),
        config.method,
        args.out.display(),
        summary.tensors,
        summary.dtype.torch_name()
    );
    Ok(())
}
