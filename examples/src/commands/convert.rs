//! `hlat convert`.

use clap::Args;

/// Arguments of `hlat convert`.
#[derive(Args)]
pub struct ConvertArgs {}

/// Runs `hlat convert`.
pub fn run(_args: ConvertArgs) -> anyhow::Result<()> {
    anyhow::bail!("`hlat convert` is not available in this build yet")
}
