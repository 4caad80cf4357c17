//! [`FlatShards`]: a tensor flattened and cut into one equal slice per rank of its groups, the
//! layout ZeRO-1 keeps the optimizer state in (DeepSpeed's partitioning, as NeuronX Distributed
//! applies it) and fully sharded data parallelism keeps the parameters in
//! ([`crate::fully_sharded`]).
//!
//! A tensor of `n` elements is flattened and padded with zeros to `degree × ⌈n / degree⌉`; rank
//! `r` holds elements `r⌈n / degree⌉ ..`. A slice keeps the tensor's rank, shaped `[1, …, 1,
//! ⌈n / degree⌉]`, so that Burn's per-parameter gradients and optimizer state can hold it.

use burn::tensor::{Shape, Tensor};
use burn_trainium::collective::{self, ReplicaGroups};

/// Tensors cut into flat slices over the ranks of each of `groups`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatShards {
    /// The groups whose ranks share each tensor (the data-parallel groups: the replicas holding
    /// the same tensor-parallel rank).
    pub groups: ReplicaGroups,
}

impl FlatShards {
    /// Ranks sharing one tensor.
    pub fn degree(&self) -> usize {
        self.groups.group_size()
    }

    /// Elements of one rank's slice of a tensor of `elements` elements.
    pub fn slice_len(&self, elements: usize) -> usize {
        elements.div_ceil(self.degree())
    }

    /// The dimensions of one rank's slice of a tensor of `dims`: `[1, …, 1, slice_len]`.
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
        self.scatter_sum(tensor).div_scalar(self.degree() as f64)
    }

    /// This rank's slice of the sum of `tensor` over the group.
    pub fn scatter_sum<const D: usize>(&self, tensor: Tensor<D>) -> Tensor<D> {
        let rows = self.rows(tensor);
        self.as_slice(collective::reduce_scatter(rows, 0, &self.groups))
    }

    /// The whole tensor of `shape` from every rank's slice (an all-gather, whose gradient is the
    /// reduce-scatter of the whole tensor's gradient: each rank's slice of the group's sum).
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

    /// A `[1, slice_len]` row in the tensor's rank.
    fn as_slice<const D: usize>(&self, row: Tensor<2>) -> Tensor<D> {
        let dims = row_dims(row.dims()[1]);
        row.reshape(dims)
    }
}

/// `[1, …, 1, length]`: a slice's dimensions in its tensor's rank.
fn row_dims<const D: usize>(length: usize) -> [usize; D] {
    let mut dims = [1; D];
    dims[D - 1] = length;
    dims
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
        let shards = FlatShards {
            groups: ReplicaGroups::all(2),
        };
        let tensor = Tensor::<1>::from_floats([1.0, 2.0, 3.0, 4.0, 5.0], &device);
        let slice = shards.slice(tensor.clone());
        let slices = collective::into_replicas(slice.clone()).unwrap();
        assert_eq!(slices[0], TensorData::new(vec![1f32, 2.0, 3.0], [3]));
        assert_eq!(slices[1], TensorData::new(vec![4f32, 5.0, 0.0], [3]));
        let whole = collective::into_replicas(shards.gather(slice, tensor.shape())).unwrap();
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
        let means = collective::into_replicas(shards.scatter_mean(grads)).unwrap();
        assert_eq!(means[0], TensorData::new(vec![3f32, 6.0], [1, 2]));
        assert_eq!(means[1], TensorData::new(vec![4f32, 0.0], [1, 2]));
    }
}
