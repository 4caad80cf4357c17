//! ZeRO stage 1 (DeepSpeed's optimizer-state partitioning, as NeuronX Distributed applies it):
//! each data-parallel rank keeps the AdamW moments of `1/dp` of every parameter, in
//! [`FlatShards`](hlat::flat_shards::FlatShards)' slices. Gradients are reduce-scattered instead
//! of all-reduced, each rank updates its slice of the parameter, and the updated slices are
//! all-gathered back into the whole parameter on every rank.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;

/// The optimizer state of every parameter partitioned over the data-parallel groups: flat
/// slices, one per rank (also the slices of the parameters under fully sharded data
/// parallelism, whose optimizer state is then laid out as ZeRO-1's).
pub use hlat::flat_shards::FlatShards as Zero1;

/// Replaces every gradient of `module` by this rank's slice of its mean over the data-parallel
/// group (see [`Zero1::scatter_mean`]).
pub fn scatter_gradients<M: Module>(module: &M, grads: &mut GradientsParams, zero: &Zero1) {
    struct Scatter<'a> {
        grads: &'a mut GradientsParams,
        zero: &'a Zero1,
    }
    impl ModuleVisitor for Scatter<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(grad) = self.grads.remove::<D>(param.id) {
                self.grads.register(param.id, self.zero.scatter_mean(grad));
            }
        }
    }
    module.visit(&mut Scatter { grads, zero });
}
