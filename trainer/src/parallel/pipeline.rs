//! The gradients of a model cut into pipeline stages: what the stages share (the embedding, the
//! final norm and the head, held by every stage) summed over the pipeline group, and what each
//! stage holds alone (its layers) kept apart when the global norm is measured.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use burn_trainium::collective::{self, CollectiveBackend, ReduceOp, ReplicaGroups};
use hlat::parallel::ParamPath;

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
        path: ParamPath,
        backend: std::marker::PhantomData<B>,
    }
    impl<B> ModuleVisitor<B> for Sum<'_, B>
    where
        B: AutodiffBackend,
        B::InnerBackend: CollectiveBackend,
    {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.enter(name);
        }

        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.exit();
        }

        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if stage_local(self.path.names()) {
                return;
            }
            if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                let summed = collective::all_reduce(grad, ReduceOp::Sum, self.groups);
                self.grads.register(param.id, summed);
            }
        }
    }
    module.visit(&mut Sum::<B> {
        grads,
        groups,
        path: ParamPath::default(),
        backend: std::marker::PhantomData,
    });
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
        path: ParamPath,
        backend: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Move<'_, B> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.enter(name);
        }

        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.exit();
        }

        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if stage_local(self.path.names())
                && let Some(grad) = self.from.remove::<B::InnerBackend, D>(param.id)
            {
                self.to.register(param.id, grad);
            }
        }
    }
    module.visit(&mut Move::<B> {
        from,
        to,
        path: ParamPath::default(),
        backend: std::marker::PhantomData,
    });
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
