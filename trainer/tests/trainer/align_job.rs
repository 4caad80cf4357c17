//! The job of `hlat align` (`pretrain` over `DataChoice::Preference`) on the TRL fixture
//! (`fixtures/align-tiny-llama3`): it trains the pairs its sampler draws, with the reference
//! log-probabilities it computes on the run's device, exactly as HLAT's optimizer step does on
//! them; `metrics.jsonl` holds every step's loss, rewards, margins and accuracy; data and tensor
//! parallelism (with sequence parallelism), ZeRO-1 and LoRA equal one device; a resumed run
//! equals an uninterrupted one.

use std::path::Path;
use std::sync::Arc;

use burn::tensor::Device;
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::lora::{LoraConfig, LoraTarget};
use hlat_train::align::{AlignMethod, DpoLoss, PreferenceObjective, PreferencePairs};
use hlat_train::checkpoint_state::ProcessShare;
use hlat_train::config::TrainConfig;
use hlat_train::data::{RowSource, Sampler};
use hlat_train::parallel::ParallelLayout;
use hlat_train::precision::Precision;
use hlat_train::pretrain::{DataChoice, DeviceInfo, PreferenceData, PretrainOptions, pretrain};
use test_support::training::logged_steps;

use super::align_trl::{examples, model, reference_log_probs, train};
use super::fixture;

/// Targets per row (the longest sequences are cut; every pair keeps completion tokens).
const SEQ_LEN: usize = 64;
/// The pad id of the rows (the tokenizer's EOS, as TRL pads).
const PAD_ID: u32 = 1001;
/// Pairs per optimizer step: one micro-batch of 8 rows.
const PAIRS_PER_STEP: usize = 4;
/// The run's seed: its sampler's order of pairs.
const SEED: u64 = 11;

/// DPO (against the fixture's reference model) and ORPO, both at β 0.1.
fn objectives() -> [(AlignMethod, PreferenceObjective); 2] {
    [
        (
            AlignMethod::Dpo,
            PreferenceObjective::Dpo {
                beta: 0.1,
                loss: DpoLoss::Sigmoid,
            },
        ),
        (AlignMethod::Orpo, PreferenceObjective::Orpo { beta: 0.1 }),
    ]
}

/// The fixture's pairs tokenized for `method`, as a run of `objective` lays them out.
fn pairs(method: AlignMethod, objective: PreferenceObjective) -> PreferencePairs {
    let examples = examples("prefs.jsonl", "llama3-tokenizer", method);
    let (pairs, dropped) = PreferencePairs::new(&examples, SEQ_LEN, PAD_ID, objective);
    assert_eq!(dropped, 0, "every pair keeps completion tokens");
    pairs
}

/// `max_steps` steps of the fixture's policy as the 10-step TRL test trains it (AdamW at a
/// constant 1e-3, betas 0.9 and 0.95, no weight decay nor clipping) in `layout`, one
/// micro-batch of [`PAIRS_PER_STEP`] pairs a step, into `out`.
fn options(
    out: &Path,
    data: PreferencePairs,
    layout: ParallelLayout,
    (max_steps, checkpoint_every): (u64, u64),
    lora: Option<LoraConfig>,
) -> PretrainOptions {
    let rows = 2 * PAIRS_PER_STEP;
    PretrainOptions {
        config: TrainConfig {
            lr: 1e-3,
            warmup_steps: 0,
            min_lr_ratio: 1.0,
            max_steps,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
            clip_grad_norm: 0.0,
            seq_len: SEQ_LEN,
            batch_tokens: SEQ_LEN * rows,
            micro_batch_rows: rows / layout.data,
            data_parallel: layout.data,
            tensor_parallel: layout.tensor,
            sequence_parallel: layout.sequence_parallel,
            zero1: layout.zero1,
            precision: Precision::F32,
            seed: SEED,
            checkpoint_every,
            keep_checkpoints: 2,
            eval_every: 0,
            progress: false,
            lora,
            ..TrainConfig::default()
        },
        out: out.to_path_buf(),
        data: DataChoice::Preference(PreferenceData {
            pairs: data,
            reference_model: Some(fixture("align-tiny-llama3/reference")),
        }),
        init_from: Some(fixture("hf-tiny-llama3")),
        init_adapter: None,
        share: ProcessShare::WHOLE,
    }
}

/// The pairs of each of `steps` steps as the run's sampler draws them.
fn drawn(pairs: &PreferencePairs, steps: usize) -> Vec<Vec<usize>> {
    let source: Arc<dyn RowSource> = Arc::new(pairs.clone());
    let mut sampler = Sampler::new(source, SEED).unwrap();
    (0..steps)
        .map(|_| {
            let rows = sampler.next_batch(PAIRS_PER_STEP);
            rows.iter().map(|row| row[0] as usize).collect()
        })
        .collect()
}

fn assert_close(found: f64, expected: f64, tolerance: f64, what: &str) {
    assert!(
        (found - expected).abs() <= tolerance * expected.abs().max(1.0),
        "{what}: {found}, expected {expected}"
    );
}

/// Four steps of the job give the losses, rewards, margins and accuracy of HLAT's optimizer
/// step trained on the pairs the run's sampler draws, against reference log-probabilities
/// computed by the library from the fixture's reference model; every step's line of
/// `metrics.jsonl` holds them.
#[test]
fn the_job_trains_the_pairs_its_sampler_draws() {
    let _random = super::exclusive_random();
    let steps = 4;
    for (method, objective) in objectives() {
        let pairs = pairs(method, objective);
        let order = drawn(&pairs, steps);
        assert_ne!(
            order[0], order[1],
            "the sampler draws different pairs each step"
        );
        let references = (method == AlignMethod::Dpo).then(|| {
            reference_log_probs(
                &model("align-tiny-llama3/reference"),
                pairs.examples(),
                SEQ_LEN,
            )
        });
        let expected = train(
            &super::host().autodiff(),
            ParallelLayout::SINGLE,
            (pairs.examples(), references.as_deref()),
            (SEQ_LEN, objective),
            &order,
        );
        let out = tempfile::tempdir().unwrap();
        let options = options(
            out.path(),
            pairs,
            ParallelLayout::SINGLE,
            (steps as u64, 0),
            None,
        );
        pretrain(&options, &super::host(), DeviceInfo::default()).unwrap();
        let logged = logged_steps(out.path());
        assert_eq!(logged.len(), steps);
        for (line, report) in logged.iter().zip(&expected) {
            let what = |name: &str| format!("{method:?} step {} {name}", line.step);
            let rewards = report
                .preference
                .expect("the library's step reports its rewards");
            assert_close(line.loss, report.loss, 1e-5, &what("loss"));
            let logged = |value: Option<f64>, name: &str| {
                value.unwrap_or_else(|| panic!("{}: missing from metrics.jsonl", what(name)))
            };
            let chosen = logged(line.rewards_chosen, "rewards_chosen");
            let rejected = logged(line.rewards_rejected, "rewards_rejected");
            let margins = logged(line.rewards_margins, "rewards_margins");
            let accuracy = logged(line.rewards_accuracies, "rewards_accuracies");
            assert_close(
                chosen,
                rewards.rewards_chosen,
                1e-5,
                &what("rewards_chosen"),
            );
            assert_close(
                rejected,
                rewards.rewards_rejected,
                1e-5,
                &what("rewards_rejected"),
            );
            assert_close(margins, chosen - rejected, 1e-5, &what("margins"));
            assert_eq!(accuracy, rewards.accuracy, "{}", what("accuracy"));
        }
        if method == AlignMethod::Dpo {
            // The reference differs from the policy: the first loss is not ln 2.
            assert!((logged[0].loss - std::f64::consts::LN_2).abs() > 1e-3);
        }
    }
}

/// DPO and ORPO under data parallelism, tensor parallelism with and without sequence
/// parallelism, and ZeRO-1 over `host` replicas, and LoRA on one device and under data and
/// tensor parallelism, equal one `host` device within 1e-4 over 4 steps of the job.
#[test]
fn preference_runs_under_every_layout_equal_one_device() {
    let _random = super::exclusive_random();
    let steps = 4;
    let two = super::trainium(TrainiumDevice::replicated(ExecutorKind::Host, 2));
    let single = ParallelLayout::SINGLE;
    let data = ParallelLayout { data: 2, ..single };
    let tensor = ParallelLayout {
        tensor: 2,
        ..single
    };
    let lora = LoraConfig {
        targets: LoraTarget::ALL.to_vec(),
        ..LoraConfig::new(4, 8.0)
    };
    for (method, objective) in [objectives()[0], objectives()[1]] {
        let run = |device: &Device, layout: ParallelLayout, lora: Option<LoraConfig>| {
            let out = tempfile::tempdir().unwrap();
            let options = options(
                out.path(),
                pairs(method, objective),
                layout,
                (steps, 0),
                lora,
            );
            pretrain(&options, device, DeviceInfo::default())
                .unwrap()
                .losses
        };
        for adapters in [None, Some(lora.clone())] {
            let one = run(&super::host(), single, adapters.clone());
            let mut layouts = vec![data, tensor];
            if adapters.is_none() {
                layouts.push(ParallelLayout {
                    sequence_parallel: true,
                    ..tensor
                });
                layouts.push(ParallelLayout {
                    zero1: true,
                    ..data
                });
            }
            for layout in layouts {
                let found = run(&two, layout, adapters.clone());
                assert_eq!(found.len(), one.len());
                for (step, (found, one)) in found.iter().zip(&one).enumerate() {
                    assert_close(
                        *found,
                        *one,
                        1e-4,
                        &format!(
                            "{method:?} {layout:?} LoRA {} step {}",
                            adapters.is_some(),
                            step + 1
                        ),
                    );
                }
            }
        }
    }
}

/// A DPO run stopped after its step-2 checkpoint and started again in its folder draws the same
/// pairs and computes the same reference: its losses equal an uninterrupted run's.
#[test]
fn a_resumed_preference_run_equals_an_uninterrupted_one() {
    let _random = super::exclusive_random();
    let (method, objective) = objectives()[0];
    let run = |out: &Path, max_steps| {
        let options = options(
            out,
            pairs(method, objective),
            ParallelLayout::SINGLE,
            (max_steps, 2),
            None,
        );
        pretrain(&options, &super::host(), DeviceInfo::default())
            .unwrap()
            .losses
    };
    let uninterrupted = tempfile::tempdir().unwrap();
    let whole = run(uninterrupted.path(), 4);
    let interrupted = tempfile::tempdir().unwrap();
    let first = run(interrupted.path(), 2);
    let rest = run(interrupted.path(), 4);
    assert_eq!([first, rest].concat(), whole);
}
