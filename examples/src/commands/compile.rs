//! `hlat compile`.

use clap::Args;

/// Arguments of `hlat compile`.
#[derive(Args)]
pub struct CompileArgs {}

/// Runs `hlat compile`.
pub fn run(_args: CompileArgs) -> anyhow::Result<()> {
    anyhow::bail!("`hlat compile` is not available in this build yet")
}
