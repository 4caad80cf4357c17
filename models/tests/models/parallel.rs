//! Tensor and sequence parallelism (`hlat::parallel`) on the replicas of a `host` device: the
//! sharded model's loss and gradients, joined back, equal the whole model's.

use burn::backend::Autodiff;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};
use burn_trainium::{ExecutorKind, Trainium, TrainiumDevice};
use hlat::parallel::{ParamPath, Placement, TensorParallel};
use hlat::{Hlat, HlatConfig};

type B = Autodiff<Trainium>;
type Gradients = <B as AutodiffBackend>::Gradients;

/// The rows of one batch (ids of the 64-token `hlat-test` vocabulary), the same on every replica.
fn batch(device: &TrainiumDevice) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let rows: Vec<i64> = (0..2 * 9).map(|i| (i * 37 + 5) % 64).collect();
    let all = Tensor::<B, 2, Int>::from_data(TensorData::new(rows, [2, 9]), device);
    (all.clone().narrow(1, 0, 8), all.narrow(1, 1, 8))
}

/// Every gradient of `model` by parameter path, one value per replica. With `parallel`, split
/// gradients are joined across the group, and under sequence parallelism those of the norm gains
/// (each rank saw its slice of the sequence) are summed over it.
fn gradients(
    model: &Hlat<B>,
    grads: &Gradients,
    parallel: Option<&TensorParallel>,
) -> Vec<(String, Vec<TensorData>)> {
    struct Collect<'a> {
        grads: &'a Gradients,
        parallel: Option<&'a TensorParallel>,
        path: ParamPath,
        out: Vec<(String, Vec<TensorData>)>,
    }
    impl ModuleVisitor<B> for Collect<'_> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.enter(name);
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let mut grad = param
                .val()
                .grad(self.grads)
                .expect("every parameter has a gradient");
            if let Some(parallel) = self.parallel {
                grad = match self.path.placement() {
                    Placement::Split(dim) => collective::all_gather(grad, dim, &parallel.groups),
                    Placement::Replicated if parallel.sequence_parallel => {
                        collective::all_reduce(grad, ReduceOp::Sum, &parallel.groups)
                    }
                    Placement::Replicated => grad,
                };
            }
            let replicas = collective::into_replicas(grad).unwrap();
            self.out.push((self.path.names().join("."), replicas));
        }
    }
    let mut collect = Collect {
        grads,
        parallel,
        path: ParamPath::default(),
        out: Vec::new(),
    };
    model.visit(&mut collect);
    collect.out
}

fn assert_close(actual: &TensorData, expected: &TensorData, what: &str) {
    let actual = actual.to_vec::<f32>().unwrap();
    let expected = expected.to_vec::<f32>().unwrap();
    assert_eq!(actual.len(), expected.len(), "{what}");
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (index, (a, e)) in actual.iter().zip(&expected).enumerate() {
        assert!(
            (a - e).abs() <= 1e-4 * scale,
            "{what}[{index}]: {a}, whole model {e} (largest {scale})"
        );
    }
}

/// The whole model against its shards over `groups` of a `replicas`-replica `host` device.
fn check(replicas: usize, groups: ReplicaGroups, sequence_parallel: bool) {
    let device = TrainiumDevice::replicated(ExecutorKind::Host, replicas as u16);
    let config = HlatConfig::preset("hlat-test").unwrap();
    // Burn initialises parameters lazily and each clone of an uninitialised parameter draws its
    // own values: `from_inner` materialises them once.
    let whole: Hlat<B> = Hlat::from_inner(config.init(&device));
    let parallel = TensorParallel {
        groups,
        sequence_parallel,
    };
    let sharded = whole.clone().shard(&parallel);
    let (inputs, targets) = batch(&device);

    let expected_loss = whole.loss(inputs.clone(), targets.clone(), None);
    let expected = gradients(&whole, &expected_loss.backward(), None);
    let loss = sharded.loss_with(inputs, targets, None, &parallel);
    let actual = gradients(&sharded, &loss.backward(), Some(&parallel));

    let losses = collective::into_replicas(loss).unwrap();
    let expected_losses = collective::into_replicas(expected_loss).unwrap();
    for loss in &losses {
        assert_close(loss, &expected_losses[0], "loss");
    }
    assert_eq!(actual.len(), expected.len());
    for ((path, grads), (expected_path, expected_grads)) in actual.iter().zip(&expected) {
        assert_eq!(path, expected_path);
        for (replica, grad) in grads.iter().enumerate() {
            assert_close(
                grad,
                &expected_grads[0],
                &format!("{path} on replica {replica}"),
            );
        }
    }
}

#[test]
fn tensor_parallel_loss_and_gradients_equal_the_whole_model() {
    check(2, ReplicaGroups::all(2), false);
}

#[test]
fn sequence_parallel_loss_and_gradients_equal_the_whole_model() {
    check(2, ReplicaGroups::all(2), true);
}

#[test]
fn tensor_parallel_pairs_inside_four_replicas_equal_the_whole_model() {
    check(4, ReplicaGroups::contiguous(4, 2).unwrap(), true);
}
