//! Kill and resume: a run interrupted after its last checkpoint and started again in the same
//! folder produces the same losses as an uninterrupted run.

use std::path::Path;

use hlat_train::config::TrainConfig;
use hlat_train::precision::Precision;
use hlat_train::pretrain::{DataChoice, DeviceInfo, PretrainOptions, pretrain};
use hlat_train::schedule::WarmupCosine;
use test_support::training::logged_steps;

fn options(out: &Path, max_steps: u64) -> PretrainOptions {
    PretrainOptions {
        config: TrainConfig {
            preset: "hlat-test".into(),
            lr: 5e-3,
            warmup_steps: 2,
            // The schedule must not depend on where a run stops.
            decay_steps: Some(6),
            max_steps,
            seq_len: 16,
            batch_tokens: 16 * 8,
            micro_batch_rows: 4,
            precision: Precision::F32,
            checkpoint_every: 3,
            keep_checkpoints: 2,
            eval_every: 3,
            eval_rows: 4,
            progress: false,
            ..TrainConfig::default()
        },
        out: out.to_path_buf(),
        data: DataChoice::Builtin,
        init_from: None,
        init_adapter: None,
        share: hlat_train::checkpoint_state::ProcessShare::WHOLE,
    }
}

fn run(out: &Path, max_steps: u64) -> Vec<f64> {
    run_with(options(out, max_steps))
}

fn run_with(options: PretrainOptions) -> Vec<f64> {
    // The project's own device, the host executor: its reductions run in a fixed order, so two
    // runs of the same steps give bit-identical losses.
    pretrain(&options, &crate::host(), DeviceInfo { compiles: None })
        .unwrap()
        .losses
}

#[test]
fn resumed_run_matches_uninterrupted_run() {
    let _random = crate::exclusive_random();
    let uninterrupted = tempfile::tempdir().unwrap();
    let reference = run(uninterrupted.path(), 6);
    assert_eq!(reference.len(), 6);

    let interrupted = tempfile::tempdir().unwrap();
    let first = run(interrupted.path(), 4);
    assert_eq!(first[..], reference[..4]);

    // Simulate a kill after step 4, before its checkpoint became visible: the step-4 folder is
    // gone though `newest` still names it; a half-written folder and one without state are
    // left behind.
    let checkpoints = interrupted.path().join("checkpoints");
    std::fs::remove_dir_all(checkpoints.join("step-00000004")).unwrap();
    std::fs::create_dir_all(checkpoints.join(".tmp-step-00000005/model")).unwrap();
    std::fs::create_dir_all(checkpoints.join("step-00000009/model")).unwrap();

    let resumed = run(interrupted.path(), 6);
    assert_eq!(resumed.len(), 3, "the run resumes after step 3");
    assert_eq!(resumed[..], reference[3..]);

    // The metrics log holds every step once, as the uninterrupted run's does.
    let steps: Vec<u64> = logged_steps(interrupted.path())
        .iter()
        .map(|metrics| metrics.step)
        .collect();
    assert_eq!(steps, (1..=6).collect::<Vec<_>>());
    let losses: Vec<f64> = logged_steps(uninterrupted.path())
        .iter()
        .map(|metrics| metrics.loss)
        .collect();
    assert_eq!(losses, reference);

    // Only the last two complete checkpoints are kept; leftovers are cleared.
    let mut names: Vec<String> = std::fs::read_dir(&checkpoints)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["newest", "step-00000003", "step-00000006", "step-00000009"]
    );
    assert_eq!(
        std::fs::read_to_string(checkpoints.join("newest")).unwrap(),
        "step-00000006"
    );

    // A finished run started again has nothing to do.
    assert!(run(interrupted.path(), 6).is_empty());
}

/// `--max-steps` is the schedule's length: a finished run started again with a larger value
/// continues on the longer schedule (the learning rate rises from the old floor), not on the
/// checkpoint's.
#[test]
fn a_longer_max_steps_continues_on_the_longer_schedule() {
    let _random = crate::exclusive_random();
    let out = tempfile::tempdir().unwrap();
    let with_length = |max_steps| {
        let mut options = options(out.path(), max_steps);
        options.config.decay_steps = None;
        options
    };
    run_with(with_length(3));
    let resumed = run_with(with_length(6));
    assert_eq!(resumed.len(), 3);
    let config = with_length(6).config;
    let longer = WarmupCosine {
        peak: config.lr,
        warmup_steps: config.warmup_steps,
        decay_steps: 6 - config.warmup_steps,
        min_ratio: config.min_lr_ratio,
    };
    let rates: Vec<f64> = logged_steps(out.path())
        .iter()
        .map(|metrics| metrics.lr)
        .collect();
    assert_eq!(rates.len(), 6);
    for step in 4..=6 {
        let expected = longer.lr(step);
        let logged = rates[step as usize - 1];
        assert!(
            (logged - expected).abs() <= 1e-12 * expected,
            "step {step}: lr {logged}, the 6-step schedule's {expected}"
        );
    }
    // The 3-step schedule had reached its floor; the longer one has not.
    assert!(
        rates[3] > config.lr * config.min_lr_ratio * 1.5,
        "{rates:?}"
    );
}
