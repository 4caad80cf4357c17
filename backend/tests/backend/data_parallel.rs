//! A small Burn training loop on `xla:0`: an MLP (burn-nn `Linear` and ReLU) trained 20 steps with
//! AdamW and a learning rate that changes every step. Losses must match the host executor, and
//! the repeating step must compile once, not once per step.

mod xla_support;

use burn::backend::Autodiff;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::Backend;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use burn_trainium::{Trainium, TrainiumDevice, stats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use xla_support::xla;

type B = Autodiff<Trainium>;

const STEPS: usize = 20;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    hidden: Linear<B>,
    output: Linear<B>,
    activation: Relu,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(8, 32).init(device),
            output: LinearConfig::new(32, 4).init(device),
            activation: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.output
            .forward(self.activation.forward(self.hidden.forward(x)))
    }
}

fn random(shape: [usize; 2], seed: u64) -> TensorData {
    let mut rng = StdRng::seed_from_u64(seed);
    let values: Vec<f32> = (0..shape[0] * shape[1])
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    TensorData::new(values, shape)
}

/// Trains on `device` from the same initial weights; returns the loss of every step and the
/// number of compiles after each step.
fn train(device: &TrainiumDevice) -> (Vec<f32>, Vec<u64>) {
    B::seed(&TrainiumDevice::HOST, 7);
    let mut model = Mlp::<B>::new(&TrainiumDevice::HOST).to_device(device);
    let x = Tensor::<B, 2>::from_data(random([16, 8], 1), device);
    let y = Tensor::<B, 2>::from_data(random([16, 4], 2), device);
    let mut optimizer = AdamWConfig::new()
        .with_weight_decay(0.1)
        .init::<B, Mlp<B>>();
    let mut losses = Vec::new();
    let mut compiles = Vec::new();
    for step in 0..STEPS {
        let prediction = model.forward(x.clone());
        let loss = (prediction - y.clone()).powi_scalar(2).mean();
        losses.push(loss.clone().into_scalar().elem::<f32>());
        let gradients = GradientsParams::from_grads(loss.backward(), &model);
        let learning_rate = 1e-2 * (1.0 + step as f64 / 7.0);
        model = optimizer.step(learning_rate, model, gradients);
        compiles.push(stats(device).compiles);
    }
    (losses, compiles)
}

#[test]
fn mlp_with_adamw_matches_the_host_and_compiles_the_step_once() {
    let device = xla(0);
    let (expected, _) = train(&TrainiumDevice::HOST);
    let (actual, compiles) = train(&device);
    for (step, (e, a)) in expected.iter().zip(&actual).enumerate() {
        assert!(
            (e - a).abs() <= 1e-4 * e.abs(),
            "step {step}: loss {a} on xla, {e} on host"
        );
    }
    assert!(
        expected[STEPS - 1] < expected[0],
        "the loss decreases: {expected:?}"
    );
    // The first steps differ (no optimizer state yet); from then on every step is the same
    // program with other scalars (learning rate, bias corrections).
    let steady = &compiles[3..];
    assert_eq!(
        steady.first(),
        steady.last(),
        "compiles after each step: {compiles:?} (the repeating step must compile once)"
    );
    let device_stats = stats(&device);
    assert!(
        device_stats.cache_hits >= (STEPS - 4) as u64,
        "{device_stats:?}"
    );
    assert_eq!(device_stats.host_fallbacks, 0, "{device_stats:?}");
}
