//! `hlat compile` of a parallel layout on `--device neuron`, as its help says, without
//! `TRAINIUM_DEVICE`: `--check-only` runs the Neuron lint over every program with no compiler at
//! all, and a compile with a stand-in compiler fills the cache.

use std::os::unix::fs::PermissionsExt;

use burn_trainium::DEVICE_ENV;

use super::hlat;
use super::multi_process_cli::STAND_IN_COMPILER;

/// The flags of a short `hlat-test` run in data parallel 2 × tensor parallel 2 with sequence
/// parallelism and ZeRO-1, into `out`.
const LAYOUT: &[&str] = &[
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
    "--seq-len",
    "16",
    "--batch-tokens",
    "64",
    "--micro-batch-rows",
    "2",
    "--no-progress",
];

#[test]
fn compile_traces_a_parallel_layout_on_the_neuron_device_it_is_given() {
    let folder = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], environment: &[(&str, &str)]| {
        let mut command = hlat();
        command
            .arg("compile")
            .args(extra)
            .args(LAYOUT)
            .current_dir(folder.path())
            .env_remove(DEVICE_ENV);
        for (name, value) in environment {
            command.env(name, value);
        }
        command.output().unwrap()
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

    let compiler = folder.path().join("stand-in-neuronx-cc");
    std::fs::write(&compiler, STAND_IN_COMPILER).unwrap();
    std::fs::set_permissions(&compiler, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cache = folder.path().join("cache");
    let compiled = run(
        &["--device", "neuron", "--out", "compiled"],
        &[
            ("NEURON_CC", compiler.to_str().unwrap()),
            ("NEURON_COMPILE_CACHE_URL", cache.to_str().unwrap()),
        ],
    );
    let stdout = String::from_utf8_lossy(&compiled.stdout);
    assert!(
        compiled.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    assert!(stdout.contains(" programs compiled in "), "{stdout}");
    assert!(std::fs::read_dir(&cache).unwrap().count() > 0);

    // Another executor is refused, naming the flag to use.
    let refused = run(&["--device", "xla:0", "--out", "refused"], &[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--device neuron"), "{stderr}");
}
