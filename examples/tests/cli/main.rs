//! The `hlat` command line end to end, in one binary: each test runs the built `hlat` program.

mod adapter_cli;
mod align_cli;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod allocator_cli;
mod async_checkpoint_cli;
mod bench_smoke;
mod compile_cache_cli;
mod compile_cli;
mod compiler_options_cli;
mod convert_cli;
mod cpt_cli;
mod cudnn_step_cli;
mod data_cli;
mod device_check_cli;
mod disk_faults;
mod errors_cli;
mod families_cli;
mod finetune_cli;
mod full_disk_cli;
mod help_cli;
mod learner_bench;
mod merge_cli;
mod multi_process_cli;
mod output_folders_cli;
mod pretrain_cli;
mod profile_cli;
mod segment_cap_cli;
mod serve_cli;

use std::process::Command;

use test_support::fixtures::fixture;

/// Polls `condition` every 20 ms until it holds; fails saying `waiting for` past `limit`.
fn wait_until(limit: std::time::Duration, waiting_for: &str, mut condition: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < limit,
            "{waiting_for}: not within {limit:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The `hlat` program under test.
fn hlat() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hlat"))
}

/// The HLO modules `TRAINIUM_DUMP_DIR=dump` made a run write (`<name>.hlo.pb`).
fn dumped_modules(dump: &std::path::Path) -> Vec<burn_trainium::hlo::HloModuleProto> {
    use prost::Message;
    std::fs::read_dir(dump)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".hlo.pb"))
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            burn_trainium::hlo::HloModuleProto::decode(bytes.as_slice())
                .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        })
        .collect()
}

/// The `xla` backend needs the XLA CPU plugin: the tests fail, never skip, without it.
fn require_plugin() {
    test_support::plugin::plugin_path();
}

/// Runs `hlat` with `arguments` and returns what it did.
fn run(arguments: &[&str]) -> std::process::Output {
    hlat().args(arguments).output().expect("running hlat")
}

/// `arguments` as [`run`] and [`succeed`] take them.
fn as_strs(arguments: &[String]) -> Vec<&str> {
    arguments.iter().map(String::as_str).collect()
}

/// Runs `hlat` with `arguments`, which must succeed; returns its standard output.
fn succeed(arguments: &[&str]) -> String {
    succeeded(arguments, run(arguments))
}

/// `hlat ARGUMENTS` run in `folder`, without `TRAINIUM_DEVICE`, with the variables `environment`.
fn run_in<V: AsRef<std::ffi::OsStr>>(
    folder: &std::path::Path,
    arguments: &[&str],
    environment: &[(&str, V)],
) -> std::process::Output {
    let mut command = hlat();
    command
        .current_dir(folder)
        .args(arguments)
        .env_remove(burn_trainium::DEVICE_ENV);
    for (name, value) in environment {
        command.env(name, value);
    }
    command.output().expect("running hlat")
}

/// [`run_in`] with no variables set.
const NO_VARIABLES: &[(&str, &str)] = &[];

/// `hlat ARGUMENTS` run in `folder` as [`run_in`] runs it, which must succeed; returns its
/// standard output.
fn succeed_in<V: AsRef<std::ffi::OsStr>>(
    folder: &std::path::Path,
    arguments: &[&str],
    environment: &[(&str, V)],
) -> String {
    succeeded(arguments, run_in(folder, arguments, environment))
}

/// Asserts that `hlat ARGUMENTS` succeeded with `output`; returns its standard output.
fn succeeded(arguments: &[&str], output: std::process::Output) -> String {
    assert!(
        output.status.success(),
        "hlat {arguments:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The flags of a training run's steps: rows of `seq_len` tokens, `batch_tokens` tokens an
/// optimizer step, micro-batches of `micro_batch_rows` rows.
const fn step_flags<'a>(
    seq_len: &'a str,
    batch_tokens: &'a str,
    micro_batch_rows: &'a str,
) -> [&'a str; 6] {
    [
        "--seq-len",
        seq_len,
        "--batch-tokens",
        batch_tokens,
        "--micro-batch-rows",
        micro_batch_rows,
    ]
}

/// The steps of the tests' short runs: four rows of 16 tokens each in one micro-batch, no
/// validation, no progress bar.
fn short_steps() -> Vec<&'static str> {
    [
        &step_flags("16", "64", "4")[..],
        &["--eval-every", "0", "--no-progress"],
    ]
    .concat()
}

/// `hlat COMMAND` of a short `hlat-test` run of `max_steps` steps on `device`: a checkpoint
/// every 2 steps, one kept (so a stray checkpoint would delete the run's own).
fn run_flags<'a>(command: &'a str, device: &'a str, max_steps: &'a str) -> Vec<&'a str> {
    let run = [
        command,
        "--device",
        device,
        "--preset",
        "hlat-test",
        "--max-steps",
        max_steps,
        "--checkpoint-every",
        "2",
        "--keep-checkpoints",
        "1",
    ];
    [&run[..], &short_steps()].concat()
}

/// The loss of every step in a run folder's `metrics.jsonl`.
fn losses(run: &std::path::Path) -> Vec<f64> {
    test_support::training::logged_steps(run)
        .iter()
        .map(|step| step.loss)
        .collect()
}

/// The number after `what` in `text` (a figure of `hlat info`, such as a GiB).
fn number_after(text: &str, what: &str) -> f64 {
    let start = text
        .find(what)
        .unwrap_or_else(|| panic!("no `{what}` in {text}"))
        + what.len();
    text[start..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}
