//! Tensor and sequence parallelism (`hlat::parallel`) on the replicas of a `host` device: the
//! sharded model's loss and gradients, joined back, equal the whole model's; so do its logits and
//! gradients when the degree exceeds the KV heads (each held by several ranks).

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use burn_trainium::collective::{self, ReplicaGroups};
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::parallel::TensorParallel;
use hlat::{Hlat, HlatConfig, ModelFamily};

use crate::parallel_support::{assert_close, assert_same_gradients, batch, by_path, materialized};
use crate::trainium;

/// The whole model against its shards over `groups` of a `replicas`-replica `host` device.
fn check(replicas: usize, groups: ReplicaGroups, sequence_parallel: bool) {
    let config = HlatConfig::preset("hlat-test").unwrap();
    check_config(config, replicas, groups, sequence_parallel);
}

/// [`check`] for a model of `config`.
fn check_config(
    config: HlatConfig,
    replicas: usize,
    groups: ReplicaGroups,
    sequence_parallel: bool,
) {
    let device = trainium(TrainiumDevice::replicated(
        ExecutorKind::Host,
        replicas as u16,
    ))
    .autodiff();
    let whole = materialized(&config, &device);
    let parallel = TensorParallel {
        groups,
        sequence_parallel,
    };
    let sharded = whole.clone().shard(&parallel);
    let (inputs, targets) = batch(&device);

    let expected_loss = whole.loss(inputs.clone(), targets.clone(), None);
    let expected_grads = GradientsParams::from_grads(expected_loss.backward(), &whole);
    let expected = by_path(&whole, &expected_grads, None);
    let loss = sharded.loss_with(inputs, targets, None, &parallel);
    let grads = GradientsParams::from_grads(loss.backward(), &sharded);
    let actual = by_path(&sharded, &grads, Some(&parallel));

    let losses = collective::into_replicas(loss).unwrap();
    let expected_losses = collective::into_replicas(expected_loss).unwrap();
    for loss in &losses {
        assert_close(loss, &expected_losses[0], 1e-4, "loss");
    }
    assert_same_gradients(&actual, &expected, 1e-4, "the whole model's");
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

/// `hlat-test` (4 heads) with `num_kv_heads` KV heads.
fn with_kv_heads(num_kv_heads: usize) -> HlatConfig {
    HlatConfig {
        num_kv_heads,
        ..HlatConfig::preset("hlat-test").unwrap()
    }
}

/// The configurations whose KV heads tp 4 replicates: 2 KV heads (each on 2 ranks), 1 (on all
/// 4), and 1 in a Qwen3 model with attention biases and per-head query/key norms.
fn replicated_kv_configs() -> [HlatConfig; 3] {
    [
        with_kv_heads(2),
        with_kv_heads(1),
        HlatConfig {
            family: ModelFamily::Qwen3,
            qkv_bias: true,
            o_proj_bias: true,
            qk_norm: true,
            ..with_kv_heads(1)
        },
    ]
}

/// Every parameter's values on every replica, by path, in visiting order.
fn parameters(model: &Hlat) -> Vec<(String, Vec<TensorData>)> {
    struct Collect {
        path: Vec<String>,
        out: Vec<(String, Vec<TensorData>)>,
    }
    impl ModuleVisitor for Collect {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let replicas = collective::into_replicas(param.val()).unwrap();
            self.out.push((self.path.join("."), replicas));
        }
    }
    let mut collect = Collect {
        path: Vec::new(),
        out: Vec::new(),
    };
    model.visit(&mut collect);
    collect.out
}

/// Four replicas of the host device, and tensor parallelism over them.
fn four_ways() -> (Device, TensorParallel) {
    let device = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 4));
    let parallel = TensorParallel {
        groups: ReplicaGroups::all(4),
        sequence_parallel: false,
    };
    (device, parallel)
}

/// A model of `config` on `device` (its values materialised) and the same model split by
/// `parallel`.
fn whole_and_split(
    config: &HlatConfig,
    device: &Device,
    parallel: &TensorParallel,
) -> (Hlat, Hlat) {
    let whole: Hlat = config.init(device);
    let whole = whole.clone().load_record(whole.into_record());
    let sharded = whole.clone().shard(parallel);
    (whole, sharded)
}

#[test]
fn replicated_kv_heads_give_the_whole_models_logits() {
    let (device, parallel) = four_ways();
    for config in replicated_kv_configs() {
        let (whole, sharded) = whole_and_split(&config, &device, &parallel);
        for layer in &sharded.layers {
            assert_eq!(
                (layer.self_attn.num_heads, layer.self_attn.num_kv_heads),
                (1, 1),
                "{config:?}"
            );
        }
        let (inputs, _) = batch(&device);
        let inputs = inputs.inner();
        let expected = collective::into_replicas(whole.forward(inputs.clone())).unwrap();
        let local = sharded.forward_with(inputs, &parallel);
        let logits = collective::all_gather(local, 2, &parallel.groups);
        for (replica, logits) in collective::into_replicas(logits)
            .unwrap()
            .iter()
            .enumerate()
        {
            let (actual, expected) = (
                logits.try_to_vec::<f32>().unwrap(),
                expected[0].try_to_vec::<f32>().unwrap(),
            );
            assert_eq!(actual.len(), expected.len());
            for (index, (a, e)) in actual.iter().zip(&expected).enumerate() {
                assert!(
                    (a - e).abs() <= 1e-5,
                    "kv {}, replica {replica}, logit {index}: {a}, whole model {e}",
                    config.num_kv_heads
                );
            }
        }
    }
}

#[test]
fn replicated_kv_heads_split_and_join_bit_exactly() {
    let (device, parallel) = four_ways();
    for config in replicated_kv_configs() {
        let (whole, sharded) = whole_and_split(&config, &device, &parallel);
        // Rank r holds KV head r / (4 / num_kv_heads): its columns of the whole projection.
        let head_dim = config.head_dim();
        let copies = 4 / config.num_kv_heads;
        let key = sharded.layers[1].self_attn.k_proj.weight.val();
        let whole_key = whole.layers[1].self_attn.k_proj.weight.val();
        let ranks = collective::into_replicas(key).unwrap();
        for (rank, part) in ranks.iter().enumerate() {
            let head = rank / copies;
            let expected = whole_key.clone().narrow(1, head * head_dim, head_dim);
            let expected = collective::into_replicas(expected).unwrap().remove(rank);
            assert_eq!(part, &expected, "kv {}, rank {rank}", config.num_kv_heads);
        }
        let joined = sharded.unshard(&parallel);
        assert_eq!(joined.layers[0].self_attn.num_kv_heads, config.num_kv_heads);
        assert_eq!(parameters(&joined), parameters(&whole), "{config:?}");
    }
}

/// Loss and gradients (each KV head's summed over the ranks holding it) as the whole model's,
/// with and without sequence parallelism, and in the second tensor-parallel group of a dp 2 ×
/// tp 4 layout.
#[test]
fn replicated_kv_heads_give_the_whole_models_loss_and_gradients() {
    for config in replicated_kv_configs() {
        check_config(config.clone(), 4, ReplicaGroups::all(4), false);
        check_config(config, 4, ReplicaGroups::all(4), true);
    }
    check_config(
        with_kv_heads(2),
        8,
        ReplicaGroups::contiguous(8, 4).unwrap(),
        true,
    );
}
