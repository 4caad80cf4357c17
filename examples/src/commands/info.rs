//! `hlat info`.

use clap::Args;

/// Arguments of `hlat info`.
#[derive(Args)]
pub struct InfoArgs {}

/// Runs `hlat info`.
pub fn run(_args: InfoArgs) -> anyhow::Result<()> {
    anyhow::bail!("`hlat info` is not available in this build yet")
}
