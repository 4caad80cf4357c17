//! Tensor and sequence parallelism (`hlat::parallel`) on the replicas of a `host` device: the
//! sharded model's loss and gradients, joined back, equal the whole model's.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn_trainium::collective::{self, ReplicaGroups};
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::parallel::TensorParallel;
use hlat::{Hlat, HlatConfig};

use crate::parallel_support::{B, assert_close, assert_same_gradients, batch, by_path};

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
