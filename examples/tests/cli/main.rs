//! The `hlat` command line end to end, in one binary: each test runs the built `hlat` program.

mod adapter_cli;
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
mod finetune_cli;
mod merge_cli;
mod multi_process_cli;
mod pretrain_cli;
mod profile_cli;
mod segment_cap_cli;

use std::process::Command;

use test_support::fixtures::fixture;

/// The `hlat` program under test.
fn hlat() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hlat"))
}

/// The `xla` backend needs the XLA CPU plugin: the tests fail, never skip, without it.
fn require_plugin() {
    test_support::plugin::plugin_path();
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
