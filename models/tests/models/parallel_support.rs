//! What the tests of tensor parallelism and activation checkpointing share: a batch, gradients
//! read back by parameter path, and a relative comparison.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_trainium::collective::{self, ReduceOp};
use hlat::parallel::{
    ParamPath, Placement, TensorParallel, join_parameter, kv_copies, kv_copy_groups,
};
use hlat::{Hlat, HlatConfig};

/// A model of `config` on `device` with its values drawn once: Burn initialises parameters
/// lazily and each clone of an uninitialised parameter draws its own values.
pub fn materialized(config: &HlatConfig, device: &Device) -> Hlat {
    let model: Hlat = config.init(device);
    model.clone().load_record(model.into_record())
}

/// Inputs and targets of one batch of 2 rows of 8 tokens (ids of the 64-token `hlat-test`
/// vocabulary), the same on every replica.
pub fn batch(device: &Device) -> (Tensor<2, Int>, Tensor<2, Int>) {
    batch_of(device, 2, 8)
}

/// Inputs and targets of one batch of `rows` rows of `seq` tokens, as [`batch`].
pub fn batch_of(device: &Device, rows: usize, seq: usize) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let ids: Vec<i64> = (0..rows * (seq + 1))
        .map(|i| (i as i64 * 37 + 5) % 64)
        .collect();
    let all = Tensor::<2, Int>::from_data(TensorData::new(ids, [rows, seq + 1]), device);
    (all.clone().narrow(1, 0, seq), all.narrow(1, 1, seq))
}

/// Every gradient of `model` by parameter path, one value per replica. With `joined`, split
/// gradients are joined across the group, under sequence parallelism those of the norm gains
/// (each rank saw its slice of the sequence) are summed over it, and those of KV heads held by
/// several ranks are summed over their holders before they are joined.
pub fn by_path(
    model: &Hlat,
    grads: &GradientsParams,
    joined: Option<&TensorParallel>,
) -> Vec<(String, Vec<TensorData>)> {
    struct Collect<'a> {
        grads: &'a GradientsParams,
        joined: Option<&'a TensorParallel>,
        path: ParamPath,
        out: Vec<(String, Vec<TensorData>)>,
    }
    impl ModuleVisitor for Collect<'_> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.enter(name);
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let mut grad = self
                .grads
                .get::<D>(param.id)
                .expect("every parameter has a gradient");
            if let Some(parallel) = self.joined {
                grad = match self.path.placement() {
                    Placement::Split(dim) => collective::all_gather(grad, dim, &parallel.groups),
                    placement @ Placement::ReplicatedHeads { copies, .. } => {
                        let copy_groups = kv_copy_groups(&parallel.groups, copies);
                        let summed = collective::all_reduce(grad, ReduceOp::Sum, &copy_groups);
                        join_parameter(summed, placement, &parallel.groups)
                    }
                    Placement::Replicated
                        if self.path.partial_gradient(parallel.sequence_parallel) =>
                    {
                        collective::all_reduce(grad, ReduceOp::Sum, &parallel.groups)
                    }
                    Placement::Replicated => grad,
                };
            }
            let replicas = collective::into_replicas(grad).unwrap();
            self.out.push((self.path.names().join("."), replicas));
        }
    }
    let copies = joined.map_or(1, |parallel| {
        kv_copies(model.config().num_kv_heads, parallel.groups.group_size())
    });
    let mut collect = Collect {
        grads,
        joined,
        path: ParamPath::with_kv_copies(copies),
        out: Vec::new(),
    };
    model.visit(&mut collect);
    collect.out
}

/// Checks every element of `actual` within `relative` × the largest magnitude of `expected`.
pub fn assert_close(actual: &TensorData, expected: &TensorData, relative: f32, what: &str) {
    let actual = actual.try_to_vec::<f32>().unwrap();
    let expected = expected.try_to_vec::<f32>().unwrap();
    assert_eq!(actual.len(), expected.len(), "{what}");
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (index, (a, e)) in actual.iter().zip(&expected).enumerate() {
        assert!(
            (a - e).abs() <= relative * scale,
            "{what}[{index}]: {a}, expected {e} (largest {scale})"
        );
    }
}

/// Every gradient of `actual`, on every replica, within `relative` of replica `r`'s gradient of
/// the same path in `expected` (replica 0's when `expected` has one replica).
pub fn assert_same_gradients(
    actual: &[(String, Vec<TensorData>)],
    expected: &[(String, Vec<TensorData>)],
    relative: f32,
    what: &str,
) {
    assert_eq!(actual.len(), expected.len(), "{what}");
    for ((path, grads), (expected_path, expected_grads)) in actual.iter().zip(expected) {
        assert_eq!(path, expected_path, "{what}");
        for (replica, grad) in grads.iter().enumerate() {
            let reference = expected_grads.get(replica).unwrap_or(&expected_grads[0]);
            assert_close(
                grad,
                reference,
                relative,
                &format!("{what}: {path} on replica {replica}"),
            );
        }
    }
}
