//! Data parallelism with the collectives: an MLP (burn-nn `Linear` and ReLU) trained 10 steps
//! with AdamW on 4 replicas, each on a quarter of the batch, gradients averaged by an all-reduce,
//! ends with the parameters of one device trained on the whole batch; the repeating step
//! compiles once. On `host` and on `xla`, each served in the process.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Device, Tensor, TensorData};
use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};
use burn_trainium::{ExecutorKind, TrainiumDevice, stats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::support::{assert_close, exclusive_random, lock_device, plugin_path};

const STEPS: usize = 10;
const REPLICAS: usize = 4;
const BATCH: usize = 16;

#[derive(Module, Debug)]
struct Mlp {
    hidden: Linear,
    output: Linear,
    activation: Relu,
}

impl Mlp {
    fn new(device: &Device) -> Self {
        Self {
            hidden: LinearConfig::new(8, 32).init(device),
            output: LinearConfig::new(32, 4).init(device),
            activation: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
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

/// `values` (`rows` × `columns`) on `device`, cut by rows into one part per replica.
fn batch(values: Vec<f32>, columns: usize, device: &Device, replicas: usize) -> Tensor<2> {
    let rows = values.len() / columns;
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

impl ModuleVisitor for AverageGradients<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(grad) = self.grads.remove::<D>(param.id) {
            let mean = collective::all_reduce(grad, ReduceOp::Mean, &self.groups);
            self.grads.register(param.id, mean);
        }
    }
}

/// The programs `device` compiled or loaded from the compile cache on disk so far.
fn new_programs(device: &TrainiumDevice) -> u64 {
    let device_stats = stats(device);
    device_stats.compiles + device_stats.programs_loaded
}

/// Trains `initial` on `trainium` served in the process; returns the loss of every step (the
/// mean over replicas), the new programs after each step and every replica's final hidden weight.
fn train(initial: &Mlp, trainium: &TrainiumDevice) -> (Vec<f32>, Vec<u64>, Vec<TensorData>) {
    let replicas = usize::from(trainium.replicas);
    let served = burn_trainium::device(&trainium.to_string()).expect("the device is served");
    assert_eq!(collective::replica_count(&served), replicas, "{trainium}");
    let device = served.autodiff();
    let mut model = initial.clone().fork(&device);
    let x = batch(random(BATCH, 8, 1), 8, &device, replicas);
    let y = batch(random(BATCH, 4, 2), 4, &device, replicas);
    let groups = ReplicaGroups::all(replicas);
    let mut optimizer = AdamWConfig::new().with_weight_decay(0.1).init();
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
        losses.push(loss.into_scalar::<f32>());
        let learning_rate = 1e-2 * (1.0 + step as f64 / 7.0);
        model = optimizer.step(learning_rate, model, grads);
        compiles.push(new_programs(trainium));
    }
    let weight = collective::into_replicas(model.valid().hidden.weight.val()).unwrap();
    (losses, compiles, weight)
}

fn check(executor: ExecutorKind) {
    let single = TrainiumDevice::new(executor, 0);
    let replicated = TrainiumDevice::replicated(executor, REPLICAS as u16);
    let _exclusive = lock_device(&replicated);
    // The same initial weights for both: drawn once, on Flex.
    let initial = {
        let _random = exclusive_random();
        let flex = Device::flex();
        flex.seed(7);
        let model = Mlp::new(&flex.autodiff());
        // Parameters initialize lazily: drawn here, under the random lock, not on first use.
        for linear in [&model.hidden, &model.output] {
            linear.weight.val();
            linear.bias.as_ref().map(Param::val);
        }
        model
    };
    let (expected, _, expected_weight) = train(&initial, &single);
    let compiled_before = new_programs(&replicated);
    let (actual, compiles, weights) = train(&initial, &replicated);
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
        // The steps ran as programs of the device (not on the device the model was made on).
        assert!(
            compiles[0] > compiled_before,
            "new programs after each step: {compiles:?}, {compiled_before} before"
        );
        let steady = &compiles[3..];
        assert_eq!(
            steady.first(),
            steady.last(),
            "new programs after each step: {compiles:?} (the repeating step must compile once)"
        );
        let after = stats(&replicated);
        assert_eq!(after.host_fallbacks, 0, "{after:?}");
        assert!(after.collectives > 0, "{after:?}");
    }
}

#[test]
fn data_parallel_training_equals_one_device_on_the_whole_batch_on_host_and_xla() {
    check(ExecutorKind::Host);
    plugin_path();
    check(ExecutorKind::Xla);
}
