//! `scripts/device-check --short` on the XLA CPU plugin, standing in for an accelerator: every
//! step runs and the report holds each one's numbers; a failing step stops the check, naming it.

use std::path::Path;
use std::process::{Command, Output};

use super::require_plugin;

/// `scripts/device-check OUT --short` with the `hlat` under test (`hlat` overrides it).
fn device_check(out: &Path, hlat: &Path) -> Output {
    Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/device-check"
    ))
    .arg(out)
    .arg("--short")
    .env("HLAT", hlat)
    .env("TRAINIUM_PJRT_PLUGIN", test_support::plugin::plugin_path())
    .env_remove(burn_trainium::DEVICE_ENV)
    .output()
    .unwrap()
}

#[test]
fn the_device_check_runs_every_step_on_the_cpu_plugin_and_reports_them() {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let out = folder.path().join("out");
    let output = device_check(&out, Path::new(env!("CARGO_BIN_EXE_hlat")));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    let steps = &report["steps"];
    for step in [
        "plugin",
        "differential",
        "pretrain",
        "pretrain-unfused",
        "cache",
        "bench",
    ] {
        assert!(steps.get(step).is_some(), "no {step} in {report}");
    }
    let differential = &steps["differential"];
    assert_eq!(differential["steps"], 4, "{differential}");
    assert!(
        differential["max_relative_loss_difference"]
            .as_f64()
            .unwrap()
            <= 2e-2,
        "{differential}"
    );
    let pretrain = &steps["pretrain"];
    assert!(pretrain["compiles"].as_u64().unwrap() > 0, "{pretrain}");
    assert!(
        pretrain["last_loss"].as_f64() < pretrain["first_loss"].as_f64(),
        "{pretrain}"
    );
    // The MFU as the records count it (attention's products in full), as MaxText counts it
    // (causal attention half) and as 6·N alone.
    let mfu = |key: &str| {
        pretrain[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {pretrain}"))
    };
    assert!(
        0.0 < mfu("median_mfu_6n")
            && mfu("median_mfu_6n") < mfu("median_mfu_maxtext")
            && mfu("median_mfu_maxtext") < mfu("median_mfu"),
        "{pretrain}"
    );
    let unfused = &steps["pretrain-unfused"];
    assert_eq!(unfused["steps"], 3, "{unfused}");
    assert_eq!(steps["cache"]["compiles"], 0, "{report}");
    let rows = steps["bench"]["results"].as_array().unwrap();
    assert!(rows.iter().any(|row| row["backend"] == "xla"), "{report}");
    assert!(out.join("device-check.log").is_file());
}

#[test]
fn a_failing_step_stops_the_device_check_naming_it() {
    let folder = tempfile::tempdir().unwrap();
    let out = folder.path().join("out");
    let output = device_check(&out, Path::new("/bin/false"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("step `differential-host` failed"),
        "{stderr}"
    );
    assert!(!out.join("report.json").exists());
}
