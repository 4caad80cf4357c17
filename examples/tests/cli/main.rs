//! The `hlat` command line end to end, in one binary: each test runs the built `hlat` program.

mod allocator_cli;
mod bench_smoke;
mod compile_cache_cli;
mod convert_cli;
mod cpt_cli;
mod data_cli;
mod errors_cli;
mod multi_process_cli;
mod pretrain_cli;
mod segment_cap_cli;

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

/// Runs `hlat` with `arguments` and returns what it did.
fn run(arguments: &[&str]) -> std::process::Output {
    hlat().args(arguments).output().expect("running hlat")
}

/// Runs `hlat` with `arguments`, which must succeed; returns its standard output.
fn succeed(arguments: &[&str]) -> String {
    let output = run(arguments);
    assert!(
        output.status.success(),
        "hlat {arguments:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}
