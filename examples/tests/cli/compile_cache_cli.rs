//! The `xla` executor's persistent compile cache: a second run of the same job, in another
//! process, loads every program from the cache and compiles nothing; a truncated entry is
//! compiled again and replaced; two processes filling one cache at once leave it whole; `hlat
//! cache` lists what each entry was compiled for and prunes.

use std::path::Path;

use burn_trainium::XLA_CACHE_ENV;

/// The command of a 3-step `hlat pretrain` of `hlat-test` on `xla:0` into `out` with the
/// compile cache in `cache`.
fn pretrain(out: &Path, cache: &Path) -> std::process::Command {
    let mut command = super::hlat();
    command
        .args([
            "pretrain",
            "--preset",
            "hlat-test",
            "--device",
            "xla:0",
            "--out",
            out.to_str().unwrap(),
            "--max-steps",
            "3",
            "--checkpoint-every",
            "3",
        ])
        .args(super::short_steps())
        .env(XLA_CACHE_ENV, cache);
    command
}

/// Runs [`pretrain`]; returns the `compiles` and `compile_seconds` of its last metrics record.
fn pretrain_compiles(out: &Path, cache: &Path) -> (u64, f64) {
    let output = pretrain(out, cache).output().expect("running hlat");
    check_run(out, &output)
}

/// The `compiles` and `compile_seconds` of the last metrics record of the run in `out`, which
/// exited as `output` says.
fn check_run(out: &Path, output: &std::process::Output) -> (u64, f64) {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let records = records(out);
    // Every record says how long the run has taken; the first one, the time to the first step.
    let elapsed: Vec<f64> = records
        .iter()
        .map(|record| record["elapsed_seconds"].as_f64().expect("elapsed_seconds"))
        .collect();
    assert!(elapsed[0] > 0.0 && elapsed.is_sorted(), "{elapsed:?}");
    let last = records.last().unwrap();
    (
        last["compiles"]
            .as_u64()
            .expect("compiles in metrics.jsonl"),
        last["compile_seconds"]
            .as_f64()
            .expect("compile_seconds in metrics.jsonl"),
    )
}

/// The records of `out`'s `metrics.jsonl`.
fn records(out: &Path) -> Vec<serde_json::Value> {
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    metrics
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The parameter tensors of the model the run in `out` saved.
fn parameter_tensors(out: &Path) -> usize {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::{Device, Tensor};

    struct Count(usize);
    impl ModuleVisitor for Count {
        fn visit_float<const D: usize>(&mut self, _: &Param<Tensor<D>>) {
            self.0 += 1;
        }
    }
    let (_, model, _) = hlat::checkpoint::load_any(out, &Device::flex()).unwrap();
    let mut count = Count(0);
    model.visit(&mut count);
    count.0
}

/// Adam's moments exist before the first step (zeros, one small program), so the second step
/// already runs the steady step's program: after the first step's record the run compiles the
/// steady step, then nothing. (When the moments were made by the first update, the second step
/// compiled a program of its own and the third the steady one; when the seed before each update
/// cut the stream, the gradients' clipping was a small program of its own.)
///
/// The step updates every parameter and both its moments in place: the module XLA compiles for
/// it aliases each of those outputs to the input it replaces (`input_output_alias`).
#[test]
fn a_run_compiles_nothing_after_its_second_step() {
    let folder = tempfile::tempdir().unwrap();
    let out = folder.path().join("run");
    let dump = folder.path().join("modules");
    let output = pretrain(&out, &folder.path().join("cache"))
        .env(burn_trainium::lower::DUMP_DIR_ENV, &dump)
        .output()
        .expect("running hlat");
    check_run(&out, &output);
    let aliased = super::dumped_modules(&dump)
        .into_iter()
        .map(|module| {
            module
                .input_output_alias
                .map_or(0, |alias| alias.entries.len())
        })
        .max()
        .unwrap();
    let parameters = parameter_tensors(&out);
    assert!(
        parameters > 0 && aliased >= 3 * parameters,
        "{aliased} outputs updated in place, {parameters} parameters"
    );
    let compiles: Vec<u64> = records(&out)
        .iter()
        .map(|record| record["compiles"].as_u64().expect("compiles"))
        .collect();
    assert_eq!(compiles.len(), 3, "{compiles:?}");
    assert!(
        compiles[1] - compiles[0] <= 1 && compiles[1] == compiles[2],
        "programs compiled after the first step: {compiles:?}"
    );
}

#[test]
fn a_second_xla_run_loads_its_programs_from_the_cache() {
    let folder = tempfile::tempdir().unwrap();
    let cache = folder.path().join("cache");
    let (first, first_seconds) = pretrain_compiles(&folder.path().join("first"), &cache);
    assert!(
        first > 0 && first_seconds > 0.0,
        "the first run compiles its programs"
    );
    // The last step's record counts the compiles until then; the run may compile more after it
    // (its final checkpoint reads).
    let entries = programs(&cache);
    assert!(
        entries.len() as u64 >= first,
        "{} cache entries, {first} compiles",
        entries.len()
    );
    let second_out = folder.path().join("second");
    let output = pretrain(&second_out, &cache)
        .output()
        .expect("running hlat");
    assert_eq!(
        check_run(&second_out, &output),
        (0, 0.0),
        "the second run compiles nothing"
    );
    // Loading its own machine's programs, the plugin reports no mismatch (its spurious tuning
    // feature warnings are left out, see burn-trainium's executor/xla_stderr.rs).
    let stderr = String::from_utf8_lossy(&output.stderr);
    let plugin_errors = stderr.lines().filter(|line| line.starts_with('E')).count();
    assert_eq!(plugin_errors, 0, "{stderr}");

    // A truncated entry does not load: it is compiled again and replaced. Every entry is
    // truncated, since which of them the steps use before the last record depends on the
    // entries' names, and those on the machine.
    let halves: Vec<u64> = entries
        .iter()
        .map(|entry| {
            let half = std::fs::metadata(entry).unwrap().len() / 2;
            std::fs::File::options()
                .write(true)
                .open(entry)
                .unwrap()
                .set_len(half)
                .unwrap();
            half
        })
        .collect();
    let (third, _) = pretrain_compiles(&folder.path().join("third"), &cache);
    assert!(third >= 1, "the truncated programs are compiled again");
    for (entry, half) in entries.iter().zip(&halves) {
        assert!(
            std::fs::metadata(entry).unwrap().len() > *half,
            "{} is not replaced",
            entry.display()
        );
    }
    let fourth = pretrain_compiles(&folder.path().join("fourth"), &cache);
    assert_eq!(fourth, (0, 0.0), "the replaced entry loads");

    // `hlat cache` lists every entry with what it was compiled for, and clears them.
    let listed = cache_command(&cache, &[]);
    let count = entries.len();
    assert!(listed.contains(&format!(": {count} entries, ")), "{listed}");
    assert!(
        listed.contains("segment_") && listed.contains("on cpu "),
        "{listed}"
    );
    let cleared = cache_command(&cache, &["--clear"]);
    assert!(
        cleared.contains(&format!(": 0 entries, 0 bytes ({count} removed)")),
        "{cleared}"
    );
    assert!(programs(&cache).is_empty());
}

/// Two processes running the same job with one empty cache: each writes its entries whole
/// (atomically), so a third run loads every program and compiles nothing.
#[test]
fn two_processes_filling_one_cache_leave_it_whole() {
    let folder = tempfile::tempdir().unwrap();
    let cache = folder.path().join("cache");
    let outs = [folder.path().join("a"), folder.path().join("b")];
    let children: Vec<_> = outs
        .iter()
        .map(|out| pretrain(out, &cache).spawn().expect("running hlat"))
        .collect();
    for (out, child) in outs.iter().zip(children) {
        let output = child.wait_with_output().unwrap();
        check_run(out, &output);
    }
    let third = pretrain_compiles(&folder.path().join("c"), &cache);
    assert_eq!(third, (0, 0.0), "every entry loads");
    // No temporary file is left behind.
    for entry in std::fs::read_dir(&cache).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(!name.to_string_lossy().starts_with('.'), "{name:?}");
    }
}

/// The cached programs in `cache`, sorted.
fn programs(cache: &Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(cache)
        .map(|listing| {
            listing
                .map(|entry| entry.unwrap().path())
                .filter(|path| {
                    path.extension()
                        .is_some_and(|extension| extension == "pjrt")
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// Runs `hlat cache` with `arguments` on `cache` (and an empty Neuron cache); its output.
fn cache_command(cache: &Path, arguments: &[&str]) -> String {
    let neuron = cache.with_file_name("neuron-cache");
    let output = super::hlat()
        .arg("cache")
        .args(arguments)
        .env(XLA_CACHE_ENV, cache)
        .env("NEURON_COMPILE_CACHE_URL", &neuron)
        .output()
        .expect("running hlat");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}
