//! The optimizer state of a parallel layout (tensor-parallel shards, ZeRO-1 slices), joined into
//! the whole model's shapes for a checkpoint (so that any layout can resume from it) and split
//! again when loaded.

use burn::module::{Module, Param};
use burn::tensor::Tensor;
use burn_trainium::collective::ReplicaGroups;
use hlat::expert_parallel::expert_of;
use hlat::parallel::{
    ParamPath, PathVisitor, Placement, join_parameter, split_parameter, visit_with_paths,
};

use super::{ParallelLayout, Zero1};
use crate::optimizer::{AdamWState, OptimizerRecord as Record, StateRecord};

/// Which way [`reshard_optimizer_state`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reshard {
    /// Each rank's slice to the whole (before saving).
    Join,
    /// The whole to each rank's slice (after loading).
    Split,
}

/// Joins or splits the moments of every parameter of `module` in `record` as `layout` shards
/// them: over the tensor-parallel groups for split parameters, and over the data-parallel groups
/// under ZeRO-1 (`module` holds this rank's tensor-parallel shards). Under expert parallelism the
/// experts' ZeRO-1 slices are left to `reshard_expert_states`, which joins them before the
/// experts and cuts them after.
pub fn reshard_optimizer_state<M: Module + 'static>(
    module: &M,
    mut record: Record,
    layout: &ParallelLayout,
    direction: Reshard,
) -> Record {
    struct Visitor<'a> {
        record: &'a mut Record,
        /// The tensor-parallel groups, when the model is split.
        tensor_groups: Option<ReplicaGroups>,
        zero1: Option<Zero1>,
        /// Whether a mixture's experts are split over expert-parallel ranks.
        experts_split: bool,
        direction: Reshard,
    }
    impl PathVisitor for Visitor<'_> {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>) {
            let tensor_split = match (&self.tensor_groups, path.placement()) {
                (Some(_), Placement::Replicated) | (None, _) => None,
                (Some(groups), placement) => Some((groups, placement)),
            };
            // Split experts' slices are joined and cut with the experts
            // (`reshard_expert_states`).
            let zero1 = if self.experts_split && expert_of(path.names()).is_some() {
                &None
            } else {
                &self.zero1
            };
            if tensor_split.is_none() && zero1.is_none() {
                return;
            }
            let Some(entry) = self.record.remove(&param.id) else {
                return;
            };
            let shape = param.val().shape();
            let reshard = |mut tensor: Tensor<D>| match self.direction {
                Reshard::Join => {
                    if let Some(zero1) = zero1 {
                        tensor = zero1.gather(tensor, shape.clone());
                    }
                    if let Some((groups, placement)) = tensor_split {
                        tensor = join_parameter(tensor, placement, groups);
                    }
                    tensor
                }
                Reshard::Split => {
                    if let Some((groups, placement)) = tensor_split {
                        tensor = split_parameter(tensor, placement, groups);
                    }
                    if let Some(zero1) = zero1 {
                        tensor = zero1.slice(tensor);
                    }
                    tensor
                }
            };
            let state: AdamWState<D> = entry.into_state();
            let state = AdamWState {
                moment1: reshard(state.moment1),
                moment2: reshard(state.moment2),
                time: state.time,
            };
            self.record.insert(param.id, StateRecord::from_state(state));
        }
    }
    let tensor_groups = layout.tensor_parallel().map(|parallel| parallel.groups);
    let copies = tensor_groups.as_ref().map_or(1, |groups| {
        crate::clip::kv_copies_of(module, groups.group_size())
    });
    let mut visitor = Visitor {
        record: &mut record,
        tensor_groups,
        zero1: layout.zero1(),
        experts_split: layout.expert > 1,
        direction,
    };
    visit_with_paths(module, ParamPath::with_kv_copies(copies), &mut visitor);
    record
}
