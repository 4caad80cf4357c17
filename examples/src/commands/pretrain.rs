//! `hlat pretrain`.

use clap::Args;

/// Arguments of `hlat pretrain`.
#[derive(Args)]
pub struct PretrainArgs {}

/// Runs `hlat pretrain`.
pub fn run(_args: PretrainArgs) -> anyhow::Result<()> {
    anyhow::bail!("`hlat pretrain` is not available in this build yet")
}
