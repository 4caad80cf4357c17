//! Activation checkpointing (`hlat::recompute`): with the layers or their attention core and MLP
//! activation recomputed in the backward pass, the loss and every gradient equal those of the
//! ordinary backward pass, on one device and on tensor-parallel pairs with sequence parallelism;
//! over a sequence long enough to attend by blocks too (the attention core then recomputed one
//! block of queries at a time in every mode).

use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use burn_trainium::collective::{self, ReplicaGroups};
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::moe::MoeConfig;
use hlat::parallel::{Exchange, TensorParallel, Unsharded};
use hlat::recompute::ActivationCheckpointing;
use hlat::{HlatConfig, ModelFamily};

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

    let (objective, balance) =
        model.objective_with(inputs.clone(), targets.clone(), None, exchange);
    let expected_grads = GradientsParams::from_grads(objective.backward(), &model);
    let expected = by_path(&model, &expected_grads, None);
    let replicas = |value: Tensor<1>| collective::into_replicas(value.detach()).unwrap();
    let expected_objective = replicas(objective);
    let expected_balance = balance.map(replicas);
    for mode in [
        ActivationCheckpointing::None,
        ActivationCheckpointing::Full,
        ActivationCheckpointing::Selective,
    ] {
        let step =
            model.loss_and_gradients(inputs.clone(), targets.clone(), None, exchange, mode, None);
        let objectives = replicas(step.objective);
        for (objective, expected) in objectives.iter().zip(&expected_objective) {
            assert_close(objective, expected, 1e-5, &format!("{mode} objective"));
        }
        match (step.load_balancing.map(replicas), &expected_balance) {
            (Some(balances), Some(expected_balances)) => {
                for (balance, expected) in balances.iter().zip(expected_balances) {
                    assert_close(balance, expected, 1e-5, &format!("{mode} load balancing"));
                }
            }
            (None, None) => {}
            (balance, expected) => {
                panic!("{mode}: load balancing {balance:?}, expected {expected:?}")
            }
        }
        let actual = by_path(&model, &step.gradients, None);
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

/// `hlat-test` as a Qwen3-MoE of 4 experts, 2 per token, with its first layer dense and a
/// load-balancing loss, whose gradient reaches every router through the stages.
fn mixture_config() -> HlatConfig {
    HlatConfig {
        moe: Some(MoeConfig {
            dense_layers: vec![0],
            ..MoeConfig::routed(4, 2, 8, 0.5)
        }),
        family: ModelFamily::Qwen3Moe,
        qk_norm: true,
        init_std: 0.5,
        ..HlatConfig::preset("hlat-test").unwrap()
    }
}

#[test]
fn recomputed_gradients_of_a_mixture_equal_kept_ones() {
    let device = host().autodiff();
    check_config(mixture_config(), &device, &Unsharded, None, 8);
    check_config(
        mixture_config(),
        &device,
        &Unsharded,
        None,
        ATTENTION_BLOCK + 2,
    );
}

#[test]
fn recomputed_gradients_of_a_mixture_equal_kept_ones_under_tensor_and_sequence_parallelism() {
    let device = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 2)).autodiff();
    let parallel = TensorParallel {
        groups: ReplicaGroups::all(2),
        sequence_parallel: true,
    };
    check_config(mixture_config(), &device, &parallel, Some(&parallel), 8);
}
