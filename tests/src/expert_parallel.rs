//! Expert parallelism of a mixture on a replicated device (`host:0-1`, `xla:0-1`): the experts of
//! a sparse layer split over 2 ranks give each rank the output the whole layer gives its own
//! tokens, and each rank's experts get the whole layer's gradient over both ranks' tokens,
//! dropless and under a capacity factor (GShard's groups being each rank's tokens). The router,
//! replicated, gets the gradient of its rank's tokens. Joining the experts gives the layer back.

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use burn_trainium::collective::{self, ReplicaGroups};
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::HlatConfig;
use hlat::expert_parallel::ExpertParallel;
use hlat::moe::{MoeConfig, SparseMoe};
use hlat::parallel::Unsharded;

use crate::support::{assert_matches, reference, trainium};

const RANKS: usize = 2;
const TOKENS: usize = 6;

fn config() -> HlatConfig {
    HlatConfig {
        init_std: 0.5,
        ..HlatConfig::preset("hlat-test").unwrap()
    }
}

fn moe() -> MoeConfig {
    MoeConfig::routed(4, 2, 8, 0.0)
}

/// Rank `rank`'s tokens `[1, TOKENS, hidden]` (`seed` 0) or loss weights (`seed` 1).
fn per_rank(rank: usize, seed: usize, hidden: usize) -> TensorData {
    let values: Vec<f32> = (0..TOKENS * hidden)
        .map(|i| (((i * 37 + rank * 53 + seed * 11) % 101) as f32 / 50.0 - 1.0) * 1.5)
        .collect();
    TensorData::new(values, [1, TOKENS, hidden])
}

/// The layer of `record` on `device`, with `capacity_factor`.
fn layer(
    record: &burn::store::ModuleRecord,
    capacity_factor: Option<f64>,
    device: &Device,
) -> SparseMoe {
    let mut layer = SparseMoe::new(&config(), &moe(), device).load_record(record.clone());
    layer.capacity_factor = capacity_factor;
    layer
}

/// Every replica's value of `tensor`.
fn replicas<const D: usize>(tensor: Tensor<D>) -> Vec<TensorData> {
    collective::into_replicas(tensor).unwrap()
}

/// Each rank's output, every expert's gradient (in expert order) and the router's, of the
/// whole layer on Flex: the loss is the sum over ranks of `sum(layer(x_r) · w_r)`.
fn whole_layer(
    record: &burn::store::ModuleRecord,
    capacity_factor: Option<f64>,
) -> (Vec<TensorData>, Vec<TensorData>, TensorData) {
    let device = reference().autodiff();
    let layer = layer(record, capacity_factor, &device);
    let hidden = config().hidden_size;
    let mut outputs = Vec::new();
    let mut loss: Option<Tensor<1>> = None;
    for rank in 0..RANKS {
        let x = Tensor::<3>::from_data(per_rank(rank, 0, hidden), &device);
        let weight = Tensor::<3>::from_data(per_rank(rank, 1, hidden), &device);
        let (output, _) = layer.forward(x, &Unsharded);
        outputs.push(output.clone().into_data());
        let term = (output * weight).sum();
        loss = Some(loss.map_or(term.clone(), |total| total + term));
    }
    let gradients = loss.unwrap().backward();
    let experts = layer
        .experts
        .iter()
        .map(|expert| {
            expert
                .gate_proj
                .weight
                .grad(&gradients)
                .unwrap()
                .into_data()
        })
        .collect();
    let router = layer.router.weight.grad(&gradients).unwrap().into_data();
    (outputs, experts, router)
}

fn check_on(executor: ExecutorKind, capacity_factor: Option<f64>) {
    let flex = reference();
    let record = SparseMoe::new(&config(), &moe(), &flex).into_record();
    let (outputs, expert_gradients, router_gradient) = whole_layer(&record, capacity_factor);

    if executor == ExecutorKind::Xla {
        crate::support::xla();
    }
    let trainium_device = TrainiumDevice::replicated(executor, RANKS as u16);
    let device = trainium(trainium_device).autodiff();
    let parallel = ExpertParallel {
        groups: ReplicaGroups::all(RANKS),
    };
    let split = layer(&record, capacity_factor, &device).split_experts(&parallel);
    assert_eq!(split.experts.len(), 2);
    assert_eq!(split.num_experts(), 4);
    let hidden = config().hidden_size;
    let data = |seed| {
        (0..RANKS)
            .map(|rank| per_rank(rank, seed, hidden))
            .collect()
    };
    let x: Tensor<3> = collective::from_replicas(data(0), &device);
    let weight: Tensor<3> = collective::from_replicas(data(1), &device);
    let (output, _) = split.forward(x, &Unsharded);
    let case = format!("{trainium_device}, capacity factor {capacity_factor:?}");
    for (rank, found) in replicas(output.clone()).iter().enumerate() {
        assert_matches(
            &format!("output of rank {rank} on {case}"),
            &outputs[rank],
            found,
            1e-5,
        );
    }
    let gradients = (output * weight).sum().backward();
    for (slot, expert) in split.experts.iter().enumerate() {
        let found = replicas(expert.gate_proj.weight.grad(&gradients).unwrap());
        for (rank, found) in found.iter().enumerate() {
            let expert = rank * split.experts.len() + slot;
            assert_matches(
                &format!("gradient of expert {expert} on rank {rank}, {case}"),
                &expert_gradients[expert],
                found,
                1e-4,
            );
        }
    }
    let router = replicas(split.router.weight.grad(&gradients).unwrap());
    let summed = router
        .into_iter()
        .map(|data| Tensor::<2>::from_data(data, &flex))
        .reduce(|total, rank| total + rank)
        .unwrap();
    assert_matches(
        &format!("router gradient summed over the ranks, {case}"),
        &router_gradient,
        &summed.into_data(),
        1e-4,
    );

    let joined = split.join_experts();
    assert_eq!(joined.experts.len(), 4);
    let whole = layer(&record, None, &flex);
    for (expert, (found, expected)) in joined.experts.iter().zip(&whole.experts).enumerate() {
        for (rank, found) in replicas(found.down_proj.weight.val()).iter().enumerate() {
            assert_eq!(
                found,
                &expected.down_proj.weight.val().into_data(),
                "expert {expert} joined on rank {rank}, {case}"
            );
        }
    }
}

#[test]
fn experts_split_over_ranks_compute_and_learn_as_the_whole_layer_dropless() {
    check_on(ExecutorKind::Host, None);
    check_on(ExecutorKind::Xla, None);
}

#[test]
fn experts_split_over_ranks_drop_as_each_ranks_gshard_group_under_a_capacity_factor() {
    check_on(ExecutorKind::Host, Some(0.5));
    check_on(ExecutorKind::Xla, Some(0.5));
}
