//! `hlat bench learner`: burn-train's `Learner` loop (its data loader, its metrics thread
//! reading every step's loss, validation every epoch) runs on `xla` as a fixed number of segments
//! a batch, the same in every run — a warm run compiles nothing — and trains as NdArray does.

use super::require_plugin;

/// The size of the loops: 3 training batches (the last of 8 items) and 2 validation batches
/// (the last of 8) per epoch.
const SIZE: [&str; 6] = [
    "--train-items",
    "40",
    "--valid-items",
    "24",
    "--batch",
    "16",
];

/// Runs `hlat bench learner` for `epochs` on `backends` (the `tasks`) with the `loops` and
/// `--profile profile`, and returns its JSON report and the folder it ran in.
fn bench_learner(
    epochs: &str,
    backends: &str,
    tasks: &str,
    loops: &str,
) -> (serde_json::Value, tempfile::TempDir) {
    let folder = tempfile::tempdir().unwrap();
    let output = super::hlat()
        .args([
            "bench",
            "learner",
            "--backends",
            backends,
            "--baseline",
            "xla",
        ])
        .args([
            "--epochs",
            epochs,
            "--json",
            "learner.json",
            "--loops",
            loops,
            "--tasks",
            tasks,
        ])
        .args(["--profile", "profile"])
        .args(SIZE)
        .current_dir(folder.path())
        .output()
        .expect("running hlat");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report =
        serde_json::from_slice(&std::fs::read(folder.path().join("learner.json")).unwrap())
            .unwrap();
    (report, folder)
}

/// The phases of the profile summary a worker wrote, by name: (seconds, count).
fn worker_phases(
    folder: &std::path::Path,
    worker: &str,
) -> std::collections::HashMap<String, (f64, u64)> {
    let path = folder.join("profile").join(worker).join("summary.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    ["in_steps", "outside_steps"]
        .iter()
        .flat_map(|part| summary[part].as_array().unwrap().clone())
        .map(|phase| {
            (
                phase["phase"].as_str().unwrap().to_string(),
                (
                    phase["seconds"].as_f64().unwrap(),
                    phase["count"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

/// The result of `task` on `backend` in `report` (one loop per report).
fn result<'a>(report: &'a serde_json::Value, task: &str, backend: &str) -> &'a serde_json::Value {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|result| result["task"] == task && result["backend"] == backend)
        .unwrap_or_else(|| panic!("no {task} on {backend} in {report}"))
}

/// The losses of a run, training then validation items.
fn losses(run: &serde_json::Value) -> Vec<f64> {
    ["train", "valid"]
        .iter()
        .flat_map(|split| run["loss"][split].as_array().unwrap().clone())
        .map(|value| value.as_f64().unwrap())
        .collect()
}

#[test]
fn a_learner_loop_runs_a_fixed_number_of_segments_and_trains_as_ndarray_does() {
    require_plugin();
    let (report, folder) = bench_learner("2", "xla,ndarray", "recurrent,cnn", "learner");
    // (task, segments a batch, programs compiled cold for 2 epochs). Every batch, training or
    // validation, runs as one program through its loss, whatever the timing of the metrics
    // thread, whose mean of the loss joins that program; the CNN's accuracy metric reads after
    // it, as a small program of its own. Programs: a first batch (also the first after each
    // validation), the first update (Adam's moments made) into the next batch, a steady update,
    // the update into the partial last batch, the partial batch's update into validation's
    // first batch, and validation's partial batch; the CNN's accuracy on a full and a partial
    // batch.
    for (task, segments_per_batch, programs) in [("recurrent", 1, 6), ("cnn", 2, 8)] {
        let xla = result(&report, task, "xla");
        let warm = &xla["warm"];
        // Each worker records its own profile under `--profile`: the warm `xla` run loads every
        // program from the cache and compiles none, the cold one compiles them.
        let cold_phases = worker_phases(folder.path(), &format!("the-{task}-task-cold-on-xla"));
        let warm_phases = worker_phases(folder.path(), &format!("the-{task}-task-warm-on-xla"));
        assert_eq!(
            warm_phases.get("cache load").map(|phase| phase.1),
            warm["programs_loaded"].as_u64(),
            "{warm_phases:?}"
        );
        assert!(!warm_phases.contains_key("compile"), "{warm_phases:?}");
        assert_eq!(
            cold_phases.get("compile").map(|phase| phase.1),
            xla["cold"]["compiles"].as_u64(),
            "{cold_phases:?}"
        );
        assert!(warm_phases["execute"].0 > 0.0, "{warm_phases:?}");
        worker_phases(folder.path(), &format!("the-{task}-task-cold-on-ndarray"));
        assert_eq!(warm["host_fallbacks"], 0, "{xla}");
        let iterations =
            warm["train_iterations"].as_u64().unwrap() + warm["valid_iterations"].as_u64().unwrap();
        assert_eq!(iterations, 2 * 5);
        assert_eq!(
            warm["segments"].as_u64(),
            Some(segments_per_batch * iterations),
            "{xla}"
        );
        assert_eq!(xla["cold"]["compiles"], programs, "{xla}");
        assert_eq!(xla["cold"]["segments"], warm["segments"], "{xla}");
        assert_eq!(warm["compiles"], 0, "{xla}");
        assert_eq!(warm["programs_loaded"], xla["cold"]["compiles"], "{xla}");

        let reference = losses(&result(&report, task, "ndarray")["warm"]);
        let measured = losses(warm);
        assert_eq!(measured.len(), iterations as usize, "{xla}");
        assert_eq!(measured.len(), reference.len(), "{xla}");
        for (measured, reference) in measured.iter().zip(&reference) {
            assert!(
                (measured - reference).abs() <= 1e-4 * reference.abs().max(1.0),
                "{task}: {measured} against NdArray's {reference}"
            );
        }
    }
}

/// Burn's examples' own loop, written by hand (each batch's loss read before `backward`, a
/// validation pass on `model.valid()`), compiles few programs cold — six at these sizes (full
/// and partial batches, with and without the update before them, training and validation),
/// where each would be a `neuronx-cc` compile of minutes on Neuron — none warm, and trains as
/// Flex does.
#[test]
fn a_loop_written_as_burns_examples_write_it_compiles_a_few_programs_and_trains_as_flex_does() {
    require_plugin();
    let (report, _folder) = bench_learner("2", "xla,flex", "recurrent,cnn", "written");
    for task in ["recurrent", "cnn"] {
        let xla = result(&report, task, "xla");
        assert_eq!(xla["training_loop"], "written", "{xla}");
        let warm = &xla["warm"];
        assert_eq!(xla["cold"]["compiles"], 6, "{xla}");
        assert_eq!(warm["compiles"], 0, "{xla}");
        assert_eq!(warm["host_fallbacks"], 0, "{xla}");
        let iterations =
            warm["train_iterations"].as_u64().unwrap() + warm["valid_iterations"].as_u64().unwrap();
        assert_eq!(iterations, 2 * 5);
        // One program a batch: the read of each loss runs the step up to it.
        assert_eq!(warm["segments"].as_u64(), Some(iterations), "{xla}");
        let reference = losses(&result(&report, task, "flex")["warm"]);
        let measured = losses(warm);
        assert_eq!(measured.len(), iterations as usize, "{xla}");
        for (measured, reference) in measured.iter().zip(&reference) {
            assert!(
                (measured - reference).abs() <= 1e-4 * reference.abs().max(1.0),
                "{task}: {measured} against Flex's {reference}"
            );
        }
    }
}

/// Burn's modern-lstm as written (a step of thousands of small operations, dropout, its
/// validation loader on `Device::default()`) trains on `xla` and `host` made Burn's default
/// device in process (`burn_trainium::set_default_device`: without it the validation batches
/// would land on Flex and Burn would stop at the first one). The `xla` device keeps every program
/// it compiled or loaded: a cold run compiles each once and loads none, a warm run loads each
/// once and compiles none (the programs hold more instructions together than the device once
/// kept, and each step loaded its programs from disk again, seconds each). `host` draws dropout
/// from Flex's generator and trains as Flex does; `xla` draws its own and trains alike.
#[test]
fn burns_modern_lstm_as_written_trains_on_the_default_device_loading_each_program_once() {
    require_plugin();
    let (report, _folder) = bench_learner("2", "xla,host,flex", "modern-lstm", "written");
    let xla = result(&report, "modern-lstm", "xla");
    let (cold, warm) = (&xla["cold"], &xla["warm"]);
    let iterations =
        warm["train_iterations"].as_u64().unwrap() + warm["valid_iterations"].as_u64().unwrap();
    assert_eq!(iterations, 2 * 5);
    assert_eq!(cold["compiles"], PROGRAMS, "{xla}");
    assert_eq!(cold["programs_loaded"], 0, "{xla}");
    assert_eq!(warm["compiles"], 0, "{xla}");
    assert_eq!(warm["programs_loaded"], PROGRAMS, "{xla}");
    assert_eq!(warm["segments"], cold["segments"], "{xla}");
    assert_eq!(warm["host_fallbacks"], 0, "{xla}");

    let flex_run = &result(&report, "modern-lstm", "flex")["warm"];
    let flex = losses(flex_run);
    let host = losses(&result(&report, "modern-lstm", "host")["warm"]);
    assert_eq!(host.len(), iterations as usize);
    for (host, flex) in host.iter().zip(&flex) {
        assert!(
            (host - flex).abs() <= 1e-4 * flex.abs().max(1.0),
            "{host} against Flex's {flex}"
        );
    }
    // Other dropout masks: the validation losses of the last epoch within 5% of Flex's.
    let valid = |run: &serde_json::Value| -> f64 {
        let values = run["loss"]["valid"].as_array().unwrap();
        values[values.len() - 2..]
            .iter()
            .map(|value| value.as_f64().unwrap())
            .sum()
    };
    let (xla_valid, flex_valid) = (valid(warm), valid(flex_run));
    assert!(
        (xla_valid - flex_valid).abs() <= 0.05 * flex_valid,
        "{xla_valid} against Flex's {flex_valid}"
    );
}

/// The programs Burn's modern-lstm compiles on `xla` in 2 epochs at [`SIZE`]: its steps of
/// small tensors are cut every 2,048 operations on a CPU plugin.
const PROGRAMS: u64 = 17;
