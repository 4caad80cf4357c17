//! Activation checkpointing (`hlat::recompute`): with the layers or their attention core and MLP
//! activation recomputed in the backward pass, the loss and every gradient equal those of the
//! ordinary backward pass, on one device and on tensor-parallel pairs with sequence parallelism;
//! over a sequence long enough to attend by blocks too (the attention core then recomputed one
//! block of queries at a time in every mode).

use burn::optim::GradientsParams;
use burn::tensor::Device;
use burn_trainium::collective::{self, ReplicaGroups};
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::HlatConfig;
use hlat::parallel::{Exchange, TensorParallel, Unsharded};
use hlat::recompute::ActivationCheckpointing;

use hlat::blocked_attention::ATTENTION_BLOCK;

use crate::parallel_support::{
    assert_close, assert_same_gradients, batch_of, by_path, materialized,
};
use crate::{host, trainium};

fn check(device: &Device, exchange: &dyn Exchange, shard: Option<&TensorParallel>, seq: usize) {
    check_config(
        HlatConfig::preset("hlat-test").unwrap(),
        device,
        exchange,
        shard,
        seq,
    );
}

fn check_config(
    mut config: HlatConfig,
    device: &Device,
    exchange: &dyn Exchange,
    shard: Option<&TensorParallel>,
    seq: usize,
) {
    config.max_seq_len = config.max_seq_len.max(seq);
    let model = materialized(&config, device);
    let model = match shard {
        Some(parallel) => model.shard(parallel),
        None => model,
    };
    let (inputs, targets) = batch_of(device, 2, seq);

    let loss = model.loss_with(inputs.clone(), targets.clone(), None, exchange);
    let expected_grads = GradientsParams::from_grads(loss.backward(), &model);
    let expected = by_path(&model, &expected_grads, None);
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
            assert_close(loss, expected, 1e-5, &format!("{mode} loss"));
        }
        let actual = by_path(&model, &grads, None);
        assert_same_gradients(&actual, &expected, 1e-5, &format!("{mode}, kept"));
    }
}

#[test]
fn recomputed_gradients_equal_kept_ones_on_one_device() {
    check(&host().autodiff(), &Unsharded, None, 8);
}

#[test]
fn gradients_of_attention_by_blocks_equal_kept_ones_over_a_long_sequence() {
    // Two whole blocks and a partial one.
    check(
        &host().autodiff(),
        &Unsharded,
        None,
        2 * ATTENTION_BLOCK + 100,
    );
}

/// A sliding window over a long sequence: the backward pass by blocks of queries masks the
/// window as the forward pass does.
#[test]
fn gradients_with_a_sliding_window_over_a_long_sequence_equal_kept_ones() {
    let seq = ATTENTION_BLOCK + 100;
    let config = crate::model::windowed_config(seq);
    check_config(config, &host().autodiff(), &Unsharded, None, seq);
}

#[test]
fn recomputed_gradients_equal_kept_ones_under_tensor_and_sequence_parallelism() {
    let device = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 2)).autodiff();
    let parallel = TensorParallel {
        groups: ReplicaGroups::all(2),
        sequence_parallel: true,
    };
    check(&device, &parallel, Some(&parallel), 8);
    check(&device, &parallel, Some(&parallel), ATTENTION_BLOCK + 2);
}
