//! `TRAINIUM_SEGMENT_CAP` from the environment: more, smaller segments, the same results.

use burn_trainium::{DEVICE_ENV, SEGMENT_CAP_ENV};

use super::{fixture, hlat};

/// Greedy ids of three new tokens on `host` and the segments that ran, with `cap` set or not.
fn generate(cap: Option<&str>) -> (String, u64) {
    let model = fixture("hf-tiny-llama");
    let mut command = hlat();
    command.env_remove(DEVICE_ENV).env_remove(SEGMENT_CAP_ENV);
    if let Some(cap) = cap {
        command.env(SEGMENT_CAP_ENV, cap);
    }
    let output = command
        .args(["generate", "--model", model.to_str().unwrap()])
        .args([
            "--prompt-ids",
            "1,2,3",
            "--format",
            "ids",
            "--max-new-tokens",
            "3",
        ])
        .arg("--stats")
        .output()
        .expect("running hlat");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "hlat generate with cap {cap:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let ids = stdout.lines().next().unwrap_or_default().to_string();
    let segments = stdout
        .lines()
        .find_map(|line| line.strip_prefix("segments run: "))
        .unwrap_or_else(|| panic!("no `segments run` line in:\n{stdout}"))
        .parse()
        .unwrap();
    (ids, segments)
}

#[test]
fn a_segment_cap_from_the_environment_cuts_segments_without_changing_results() {
    let (ids, segments) = generate(None);
    let (capped_ids, capped_segments) = generate(Some("8"));
    assert_eq!(capped_ids, ids, "the cap must not change what is generated");
    assert!(
        capped_segments > 4 * segments,
        "a cap of 8 operations must run many more segments: {capped_segments} vs {segments}"
    );
}
