//! `--profile DIR`: a Chrome/Perfetto trace of every phase of a run, and a per-phase summary
//! that adds up to the steps' time.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::{hlat, require_plugin};

/// The phases' own time in `trace.json`: the events parse, every begin has its end on the same
/// thread in stack order (spans nest), and each phase's own time (its spans' time less their
/// children's) is added up, in seconds.
fn own_times(trace: &Path) -> BTreeMap<String, f64> {
    let events: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(trace).unwrap()).expect("trace.json parses");
    let mut stacks: BTreeMap<u64, Vec<(String, f64, f64)>> = BTreeMap::new();
    let mut times: BTreeMap<String, f64> = BTreeMap::new();
    for event in &events {
        let (Some(phase), Some(name)) = (event["ph"].as_str(), event["name"].as_str()) else {
            continue;
        };
        let thread = event["tid"].as_u64().unwrap();
        let stack = stacks.entry(thread).or_default();
        match phase {
            "B" => stack.push((name.to_string(), event["ts"].as_f64().unwrap(), 0.0)),
            "E" => {
                let (open, start, children) = stack.pop().expect("an end after its begin");
                assert_eq!(open, name, "spans nest on thread {thread}");
                let total = (event["ts"].as_f64().unwrap() - start) * 1e-6;
                *times.entry(open).or_default() += total - children;
                if let Some(parent) = stack.last_mut() {
                    parent.2 += total;
                }
            }
            _ => {}
        }
    }
    for (thread, stack) in stacks {
        assert!(
            stack.is_empty(),
            "spans left open on thread {thread}: {stack:?}"
        );
    }
    times
}

/// Runs `hlat pretrain` for 3 steps with `flags` and `--profile`, with `environment`: the
/// phases' own times in its trace, its printed output, its summary and its `metrics.jsonl`.
fn profiled_run(
    folder: &Path,
    flags: &[&str],
    environment: &[(&str, &str)],
) -> (BTreeMap<String, f64>, String, Value, Vec<Value>) {
    let out = folder.join("run");
    let profile = folder.join("profile");
    let mut command = hlat();
    command
        .args(["pretrain", "--max-steps", "3", "--no-progress", "--out"])
        .arg(&out)
        .arg("--profile")
        .arg(&profile)
        .args(flags);
    for (name, value) in environment {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(profile.join("summary.json")).unwrap())
            .unwrap();
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (
        own_times(&profile.join("trace.json")),
        stdout,
        summary,
        metrics,
    )
}

/// Three steps on `xla`: every phase of a step is in the trace with time of its own, and the
/// summary's phases add up to the step time `metrics.jsonl` measured, within 10%. On `host` with
/// two data-parallel replicas the collectives have spans of their own; an operation kept on the
/// host (`TRAINIUM_HOST_OPERATIONS`) has its host-fallback span.
#[test]
fn a_profile_traces_every_phase_and_adds_up_to_the_steps() {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let (times, stdout, summary, metrics) =
        profiled_run(&folder.path().join("xla"), &["--device", "xla"], &[]);
    for phase in [
        "step",
        "data",
        "optimizer",
        "capture",
        "fingerprint",
        "lower",
        "compile",
        "execute",
        "transfer to device",
        "transfer to host",
        "validation",
        "checkpoint",
    ] {
        let time = times.get(phase).copied().unwrap_or_default();
        assert!(time > 0.0, "phase `{phase}`: {time} s in {times:?}");
    }
    assert!(stdout.contains("3 steps, "), "{stdout}");
    let phases: f64 = summary["in_steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|phase| phase["seconds"].as_f64().unwrap())
        .sum();
    // The steps as the trainer measured them: tokens over tokens per second.
    let measured: f64 = metrics
        .iter()
        .map(|step| step["tokens"].as_f64().unwrap() / step["tokens_per_s"].as_f64().unwrap())
        .sum();
    assert_eq!(summary["steps"], 3);
    assert!(
        (phases - measured).abs() <= 0.1 * measured,
        "the phases add up to {phases} s, the steps took {measured} s"
    );

    let (times, ..) = profiled_run(
        &folder.path().join("host"),
        &["--device", "host", "--dp", "2"],
        &[],
    );
    assert!(
        times.get("collective").copied().unwrap_or_default() > 0.0,
        "{times:?}"
    );
    let (times, ..) = profiled_run(
        &folder.path().join("fallback"),
        &["--device", "xla"],
        &[("TRAINIUM_HOST_OPERATIONS", "Float::Exp")],
    );
    assert!(
        times.get("host fallback").copied().unwrap_or_default() > 0.0,
        "{times:?}"
    );
}
