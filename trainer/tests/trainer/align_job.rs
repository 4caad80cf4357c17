//! The job of `hlat align` (`pretrain` over `DataChoice::Preference`) on the TRL fixture
//! (`fixtures/align-tiny-llama3`): it trains the pairs its sampler draws, in several
//! micro-batches a step, with the reference log-probabilities it computes on the run's device,
//! exactly as HLAT's optimizer step does on them; `metrics.jsonl` holds every step's loss,
//! rewards, margins and accuracy; data and tensor parallelism (with sequence parallelism),
//! ZeRO-1, LoRA and a mixture of experts' expert parallelism equal one device; a resumed run
//! equals an uninterrupted one, reusing the reference log-probabilities its folder pins, and a
//! run started again with other settings is refused naming them.

use std::path::Path;
use std::sync::Arc;

use burn::tensor::Device;
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::lora::{LoraConfig, LoraTarget};
use hlat_train::align::run_state::{PINNED_PAIRS_FILE, PinnedPairs};
use hlat_train::align::{AlignMethod, DpoLoss, PreferenceObjective, PreferencePairs};
use hlat_train::checkpoint_state::ProcessShare;
use hlat_train::config::TrainConfig;
use hlat_train::data::{RowSource, Sampler};
use hlat_train::metrics::StepMetrics;
use hlat_train::parallel::{ActivationCheckpointing, ParallelLayout};
use hlat_train::precision::Precision;
use hlat_train::pretrain::{DataChoice, DeviceInfo, PreferenceData, PretrainOptions, pretrain};
use test_support::training::logged_steps;

use super::align_trl::{examples, model, reference_log_probs, train};
use super::fixture;

/// Targets per row (the longest sequences are cut; every pair keeps completion tokens).
const SEQ_LEN: usize = 64;
/// The pad id of the rows (the tokenizer's EOS, as TRL pads).
const PAD_ID: u32 = 1001;
/// Pairs per optimizer step and per micro-batch (over every data-parallel replica) of the runs
/// compared with the optimizer step: two micro-batches a step, and a reference pass whose last
/// batch of 3 pairs is short (8 pairs).
const FIRST_SHAPE: RunShape = (6, 3);
/// The same of the runs compared across layouts: two micro-batches a step.
const LAYOUT_SHAPE: RunShape = (8, 4);

/// Pairs per optimizer step and per micro-batch, over every data-parallel replica.
type RunShape = (usize, usize);
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

/// A run of `max_steps` steps of `policy` (a fixture) as the 10-step TRL test trains it (AdamW
/// at a constant 1e-3, betas 0.9 and 0.95, no weight decay nor clipping) in `layout`, of
/// `shape`, into `out`.
fn options(
    out: &Path,
    (policy, data): (&str, PreferencePairs),
    (layout, shape): (ParallelLayout, RunShape),
    (max_steps, checkpoint_every): (u64, u64),
    lora: Option<LoraConfig>,
) -> PretrainOptions {
    let (pairs_per_step, pairs_per_micro_batch) = shape;
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
            batch_tokens: SEQ_LEN * 2 * pairs_per_step,
            micro_batch_rows: 2 * pairs_per_micro_batch / layout.data,
            data_parallel: layout.data,
            expert_parallel: layout.expert,
            tensor_parallel: layout.tensor,
            sequence_parallel: layout.sequence_parallel,
            zero1: layout.zero1,
            fsdp: layout.fsdp,
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
        init_from: Some(fixture(policy)),
        init_adapter: None,
        share: ProcessShare::WHOLE,
    }
}

/// The micro-batches of pairs of each of `steps` steps of `shape` on one device as the run's
/// sampler draws them.
fn drawn(pairs: &PreferencePairs, steps: usize, shape: RunShape) -> Vec<Vec<Vec<usize>>> {
    let source: Arc<dyn RowSource> = Arc::new(pairs.clone());
    let mut sampler = Sampler::new(source, SEED).unwrap();
    (0..steps)
        .map(|_| {
            let rows = sampler.next_batch(shape.0);
            let indices: Vec<usize> = rows.iter().map(|row| row[0] as usize).collect();
            indices.chunks(shape.1).map(<[usize]>::to_vec).collect()
        })
        .collect()
}

/// The rewards of a line of `metrics.jsonl`: chosen, rejected, margins, accuracy.
fn rewards(line: &StepMetrics) -> [f64; 4] {
    [
        line.rewards_chosen,
        line.rewards_rejected,
        line.rewards_margins,
        line.rewards_accuracies,
    ]
    .map(|value| value.unwrap_or_else(|| panic!("step {}: rewards missing", line.step)))
}

fn assert_close(found: f64, expected: f64, tolerance: f64, what: &str) {
    assert!(
        (found - expected).abs() <= tolerance * expected.abs().max(1.0),
        "{what}: {found}, expected {expected}"
    );
}

/// Runs the job of `options` on `device`; its losses.
fn run_job(options: &PretrainOptions, device: &Device) -> Vec<f64> {
    pretrain(options, device, DeviceInfo::default())
        .unwrap()
        .losses
}

/// Four steps of the job, each two micro-batches, give the losses, rewards, margins and accuracy
/// of HLAT's optimizer step trained on the pairs the run's sampler draws, against reference
/// log-probabilities computed by the library from the fixture's reference model (the job's
/// reference pass ends on a short batch); every step's line of `metrics.jsonl` holds them.
#[test]
fn the_job_trains_the_pairs_its_sampler_draws() {
    let _random = super::exclusive_random();
    let steps = 4;
    for (method, objective) in objectives() {
        let pairs = pairs(method, objective);
        assert_ne!(
            pairs.examples().len() % FIRST_SHAPE.1,
            0,
            "a short last batch"
        );
        let order = drawn(&pairs, steps, FIRST_SHAPE);
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
            (pairs.examples(), references.as_deref()),
            (SEQ_LEN, objective),
            &order,
        );
        let out = tempfile::tempdir().unwrap();
        let options = options(
            out.path(),
            ("hf-tiny-llama3", pairs),
            (ParallelLayout::SINGLE, FIRST_SHAPE),
            (steps as u64, 0),
            None,
        );
        run_job(&options, &super::host());
        let logged = logged_steps(out.path());
        assert_eq!(logged.len(), steps);
        for (line, report) in logged.iter().zip(&expected) {
            let what = |name: &str| format!("{method:?} step {} {name}", line.step);
            let library = report
                .preference
                .expect("the library's step reports its rewards");
            assert_close(line.loss, report.loss, 1e-5, &what("loss"));
            let [chosen, rejected, margins, accuracy] = rewards(line);
            assert_close(
                chosen,
                library.rewards_chosen,
                1e-5,
                &what("rewards_chosen"),
            );
            assert_close(
                rejected,
                library.rewards_rejected,
                1e-5,
                &what("rewards_rejected"),
            );
            assert_close(margins, chosen - rejected, 1e-5, &what("margins"));
            assert_eq!(accuracy, library.accuracy, "{}", what("accuracy"));
        }
        if method == AlignMethod::Dpo {
            // The reference differs from the policy: the first loss is not ln 2.
            assert!((logged[0].loss - std::f64::consts::LN_2).abs() > 1e-3);
        }
    }
}

/// Asserts that the run in `found` logged the losses and rewards of the run in `one` within
/// 1e-4.
fn assert_same_run(found: &Path, one: &Path, what: &str) {
    let (found, one) = (logged_steps(found), logged_steps(one));
    assert_eq!(found.len(), one.len(), "{what}");
    for (found, one) in found.iter().zip(&one) {
        let what = format!("{what} step {}", one.step);
        assert_close(found.loss, one.loss, 1e-4, &format!("{what} loss"));
        for (found, one) in rewards(found).iter().zip(rewards(one)) {
            assert_close(*found, one, 1e-4, &format!("{what} rewards"));
        }
    }
}

/// DPO and ORPO under data parallelism, tensor parallelism with and without sequence
/// parallelism, ZeRO-1 and fully sharded data parallelism (with and without selective activation
/// checkpointing) over `host` replicas, with full and selective activation checkpointing (the
/// stages' backward pass with the pairs' loss at the head), and LoRA on one device and under
/// data, fully sharded and tensor parallelism, equal one `host` device within 1e-4 over 4
/// steps of the job of two micro-batches each: the losses and every reward.
#[test]
fn preference_runs_under_every_layout_equal_one_device() {
    let _random = super::exclusive_random();
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
    let folder = tempfile::tempdir().unwrap();
    for (method, objective) in objectives() {
        let run = |name: &str, device: &Device, layout, lora: Option<LoraConfig>| {
            let out = folder.path().join(format!("{method:?}-{name}"));
            let mut options = options(
                &out,
                ("hf-tiny-llama3", pairs(method, objective)),
                (layout, LAYOUT_SHAPE),
                (4, 0),
                lora,
            );
            for (suffix, mode) in [
                ("-full", ActivationCheckpointing::Full),
                ("-selective", ActivationCheckpointing::Selective),
            ] {
                if name.ends_with(suffix) {
                    options.config.activation_checkpointing = mode;
                }
            }
            run_job(&options, device);
            out
        };
        for adapters in [None, Some(lora.clone())] {
            let kind = if adapters.is_some() { "lora" } else { "full" };
            let one = run(
                &format!("{kind}-one"),
                &super::host(),
                single,
                adapters.clone(),
            );
            let sharded = ParallelLayout { fsdp: true, ..data };
            let mut layouts = vec![
                ("dp2", data),
                ("tp2", tensor),
                ("dp2-fsdp", sharded),
                ("dp2-fsdp-selective", sharded),
            ];
            if adapters.is_none() {
                let sequence = ParallelLayout {
                    sequence_parallel: true,
                    ..tensor
                };
                layouts.push(("tp2-sp", sequence));
                layouts.push((
                    "dp2-zero1",
                    ParallelLayout {
                        zero1: true,
                        ..data
                    },
                ));
                layouts.push(("tp2-full", tensor));
            }
            for (name, layout) in layouts {
                let found = run(&format!("{kind}-{name}"), &two, layout, adapters.clone());
                assert_same_run(&found, &one, &format!("{method:?} {kind} {name}"));
            }
            for name in ["one-full", "one-selective"] {
                let found = run(
                    &format!("{kind}-{name}"),
                    &super::host(),
                    single,
                    adapters.clone(),
                );
                assert_same_run(&found, &one, &format!("{method:?} {kind} {name}"));
            }
        }
    }
}

/// DPO of a mixture of experts (the tiny Mixtral, its own reference: the first loss is ln 2)
/// with its experts split over two data-parallel replicas equals one device, its reference pass
/// included.
#[test]
fn a_mixture_aligns_with_its_experts_split_as_on_one_device() {
    let _random = super::exclusive_random();
    let (method, objective) = objectives()[0];
    let two = super::trainium(TrainiumDevice::replicated(ExecutorKind::Host, 2));
    let experts = ParallelLayout {
        data: 2,
        expert: 2,
        ..ParallelLayout::SINGLE
    };
    let folder = tempfile::tempdir().unwrap();
    let run = |name: &str, device: &Device, layout| {
        let out = folder.path().join(name);
        let mut options = options(
            &out,
            ("hf-tiny-mixtral", pairs(method, objective)),
            (layout, LAYOUT_SHAPE),
            (3, 0),
            None,
        );
        let DataChoice::Preference(data) = &mut options.data else {
            unreachable!()
        };
        data.reference_model = None;
        run_job(&options, device);
        out
    };
    let one = run("one", &super::host(), ParallelLayout::SINGLE);
    assert!((logged_steps(&one)[0].loss - std::f64::consts::LN_2).abs() < 1e-5);
    let split = run("ep2", &two, experts);
    assert_same_run(&split, &one, "Mixtral dp 2 ep 2");
}

/// A DPO run stopped after its step-2 checkpoint and started again in its folder draws the same
/// pairs and reuses the reference log-probabilities its folder pins: its losses equal an
/// uninterrupted run's, and changing the pinned values changes them. Started again with another
/// β, other pairs or another reference model, it is refused naming the pinned file.
#[test]
fn a_resumed_preference_run_equals_an_uninterrupted_one() {
    let _random = super::exclusive_random();
    let (method, objective) = objectives()[0];
    let shape = (ParallelLayout::SINGLE, FIRST_SHAPE);
    let options = |out: &Path, max_steps| {
        options(
            out,
            ("hf-tiny-llama3", pairs(method, objective)),
            shape,
            (max_steps, 2),
            None,
        )
    };
    let run = |out: &Path, max_steps| run_job(&options(out, max_steps), &super::host());
    let uninterrupted = tempfile::tempdir().unwrap();
    let whole = run(uninterrupted.path(), 4);
    let interrupted = tempfile::tempdir().unwrap();
    let first = run(interrupted.path(), 2);
    let rest = run(interrupted.path(), 4);
    assert_eq!([first, rest].concat(), whole);

    let pinned = interrupted.path().join(PINNED_PAIRS_FILE);
    let mut state = PinnedPairs::read(interrupted.path()).unwrap().unwrap();
    assert_eq!(state.pairs, 8);
    // The run computed the reference once; a run started again reads it from the folder.
    let reference = state.reference.as_mut().unwrap();
    // Lower every chosen completion's reference (a shift of both sides would cancel).
    reference
        .log_probs
        .iter_mut()
        .step_by(2)
        .for_each(|value| *value -= 1.0);
    state.write(interrupted.path()).unwrap();
    let changed = run(interrupted.path(), 5);
    let again = run(uninterrupted.path(), 5);
    assert_ne!(changed, again, "the pinned reference was not used");

    let refused = |options: PretrainOptions, what: &str| {
        let error = pretrain(&options, &super::host(), DeviceInfo::default())
            .err()
            .unwrap_or_else(|| panic!("{what}: not refused"))
            .to_string();
        assert!(error.contains(pinned.to_str().unwrap()), "{what}: {error}");
    };
    let mut other_beta = options(interrupted.path(), 6);
    let DataChoice::Preference(data) = &mut other_beta.data else {
        unreachable!()
    };
    data.pairs = pairs(
        method,
        PreferenceObjective::Dpo {
            beta: 0.2,
            loss: DpoLoss::Sigmoid,
        },
    );
    refused(other_beta, "another beta");
    let mut other_pairs = options(interrupted.path(), 6);
    let DataChoice::Preference(data) = &mut other_pairs.data else {
        unreachable!()
    };
    let examples = data.pairs.examples()[..6].to_vec();
    data.pairs = PreferencePairs::new(&examples, SEQ_LEN, PAD_ID, objective).0;
    refused(other_pairs, "other pairs");
    let mut other_reference = options(interrupted.path(), 6);
    let DataChoice::Preference(data) = &mut other_reference.data else {
        unreachable!()
    };
    data.reference_model = Some(fixture("hf-tiny-llama3"));
    refused(other_reference, "another reference");
}

/// A LoRA run's checkpoint named as the reference (its `model/` is the frozen base alone, the
/// adapter kept beside it) is refused naming the adapter, before any reference pass.
#[test]
fn a_lora_runs_checkpoint_is_refused_as_the_reference() {
    let (method, objective) = objectives()[0];
    let checkpoint = tempfile::tempdir().unwrap();
    let model = checkpoint.path().join("model");
    copy_folder(&fixture("align-tiny-llama3/reference"), &model);
    let adapter = checkpoint.path().join(hlat_train::pretrain::ADAPTER_DIR);
    std::fs::create_dir(&adapter).unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut options = options(
        out.path(),
        ("hf-tiny-llama3", pairs(method, objective)),
        (ParallelLayout::SINGLE, FIRST_SHAPE),
        (1, 0),
        None,
    );
    let DataChoice::Preference(data) = &mut options.data else {
        unreachable!()
    };
    data.reference_model = Some(model.clone());
    let Err(error) = pretrain(&options, &super::host(), DeviceInfo::default()) else {
        panic!("a LoRA run's checkpoint taken as the reference");
    };
    let error = error.to_string();
    assert!(
        error.contains("a LoRA run") && error.contains(adapter.to_str().unwrap()),
        "{error}"
    );
}

/// Copies the files of the folder `from` into a new folder `to`.
fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}
