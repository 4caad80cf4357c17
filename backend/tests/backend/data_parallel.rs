//! Data parallelism with the collectives: an MLP (burn-nn `Linear` and ReLU) trained 10 steps
//! with AdamW on 4 replicas, each on a quarter of the batch, gradients averaged by an all-reduce,
//! ends with the parameters of one device trained on the whole batch; the repeating step
//! compiles once. On `host` and on `xla`.

use burn::backend::Autodiff;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::Backend;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};
use burn_trainium::{ExecutorKind, Trainium, TrainiumDevice, stats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::support::{assert_close, exclusive_random, lock_device, plugin_path};

type B = Autodiff<Trainium>;

const STEPS: usize = 10;
const REPLICAS: usize = 4;
const BATCH: usize = 16;

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

fn random(rows: usize, columns: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..rows * columns)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect()
}

/// `values` (`rows` × `columns`) on `device`, cut by rows into one quarter per replica when the
/// device has replicas.
fn batch(values: Vec<f32>, columns: usize, device: &TrainiumDevice) -> Tensor<B, 2> {
    let rows = values.len() / columns;
    let replicas = usize::from(device.replicas);
    let part = rows / replicas;
    let shards = values
        .chunks(part * columns)
        .map(|shard| TensorData::new(shard.to_vec(), [part, columns]))
        .collect();
    collective::from_replicas(shards, device)
}

/// Averages every parameter's gradient over the replicas.
struct AverageGradients<'a> {
    grads: &'a mut GradientsParams,
    groups: ReplicaGroups,
}

impl ModuleVisitor<B> for AverageGradients<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.remove::<Trainium, D>(param.id) {
            let mean = collective::all_reduce(grad, ReduceOp::Mean, &self.groups);
            self.grads.register(param.id, mean);
        }
    }
}

/// Trains on `device` from the same initial weights; returns the loss of every step (the mean
/// over replicas), the compiles after each step and every replica's final hidden weight.
fn train(device: &TrainiumDevice) -> (Vec<f32>, Vec<u64>, Vec<TensorData>) {
    B::seed(&TrainiumDevice::HOST, 7);
    let mut model = Mlp::<B>::new(&TrainiumDevice::HOST).to_device(device);
    let x = batch(random(BATCH, 8, 1), 8, device);
    let y = batch(random(BATCH, 4, 2), 4, device);
    let groups = ReplicaGroups::all(usize::from(device.replicas));
    let mut optimizer = AdamWConfig::new()
        .with_weight_decay(0.1)
        .init::<B, Mlp<B>>();
    let mut losses = Vec::new();
    let mut compiles = Vec::new();
    for step in 0..STEPS {
        let loss = (model.forward(x.clone()) - y.clone()).powi_scalar(2).mean();
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        model.visit(&mut AverageGradients {
            grads: &mut grads,
            groups: groups.clone(),
        });
        let loss = collective::all_reduce(loss.inner(), ReduceOp::Mean, &groups);
        losses.push(loss.into_scalar().elem::<f32>());
        let learning_rate = 1e-2 * (1.0 + step as f64 / 7.0);
        model = optimizer.step(learning_rate, model, grads);
        compiles.push(stats(device).compiles);
    }
    let weight = collective::into_replicas(model.valid().hidden.weight.val()).unwrap();
    (losses, compiles, weight)
}

fn check(executor: ExecutorKind) {
    let single = TrainiumDevice::new(executor, 0);
    let replicated = TrainiumDevice::replicated(executor, REPLICAS as u16);
    let _exclusive = lock_device(&replicated);
    let (expected, _, expected_weight) = train(&single);
    let (actual, compiles, weights) = train(&replicated);
    for (step, (e, a)) in expected.iter().zip(&actual).enumerate() {
        assert!(
            (e - a).abs() <= 1e-5 * e.abs(),
            "step {step}: loss {a} on {replicated}, {e} on {single}"
        );
    }
    assert!(
        expected[STEPS - 1] < expected[0],
        "the loss decreases: {expected:?}"
    );
    assert_eq!(weights.len(), REPLICAS);
    for (replica, weight) in weights.iter().enumerate() {
        assert_close(
            &format!("hidden weight of replica {replica} on {replicated}"),
            &expected_weight[0],
            weight,
            1e-5,
        );
    }
    if executor == ExecutorKind::Xla {
        // The first steps differ (no optimizer state yet); from then on every step is the same
        // program with other scalars (learning rate, bias corrections).
        let steady = &compiles[3..];
        assert_eq!(
            steady.first(),
            steady.last(),
            "compiles after each step: {compiles:?} (the repeating step must compile once)"
        );
        let after = stats(&replicated);
        assert_eq!(after.host_fallbacks, 0, "{after:?}");
        assert!(after.collectives > 0, "{after:?}");
    }
}

/// One test for both executors: the initial weights come from the host's process-wide random
/// generator, which two tests running at once would share.
#[test]
fn data_parallel_training_equals_one_device_on_the_whole_batch_on_host_and_xla() {
    let _random = exclusive_random();
    check(ExecutorKind::Host);
    plugin_path();
    check(ExecutorKind::Xla);
}
