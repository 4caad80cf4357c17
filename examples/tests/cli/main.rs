//! The `hlat` command line end to end, in one binary: each test runs the built `hlat` program.

mod bench_smoke;
mod data_cli;
mod pretrain_cli;

use std::path::PathBuf;
use std::process::Command;

/// A file or folder of the repository's `fixtures/`.
fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name)
}

/// The `hlat` program under test.
fn hlat() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hlat"))
}
