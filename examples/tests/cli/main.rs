//! The `hlat` command line end to end, in one binary: each test runs the built `hlat` program.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod allocator_cli;
mod bench_smoke;
mod compile_cache_cli;
mod compile_cli;
mod compiler_options_cli;
mod convert_cli;
mod cpt_cli;
mod data_cli;
mod errors_cli;
mod families_cli;
mod merge_cli;
mod multi_process_cli;
mod pretrain_cli;
mod profile_cli;
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

/// The `xla` backend needs the XLA CPU plugin: the tests fail, never skip, without it.
fn require_plugin() {
    let variable = burn_trainium::PLUGIN_ENV;
    let path = PathBuf::from(std::env::var_os(variable).unwrap_or_default());
    assert!(
        path.is_file(),
        "the XLA CPU PJRT plugin is missing (`{variable}` = `{}`): run the tests with \
         `scripts/test`",
        path.display()
    );
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
