//! `hlat eval`.

use clap::Args;

/// Arguments of `hlat eval`.
#[derive(Args)]
pub struct EvalArgs {}

/// Runs `hlat eval`.
pub fn run(_args: EvalArgs) -> anyhow::Result<()> {
    anyhow::bail!("`hlat eval` is not available in this build yet")
}
