//! Activation checkpointing (`hlat::recompute`): with the layers or their attention core and MLP
//! activation recomputed in the backward pass, the loss and every gradient equal those of the
//! ordinary backward pass, on one device and on tensor-parallel pairs with sequence parallelism.

use burn::backend::Autodiff;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor, TensorData};
use burn_trainium::collective::{self, ReplicaGroups};
use burn_trainium::{ExecutorKind, Trainium, TrainiumDevice};
use hlat::parallel::{Exchange, ParamPath, TensorParallel, Unsharded};
use hlat::recompute::ActivationCheckpointing;
use hlat::{Hlat, HlatConfig};

type B = Autodiff<Trainium>;

/// Every gradient in `grads` by parameter path, one value per replica.
fn by_path(model: &Hlat<B>, grads: &GradientsParams) -> Vec<(String, Vec<TensorData>)> {
    struct Collect<'a> {
        grads: &'a GradientsParams,
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
            let grad = self
                .grads
                .get::<Trainium, D>(param.id)
                .expect("every parameter has a gradient");
            let replicas = collective::into_replicas(grad).unwrap();
            self.out.push((self.path.names().join("."), replicas));
        }
    }
    let mut collect = Collect {
        grads,
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
            (a - e).abs() <= 1e-5 * scale,
            "{what}[{index}]: {a} recomputed, {e} kept (largest {scale})"
        );
    }
}

fn check(device: &TrainiumDevice, exchange: &dyn Exchange<B>, shard: Option<&TensorParallel>) {
    let config = HlatConfig::preset("hlat-test").unwrap();
    let model: Hlat<B> = Hlat::from_inner(config.init(device));
    let model = match shard {
        Some(parallel) => model.shard(parallel),
        None => model,
    };
    let rows: Vec<i64> = (0..2 * 9).map(|i| (i * 29 + 3) % 64).collect();
    let all = Tensor::<B, 2, Int>::from_data(TensorData::new(rows, [2, 9]), device);
    let (inputs, targets) = (all.clone().narrow(1, 0, 8), all.narrow(1, 1, 8));

    let loss = model.loss_with(inputs.clone(), targets.clone(), None, exchange);
    let expected = by_path(
        &model,
        &GradientsParams::from_grads(loss.backward(), &model),
    );
    let expected_loss = collective::into_replicas(loss).unwrap();
    for mode in [
        ActivationCheckpointing::None,
        ActivationCheckpointing::Full,
        ActivationCheckpointing::Selective,
    ] {
        let (loss, grads) =
            model.loss_and_gradients(inputs.clone(), targets.clone(), None, exchange, mode);
        let losses = collective::into_replicas(loss).unwrap();
        for (loss, expected) in losses.iter().zip(&expected_loss) {
            assert_close(loss, expected, &format!("{mode} loss"));
        }
        let actual = by_path(&model, &grads);
        assert_eq!(actual.len(), expected.len());
        for ((path, grads), (_, expected)) in actual.iter().zip(&expected) {
            for (replica, (grad, expected)) in grads.iter().zip(expected).enumerate() {
                assert_close(
                    grad,
                    expected,
                    &format!("{mode}: {path} on replica {replica}"),
                );
            }
        }
    }
}

#[test]
fn recomputed_gradients_equal_kept_ones_on_one_device() {
    check(&TrainiumDevice::HOST, &Unsharded, None);
}

#[test]
fn recomputed_gradients_equal_kept_ones_under_tensor_and_sequence_parallelism() {
    let device = TrainiumDevice::replicated(ExecutorKind::Host, 2);
    let parallel = TensorParallel {
        groups: ReplicaGroups::all(2),
        sequence_parallel: true,
    };
    check(&device, &parallel, Some(&parallel));
}
