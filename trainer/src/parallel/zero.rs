//! ZeRO stage 1 (DeepSpeed's optimizer-state partitioning, as NeuronX Distributed applies it):
//! each data-parallel rank keeps the AdamW moments of `1/dp` of every parameter. Gradients are
//! reduce-scattered instead of all-reduced, each rank updates its slice of the parameter, and
//! the updated slices are all-gathered back into the whole parameter on every rank.
//!
//! A parameter of `n` elements is flattened and padded with zeros to `dp × ⌈n / dp⌉`; rank `r`
//! owns elements `r⌈n / dp⌉ ..`. A slice keeps the parameter's rank, shaped `[1, …, 1, ⌈n / dp⌉]`,
//! so that Burn's per-rank optimizer state and gradients can hold it.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Shape, Tensor};
use burn_trainium::collective::{self, ReplicaGroups};

/// The optimizer state of every parameter partitioned over the data-parallel `groups`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zero1 {
    /// The data-parallel groups (the replicas holding the same tensor-parallel rank).
    pub groups: ReplicaGroups,
}

impl Zero1 {
    /// Ranks sharing the state of one parameter.
    pub fn degree(&self) -> usize {
        self.groups.group_size()
    }

    /// Elements of one rank's slice of a parameter of `elements` elements.
    pub fn slice_len(&self, elements: usize) -> usize {
        elements.div_ceil(self.degree())
    }

    /// The dimensions of one rank's slice of a parameter of `dims`: `[1, …, 1, slice_len]`.
    pub fn slice_dims<const D: usize>(&self, dims: [usize; D]) -> [usize; D] {
        row_dims(self.slice_len(dims.iter().product()))
    }

    /// This rank's slice of `tensor` (`[1, …, 1, slice_len]`).
    pub fn slice<const D: usize>(&self, tensor: Tensor<D>) -> Tensor<D> {
        let rows = self.rows(tensor);
        self.as_slice(collective::split(rows, 0, &self.groups))
    }

    /// This rank's slice of the mean of `tensor` over the group (a gradient's reduce-scatter).
    pub fn scatter_mean<const D: usize>(&self, tensor: Tensor<D>) -> Tensor<D> {
        let rows = self.rows(tensor);
        let summed = collective::reduce_scatter(rows, 0, &self.groups);
        self.as_slice(summed.div_scalar(self.degree() as f64))
    }

    /// The whole tensor of `shape` from every rank's slice (an all-gather).
    pub fn gather<const D: usize>(&self, slice: Tensor<D>, shape: Shape) -> Tensor<D> {
        let elements = shape.num_elements();
        let row = slice.reshape([1, self.slice_len(elements)]);
        collective::all_gather(row, 0, &self.groups)
            .reshape([-1])
            .narrow(0, 0, elements)
            .reshape(shape)
    }

    /// `tensor` flattened, padded and cut into one row per rank: `[degree, slice_len]`.
    fn rows<const D: usize>(&self, tensor: Tensor<D>) -> Tensor<2> {
        let elements = tensor.shape().num_elements();
        let slice_len = self.slice_len(elements);
        let padding = slice_len * self.degree() - elements;
        let flat = tensor.reshape([elements]);
        let flat = if padding == 0 {
            flat
        } else {
            let zeros = Tensor::<1>::zeros([padding], &flat.device()).cast(flat.dtype());
            Tensor::cat(vec![flat, zeros], 0)
        };
        flat.reshape([self.degree(), slice_len])
    }

    /// A `[1, slice_len]` row in the parameter's rank.
    fn as_slice<const D: usize>(&self, row: Tensor<2>) -> Tensor<D> {
        let dims = row_dims(row.dims()[1]);
        row.reshape(dims)
    }
}

/// `[1, …, 1, length]`: a slice's dimensions in its parameter's rank.
fn row_dims<const D: usize>(length: usize) -> [usize; D] {
    let mut dims = [1; D];
    dims[D - 1] = length;
    dims
}

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

#[cfg(test)]
mod tests {
    use burn::tensor::TensorData;
    use burn_trainium::{ExecutorKind, TrainiumDevice};

    use super::*;

    /// Five elements over two ranks: slices of three, the second padded with a zero.
    #[test]
    fn slices_pad_and_gather_back() {
        let spec = TrainiumDevice::replicated(ExecutorKind::Host, 2).to_string();
        let device = burn_trainium::device(&spec).unwrap();
        let zero1 = Zero1 {
            groups: ReplicaGroups::all(2),
        };
        let tensor = Tensor::<1>::from_floats([1.0, 2.0, 3.0, 4.0, 5.0], &device);
        let slice = zero1.slice(tensor.clone());
        let slices = collective::into_replicas(slice.clone()).unwrap();
        assert_eq!(slices[0], TensorData::new(vec![1f32, 2.0, 3.0], [3]));
        assert_eq!(slices[1], TensorData::new(vec![4f32, 5.0, 0.0], [3]));
        let whole = collective::into_replicas(zero1.gather(slice, tensor.shape())).unwrap();
        for replica in whole {
            assert_eq!(
                replica,
                TensorData::new(vec![1f32, 2.0, 3.0, 4.0, 5.0], [5])
            );
        }

        let per_replica = vec![
            TensorData::new(vec![2f32, 4.0, 6.0], [3, 1]),
            TensorData::new(vec![4f32, 8.0, 2.0], [3, 1]),
        ];
        let grads: Tensor<2> = collective::from_replicas(per_replica, &device);
        let means = collective::into_replicas(zero1.scatter_mean(grads)).unwrap();
        assert_eq!(means[0], TensorData::new(vec![3f32, 6.0], [1, 2]));
        assert_eq!(means[1], TensorData::new(vec![4f32, 0.0], [1, 2]));
    }
}
