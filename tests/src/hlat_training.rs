//! The real HLAT model (`hlat-test` preset: RoPE, grouped-query causal attention, SwiGLU,
//! RMSNorm, untied head) trained for a few optimizer steps of HLAT's recipe (its AdamW, warmup,
//! global-norm clipping; the optimizer step `hlat pretrain` runs) on the Trainium `host` and
//! `xla` executors, from the same initial weights as on Flex: losses, gradient norms and the
//! trained weights agree.

use burn::tensor::{Device, TensorData};
use burn_trainium::stats;
use hlat::{Hlat, HlatConfig};
use hlat_train::config::TrainConfig;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::OptimizerStep;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::schedule::WarmupCosine;

use test_support::training::Training;

use crate::support::{Numbers, assert_matches, devices_under_test, reference};

const STEPS: u64 = 4;
const ROWS: usize = 4;
const SEQ_LEN: usize = 16;

/// What a run produced: per step the loss and the gradient norm, then the trained LM head and
/// first query projection.
struct Run {
    losses: Vec<f64>,
    grad_norms: Vec<f64>,
    weights: Vec<TensorData>,
}

fn token_rows(vocab: usize) -> Vec<Vec<u32>> {
    let mut numbers = Numbers::new(5);
    (0..ROWS)
        .map(|_| {
            (0..=SEQ_LEN)
                .map(|_| numbers.below(vocab as u64) as u32)
                .collect()
        })
        .collect()
}

fn train(model: Hlat, device: &Device) -> Run {
    let rows = token_rows(model.config().vocab_size);
    let recipe = TrainConfig::default();
    // HLAT's 1e-8 lets a weight whose gradient is nearly zero move by up to ±lr on rounding noise
    // alone (backends sum in different orders); 1e-3 keeps each update smooth in the gradient,
    // so trained weights can be compared closely.
    let settings = AdamWSettings {
        eps: 1e-3,
        ..AdamWSettings::from_config(&recipe)
    };
    let schedule = WarmupCosine {
        peak: 3e-3,
        warmup_steps: 2,
        decay_steps: 2,
        min_ratio: 0.1,
    };
    let step = OptimizerStep {
        seed: 7,
        max_consecutive_skips: 3,
        ..OptimizerStep::from_config(&recipe)
    };
    let mut training = Training::new(LanguageModel::new(model, None), settings, schedule, step);
    let mut run = Run {
        losses: Vec::new(),
        grad_norms: Vec::new(),
        weights: Vec::new(),
    };
    for _ in 0..STEPS {
        let report = training
            .train(vec![LmBatch::from_rows(&rows, device)])
            .unwrap();
        run.losses.push(report.loss);
        run.grad_norms.push(report.grad_norm);
    }
    let hlat = training.model().hlat;
    run.weights = vec![
        hlat.lm_head
            .as_ref()
            .expect("HLAT is untied")
            .weight
            .val()
            .into_data(),
        hlat.layers[0].self_attn.q_proj.weight.val().into_data(),
    ];
    run
}

#[test]
fn hlat_trains_identically_on_host_xla_and_flex() {
    let _random = crate::support::exclusive_random();
    let config = HlatConfig::preset("hlat-test").unwrap();
    let cpu = reference().autodiff();
    let initial = config.init(&cpu);
    let folder = tempfile::tempdir().unwrap();
    hlat::checkpoint::save_native(&initial, &config, folder.path()).unwrap();
    let expected = train(initial, &cpu);
    assert!(
        expected.losses[STEPS as usize - 1] < expected.losses[0],
        "the loss falls: {:?}",
        expected.losses
    );

    for (trainium, device) in devices_under_test() {
        let device = device.autodiff();
        let (_, model) = hlat::checkpoint::load_native(folder.path(), &device).unwrap();
        device.sync().unwrap();
        let before = stats(&trainium);
        let actual = train(model, &device);
        for (step, (e, a)) in expected.losses.iter().zip(&actual.losses).enumerate() {
            assert!(
                (e - a).abs() <= 1e-4 * e.abs(),
                "step {step}: loss {a} on {trainium}, {e} on Flex"
            );
        }
        for (step, (e, a)) in expected
            .grad_norms
            .iter()
            .zip(&actual.grad_norms)
            .enumerate()
        {
            assert!(
                (e - a).abs() <= 1e-3 * e.abs(),
                "step {step}: gradient norm {a} on {trainium}, {e} on Flex"
            );
        }
        for (index, (e, a)) in expected.weights.iter().zip(&actual.weights).enumerate() {
            assert_matches(
                &format!("trained weight #{index} on {trainium}"),
                e,
                a,
                1e-4,
            );
        }
        if trainium != burn_trainium::TrainiumDevice::HOST {
            device.sync().unwrap();
            let after = stats(&trainium);
            assert_eq!(
                after.host_fallbacks, before.host_fallbacks,
                "the HLAT step falls back to the host on {trainium}: {after:?}"
            );
        }
    }
}

/// Stochastic rounding to bf16 (the `bf16-sr` precision's update) keeps zeros, values near the
/// bottom and the top of the f32 range finite, on the host and on `xla`, whose CPU client flushes
/// subnormals to zero: each result is one of the value's two bf16 neighbours (a value below
/// 2^-119, whose bf16 spacing is subnormal, rounds to nearest, or to zero where flushed).
#[test]
fn stochastic_rounding_keeps_extreme_values_finite_on_every_device() {
    use burn::tensor::{DType, Tensor};
    use hlat_train::rounding::stochastic_round_bf16;
    let inputs = [
        0.0f32,
        -0.0,
        1e-39,
        f32::MIN_POSITIVE,
        1e-37,
        3e-36,
        1e-30,
        -1.0,
        1.0 + 2f32.powi(-9),
        3e38,
    ];
    for (trainium, device) in devices_under_test() {
        let tensor = Tensor::<1>::from_data(TensorData::new(inputs.to_vec(), [10]), &device);
        let rounded = stochastic_round_bf16(tensor)
            .cast(DType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for (&input, &output) in inputs.iter().zip(&rounded) {
            let below = f32::from_bits(input.to_bits() & 0xFFFF_0000);
            let above = if below == input {
                input
            } else {
                f32::from_bits(below.to_bits() + 0x1_0000)
            };
            assert!(
                output.is_finite()
                    && (output == below
                        || output == above
                        || (input.abs() < 1e-36 && output == 0.0)),
                "{input:e} on {trainium}: {output:e}"
            );
        }
    }
}
