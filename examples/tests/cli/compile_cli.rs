//! `hlat compile` of a parallel layout on `--device neuron`, as its help says, without
//! `TRAINIUM_DEVICE`: `--check-only` runs the Neuron lint over every program with no compiler at
//! all, and a compile with a stand-in compiler fills the cache.

use std::path::Path;

use super::multi_process_cli::cached_modules;
use super::{run_in, step_flags};

/// The steps compiled: 64 tokens in micro-batches of two 16-token rows, no progress bar.
fn steps() -> Vec<&'static str> {
    [&step_flags("16", "64", "2")[..], &["--no-progress"]].concat()
}

/// The flags of a short `hlat-test` run in data parallel 2 × tensor parallel 2 with sequence
/// parallelism and ZeRO-1.
fn layout() -> Vec<&'static str> {
    let parallel = [
        "--preset",
        "hlat-test",
        "--dp",
        "2",
        "--tp",
        "2",
        "--sequence-parallel",
        "--zero1",
        "--max-steps",
        "2",
    ];
    [&parallel[..], &steps()].concat()
}

/// `hlat compile` of `layout` with `extra` flags and `environment`, in `folder`, without
/// `TRAINIUM_DEVICE`.
fn compile(
    folder: &Path,
    layout: &[&str],
    extra: &[&str],
    environment: &[(&str, &str)],
) -> std::process::Output {
    let arguments = [&["compile"][..], extra, layout].concat();
    run_in(folder, &arguments, environment)
}

/// `hlat compile` of `layout` for `neuron` with the stand-in compiler into a cache in `folder`:
/// its standard output (the command must succeed) and the cache.
fn compile_with_stand_in(folder: &Path, layout: &[&str]) -> (String, std::path::PathBuf) {
    let compiler = test_support::stand_in::compiler(folder);
    let cache = folder.join("cache");
    let compiled = compile(
        folder,
        layout,
        &["--device", "neuron", "--out", "compiled"],
        &[
            ("NEURON_CC", compiler.to_str().unwrap()),
            ("NEURON_COMPILE_CACHE_URL", cache.to_str().unwrap()),
        ],
    );
    let stdout = String::from_utf8_lossy(&compiled.stdout).into_owned();
    assert!(
        compiled.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    (stdout, cache)
}

#[test]
fn compile_traces_a_parallel_layout_on_the_neuron_device_it_is_given() {
    let folder = tempfile::tempdir().unwrap();
    let layout = layout();
    let run = |extra: &[&str], environment: &[(&str, &str)]| {
        compile(folder.path(), &layout, extra, environment)
    };

    // No compiler on PATH: the lint alone.
    let checked = run(
        &["--check-only", "--out", "checked"],
        &[("NEURON_CC", "/nonexistent/neuronx-cc")],
    );
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert!(
        checked.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(
        stdout.contains("programs checked: every one within"),
        "{stdout}"
    );

    let (stdout, cache) = compile_with_stand_in(folder.path(), &layout);
    assert!(stdout.contains(" programs compiled in "), "{stdout}");
    assert!(std::fs::read_dir(&cache).unwrap().count() > 0);

    // Another executor is refused, naming the flag to use.
    let refused = run(&["--device", "xla:0", "--out", "refused"], &[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--device neuron"), "{stderr}");
}

/// A fully sharded layout (data parallel 2, each layer gathered again for its recomputation)
/// passes the Neuron lint, and the programs the compiler receives gather the weights
/// (`all-gather`) and reduce-scatter their gradients (`reduce-scatter`).
#[test]
fn compile_checks_a_fully_sharded_layout_with_its_gathers_and_scatters() {
    let folder = tempfile::tempdir().unwrap();
    let sharded = [
        "--preset",
        "hlat-test",
        "--dp",
        "2",
        "--fsdp",
        "--activation-checkpointing",
        "full",
        "--max-steps",
        "1",
    ];
    let layout = [&sharded[..], &steps()].concat();
    let checked = compile(
        folder.path(),
        &layout,
        &["--check-only", "--out", "checked"],
        &[("NEURON_CC", "/nonexistent/neuronx-cc")],
    );
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert!(
        checked.status.success() && stdout.contains("programs checked: every one within"),
        "{stdout}{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let (_, cache) = compile_with_stand_in(folder.path(), &layout);
    let opcodes: std::collections::BTreeSet<String> = cached_modules(&cache)
        .iter()
        .flat_map(|module| &module.computations)
        .flat_map(|computation| &computation.instructions)
        .map(|instruction| instruction.opcode.clone())
        .collect();
    assert!(
        opcodes.contains("all-gather") && opcodes.contains("reduce-scatter"),
        "{opcodes:?}"
    );
}

/// A pipeline of two stages, each tensor parallel 2 with sequence parallelism, compiled for
/// `neuron` with the stand-in compiler: the programs `neuronx-cc` receives pass activations
/// between the stages as `collective-permute` between the replicas of each stage pair, and pass
/// the Neuron lint.
#[test]
fn compile_sends_the_stage_to_stage_collectives_to_the_neuron_compiler() {
    let folder = tempfile::tempdir().unwrap();
    let stages = [
        "--preset",
        "hlat-test",
        "--pp",
        "2",
        "--tp",
        "2",
        "--sequence-parallel",
        "--max-steps",
        "1",
    ];
    let (_, cache) = compile_with_stand_in(folder.path(), &[&stages[..], &steps()].concat());
    let pairs: Vec<Vec<(i64, i64)>> = cached_modules(&cache)
        .iter()
        .flat_map(|module| &module.computations)
        .flat_map(|computation| &computation.instructions)
        .filter(|instruction| instruction.opcode == "collective-permute")
        .map(|instruction| {
            let mut pairs: Vec<(i64, i64)> = instruction
                .source_target_pairs
                .iter()
                .map(|pair| (pair.source, pair.target))
                .collect();
            pairs.sort();
            pairs
        })
        .collect();
    assert!(
        !pairs.is_empty(),
        "no collective-permute reached the compiler"
    );
    // Replicas 0-1 are stage 0, 2-3 stage 1 (tensor ranks 0 and 1 of each): forward 0>2, 1>3,
    // and round to the first stage (the next chunk), backward the other way.
    for found in pairs {
        assert_eq!(found, [(0, 2), (1, 3), (2, 0), (3, 1)]);
    }
}
