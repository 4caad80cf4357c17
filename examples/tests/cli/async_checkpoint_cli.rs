//! Checkpoints written in the background (`hlat pretrain --async-checkpoint`): a run resumed from
//! them trains on as a run never stopped; a process killed (SIGKILL) before, during or right after
//! a background write resumes from the last complete checkpoint with the losses of a run never
//! killed; a write that fails stops the run naming the file, or, with
//! `--continue-on-checkpoint-error`, is reported while training goes on.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use hlat::checkpoint::run_folder::RunFolder;

use super::disk_faults::{DiskFault, hlat_with};
use super::{NO_VARIABLES, as_strs, losses, run_flags, succeed_in, wait_until};

/// The steps of the runs here: a checkpoint every 2 ([`run_flags`]), the one of step 4 faulted.
const STEPS: &str = "8";

/// `hlat pretrain` of the short run into `out` to `max_steps`, writing checkpoints in the
/// background, with `extra` flags.
fn background_run(out: &str, max_steps: &str, extra: &[&str]) -> Vec<String> {
    [
        &run_flags("pretrain", "host", max_steps)[..],
        &["--out", out, "--async-checkpoint"],
        extra,
    ]
    .concat()
    .into_iter()
    .map(String::from)
    .collect()
}

/// The losses of the run never stopped, written synchronously, in `work/whole`.
fn uninterrupted_losses(work: &Path) -> Vec<f64> {
    let flags = [
        &run_flags("pretrain", "host", STEPS)[..],
        &["--out", "whole"],
    ]
    .concat();
    succeed_in(work, &flags, NO_VARIABLES);
    losses(&work.join("whole"))
}

/// Asserts that two runs' losses agree to 1e-6.
fn assert_same_losses(found: &[f64], expected: &[f64], what: &str) {
    assert_eq!(
        found.len(),
        expected.len(),
        "{what}: {found:?} vs {expected:?}"
    );
    for (step, (found, expected)) in found.iter().zip(expected).enumerate() {
        assert!(
            (found - expected).abs() <= 1e-6,
            "{what}: step {} loss {found} against {expected}",
            step + 1
        );
    }
}

/// The newest complete checkpoint of the run folder `run`.
fn newest(run: &Path) -> Option<PathBuf> {
    RunFolder::new(run).newest().unwrap()
}

#[test]
fn a_run_resumed_from_background_checkpoints_trains_as_one_never_stopped() {
    let folder = tempfile::tempdir().unwrap();
    let work = folder.path();
    let expected = uninterrupted_losses(work);
    let first = succeed_in(
        work,
        &as_strs(&background_run("run", "4", &[])),
        NO_VARIABLES,
    );
    assert!(first.contains("step-00000004"), "{first}");
    let resumed = succeed_in(
        work,
        &as_strs(&background_run("run", STEPS, &[])),
        NO_VARIABLES,
    );
    assert!(resumed.contains("trained steps 5..8"), "{resumed}");
    assert_same_losses(&losses(&work.join("run")), &expected, "resumed");
    let held: Vec<f64> = test_support::training::logged_steps(&work.join("run"))
        .iter()
        .filter_map(|step| step.checkpoint_seconds)
        .collect();
    assert_eq!(held.len(), 4, "a checkpoint time at steps 2, 4, 6 and 8");
}

#[test]
fn a_run_killed_before_during_or_right_after_a_background_write_resumes_as_never_killed() {
    let folder = tempfile::tempdir().unwrap();
    let work = folder.path();
    let expected = uninterrupted_losses(work);
    let marker = work.join("stalled");
    let points = [
        (
            "before its first file",
            DiskFault::StallWrite {
                path: ".tmp-step-00000004/",
                marker: &marker,
            },
        ),
        (
            "during it: the model written, the optimizer state not",
            DiskFault::StallWrite {
                path: "step-00000004/optimizer",
                marker: &marker,
            },
        ),
        (
            "after its last file, before it is renamed into place",
            DiskFault::StallRename {
                path: "checkpoints/.tmp-step-00000004",
                marker: &marker,
            },
        ),
    ];
    for (index, (point, fault)) in points.iter().enumerate() {
        let out = format!("killed-{index}");
        let flags = background_run(&out, STEPS, &[]);
        let mut child = hlat_with(work, &as_strs(&flags), fault)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting hlat");
        wait_until(
            Duration::from_secs(300),
            &format!("{point}: the write stalling"),
            || {
                if let Some(status) = child.try_wait().unwrap() {
                    let mut stderr = String::new();
                    child
                        .stderr
                        .take()
                        .unwrap()
                        .read_to_string(&mut stderr)
                        .unwrap();
                    panic!("{point}: hlat ended ({status}) before the write stalled:\n{stderr}");
                }
                marker.exists()
            },
        );
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_file(&marker).unwrap();
        let run = work.join(&out);
        assert_eq!(
            newest(&run),
            Some(RunFolder::new(&run).step_dir(2)),
            "{point}: killed while step 4's checkpoint was written"
        );
        let resumed = succeed_in(work, &as_strs(&flags), NO_VARIABLES);
        assert!(resumed.contains("trained steps 3..8"), "{point}: {resumed}");
        assert_same_losses(&losses(&run), &expected, point);
    }
}

#[test]
fn a_background_write_that_fails_stops_the_run_naming_the_file_unless_told_to_go_on() {
    let folder = tempfile::tempdir().unwrap();
    let work = folder.path();
    let expected = uninterrupted_losses(work);
    let failing = DiskFault::FailUnder(".tmp-step-00000004/");

    let stopped = hlat_with(
        work,
        &as_strs(&background_run("stopped", STEPS, &[])),
        &failing,
    )
    .output()
    .expect("running hlat");
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert_eq!(stopped.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("stopped/checkpoints/.tmp-step-00000004/")
            && stderr.contains("No space left on device"),
        "the failed file is not named: {stderr}"
    );
    let run = work.join("stopped");
    assert_eq!(newest(&run), Some(RunFolder::new(&run).step_dir(2)));
    // The write fails at once: the step after it stops the run (before its metrics are logged),
    // or, if the failure comes later, the next checkpoint, waiting for it, does.
    let trained = losses(&run).len();
    assert!((4..=5).contains(&trained), "trained {trained} steps");
    assert_same_losses(&losses(&run), &expected[..trained], "stopped");

    let flags = background_run("goes-on", STEPS, &["--continue-on-checkpoint-error"]);
    let went_on = hlat_with(work, &as_strs(&flags), &failing)
        .output()
        .expect("running hlat");
    let stderr = String::from_utf8_lossy(&went_on.stderr);
    assert!(went_on.status.success(), "{stderr}");
    assert!(
        stderr.contains("the checkpoint of step 4 was not written, training goes on"),
        "{stderr}"
    );
    let run = work.join("goes-on");
    assert_eq!(newest(&run), Some(RunFolder::new(&run).step_dir(8)));
    assert_same_losses(&losses(&run), &expected, "went on");

    // The last checkpoint is never given up.
    let failing_last = DiskFault::FailUnder(".tmp-step-00000008/");
    let flags = background_run("last", STEPS, &["--continue-on-checkpoint-error"]);
    let lost_last = hlat_with(work, &as_strs(&flags), &failing_last)
        .output()
        .expect("running hlat");
    let stderr = String::from_utf8_lossy(&lost_last.stderr);
    assert_eq!(lost_last.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the checkpoint of step 8 could not be written")
            && stderr.contains("the newest written is step 6's"),
        "{stderr}"
    );
}

#[test]
fn sigterm_stops_a_run_after_a_step_that_it_checkpoints_once_the_write_under_way_is_done() {
    let folder = tempfile::tempdir().unwrap();
    let work = folder.path();
    let expected = uninterrupted_losses(work);
    // Each checkpoint takes seconds to write, so that one is under way when the signal comes.
    let slow = DiskFault::SlowUnder {
        path: "checkpoints/.tmp-step-",
        millis: 200,
    };
    let flags = background_run("run", STEPS, &[]);
    let child = hlat_with(work, &as_strs(&flags), &slow)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting hlat");
    let run = work.join("run");
    wait_until(Duration::from_secs(300), "step 3", || {
        std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |text| text.lines().count())
            >= 3
    });
    // SAFETY: `kill` sends a signal to the child process, which this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("SIGTERM: stopping after this step"),
        "{stderr}"
    );
    assert!(
        stderr.contains("waiting for the checkpoint of step"),
        "the run did not wait for its write: {stderr}"
    );
    let stopped = losses(&run).len();
    assert!(stopped < 8, "the run went on to its end after SIGTERM");
    assert_eq!(
        newest(&run),
        Some(RunFolder::new(&run).step_dir(stopped as u64)),
        "the step reached is the newest checkpoint"
    );
    let resumed = succeed_in(work, &as_strs(&flags), NO_VARIABLES);
    assert!(
        resumed.contains(&format!("trained steps {}..8", stopped + 1)),
        "{resumed}"
    );
    assert_same_losses(&losses(&run), &expected, "stopped by SIGTERM");
}
