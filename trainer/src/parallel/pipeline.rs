//! The gradients and optimizer state of a model cut into pipeline stages: what the stages share
//! (the embedding, the final norm and the head, held by every stage) summed over the pipeline
//! group, what each stage holds alone (its layer slots) kept apart when the global norm is
//! measured, and the slots' optimizer state gathered per stage for a checkpoint and scattered
//! back when one is loaded.

use std::collections::HashMap;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};
use hlat::parallel::{ParamPath, PathVisitor, visit_with_paths};

use crate::optimizer::{AdamWState, OptimizerRecord as Record, StateRecord};

/// Whether the parameter at `path` (from the model or a module holding it, e.g.
/// `hlat.layers.0.mlp.up_proj.weight`) belongs to one stage (a decoder layer slot) rather than
/// to every stage.
fn stage_local(path: &[String]) -> bool {
    path.iter().any(|name| name == "layers")
}

/// Sums the gradients of the parameters every stage holds (each stage computed its part: the
/// first the embedding's, the last the head's, both for a tied embedding) over `groups`, the
/// pipeline groups.
pub fn sum_shared_gradients<M: Module>(
    module: &M,
    grads: &mut GradientsParams,
    groups: &ReplicaGroups,
) {
    struct Sum<'a> {
        grads: &'a mut GradientsParams,
        groups: &'a ReplicaGroups,
    }
    impl PathVisitor for Sum<'_> {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>) {
            if stage_local(path.names()) {
                return;
            }
            if let Some(grad) = self.grads.remove::<D>(param.id) {
                let summed = collective::all_reduce(grad, ReduceOp::Sum, self.groups);
                self.grads.register(param.id, summed);
            }
        }
    }
    let mut sum = Sum { grads, groups };
    visit_with_paths(module, ParamPath::default(), &mut sum);
}

/// Moves the gradients of the stage-local parameters (the layer slots) from `from` to `to`:
/// their squares sum over the pipeline group, the shared ones' count once.
pub fn move_stage_gradients<M: Module>(
    module: &M,
    from: &mut GradientsParams,
    to: &mut GradientsParams,
) {
    super::gradients::move_gradients_where(module, from, to, stage_local);
}

/// Takes the state of every layer-slot parameter of `module` out of `record` (whole, joined over
/// tensor-parallel ranks and ZeRO-1 slices) and returns, per parameter, its state on each stage
/// in stage order: the moments gathered over `groups`, the pipeline groups.
pub(crate) fn gather_stage_states<M: Module>(
    module: &M,
    record: &mut Record,
    groups: &ReplicaGroups,
) -> HashMap<ParamId, Vec<StateRecord>> {
    struct Gather<'a> {
        record: &'a mut Record,
        groups: &'a ReplicaGroups,
        stages: HashMap<ParamId, Vec<StateRecord>>,
    }
    impl PathVisitor for Gather<'_> {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>) {
            if !stage_local(path.names()) {
                return;
            }
            let Some(entry) = self.record.remove(&param.id) else {
                return;
            };
            let state: AdamWState<D> = entry.into_state();
            let rows = state.moment1.dims()[0];
            let gather = |moment| collective::all_gather(moment, 0, self.groups);
            let (moment1, moment2) = (gather(state.moment1), gather(state.moment2));
            let per_stage = (0..self.groups.group_size())
                .map(|stage| {
                    StateRecord::from_state(AdamWState {
                        moment1: moment1.clone().narrow(0, stage * rows, rows),
                        moment2: moment2.clone().narrow(0, stage * rows, rows),
                        time: state.time,
                    })
                })
                .collect();
            self.stages.insert(param.id, per_stage);
        }
    }
    let mut gather = Gather {
        record,
        groups,
        stages: HashMap::new(),
    };
    visit_with_paths(module, ParamPath::default(), &mut gather);
    gather.stages
}

/// The inverse of [`gather_stage_states`]: from each layer-slot parameter's state on every stage
/// (`None` for a padding slot: zero moments), the record whose state on each replica is its
/// stage's.
pub(crate) fn scatter_stage_states<M: Module>(
    module: &M,
    mut stages: HashMap<ParamId, Vec<Option<StateRecord>>>,
    groups: &ReplicaGroups,
) -> Record {
    struct Scatter<'a> {
        stages: &'a mut HashMap<ParamId, Vec<Option<StateRecord>>>,
        groups: &'a ReplicaGroups,
        record: Record,
    }
    impl ModuleVisitor for Scatter<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let Some(per_stage) = self.stages.remove(&param.id) else {
                return;
            };
            // The moments live outside the autodiff graph.
            let device = param.val().device().inner();
            let states: Vec<Option<AdamWState<D>>> = per_stage
                .into_iter()
                .map(|state| state.map(StateRecord::into_state))
                .collect();
            let time = states
                .iter()
                .flatten()
                .map(|state| state.time)
                .max()
                .unwrap_or(0);
            let zeros = || Tensor::<D>::zeros(param.shape(), &device);
            let (mut first, mut second) = (Vec::new(), Vec::new());
            for state in states {
                let (moment1, moment2) = match state {
                    Some(state) => (state.moment1, state.moment2),
                    None => (zeros(), zeros()),
                };
                first.push(moment1);
                second.push(moment2);
            }
            let scatter = |moments| collective::split(Tensor::cat(moments, 0), 0, self.groups);
            self.record.insert(
                param.id,
                StateRecord::from_state(AdamWState {
                    moment1: scatter(first),
                    moment2: scatter(second),
                    time,
                }),
            );
        }
    }
    let mut scatter = Scatter {
        stages: &mut stages,
        groups,
        record: Record::default(),
    };
    module.visit(&mut scatter);
    scatter.record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_layer_slots_belong_to_one_stage() {
        let path = |text: &str| text.split('.').map(str::to_string).collect::<Vec<_>>();
        assert!(stage_local(&path("layers.0.self_attn.q_proj.weight")));
        assert!(stage_local(&path("hlat.layers.1.mlp.up_proj.weight")));
        assert!(!stage_local(&path("hlat.embed_tokens.weight")));
        assert!(!stage_local(&path("lm_head.weight")));
        assert!(!stage_local(&path("norm.gamma")));
    }
}
