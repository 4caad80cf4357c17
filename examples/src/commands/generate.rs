//! `hlat generate`.

use clap::Args;

/// Arguments of `hlat generate`.
#[derive(Args)]
pub struct GenerateArgs {}

/// Runs `hlat generate`.
pub fn run(_args: GenerateArgs) -> anyhow::Result<()> {
    anyhow::bail!("`hlat generate` is not available in this build yet")
}
