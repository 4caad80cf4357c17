//! Parallel training through the pretraining job (`hlat pretrain --dp N --tp M
//! --sequence-parallel`): the same global batch on one device and on the replicas of a device,
//! the same losses and gradient norms step by step.

use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Tensor, TensorData};
use burn::train::Learner;
use burn_trainium::{ExecutorKind, TrainiumDevice, stats};
use hlat::HlatConfig;
use hlat::pipeline::PipelineSchedule;
use hlat_train::config::TrainConfig;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::{OptimizerStep, SharedOptimizer};
use hlat_train::optimizer::{AdamWSettings, AdamWState, HlatAdamW, HlatOptimizer, OptimizerRecord};
use hlat_train::parallel::{
    ActivationCheckpointing, DeviceMemory, ParallelLayout, StepShape, split_rows,
};
use hlat_train::precision::Precision;
use hlat_train::pretrain::{
    CompileTotals, DataChoice, DeviceInfo, PretrainOptions, PretrainSummary, pretrain,
};
use hlat_train::progress::TrainingProgress;
use hlat_train::schedule::{WarmupCosine, WarmupCosineScheduler};

use test_support::training::EVERY_PARALLELISM;

use crate::support::{host, trainium, xla};

pub(crate) const STEPS: u64 = 10;

/// How the replicas of a device share one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub data: usize,
    /// Of the data-parallel replicas, those a mixture's experts are split over.
    pub expert: usize,
    pub tensor: usize,
    /// Pipeline stages, and chunks per stage (the interleaved schedule above 1).
    pub pipeline: usize,
    pub virtual_stages: usize,
    pub sequence_parallel: bool,
    pub zero1: bool,
    /// Fully sharded data parallelism over the data-parallel replicas.
    pub fsdp: bool,
    pub checkpointing: ActivationCheckpointing,
    /// LoRA adapters of rank 4 (alpha 8, no dropout) on every projection, the base frozen.
    pub lora: bool,
}

pub(crate) const ONE_DEVICE: Layout = Layout {
    data: 1,
    expert: 1,
    tensor: 1,
    pipeline: 1,
    virtual_stages: 1,
    lora: false,
    sequence_parallel: false,
    zero1: false,
    fsdp: false,
    checkpointing: ActivationCheckpointing::None,
};

impl Layout {
    /// The replicas the layout needs.
    pub fn replicas(&self) -> u16 {
        (self.data * self.tensor * self.pipeline) as u16
    }
}

/// A short run of `hlat-test` on the built-in corpus in `layout`.
fn run(device: &TrainiumDevice, layout: Layout) -> PretrainSummary {
    run_from(device, layout, None)
}

/// [`run`] starting from the model saved in `start` when given.
pub(crate) fn run_from(
    device: &TrainiumDevice,
    layout: Layout,
    start: Option<&Path>,
) -> PretrainSummary {
    let out = tempfile::tempdir().unwrap();
    run_until(device, layout, out.path(), STEPS, start)
}

/// `run` in `out` (resuming from its newest checkpoint, else starting from the model in `start`
/// or a fresh `hlat-test`) until step `max_steps`, with a checkpoint every 3 steps and the
/// validation loss at the end; the learning rate decays over `STEPS` whatever `max_steps`.
pub(crate) fn run_until(
    device: &TrainiumDevice,
    layout: Layout,
    out: &Path,
    max_steps: u64,
    start: Option<&Path>,
) -> PretrainSummary {
    let options = PretrainOptions {
        config: TrainConfig {
            preset: "hlat-test".into(),
            lr: 1e-2,
            warmup_steps: 2,
            max_steps,
            decay_steps: Some(STEPS),
            seq_len: 16,
            batch_tokens: 16 * 8,
            micro_batch_rows: 8 / (2 * layout.data),
            data_parallel: layout.data,
            expert_parallel: layout.expert,
            tensor_parallel: layout.tensor,
            pipeline_parallel: layout.pipeline,
            virtual_stages: layout.virtual_stages,
            pipeline_schedule: if layout.virtual_stages > 1 {
                PipelineSchedule::Interleaved
            } else {
                PipelineSchedule::OneForwardOneBackward
            },
            sequence_parallel: layout.sequence_parallel,
            zero1: layout.zero1,
            fsdp: layout.fsdp,
            activation_checkpointing: layout.checkpointing,
            lora: layout.lora.then(|| hlat::lora::LoraConfig::new(4, 8.0)),
            eval_every: STEPS,
            checkpoint_every: 3,
            progress: false,
            ..TrainConfig::quickstart()
        },
        out: out.to_path_buf(),
        data: DataChoice::Builtin,
        init_from: start.map(Path::to_path_buf),
        init_adapter: None,
        share: hlat_train::checkpoint_state::ProcessShare::WHOLE,
    };
    let device_for_stats = *device;
    let compiles = move || {
        let stats = stats(&device_for_stats);
        CompileTotals {
            programs: stats.compiles,
            seconds: stats.compile_seconds,
        }
    };
    pretrain(
        &options,
        &trainium(*device),
        DeviceInfo {
            compiles: Some(std::sync::Arc::new(compiles)),
        },
    )
    .unwrap()
}

/// On `host` and on `xla`, each of `layouts` run from `start` (else a fresh `hlat-test`) on a
/// replicated device equals one device's run within 1e-4; `after` sees each layout's device and
/// its statistics before the run.
pub(crate) fn assert_layouts_run_as_one_device(
    layouts: &[Layout],
    start: Option<&Path>,
    after: impl Fn(&Layout, &TrainiumDevice, &burn_trainium::Stats),
) {
    for executor in [ExecutorKind::Host, ExecutorKind::Xla] {
        if executor == ExecutorKind::Xla {
            xla();
        }
        let expected = run_from(&TrainiumDevice::new(executor, 0), ONE_DEVICE, start);
        for layout in layouts {
            let device = TrainiumDevice::replicated(executor, layout.replicas());
            let served = trainium(device);
            served.sync().unwrap();
            let before = stats(&device);
            let actual = run_from(&device, *layout, start);
            assert_same_run(&expected, &actual, 1e-4, &format!("{layout:?} on {device}"));
            served.sync().unwrap();
            after(layout, &device, &before);
        }
    }
}

/// On `xla`, the run since `before` ran collectives inside its programs and nothing on the host.
pub(crate) fn exchanged_in_the_programs(device: &TrainiumDevice, before: &burn_trainium::Stats) {
    if device.executor == ExecutorKind::Xla {
        let after = stats(device);
        assert!(after.collectives > before.collectives, "{after:?}");
        assert_eq!(after.host_fallbacks, before.host_fallbacks, "{after:?}");
    }
}

/// Losses and gradient norms step by step, and the validation loss at the end, within `relative`
/// of one device's.
pub(crate) fn assert_same_run(
    expected: &PretrainSummary,
    actual: &PretrainSummary,
    relative: f64,
    what: &str,
) {
    assert_eq!(actual.losses.len(), STEPS as usize, "{what}");
    let (Some(e), Some(a)) = (expected.val_loss, actual.val_loss) else {
        panic!("{what}: no validation loss");
    };
    assert!(
        (e - a).abs() <= relative * e.abs(),
        "{what}: validation loss {a}, one device {e}"
    );
    let pairs = [
        ("loss", &expected.losses, &actual.losses),
        ("gradient norm", &expected.grad_norms, &actual.grad_norms),
    ];
    for (name, expected, actual) in pairs {
        for (step, (e, a)) in expected.iter().zip(actual).enumerate() {
            assert!(
                (e - a).abs() <= relative * e.abs(),
                "{what}, step {}: {name} {a}, one device {e}",
                step + 1
            );
        }
    }
}

#[test]
fn data_parallel_pretraining_equals_one_device_on_host_and_xla() {
    let _random = crate::support::exclusive_random();
    for (executor, replicas) in [(ExecutorKind::Host, 2), (ExecutorKind::Xla, 4)] {
        if executor == ExecutorKind::Xla {
            xla();
        }
        let single = TrainiumDevice::new(executor, 0);
        let replicated = TrainiumDevice::replicated(executor, replicas as u16);
        let expected = run(&single, ONE_DEVICE);
        let layout = Layout {
            data: replicas,
            ..ONE_DEVICE
        };
        let actual = run(&replicated, layout);
        assert_same_run(
            &expected,
            &actual,
            1e-5,
            &format!("{layout:?} on {replicated}"),
        );
        if executor == ExecutorKind::Xla {
            trainium(replicated).sync().unwrap();
            let after = stats(&replicated);
            assert!(after.collectives > 0, "{after:?}");
            assert_eq!(after.host_fallbacks, 0, "{after:?}");
        }
    }
}

/// Tensor parallel 2, data parallel 2 × tensor parallel 2, tensor parallel 2 with sequence
/// parallelism, data parallel 2 with ZeRO-1, all of them together, full and selective
/// activation checkpointing, and tensor parallel 4, where each of `hlat-test`'s 2 KV heads is
/// held by 2 ranks (their gradients summed over the holders, the global norm counting each head
/// once), alone and with sequence parallelism, each against one device (relative 1e-4: the split
/// sums add in another order).
#[test]
fn parallel_layouts_pretrain_as_one_device_on_host_and_xla() {
    let _random = crate::support::exclusive_random();
    let layouts = [
        Layout {
            tensor: 2,
            ..ONE_DEVICE
        },
        Layout {
            data: 2,
            tensor: 2,
            ..ONE_DEVICE
        },
        Layout {
            tensor: 2,
            sequence_parallel: true,
            ..ONE_DEVICE
        },
        Layout {
            data: 2,
            zero1: true,
            ..ONE_DEVICE
        },
        Layout {
            data: 2,
            tensor: 2,
            sequence_parallel: true,
            zero1: true,
            ..ONE_DEVICE
        },
        Layout {
            checkpointing: ActivationCheckpointing::Full,
            ..ONE_DEVICE
        },
        Layout {
            tensor: 2,
            sequence_parallel: true,
            checkpointing: ActivationCheckpointing::Selective,
            ..ONE_DEVICE
        },
        Layout {
            tensor: 4,
            ..ONE_DEVICE
        },
        Layout {
            tensor: 4,
            sequence_parallel: true,
            checkpointing: ActivationCheckpointing::Selective,
            ..ONE_DEVICE
        },
    ];
    assert_eq!(HlatConfig::preset("hlat-test").unwrap().num_kv_heads, 2);
    assert_layouts_run_as_one_device(&layouts, None, |_, _, _| {});
}

/// A tensor-parallel run checkpoints one model file per rank, any other run the whole model; any
/// layout resumes from either: a run of tensor-parallel pairs resumed on one device, one device
/// resumed as tensor-parallel pairs with sequence parallelism, ZeRO-1 pairs resumed as
/// tensor-parallel pairs, dp 4 resumed as dp 2 with ZeRO-1, and tp 4 (replicated KV heads)
/// resumed on one device and back continue as one device would (the AdamW moments are joined and
/// split too).
#[test]
fn checkpoints_resume_across_tensor_parallel_layouts() {
    let _random = crate::support::exclusive_random();
    let single = TrainiumDevice::new(ExecutorKind::Host, 0);
    let pairs = TrainiumDevice::replicated(ExecutorKind::Host, 2);
    let tensor_pairs = Layout {
        tensor: 2,
        sequence_parallel: true,
        ..ONE_DEVICE
    };
    let zero_pairs = Layout {
        data: 2,
        zero1: true,
        ..ONE_DEVICE
    };
    let quads = TrainiumDevice::replicated(ExecutorKind::Host, 4);
    let data_quads = Layout {
        data: 4,
        ..ONE_DEVICE
    };
    // Tensor parallel 4: each of the 2 KV heads on 2 ranks, its moments joined and split too.
    let tensor_quads = Layout {
        tensor: 4,
        ..ONE_DEVICE
    };
    let orders = [
        ((&pairs, tensor_pairs), (&single, ONE_DEVICE)),
        ((&single, ONE_DEVICE), (&pairs, tensor_pairs)),
        ((&pairs, zero_pairs), (&pairs, tensor_pairs)),
        ((&quads, data_quads), (&pairs, zero_pairs)),
        ((&quads, tensor_quads), (&single, ONE_DEVICE)),
        ((&single, ONE_DEVICE), (&quads, tensor_quads)),
    ];
    assert_resumes_as_one_device(&orders, None, |_, _| {});
}

/// The tiny Mixtral transformers made (4 experts, 2 a token, 2 layers).
fn tiny_mixtral() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf-tiny-mixtral")
}

/// [`tiny_mixtral`] without its load-balancing loss (`router_aux_loss_coef` 0), copied into
/// `folder`: the load-balancing loss of each replica's micro-batch is not linear in the
/// batch, so with it no data-parallel run equals one device.
fn tiny_mixtral_without_balancing(folder: &Path) -> std::path::PathBuf {
    let source = tiny_mixtral();
    let copy = folder.join("hf-tiny-mixtral");
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
    }
    let config = std::fs::read_to_string(source.join("config.json")).unwrap();
    let edited = config.replace(
        "\"router_aux_loss_coef\": 0.02",
        "\"router_aux_loss_coef\": 0.0",
    );
    assert_ne!(edited, config, "the fixture's coefficient moved");
    std::fs::write(copy.join("config.json"), edited).unwrap();
    copy
}

/// Expert parallelism of a tiny Mixtral (`--dp 2 --ep 2`, and `--dp 4 --ep 2`: two pairs of
/// expert ranks, their experts' gradients averaged between the pairs), tensor parallelism of
/// its experts (`--tp 2`, also with sequence parallelism and selective checkpointing) and both
/// (`--dp 2 --ep 2 --tp 2`), `--dp 2 --ep 2` with full checkpointing or 2 pipeline stages, and
/// `--dp 2`, `--dp 2 --ep 2` and `--dp 4 --ep 2` with ZeRO-1, dropless, against one
/// device: the same losses and gradient norms over 10 steps (relative 1e-4), on `host` and
/// `xla`. With the load-balancing loss (computed per replica's micro-batch, as data-parallel
/// Megatron and transformers under DDP compute it), expert parallelism and full sharding (with
/// and without full checkpointing) equal the same data parallelism without them.
#[test]
fn expert_parallel_pretraining_equals_one_device_on_host_and_xla() {
    let _random = crate::support::exclusive_random();
    let folder = tempfile::tempdir().unwrap();
    let unbalanced = tiny_mixtral_without_balancing(folder.path());
    let mixtral = tiny_mixtral();
    let data_pairs = Layout {
        data: 2,
        ..ONE_DEVICE
    };
    let pairs = TrainiumDevice::replicated(ExecutorKind::Host, 2);
    let expected = run_from(&pairs, data_pairs, Some(&mixtral));
    let expert_pairs = Layout {
        expert: 2,
        ..data_pairs
    };
    let actual = run_from(&pairs, expert_pairs, Some(&mixtral));
    assert_same_run(
        &expected,
        &actual,
        1e-5,
        "ep 2 against dp 2 with load balancing",
    );
    // Fully sharded (the experts sliced as every parameter), whole and with its layers
    // recomputed: the same data parallelism.
    let sharded_pairs = Layout {
        fsdp: true,
        ..data_pairs
    };
    for layout in [
        sharded_pairs,
        Layout {
            checkpointing: ActivationCheckpointing::Full,
            ..sharded_pairs
        },
    ] {
        let actual = run_from(&pairs, layout, Some(&mixtral));
        assert_same_run(&expected, &actual, 1e-4, &format!("{layout:?}"));
    }
    // Tensor parallelism keeps each micro-batch whole: with the load-balancing loss too, it is
    // one device's run.
    let single = TrainiumDevice::new(ExecutorKind::Host, 0);
    let expected = run_from(&single, ONE_DEVICE, Some(&mixtral));
    let tensor_pairs = Layout {
        tensor: 2,
        ..ONE_DEVICE
    };
    let actual = run_from(&pairs, tensor_pairs, Some(&mixtral));
    assert_same_run(&expected, &actual, 1e-4, "tp 2 with load balancing");
    // Recomputed layers pass the load-balancing loss's gradient to their routers.
    let recomputed_pairs = Layout {
        sequence_parallel: true,
        checkpointing: ActivationCheckpointing::Full,
        ..tensor_pairs
    };
    let actual = run_from(&pairs, recomputed_pairs, Some(&mixtral));
    assert_same_run(
        &expected,
        &actual,
        1e-4,
        "tp 2, sequence parallel, full checkpointing, with load balancing",
    );
    // Pipeline stages exchange their routers' statistics: the load-balancing loss of each
    // micro-batch joins both stages' layers, as on one device.
    let pipelined = Layout {
        pipeline: 2,
        ..ONE_DEVICE
    };
    let actual = run_from(&pairs, pipelined, Some(&mixtral));
    assert_same_run(&expected, &actual, 1e-4, "pp 2 with load balancing");
    let mut layouts: Vec<Layout> = [(2, 2, 1), (4, 2, 1), (1, 1, 2), (2, 2, 2)]
        .map(|(data, expert, tensor)| Layout {
            data,
            expert,
            tensor,
            ..ONE_DEVICE
        })
        .into();
    layouts.extend([
        Layout {
            tensor: 2,
            sequence_parallel: true,
            checkpointing: ActivationCheckpointing::Selective,
            ..ONE_DEVICE
        },
        Layout {
            data: 2,
            expert: 2,
            checkpointing: ActivationCheckpointing::Full,
            ..ONE_DEVICE
        },
        Layout {
            data: 2,
            expert: 2,
            pipeline: 2,
            ..ONE_DEVICE
        },
        // ZeRO-1: experts not split (sliced as every parameter), each held by one replica (not
        // sliced), and by two (sliced over them).
        Layout {
            data: 2,
            zero1: true,
            ..ONE_DEVICE
        },
        Layout {
            data: 2,
            expert: 2,
            zero1: true,
            ..ONE_DEVICE
        },
        Layout {
            data: 4,
            expert: 2,
            zero1: true,
            ..ONE_DEVICE
        },
    ]);
    assert_layouts_run_as_one_device(&layouts, Some(&unbalanced), |_, device, before| {
        exchanged_in_the_programs(device, before);
    });
    // LoRA on the attention and on every expert (PEFT's fused gate-up and down adapters), the
    // base frozen: split over expert-parallel and tensor-parallel pairs as on one device.
    let adapted = Layout {
        lora: true,
        ..ONE_DEVICE
    };
    let expected = run_from(&single, adapted, Some(&unbalanced));
    assert!(
        expected.losses[STEPS as usize - 1] < expected.losses[0],
        "the adapters do not train: {:?}",
        expected.losses
    );
    for layout in [
        Layout {
            data: 2,
            expert: 2,
            ..adapted
        },
        Layout {
            tensor: 2,
            ..adapted
        },
    ] {
        let actual = run_from(&pairs, layout, Some(&unbalanced));
        assert_same_run(&expected, &actual, 1e-4, &format!("{layout:?}"));
    }
}

/// A run of experts split over 2 ranks (alone, with tensor parallelism, and with ZeRO-1 over
/// replicas holding the same experts) checkpoints the whole set of experts and their optimizer
/// state: one device resumes from it, and it resumes from one
/// device's, as an uninterrupted run.
#[test]
fn checkpoints_resume_across_expert_parallel_layouts() {
    let _random = crate::support::exclusive_random();
    let single = TrainiumDevice::new(ExecutorKind::Host, 0);
    let pairs = TrainiumDevice::replicated(ExecutorKind::Host, 2);
    let expert_pairs = Layout {
        data: 2,
        expert: 2,
        ..ONE_DEVICE
    };
    // Experts split 2 ways and each expert's projections 2 ways: one model file per tensor-parallel
    // rank, each with every expert.
    let quads = TrainiumDevice::replicated(ExecutorKind::Host, 4);
    let expert_tensor_quads = Layout {
        tensor: 2,
        ..expert_pairs
    };
    // Each expert held by two replicas, its AdamW moments sliced over them by ZeRO-1.
    let expert_zero_quads = Layout {
        data: 4,
        zero1: true,
        ..expert_pairs
    };
    let orders = [
        ((&pairs, expert_pairs), (&single, ONE_DEVICE)),
        ((&single, ONE_DEVICE), (&pairs, expert_pairs)),
        ((&quads, expert_tensor_quads), (&single, ONE_DEVICE)),
        ((&single, ONE_DEVICE), (&quads, expert_tensor_quads)),
        ((&quads, expert_zero_quads), (&single, ONE_DEVICE)),
        ((&single, ONE_DEVICE), (&quads, expert_zero_quads)),
    ];
    let folder = tempfile::tempdir().unwrap();
    let unbalanced = tiny_mixtral_without_balancing(folder.path());
    assert_resumes_as_one_device(&orders, Some(&unbalanced), |_, _| {});
}

/// A device and the layout of a run on it.
pub(crate) type Placed<'a> = (&'a TrainiumDevice, Layout);

/// For each pair of layouts, a run of the first to half the steps, resumed by the second from
/// its checkpoint to the end in the same folder, equals an uninterrupted run on one `host`
/// device from the same start (`start`, else a fresh `hlat-test`) within 1e-4. `inspect` sees
/// each first layout and the model folder of its checkpoint; the checkpoint is sharded (rank or
/// stage files) exactly when the first layout splits the model.
pub(crate) fn assert_resumes_as_one_device(
    orders: &[(Placed, Placed)],
    start: Option<&Path>,
    inspect: impl Fn(&Layout, &Path),
) {
    let expected = run_from(
        &TrainiumDevice::new(ExecutorKind::Host, 0),
        ONE_DEVICE,
        start,
    );
    for &((first_device, first), (then_device, then)) in orders {
        let out = tempfile::tempdir().unwrap();
        let head = run_until(first_device, first, out.path(), STEPS / 2, start);
        let model_dir = head.checkpoint.as_ref().unwrap().join("model");
        assert_eq!(
            hlat::checkpoint::files::is_sharded(&model_dir),
            first.tensor > 1 || first.pipeline > 1,
            "{first:?}: {}",
            model_dir.display()
        );
        inspect(&first, &model_dir);
        let tail = run_until(then_device, then, out.path(), STEPS, start);
        assert_eq!(tail.start_step, STEPS / 2);
        let joined = PretrainSummary {
            losses: [head.losses, tail.losses].concat(),
            grad_norms: [head.grad_norms, tail.grad_norms].concat(),
            ..tail
        };
        assert_same_run(
            &expected,
            &joined,
            1e-4,
            &format!("{first:?} then {then:?}"),
        );
    }
}

/// One optimizer step of `model` in `layout` over `batch`, with HLAT's AdamW and a short
/// schedule: the model after it and the optimizer's state.
pub(crate) fn one_step(
    model: LanguageModel,
    layout: ParallelLayout,
    batch: LmBatch,
) -> (LanguageModel, OptimizerRecord) {
    let recipe = TrainConfig::default();
    let step = OptimizerStep {
        seed: 1,
        max_consecutive_skips: 1,
        layout,
        ..OptimizerStep::from_config(&recipe)
    };
    let optimizer = SharedOptimizer::new(HlatOptimizer::new(
        HlatAdamW::new(AdamWSettings::from_config(&recipe)).partitioned_for(&layout),
    ));
    let schedule = WarmupCosine {
        peak: 1e-3,
        warmup_steps: 1,
        decay_steps: 1,
        min_ratio: 0.1,
    };
    let scheduler = WarmupCosineScheduler::new(schedule);
    let module_optimizer = optimizer.module_optimizer(&model);
    let mut learner = Learner::new(model, module_optimizer, scheduler);
    let mut progress = TrainingProgress::default();
    step.run(&mut learner, &mut progress, vec![batch]).unwrap();
    let record = optimizer.lock().to_record();
    (learner.model(), record)
}

/// `count` rows of `width` consecutive token ids (modulo `vocab`).
pub(crate) fn token_rows(count: u32, width: u32, vocab: u32) -> Vec<Vec<u32>> {
    (0..count)
        .map(|row| (0..width).map(|i| (row * width + i) % vocab).collect())
        .collect()
}

/// Under ZeRO-1 each data-parallel replica holds `1/dp` of the AdamW moments (a slice of
/// ⌈n / dp⌉ elements of each n-element parameter).
#[test]
fn zero1_keeps_a_slice_of_the_optimizer_state_per_replica() {
    let _random = crate::support::exclusive_random();
    let device = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 2)).autodiff();
    let state_elements = |zero1: bool| {
        let config = HlatConfig::preset("hlat-test").unwrap();
        let model = LanguageModel::new(config.init(&device), None);
        let layout = ParallelLayout {
            data: 2,
            zero1,
            ..ParallelLayout::SINGLE
        };
        let rows = token_rows(4, 9, 64);
        let batch = LmBatch::from_replica_rows(&split_rows(&rows, 2), &device);
        let (model, record) = one_step(model, layout, batch);
        let mut count = MomentElements {
            record,
            elements: 0,
        };
        model.visit(&mut count);
        count.elements
    };
    let whole = state_elements(false);
    let sliced = state_elements(true);
    assert!(whole > 0);
    assert_eq!(
        sliced * 2,
        whole,
        "ZeRO-1 state {sliced} elements, whole {whole}"
    );
}

/// Counts the elements of the AdamW moments in an optimizer record, parameter by parameter.
pub(crate) struct MomentElements {
    record: OptimizerRecord,
    elements: usize,
}

impl ModuleVisitor for MomentElements {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(entry) = self.record.remove(&param.id) {
            let state: AdamWState<D> = entry.into_state();
            self.elements +=
                state.moment1.shape().num_elements() + state.moment2.shape().num_elements();
        }
    }
}

/// The bytes `hlat info` counts for one device agree with those a replica holds in a step of
/// dp 2 × tp 2 with sequence parallelism and ZeRO-1 (within 10%): the parameters and the AdamW
/// state after the step, and the activations one micro-batch's forward pass leaves for its
/// backward (the autodiff graph's saved tensors, from the device's live-bytes gauge).
#[test]
fn memory_estimate_matches_the_bytes_a_replica_holds() {
    let _random = crate::support::exclusive_random();
    let device = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 4)).autodiff();
    let layout = EVERY_PARALLELISM;
    let config = HlatConfig::preset("hlat-test").unwrap();
    let parallel = layout.tensor_parallel().unwrap();
    let hlat = config.init(&device).shard(&parallel);
    let model = LanguageModel::sharded(hlat, None, parallel.clone());
    let rows = token_rows(4, 9, 64);
    // Each data-parallel slice goes to both ranks of its tensor-parallel pair.
    let slices = split_rows(&rows, 2);
    let per_replica: Vec<&[Vec<u32>]> = slices.iter().flat_map(|slice| [*slice, *slice]).collect();
    let batch = LmBatch::from_replica_rows(&per_replica, &device);
    let (trained, record) = one_step(model, layout, batch);

    // The activations, on a device of their own (no earlier graph is freed while measuring),
    // with the parameters materialised first.
    let fresh_trainium = TrainiumDevice::new(ExecutorKind::Host, 8).with_replicas(4);
    let fresh = trainium(fresh_trainium).autodiff();
    let hlat = config.init(&fresh);
    let hlat = hlat
        .clone()
        .load_record(hlat.into_record())
        .shard(&parallel);
    let model = LanguageModel::sharded(hlat, None, parallel.clone());
    let batch = LmBatch::from_replica_rows(&per_replica, &fresh);
    fresh.sync().unwrap();
    let before = stats(&fresh_trainium).live_bytes;
    let loss = model.loss(&batch);
    fresh.sync().unwrap();
    let loss_bytes = 4;
    let activation_bytes = stats(&fresh_trainium).live_bytes - before - loss_bytes;
    drop(loss);

    let held = HeldBytes::of(&trained, record);
    let estimate = DeviceMemory::estimate(&config, &layout, &ROWS_OF_EIGHT);
    for (what, held, estimated) in [
        ("parameters", held.parameter_bytes, estimate.parameter_bytes),
        (
            "optimizer state",
            held.optimizer_bytes,
            estimate.optimizer_bytes,
        ),
        ("activations", activation_bytes, estimate.activation_bytes),
    ] {
        println!("{what}: held {held}, estimated {estimated}");
        let ratio = held as f64 / estimated as f64;
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{what}: a replica holds {held} bytes, hlat info says {estimated}"
        );
    }
}

/// The step of [`token_rows`]`(4, 9, _)` cut into one micro-batch per data-parallel replica:
/// rows of 8 tokens, 2 of them per micro-batch, in f32.
pub(crate) const ROWS_OF_EIGHT: StepShape = StepShape {
    seq_len: 8,
    micro_batch_rows: 2,
    precision: Precision::F32,
    checkpointing: ActivationCheckpointing::None,
    pipeline: None,
    lora: None,
    moe_capacity_factor: None,
};

/// Bytes of a replica's parameters and of their AdamW moments (every replica's tensors have the
/// same shapes).
pub(crate) struct HeldBytes {
    record: OptimizerRecord,
    pub parameter_bytes: u64,
    pub optimizer_bytes: u64,
}

impl HeldBytes {
    /// The bytes of `model`'s parameters and of their moments in `record`.
    pub(crate) fn of(model: &LanguageModel, record: OptimizerRecord) -> Self {
        let mut held = Self {
            record,
            parameter_bytes: 0,
            optimizer_bytes: 0,
        };
        model.visit(&mut held);
        held
    }
}

impl ModuleVisitor for HeldBytes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        self.parameter_bytes += (value.shape().num_elements() * value.dtype().size()) as u64;
        if let Some(entry) = self.record.remove(&param.id) {
            let state: AdamWState<D> = entry.into_state();
            for moment in [state.moment1, state.moment2] {
                self.optimizer_bytes +=
                    (moment.shape().num_elements() * moment.dtype().size()) as u64;
            }
        }
    }
}

/// The activation memory checkpointing saves, measured: the scratch memory the XLA compiler
/// assigns to one training step of `hlat-tiny` (its intermediate values), without checkpointing,
/// with selective and with full checkpointing. (The XLA CPU compiler drops optimization barriers
/// before it schedules, so it keeps more than a compiler that honours them: see
/// docs/parallel.md for the numbers.)
#[test]
fn activation_checkpointing_shrinks_the_compiled_steps_scratch_memory() {
    let _random = crate::support::exclusive_random();
    // The largest scratch counted is the device's, and another test's reads on a shared device
    // would cut this step into smaller programs: a device of its own, its step one program.
    let (_device, xla_1) = crate::support::exclusive_second_xla();
    burn_trainium::set_segment_cap(&xla_1, burn_trainium::DEFAULT_SEGMENT_CAP);
    let device = trainium(xla_1).autodiff();
    let mut scratch = Vec::new();
    for checkpointing in [
        ActivationCheckpointing::None,
        ActivationCheckpointing::Selective,
        ActivationCheckpointing::Full,
    ] {
        device.sync().unwrap();
        burn_trainium::reset_stats(&xla_1);
        let config = HlatConfig::preset("hlat-tiny").unwrap();
        let model = LanguageModel {
            checkpointing,
            ..LanguageModel::new(config.init(&device), None)
        };
        let rows = token_rows(4, 257, 512);
        one_step(
            model,
            ParallelLayout::SINGLE,
            LmBatch::from_rows(&rows, &device),
        );
        device.sync().unwrap();
        let counted = stats(&xla_1);
        let bytes = counted.largest_scratch_bytes;
        println!(
            "{checkpointing}: {bytes} bytes of scratch memory ({} segments, {} compiled, {} \
             loaded, {} cache hits)",
            counted.segments_run, counted.compiles, counted.programs_loaded, counted.cache_hits
        );
        scratch.push(bytes);
    }
    let [none, selective, full] = scratch[..] else {
        unreachable!()
    };
    assert!(none > 0, "the plugin reports compiled memory statistics");
    assert!(
        full < none,
        "full checkpointing: {full} bytes, none: {none}"
    );
    assert!(
        selective < none,
        "selective checkpointing: {selective} bytes, none: {none}"
    );
}

/// The Neuron compiler's lowering (the split reading each replica's index from a parameter and
/// selecting among constant-offset slices, powers as listed operators) run on the XLA CPU plugin
/// trains as XLA's own lowering does: tensor parallel 2 with sequence parallelism (the split of
/// the shards and of the vocabulary), to 1e-5 over 10 steps (the programs differ, so XLA fuses
/// and sums them in another order: a gradient norm differed by 1.1e-6 relative in one run).
/// ZeRO-1's split is the same lowering, checked on strided groups by the backend's collectives
/// test.
#[test]
fn the_neuron_lowering_trains_as_the_default_lowering_on_xla() {
    use burn_trainium::lower::OperatorRules;
    let _random = crate::support::exclusive_random();
    xla();
    // A replicated device no other test uses, so that its rules are this test's own.
    let neuron_rules = TrainiumDevice::xla(2).with_replicas(2);
    burn_trainium::set_operator_rules(&neuron_rules, OperatorRules::Neuron);
    let layouts = [Layout {
        tensor: 2,
        sequence_parallel: true,
        ..ONE_DEVICE
    }];
    for layout in layouts {
        let expected = run(&TrainiumDevice::replicated(ExecutorKind::Xla, 2), layout);
        let actual = run(&neuron_rules, layout);
        assert_same_run(
            &expected,
            &actual,
            1e-5,
            &format!("{layout:?} under Neuron's rules"),
        );
    }
    // A fractional power, as exp(e · log x), against the host.
    let values = TensorData::new(vec![0.25f32, 1.0, 2.0, 7.5], [4]);
    let power = |device: &burn::tensor::Device| {
        Tensor::<1>::from_data(values.clone(), device)
            .powf_scalar(0.3)
            .into_data()
    };
    power(&trainium(neuron_rules))
        .assert_approx_eq::<f32>(&power(&host()), burn::tensor::Tolerance::absolute(1e-6));
}
