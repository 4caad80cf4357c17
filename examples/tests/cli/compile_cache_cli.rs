//! The `xla` executor's persistent compile cache: a second run of the same job, in another
//! process, loads every program from the cache and compiles nothing.

use burn_trainium::XLA_CACHE_ENV;

/// Runs a 3-step `hlat pretrain` of `hlat-test` on `xla:0` into `out` with the compile cache in
/// `cache`; returns the `compiles` of its last metrics record.
fn pretrain_compiles(out: &std::path::Path, cache: &std::path::Path) -> u64 {
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
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    last["compiles"]
        .as_u64()
        .expect("compiles in metrics.jsonl")
}

#[test]
fn a_second_xla_run_loads_its_programs_from_the_cache() {
    let folder = tempfile::tempdir().unwrap();
    let cache = folder.path().join("cache");
    let first = pretrain_compiles(&folder.path().join("first"), &cache);
    assert!(first > 0, "the first run compiles its programs");
    // The last step's record counts the compiles until then; the run may compile more after it
    // (its final checkpoint reads).
    let entries = std::fs::read_dir(&cache).unwrap().count() as u64;
    assert!(
        entries >= first,
        "{entries} cache entries, {first} compiles"
    );
    let second = pretrain_compiles(&folder.path().join("second"), &cache);
    assert_eq!(second, 0, "the second run compiles nothing");
}
