//! `hlat bench` runs end to end (a smoke test: no timing is asserted).

use std::process::Command;

fn hlat(arguments: &[&str], folder: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hlat"))
        .args(arguments)
        .current_dir(folder)
        .output()
        .expect("running hlat")
}

#[test]
fn bench_train_measures_each_backend_and_writes_json() {
    let folder = tempfile::tempdir().unwrap();
    let output = hlat(
        &[
            "bench",
            "train",
            "--preset",
            "hlat-test",
            "--backends",
            "host,ndarray",
            "--baseline",
            "ndarray",
            "--warmup",
            "1",
            "--steps",
            "1",
            "--batch",
            "1",
            "--seq-len",
            "8",
            "--json",
            "train.json",
        ],
        folder.path(),
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(folder.path().join("train.json")).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    let backends: Vec<&str> = results
        .iter()
        .map(|result| result["backend"].as_str().unwrap())
        .collect();
    assert_eq!(backends, ["host", "ndarray"]);
    // Both backends trained the same model on the same batch.
    let losses: Vec<f64> = results
        .iter()
        .map(|result| result["final_loss"].as_f64().unwrap())
        .collect();
    assert!(
        (losses[0] - losses[1]).abs() < 1e-3 * losses[1].abs(),
        "{losses:?}"
    );
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("| host |") && table.contains("1.00×"),
        "{table}"
    );
}

#[test]
fn bench_ops_measures_each_operation() {
    let folder = tempfile::tempdir().unwrap();
    let output = hlat(
        &[
            "bench",
            "ops",
            "--preset",
            "hlat-test",
            "--backends",
            "host",
            "--batch",
            "1",
            "--seq-len",
            "8",
            "--repeats",
            "1",
            "--json",
            "ops.json",
        ],
        folder.path(),
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(folder.path().join("ops.json")).unwrap()).unwrap();
    let operations: Vec<&str> = results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["operation"].as_str().unwrap())
        .collect();
    for expected in ["matmul", "softmax", "rmsnorm", "causal attention"] {
        assert!(
            operations.iter().any(|name| name.starts_with(expected)),
            "{expected} missing: {operations:?}"
        );
    }
}

#[test]
fn an_unknown_backend_is_a_clear_error() {
    let folder = tempfile::tempdir().unwrap();
    let output = hlat(&["bench", "train", "--backends", "tpu"], folder.path());
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown backend `tpu`"), "{stderr}");
}
