//! Fully sharded data parallelism (PyTorch's FSDP2, DeepSpeed's ZeRO-3): each rank of a
//! data-parallel group keeps only its flat slice of every parameter ([`FlatShards`]), and a
//! layer's weights are gathered whole just before the layer runs.
//!
//! A training step gathers them in one of two ways:
//! - through the autodiff graph ([`FullySharded::gather`]): the all-gather's backward pass is the
//!   reduce-scatter that leaves each rank its slice of the group's summed gradient (the plain
//!   step, where the whole model is gathered at once);
//! - as fresh leaves ([`FullySharded::gather_leaves`]), one layer at a time, in the staged step
//!   of `Hlat::loss_and_gradients`: a layer's weights are gathered for its forward pass (and kept
//!   for the backward pass only where its activations are kept), gathered again where its
//!   backward pass recomputes it, and the whole gradients are reduce-scattered into slices as
//!   soon as the layer's backward pass is done ([`FullySharded::scatter_into`]). At most one
//!   layer's whole weights and gradients are then alive besides the slices, with activation
//!   checkpointing.
//!
//! The optimizer updates the slices; its state has the slices' shapes, which is ZeRO-1's layout
//! of the state (so a checkpoint joins and splits it as ZeRO-1's).

use std::collections::HashMap;
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Shape, Tensor};
use burn_trainium::collective::ReplicaGroups;

use crate::flat_shards::FlatShards;

/// The parameters of a module kept as flat slices over the data-parallel groups, with the whole
/// shape of each (keyed by parameter id: the slices keep their parameters' ids).
#[derive(Debug, Clone)]
pub struct FullySharded {
    /// How each parameter is cut.
    pub shards: FlatShards,
    /// The whole shape of every sharded parameter (this rank's tensor-parallel shard's shape
    /// when the model is also split by tensor parallelism).
    shapes: Arc<HashMap<ParamId, Shape>>,
}

impl FullySharded {
    /// `module` with every float parameter replaced by this rank's slice over its group of
    /// `groups` (a new leaf of the graph that trains when the parameter did), and the sharding
    /// that gathers them back.
    pub fn shard<M: Module>(module: M, groups: ReplicaGroups) -> (M, Self) {
        struct Shard<'a> {
            shards: &'a FlatShards,
            shapes: HashMap<ParamId, Shape>,
        }
        impl ModuleMapper for Shard<'_> {
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
                let require_grad = param.val().is_require_grad();
                let (id, tensor, mapper) = param.consume();
                self.shapes.insert(id, tensor.shape());
                // Detached after the split too: a collective's output is not a leaf.
                let slice = self.shards.slice(tensor.detach()).detach();
                Param::from_mapped_value(id, slice.set_require_grad(require_grad), mapper)
            }
        }
        let shards = FlatShards { groups };
        let mut shard = Shard {
            shards: &shards,
            shapes: HashMap::new(),
        };
        let module = module.map(&mut shard);
        let shapes = Arc::new(shard.shapes);
        (module, Self { shards, shapes })
    }

    /// The whole shape of parameter `id`, when it is sharded here.
    pub fn whole_shape(&self, id: ParamId) -> Option<&Shape> {
        self.shapes.get(&id)
    }

    /// `module` with every sharded parameter gathered whole, in the autodiff graph of its slice:
    /// backpropagating through it leaves each rank its slice of the gradient summed over the
    /// group.
    pub fn gather<M: Module>(&self, module: M) -> M {
        module.map(&mut Gather {
            sharded: self,
            slices: None,
        })
    }

    /// `module` with every sharded parameter gathered whole as a new leaf of the graph (that
    /// trains when its slice does): its gradients are whole, for
    /// [`FullySharded::scatter_into`] to cut.
    pub fn gather_leaves<M: Module>(&self, module: M) -> M {
        let slices = self.slices_of(&module);
        self.gather_leaves_from(module, slices)
    }

    /// This rank's slices of `module`'s sharded parameters, in visiting order, as `[1, 1, n]`
    /// values without graph: what [`FullySharded::gather_leaves_from`] gathers, for a caller to
    /// pass through an optimization barrier first (so that a compiler cannot gather a layer's
    /// weights before the values it is fenced with exist).
    pub fn slices_of<M: Module>(&self, module: &M) -> Vec<Tensor<3>> {
        struct Slices<'a> {
            sharded: &'a FullySharded,
            slices: Vec<Tensor<3>>,
        }
        impl ModuleVisitor for Slices<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                if self.sharded.whole_shape(param.id).is_some() {
                    let slice = param.val().detach();
                    let elements = slice.shape().num_elements();
                    self.slices.push(slice.reshape([1, 1, elements]));
                }
            }
        }
        let mut visitor = Slices {
            sharded: self,
            slices: Vec::new(),
        };
        module.visit(&mut visitor);
        visitor.slices
    }

    /// [`FullySharded::gather_leaves`] of `module` from `slices` ([`FullySharded::slices_of`]'s,
    /// through a barrier, say) instead of its parameters' own values.
    pub fn gather_leaves_from<M: Module>(&self, module: M, slices: Vec<Tensor<3>>) -> M {
        module.map(&mut Gather {
            sharded: self,
            slices: Some(slices.into_iter()),
        })
    }

    /// Adds to `into` this rank's slice of the sum over the group (a reduce-scatter) of each whole
    /// gradient of `module`'s sharded parameters in `whole`.
    pub fn scatter_into<M: Module>(
        &self,
        module: &M,
        mut whole: GradientsParams,
        into: &mut GradientsParams,
    ) {
        struct Scatter<'a> {
            sharded: &'a FullySharded,
            whole: &'a mut GradientsParams,
            into: &'a mut GradientsParams,
        }
        impl ModuleVisitor for Scatter<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                if self.sharded.whole_shape(param.id).is_none() {
                    return;
                }
                let Some(grad) = self.whole.remove::<D>(param.id) else {
                    return;
                };
                let slice = self.sharded.shards.scatter_sum(grad);
                let sum = match self.into.remove::<D>(param.id) {
                    Some(total) => total + slice,
                    None => slice,
                };
                self.into.register(param.id, sum);
            }
        }
        module.visit(&mut Scatter {
            sharded: self,
            whole: &mut whole,
            into,
        });
    }

    /// Elements of the slices this rank holds, padding included.
    pub fn slice_elements(&self) -> usize {
        self.shapes
            .values()
            .map(|shape| self.shards.slice_len(shape.num_elements()))
            .sum()
    }
}

/// Gathers the sharded parameters whole: through the graph, or as leaves from `slices` (one per
/// sharded parameter, in visiting order).
struct Gather<'a> {
    sharded: &'a FullySharded,
    slices: Option<std::vec::IntoIter<Tensor<3>>>,
}

impl ModuleMapper for Gather<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(shape) = self.sharded.whole_shape(param.id).cloned() else {
            return param;
        };
        let shards = &self.sharded.shards;
        let Some(slices) = self.slices.as_mut() else {
            return param.map(|slice| shards.gather(slice, shape));
        };
        let require_grad = param.val().is_require_grad();
        let fenced = slices.next().expect("one slice per sharded parameter");
        param.map(|slice| {
            let slice = fenced.reshape(slice.shape());
            shards
                .gather(slice, shape)
                .detach()
                .set_require_grad(require_grad)
        })
    }
}
