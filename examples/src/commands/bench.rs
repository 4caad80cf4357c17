//! `hlat bench`.

use clap::Args;

/// Arguments of `hlat bench`.
#[derive(Args)]
pub struct BenchArgs {}

/// Runs `hlat bench`.
pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("`hlat bench` is not available in this build yet")
}
