//! Collectives across the replicas of a device, for Burn code that stays generic.
//!
//! A replicated Trainium device (`xla:0-3`, [`crate::TrainiumDevice::replicated`]) runs each
//! captured segment once on every replica; its tensors hold one buffer per replica. The
//! operations here combine those buffers, as the collectives of NeuronX Distributed and
//! torch-xla do: [`all_reduce`], [`all_gather`], [`reduce_scatter`], [`split`] (keep this
//! replica's chunk) and [`optimization_barrier`], over [`ReplicaGroups`] such as `[[0, 1], [2, 3]]`,
//! and [`permute`] over [`SourceTargetPairs`] such as `0>1,1>2` (pipeline stages passing
//! activations on). On Trainium they are captured as operations of the segment, lowered to the
//! HLO collectives (`all-reduce`, `all-gather`, `reduce-scatter`, `collective-permute`,
//! `opt-barrier`) compiled into the program, and run in process on the `host` executor, the
//! reference.
//!
//! [`CollectiveBackend`] is implemented for [`crate::Trainium`], for `Autodiff<B>` of any
//! implementation (with the backward rules of tensor parallelism: all-reduce ↔ identity,
//! all-gather ↔ reduce-scatter, split ↔ all-gather, permute ↔ permute with the pairs reversed,
//! and [`copy_to_group`] whose gradient is all-reduced), and for the single-device backends
//! `NdArray` and `Flex`, where every group has one member and the collectives are identities
//! (a permute that sends the one replica nothing gives zeros), so that models written with them
//! run anywhere.
//!
//! ```no_run
//! use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};
//! use burn_trainium::{ExecutorKind, Trainium, TrainiumDevice};
//! use burn::tensor::{Tensor, TensorData};
//!
//! let device = TrainiumDevice::replicated(ExecutorKind::Xla, 4);
//! let per_replica = (0..4).map(|r| TensorData::from([r as f32, 1.0])).collect();
//! let x: Tensor<Trainium, 1> = collective::from_replicas(per_replica, &device);
//! let pairs = ReplicaGroups::contiguous(4, 2).unwrap();
//! let summed = collective::all_reduce(x, ReduceOp::Sum, &pairs);
//! // Replicas 0 and 1 hold [1, 2], replicas 2 and 3 hold [5, 2].
//! let values = collective::into_replicas(summed).unwrap();
//! ```

mod autodiff;
mod groups;
mod operation;
mod pairs;
mod single;
mod trainium;

pub use groups::{GroupsError, ReplicaGroups};
pub use operation::{Collective, ReduceOp};
pub use pairs::SourceTargetPairs;

use burn_backend::tensor::{FloatTensor, IntTensor};
use burn_backend::{Backend, ExecutionError, TensorData};
use burn_tensor::{Int, Tensor, TensorPrimitive};

/// A backend whose devices may stand for several replicas, with collectives across them.
pub trait CollectiveBackend: Backend {
    /// How many replicas `device` stands for (1 for a single device).
    fn replica_count(device: &Self::Device) -> usize;

    /// A float tensor whose replica `r` holds `data[r]`; `data` has one entry per replica.
    fn float_from_replicas(data: Vec<TensorData>, device: &Self::Device) -> FloatTensor<Self>;

    /// An int tensor whose replica `r` holds `data[r]`; `data` has one entry per replica.
    fn int_from_replicas(data: Vec<TensorData>, device: &Self::Device) -> IntTensor<Self>;

    /// The data of every replica of a float tensor, in replica order.
    fn float_into_replicas(tensor: FloatTensor<Self>) -> Result<Vec<TensorData>, ExecutionError>;

    /// The data of this process's first `count` replicas of a float tensor (fewer if it holds
    /// fewer), and the index of the first among every replica: 0 unless the device spans the
    /// processes of a job. Nothing moves between processes, so one process may read while the
    /// others do not.
    fn float_into_local_replicas(
        tensor: FloatTensor<Self>,
        count: usize,
    ) -> Result<(usize, Vec<TensorData>), ExecutionError>;

    /// Runs `collective` on `tensors` (one tensor, or several for the barrier).
    ///
    /// # Panics
    /// When the groups do not cover the device's replicas, or the shapes do not fit (as Burn's
    /// own operations do on shape errors).
    fn collective(
        collective: Collective,
        tensors: Vec<FloatTensor<Self>>,
    ) -> Vec<FloatTensor<Self>>;

    /// Returns `tensor` unchanged; under autodiff, its gradient is all-reduced (summed) over
    /// `groups`: Megatron's "copy to the tensor-parallel region", paired with
    /// [`Collective::AllReduce`] whose gradient is the identity.
    fn copy_to_group(tensor: FloatTensor<Self>, _groups: &ReplicaGroups) -> FloatTensor<Self> {
        tensor
    }
}

fn float_primitive<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> FloatTensor<B> {
    tensor.into_primitive().tensor()
}

fn float_tensor<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

fn run_one<B: CollectiveBackend, const D: usize>(
    collective: Collective,
    tensor: Tensor<B, D>,
) -> Tensor<B, D> {
    let mut outputs = B::collective(collective, vec![float_primitive(tensor)]);
    float_tensor(outputs.remove(0))
}

/// Each replica gets the reduction of its group's values.
pub fn all_reduce<B: CollectiveBackend, const D: usize>(
    tensor: Tensor<B, D>,
    op: ReduceOp,
    groups: &ReplicaGroups,
) -> Tensor<B, D> {
    run_one(
        Collective::AllReduce {
            op,
            groups: groups.clone(),
        },
        tensor,
    )
}

/// Each replica gets its group's values concatenated along `dim`, in group order.
pub fn all_gather<B: CollectiveBackend, const D: usize>(
    tensor: Tensor<B, D>,
    dim: usize,
    groups: &ReplicaGroups,
) -> Tensor<B, D> {
    run_one(
        Collective::AllGather {
            dim,
            groups: groups.clone(),
        },
        tensor,
    )
}

/// The group's values are summed and cut along `dim`; each replica gets the chunk of its
/// position in the group.
pub fn reduce_scatter<B: CollectiveBackend, const D: usize>(
    tensor: Tensor<B, D>,
    dim: usize,
    groups: &ReplicaGroups,
) -> Tensor<B, D> {
    run_one(
        Collective::ReduceScatter {
            dim,
            groups: groups.clone(),
        },
        tensor,
    )
}

/// Each replica keeps the chunk along `dim` of its position in its group.
pub fn split<B: CollectiveBackend, const D: usize>(
    tensor: Tensor<B, D>,
    dim: usize,
    groups: &ReplicaGroups,
) -> Tensor<B, D> {
    run_one(
        Collective::Split {
            dim,
            groups: groups.clone(),
        },
        tensor,
    )
}

/// Each replica passes `tensor` to the replica `pairs` pair it with and gets the value of the
/// replica paired with it, zeros if none: the stage-to-stage step of a pipeline. Its gradient
/// goes the other way round.
pub fn permute<B: CollectiveBackend, const D: usize>(
    tensor: Tensor<B, D>,
    pairs: &SourceTargetPairs,
) -> Tensor<B, D> {
    run_one(
        Collective::Permute {
            pairs: pairs.clone(),
        },
        tensor,
    )
}

/// `tensor` unchanged; its gradient is summed over `groups` (see
/// [`CollectiveBackend::copy_to_group`]).
pub fn copy_to_group<B: CollectiveBackend, const D: usize>(
    tensor: Tensor<B, D>,
    groups: &ReplicaGroups,
) -> Tensor<B, D> {
    float_tensor(B::copy_to_group(float_primitive(tensor), groups))
}

/// `tensors` unchanged, fenced: a compiler may not move computation into or out of the barrier.
pub fn optimization_barrier<B: CollectiveBackend, const D: usize>(
    tensors: Vec<Tensor<B, D>>,
) -> Vec<Tensor<B, D>> {
    let primitives = tensors.into_iter().map(float_primitive).collect();
    B::collective(Collective::Barrier, primitives)
        .into_iter()
        .map(float_tensor)
        .collect()
}

/// A float tensor whose replica `r` holds `data[r]` (one entry per replica of `device`).
pub fn from_replicas<B: CollectiveBackend, const D: usize>(
    data: Vec<TensorData>,
    device: &B::Device,
) -> Tensor<B, D> {
    float_tensor(B::float_from_replicas(data, device))
}

/// An int tensor whose replica `r` holds `data[r]` (one entry per replica of `device`).
pub fn int_from_replicas<B: CollectiveBackend, const D: usize>(
    data: Vec<TensorData>,
    device: &B::Device,
) -> Tensor<B, D, Int> {
    Tensor::from_primitive(B::int_from_replicas(data, device))
}

/// The data of every replica of a float tensor, in replica order.
pub fn into_replicas<B: CollectiveBackend, const D: usize>(
    tensor: Tensor<B, D>,
) -> Result<Vec<TensorData>, ExecutionError> {
    B::float_into_replicas(float_primitive(tensor))
}

/// The data of this process's first `count` replicas of a float tensor, and the index of the
/// first (see [`CollectiveBackend::float_into_local_replicas`]).
pub fn into_local_replicas<B: CollectiveBackend, const D: usize>(
    tensor: Tensor<B, D>,
    count: usize,
) -> Result<(usize, Vec<TensorData>), ExecutionError> {
    B::float_into_local_replicas(float_primitive(tensor), count)
}
