//! The gradients and optimizer state of a model cut into pipeline stages: what the stages share
//! (the embedding, the final norm and the head, held by every stage) summed over the pipeline
//! group, what each stage holds alone (its layer slots) kept apart when the global norm is
//! measured, and the slots' optimizer state gathered per stage for a checkpoint and scattered
//! back when one is loaded.

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::optim::record::AdaptorRecord;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use burn_trainium::collective::{self, CollectiveBackend, ReduceOp, ReplicaGroups};
use hlat::parallel::{ParamPath, PathVisitor, visit_with_paths};

use super::state::Record;
use crate::optimizer::{AdamWState, HlatAdamW};

/// The optimizer state of one parameter.
pub(crate) type StateRecord<B> = AdaptorRecord<HlatAdamW, B>;

/// Whether the parameter at `path` (from the model or a module holding it, e.g.
/// `hlat.layers.0.mlp.up_proj.weight`) belongs to one stage (a decoder layer slot) rather than
/// to every stage.
fn stage_local(path: &[String]) -> bool {
    path.iter().any(|name| name == "layers")
}

/// Sums the gradients of the parameters every stage holds (each stage computed its part: the
/// first the embedding's, the last the head's, both for a tied embedding) over `groups`, the
/// pipeline groups.
pub fn sum_shared_gradients<B, M>(module: &M, grads: &mut GradientsParams, groups: &ReplicaGroups)
where
    B: AutodiffBackend,
    B::InnerBackend: CollectiveBackend,
    M: AutodiffModule<B>,
{
    struct Sum<'a, B: AutodiffBackend> {
        grads: &'a mut GradientsParams,
        groups: &'a ReplicaGroups,
        backend: std::marker::PhantomData<B>,
    }
    impl<B> PathVisitor<B> for Sum<'_, B>
    where
        B: AutodiffBackend,
        B::InnerBackend: CollectiveBackend,
    {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<B, D>>) {
            if stage_local(path.names()) {
                return;
            }
            if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                let summed = collective::all_reduce(grad, ReduceOp::Sum, self.groups);
                self.grads.register(param.id, summed);
            }
        }
    }
    let mut sum = Sum::<B> {
        grads,
        groups,
        backend: std::marker::PhantomData,
    };
    visit_with_paths(module, ParamPath::default(), &mut sum);
}

/// Moves the gradients of the stage-local parameters (the layer slots) from `from` to `to`:
/// their squares sum over the pipeline group, the shared ones' count once.
pub fn move_stage_gradients<B, M>(module: &M, from: &mut GradientsParams, to: &mut GradientsParams)
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    struct Move<'a, B: AutodiffBackend> {
        from: &'a mut GradientsParams,
        to: &'a mut GradientsParams,
        backend: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> PathVisitor<B> for Move<'_, B> {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<B, D>>) {
            if stage_local(path.names())
                && let Some(grad) = self.from.remove::<B::InnerBackend, D>(param.id)
            {
                self.to.register(param.id, grad);
            }
        }
    }
    let mut moving = Move::<B> {
        from,
        to,
        backend: std::marker::PhantomData,
    };
    visit_with_paths(module, ParamPath::default(), &mut moving);
}

/// Takes the state of every layer-slot parameter of `module` out of `record` (whole, joined over
/// tensor-parallel ranks and ZeRO-1 slices) and returns, per parameter, its state on each stage
/// in stage order: the moments gathered over `groups`, the pipeline groups.
pub(crate) fn gather_stage_states<B, M>(
    module: &M,
    record: &mut Record<M, B>,
    groups: &ReplicaGroups,
) -> HashMap<ParamId, Vec<StateRecord<B>>>
where
    B: AutodiffBackend,
    B::InnerBackend: CollectiveBackend,
    M: AutodiffModule<B>,
{
    struct Gather<'a, B: AutodiffBackend<InnerBackend: CollectiveBackend>, M: AutodiffModule<B>> {
        record: &'a mut Record<M, B>,
        groups: &'a ReplicaGroups,
        stages: HashMap<ParamId, Vec<StateRecord<B>>>,
    }
    impl<B, M> PathVisitor<B> for Gather<'_, B, M>
    where
        B: AutodiffBackend,
        B::InnerBackend: CollectiveBackend,
        M: AutodiffModule<B>,
    {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<B, D>>) {
            if !stage_local(path.names()) {
                return;
            }
            let Some(entry) = self.record.remove(&param.id) else {
                return;
            };
            let state: AdamWState<B::InnerBackend, D> = entry.into_state();
            let rows = state.moment1.dims()[0];
            let gather = |moment| collective::all_gather(moment, 0, self.groups);
            let (moment1, moment2) = (gather(state.moment1), gather(state.moment2));
            let per_stage = (0..self.groups.group_size())
                .map(|stage| {
                    AdaptorRecord::from_state(AdamWState {
                        moment1: moment1.clone().narrow(0, stage * rows, rows),
                        moment2: moment2.clone().narrow(0, stage * rows, rows),
                        time: state.time,
                    })
                })
                .collect();
            self.stages.insert(param.id, per_stage);
        }
    }
    let mut gather = Gather::<B, M> {
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
pub(crate) fn scatter_stage_states<B, M>(
    module: &M,
    mut stages: HashMap<ParamId, Vec<Option<StateRecord<B>>>>,
    groups: &ReplicaGroups,
) -> Record<M, B>
where
    B: AutodiffBackend,
    B::InnerBackend: CollectiveBackend,
    M: AutodiffModule<B>,
{
    struct Scatter<'a, B: AutodiffBackend<InnerBackend: CollectiveBackend>, M: AutodiffModule<B>> {
        stages: &'a mut HashMap<ParamId, Vec<Option<StateRecord<B>>>>,
        groups: &'a ReplicaGroups,
        record: Record<M, B>,
    }
    impl<B, M> ModuleVisitor<B> for Scatter<'_, B, M>
    where
        B: AutodiffBackend,
        B::InnerBackend: CollectiveBackend,
        M: AutodiffModule<B>,
    {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(per_stage) = self.stages.remove(&param.id) else {
                return;
            };
            let device = param.val().device();
            let states: Vec<Option<AdamWState<B::InnerBackend, D>>> = per_stage
                .into_iter()
                .map(|state| state.map(AdaptorRecord::into_state))
                .collect();
            let time = states
                .iter()
                .flatten()
                .map(|state| state.time)
                .max()
                .unwrap_or(0);
            let zeros = || Tensor::<B::InnerBackend, D>::zeros(param.shape(), &device);
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
                AdaptorRecord::from_state(AdamWState {
                    moment1: scatter(first),
                    moment2: scatter(second),
                    time,
                }),
            );
        }
    }
    let mut scatter = Scatter::<B, M> {
        stages: &mut stages,
        groups,
        record: Record::<M, B>::default(),
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
