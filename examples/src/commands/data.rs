//! `hlat data`.

use clap::Args;

/// Arguments of `hlat data`.
#[derive(Args)]
pub struct DataArgs {}

/// Runs `hlat data`.
pub fn run(_args: DataArgs) -> anyhow::Result<()> {
    anyhow::bail!("`hlat data` is not available in this build yet")
}
