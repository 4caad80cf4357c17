//! Global-norm gradient measurement and scaling (Burn's built-in clipping is per tensor).

use std::any::Any;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Tensor};
use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};
use hlat::Hlat;
use hlat::parallel::{ParamPath, PathVisitor, Placement, kv_copies, visit_with_paths};

use crate::language_model::LanguageModel;

/// The sum of squares of every gradient of `module`, in f32, as a one-element tensor (lazy: no
/// read back). Parameters without a gradient are skipped. With `tensor_groups`, the model is
/// split over those tensor-parallel groups: the squares of split parameters are summed over the
/// group, those every rank holds whole are counted once, and so are KV heads held by several
/// ranks ([`kv_copies_of`]; their copies' gradients are the same once summed over them).
pub fn grad_sum_of_squares<M>(
    module: &M,
    grads: &GradientsParams,
    tensor_groups: Option<&ReplicaGroups>,
) -> Option<Tensor<1>>
where
    M: Module + 'static,
{
    let copies = tensor_groups.map_or(1, |groups| kv_copies_of(module, groups.group_size()));
    let mut visitor = SumOfSquares {
        grads,
        split: None,
        whole: None,
    };
    visit_with_paths(module, ParamPath::with_kv_copies(copies), &mut visitor);
    let split = match (visitor.split, tensor_groups) {
        (Some(split), Some(groups)) => Some(collective::all_reduce(split, ReduceOp::Sum, groups)),
        (split, _) => split,
    };
    match (split, visitor.whole) {
        (Some(split), Some(whole)) => Some(split + whole),
        (split, whole) => split.or(whole),
    }
}

/// How many ranks of a tensor-parallel group of `degree` hold each KV head of `module`
/// ([`hlat::parallel::kv_copies`]: more than 1 when `degree` exceeds `num_kv_heads`). The
/// trainer's [`LanguageModel`] and a bare [`Hlat`] know their configuration; any other module is
/// taken to hold no replicated KV heads (1).
pub fn kv_copies_of<M: 'static>(module: &M, degree: usize) -> usize {
    let module: &dyn Any = module;
    let config = match module.downcast_ref::<LanguageModel>() {
        Some(model) => Some(model.hlat.config()),
        None => module.downcast_ref::<Hlat>().map(Hlat::config),
    };
    config.map_or(1, |config| kv_copies(config.num_kv_heads, degree))
}

/// Multiplies every gradient of `module` by `factor`.
pub fn scale_grads<M: Module>(module: &M, grads: &mut GradientsParams, factor: f64) {
    module.visit(&mut Scale { grads, factor });
}

/// The factor torch's `clip_grad_norm_` multiplies gradients by: `max_norm / (norm + 1e-6)`
/// capped at 1; clipping is off when `max_norm` is 0.
pub fn clip_coefficient(norm: f64, max_norm: f64) -> f64 {
    if max_norm == 0.0 {
        1.0
    } else {
        (max_norm / (norm + 1e-6)).min(1.0)
    }
}

struct SumOfSquares<'a> {
    grads: &'a GradientsParams,
    /// Parameters split across tensor-parallel ranks.
    split: Option<Tensor<1>>,
    /// Parameters every rank holds whole.
    whole: Option<Tensor<1>>,
}

impl PathVisitor for SumOfSquares<'_> {
    fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>) {
        let Some(grad) = self.grads.get::<D>(param.id) else {
            return;
        };
        let squares = grad.cast(DType::F32).square().sum();
        let (total, squares) = match path.placement() {
            Placement::Split(_) => (&mut self.split, squares),
            // Summed over the group with the other split parameters, each copy counting for
            // `1 / copies` of its head.
            Placement::ReplicatedHeads { copies, .. } => {
                (&mut self.split, squares.div_scalar(copies as f64))
            }
            Placement::Replicated => (&mut self.whole, squares),
        };
        *total = Some(match total.take() {
            Some(total) => total + squares,
            None => squares,
        });
    }
}

struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl ModuleVisitor for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(grad) = self.grads.remove::<D>(param.id) {
            self.grads.register(param.id, grad.mul_scalar(self.factor));
        }
    }
}
