//! Today's LLaMA family on the compiled device and under tensor parallelism: every transformers
//! fixture (`fixtures/hf-tiny-*`) imports on `xla` with transformers' logits and greedy
//! continuation, and the families with tied embeddings, biases and per-head norms train under
//! `--tp 2`, `--dp 2 --tp 2` and sequence parallelism as on one device.

use burn::tensor::{Int, Tensor, TensorData};
use burn_trainium::{ExecutorKind, TrainiumDevice, stats};
use hlat::generate::{GenerationOptions, Sampling, generate};
use hlat::hf::{WeightDtype, import_hf};
use hlat_train::config::TrainConfig;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::OptimizerStep;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::parallel::ParallelLayout;
use hlat_train::schedule::WarmupCosine;
use serde_json::Value;

use test_support::fixtures::{expected, fixture};
use test_support::training::Training;

use crate::support::{trainium, xla};

fn numbers(value: &Value) -> Vec<f64> {
    match value {
        Value::Array(items) => items.iter().flat_map(numbers).collect(),
        number => vec![number.as_f64().unwrap()],
    }
}

fn ids(value: &Value) -> Vec<u32> {
    numbers(value).into_iter().map(|id| id as u32).collect()
}

#[test]
fn every_family_matches_transformers_on_xla() {
    let _device = crate::support::exclusive_xla();
    let xla = xla();
    let device = trainium(xla);
    device.sync().unwrap();
    let before = stats(&xla).host_fallbacks;
    for name in [
        "hf-tiny-llama3",
        "hf-tiny-qwen2",
        "hf-tiny-qwen3",
        "hf-tiny-mistral",
        "hf-tiny-llama-bias",
    ] {
        let expected = expected(name);
        let (config, model) = import_hf(&fixture(name), &device, WeightDtype::F32).unwrap();
        let input_ids: Vec<i64> = ids(&expected["input_ids"])
            .iter()
            .map(|&id| id as i64)
            .collect();
        let seq = input_ids.len() / 2;
        let input = Tensor::<2, Int>::from_data(TensorData::new(input_ids, [2, seq]), &device);
        let logits = model.forward(input);
        let slices = [
            (logits.clone().narrow(1, 0, 4), "logits_first_positions"),
            (logits.narrow(1, seq - 1, 1), "logits_last_position"),
        ];
        for (slice, key) in slices {
            let actual = slice.into_data().try_to_vec::<f32>().unwrap();
            let reference = numbers(&expected[key]);
            assert_eq!(actual.len(), reference.len(), "{name}: {key}");
            let worst = actual
                .iter()
                .zip(&reference)
                .map(|(a, e)| (*a as f64 - e).abs())
                .fold(0.0, f64::max);
            assert!(worst <= 1e-4, "{name}: {key} differs by {worst}");
        }
        let continuation = ids(&expected["greedy_continuation"]);
        let options = GenerationOptions {
            max_new_tokens: continuation.len(),
            sampling: Sampling::Greedy,
            seed: 0,
            stop_ids: vec![config.eos_token_id],
        };
        let generated =
            generate(&model, &ids(&expected["greedy_prompt"]), &options, |_| {}).unwrap();
        assert_eq!(generated, continuation, "{name}");
    }
    device.sync().unwrap();
    assert_eq!(stats(&xla).host_fallbacks, before);
}

const STEPS: usize = 10;

/// Losses and gradient norms of `STEPS` AdamW steps of fixture `name` on its training batch in
/// `layout` (on `executor`'s replicated device when the layout splits anything).
fn train(name: &str, executor: ExecutorKind, layout: ParallelLayout) -> Vec<(f64, f64)> {
    let replicas = layout.data * layout.tensor;
    let device = if replicas == 1 {
        TrainiumDevice::new(executor, 0)
    } else {
        TrainiumDevice::replicated(executor, replicas as u16)
    };
    let device = trainium(device).autodiff();
    let (_, hlat) = import_hf(&fixture(name), &device, WeightDtype::F32).unwrap();
    let model = match layout.tensor_parallel() {
        Some(parallel) => LanguageModel::sharded(hlat.shard(&parallel), None, parallel),
        None => LanguageModel::new(hlat, None),
    };
    let recipe = TrainConfig::default();
    let step = OptimizerStep {
        seed: 0,
        max_consecutive_skips: 1,
        layout,
        ..OptimizerStep::from_config(&recipe)
    };
    let settings = AdamWSettings::from_config(&recipe);
    let mut training = Training::new(model, settings, WarmupCosine::constant(1e-3), step);
    let rows: Vec<Vec<u32>> = expected(name)["train"]["batch"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    (0..STEPS)
        .map(|_| {
            let batch = LmBatch::for_layout(&rows, &layout, &device);
            let report = training.train(vec![batch]).unwrap();
            (report.loss, report.grad_norm)
        })
        .collect()
}

/// Tied embeddings (Llama 3.2-style: one weight, both gradients summed, the head
/// vocabulary-parallel with the embedding), q/k/v biases split with their heads and tied
/// embeddings (Qwen2), per-head q/k norms whose gradients are summed over the group (Qwen3), and
/// the output and MLP biases added once after the row-parallel sums (Llama with every bias), and
/// the mixtures of experts (Mixtral, Qwen2-MoE's shared expert, Qwen3-MoE's sparse steps): each
/// trains under tensor parallelism as on one device, within 1e-4 (the split sums add in another
/// order).
#[test]
fn families_train_under_tensor_parallelism_as_on_one_device() {
    let _random = crate::support::exclusive_random();
    let tp2 = ParallelLayout {
        tensor: 2,
        ..ParallelLayout::SINGLE
    };
    let dp2_tp2 = ParallelLayout { data: 2, ..tp2 };
    let tp2_sp = ParallelLayout {
        sequence_parallel: true,
        ..tp2
    };
    let cases = [
        (
            "hf-tiny-llama3",
            ExecutorKind::Host,
            vec![tp2, dp2_tp2, tp2_sp],
        ),
        ("hf-tiny-llama3", ExecutorKind::Xla, vec![tp2, dp2_tp2]),
        ("hf-tiny-qwen2", ExecutorKind::Host, vec![dp2_tp2]),
        ("hf-tiny-qwen3", ExecutorKind::Host, vec![tp2, tp2_sp]),
        ("hf-tiny-llama-bias", ExecutorKind::Host, vec![tp2, tp2_sp]),
        // Mixtures: each expert's projections split, their partial products weighted and summed
        // once, the router's and the shared expert gate's gradients summed over the group, the
        // load-balancing loss counted once.
        ("hf-tiny-mixtral", ExecutorKind::Xla, vec![tp2]),
        ("hf-tiny-qwen2-moe", ExecutorKind::Host, vec![tp2]),
        ("hf-tiny-qwen3-moe", ExecutorKind::Host, vec![tp2]),
    ];
    for (name, executor, layouts) in cases {
        if executor == ExecutorKind::Xla {
            xla();
        }
        let expected = train(name, executor, ParallelLayout::SINGLE);
        for layout in layouts {
            let actual = train(name, executor, layout);
            for (step, ((loss, norm), (one_loss, one_norm))) in
                actual.iter().zip(&expected).enumerate()
            {
                for (what, a, e) in [("loss", loss, one_loss), ("gradient norm", norm, one_norm)] {
                    assert!(
                        (a - e).abs() <= 1e-4 * e.abs(),
                        "{name} on {executor:?}, {layout:?}, step {}: {what} {a}, one device {e}",
                        step + 1
                    );
                }
            }
        }
    }
}
