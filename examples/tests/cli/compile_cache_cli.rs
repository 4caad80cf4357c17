//! The `xla` executor's persistent compile cache: a second run of the same job, in another
//! process, loads every program from the cache and compiles nothing.

use burn_trainium::XLA_CACHE_ENV;

/// Runs a 3-step `hlat pretrain` of `hlat-test` on `xla:0` into `out` with the compile cache in
/// `cache`; returns the `compiles` and `compile_seconds` of its last metrics record.
fn pretrain_compiles(out: &std::path::Path, cache: &std::path::Path) -> (u64, f64) {
    let output = super::hlat()
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
            "--seq-len",
            "16",
            "--batch-tokens",
            "64",
            "--micro-batch-rows",
            "4",
            "--eval-every",
            "0",
            "--checkpoint-every",
            "3",
            "--no-progress",
        ])
        .env(XLA_CACHE_ENV, cache)
        .output()
        .expect("running hlat");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = metrics
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
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
    let entries = std::fs::read_dir(&cache).unwrap().count() as u64;
    assert!(
        entries >= first,
        "{entries} cache entries, {first} compiles"
    );
    let second = pretrain_compiles(&folder.path().join("second"), &cache);
    assert_eq!(second, (0, 0.0), "the second run compiles nothing");
}
