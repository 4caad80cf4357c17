//! Expert parallelism in the training step and its checkpoints: each rank holds its share of a
//! mixture's experts ([`hlat::expert_parallel`]), so their gradients and optimizer state follow
//! other groups than the replicated parameters'.
//!
//! An expert's gradient on a rank is already the sum over its expert-parallel group's tokens
//! (the all-to-all's backward brings it home); under data parallelism, where each replica's
//! gradient is of its own slice's mean loss and the replicated ones are averaged over the
//! data-parallel group, the experts' are averaged over the replicas that hold the same experts
//! and divided by the expert-parallel degree, which gives the same mean over the global batch.
//! Checkpoints hold the whole set of experts: the state is joined before saving and split again
//! after loading, so any layout resumes from any other.

use std::collections::HashMap;

use burn::module::{Module, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn_trainium::collective::{self, ReplicaGroups};
use hlat::Hlat;
use hlat::expert_parallel::expert_of;
use hlat::parallel::{ParamPath, PathVisitor, visit_with_paths};

use super::{ParallelLayout, Zero1, average_gradients, scatter_gradients};
use crate::optimizer::{AdamWState, OptimizerRecord as Record, StateRecord};

/// Moves the gradients of the experts' parameters from `from` to `to`.
pub fn move_expert_gradients<M: Module>(
    module: &M,
    from: &mut GradientsParams,
    to: &mut GradientsParams,
) {
    super::gradients::move_gradients_where(module, from, to, |names| expert_of(names).is_some());
}

/// Reduces `grads` over `layout`'s data-parallel groups, the experts' as expert parallelism
/// needs (see the module's documentation): averaged, or under ZeRO-1 reduce-scattered, the
/// replicated parameters' over the data-parallel groups and the experts' over the replicas
/// holding the same experts.
pub fn reduce_gradients_with_experts<M: Module>(
    module: &M,
    grads: &mut GradientsParams,
    layout: &ParallelLayout,
) {
    let mut experts = GradientsParams::new();
    move_expert_gradients(module, grads, &mut experts);
    match layout.zero1() {
        Some(zero1) => scatter_gradients(module, grads, &zero1),
        None => average_gradients(module, grads, &layout.data_groups()),
    }
    match layout.zero1_of_experts() {
        Some(zero1) => scatter_gradients(module, &mut experts, &zero1),
        None if layout.data > layout.expert => {
            average_gradients(module, &mut experts, &layout.expert_data_groups())
        }
        None => {}
    }
    crate::clip::scale_grads(module, &mut experts, 1.0 / layout.expert as f64);
    move_expert_gradients(module, &mut experts, grads);
}

/// Which way [`reshard_expert_states`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertStates {
    /// Each rank's experts' state to the whole set's (before saving).
    Join,
    /// The whole set's state to each rank's experts' (after loading).
    Split,
}

/// Moves the AdamW state of the experts in `record` between `split` (a model whose experts are
/// split over its expert-parallel groups) and `whole` (the same model with every expert, as
/// `Hlat::join_experts` or the model before `Hlat::split_experts` has it): slot `i` of rank `k`
/// holds expert `k · local + i`, `local` being the experts a rank holds. Under `zero1` (the
/// experts' ZeRO-1, `ParallelLayout::zero1_of_experts`) each rank's state is a slice of its
/// experts': gathered before joining, cut after splitting. The other parameters' state is
/// untouched; nothing moves when `split`'s experts are not split.
pub fn reshard_expert_states(
    split: &Hlat,
    whole: &Hlat,
    record: &mut Record,
    (direction, zero1): (ExpertStates, Option<&Zero1>),
) {
    let Some(groups) = split.expert_parallel().map(|parallel| &parallel.groups) else {
        return;
    };
    let local = split
        .layers
        .iter()
        .find_map(|layer| layer.moe.as_ref())
        .map_or(0, |moe| moe.experts.len());
    struct Ids(HashMap<Vec<String>, ParamId>);
    impl PathVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>) {
            if expert_of(path.names()).is_some() {
                self.0.insert(path.names().to_vec(), param.id);
            }
        }
    }
    let mut whole_ids = Ids(HashMap::new());
    visit_with_paths(whole, ParamPath::default(), &mut whole_ids);

    struct Move<'a> {
        whole_ids: HashMap<Vec<String>, ParamId>,
        record: &'a mut Record,
        groups: &'a ReplicaGroups,
        local: usize,
        direction: ExpertStates,
        zero1: Option<&'a Zero1>,
    }
    impl PathVisitor for Move<'_> {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>) {
            let Some((at, slot)) = expert_of(path.names()) else {
                return;
            };
            let degree = self.groups.group_size();
            let whole: Vec<ParamId> = (0..degree)
                .map(|rank| {
                    let mut names = path.names().to_vec();
                    names[at] = (rank * self.local + slot).to_string();
                    self.whole_ids[&names]
                })
                .collect();
            match self.direction {
                ExpertStates::Join => {
                    let Some(entry) = self.record.remove(&param.id) else {
                        return;
                    };
                    let state: AdamWState<D> = entry.into_state();
                    let shape = param.val().shape();
                    let rows = shape[0];
                    let gather = |moment: Tensor<D>| {
                        let moment = match self.zero1 {
                            Some(zero1) => zero1.gather(moment, shape.clone()),
                            None => moment,
                        };
                        collective::all_gather(moment, 0, self.groups)
                    };
                    let (first, second) = (gather(state.moment1), gather(state.moment2));
                    for (rank, id) in whole.into_iter().enumerate() {
                        let chunk =
                            |moment: &Tensor<D>| moment.clone().narrow(0, rank * rows, rows);
                        let state = AdamWState {
                            moment1: chunk(&first),
                            moment2: chunk(&second),
                            time: state.time,
                        };
                        self.record.insert(id, StateRecord::from_state(state));
                    }
                }
                ExpertStates::Split => {
                    let states: Option<Vec<AdamWState<D>>> = whole
                        .iter()
                        .map(|id| self.record.remove(id).map(StateRecord::into_state))
                        .collect();
                    let Some(states) = states else {
                        return;
                    };
                    let time = states[0].time;
                    let pick = |moments: Vec<Tensor<D>>| {
                        let moment = collective::split(Tensor::cat(moments, 0), 0, self.groups);
                        match self.zero1 {
                            Some(zero1) => zero1.slice(moment),
                            None => moment,
                        }
                    };
                    let (first, second): (Vec<_>, Vec<_>) = states
                        .into_iter()
                        .map(|state| (state.moment1, state.moment2))
                        .unzip();
                    let state = AdamWState {
                        moment1: pick(first),
                        moment2: pick(second),
                        time,
                    };
                    self.record.insert(param.id, StateRecord::from_state(state));
                }
            }
        }
    }
    visit_with_paths(
        split,
        ParamPath::default(),
        &mut Move {
            whole_ids: whole_ids.0,
            record,
            groups,
            local,
            direction,
            zero1,
        },
    );
}
