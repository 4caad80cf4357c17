//! Collectives across the replicas of a device, for Burn code that stays generic.
//!
//! A replicated Trainium device (`xla:0-3`, [`crate::TrainiumDevice::replicated`]) runs each
//! captured segment once on every replica; its tensors hold one buffer per replica. The
//! operations here combine those buffers, as the collectives of NeuronX Distributed and
//! torch-xla do: [`all_reduce`], [`all_gather`], [`reduce_scatter`], [`all_to_all`], [`split`] (keep this
//! replica's chunk) and [`optimization_barrier`], over [`ReplicaGroups`] such as `[[0, 1], [2, 3]]`,
//! and [`permute`] over [`SourceTargetPairs`] such as `0>1,1>2` (pipeline stages passing
//! activations on). On Trainium they are captured as operations of the segment, lowered to the
//! HLO collectives (`all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all`, `collective-permute`,
//! `opt-barrier`) compiled into the program, and run in process on the `host` executor, the
//! reference.
//!
//! They are functions of Burn's `Tensor<D>`: on a Trainium device (served in the process by
//! [`crate::device`] or by `hlat serve`) they travel as custom operations of the stream
//! ([`CollectiveExtension`], with the backward rules of tensor parallelism: all-reduce ↔
//! identity, all-gather ↔ reduce-scatter, split ↔ all-gather, all-to-all ↔ all-to-all, permute ↔ permute with the pairs
//! reversed, and [`copy_to_group`] whose gradient is all-reduced); on any other device every
//! group has one member and the collectives are identities (a permute that sends the one replica
//! nothing gives zeros), so that models written with them run anywhere.
//!
//! ```no_run
//! use burn::tensor::{Tensor, TensorData};
//! use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};
//!
//! let device = burn_trainium::device("xla:0-3")?;
//! let per_replica = (0..4).map(|r| TensorData::from([r as f32, 1.0])).collect();
//! let x: Tensor<1> = collective::from_replicas(per_replica, &device);
//! let pairs = ReplicaGroups::contiguous(4, 2).unwrap();
//! let summed = collective::all_reduce(x, ReduceOp::Sum, &pairs);
//! // Replicas 0 and 1 hold [1, 2], replicas 2 and 3 hold [5, 2].
//! let values = collective::into_replicas(summed).unwrap();
//! # Ok::<(), burn_trainium::BackendError>(())
//! ```

mod extension;
mod groups;
mod operation;
mod pairs;
mod tensor;
mod trainium;

pub use extension::{CollectiveExtension, REPLICA_LAYOUT, REPLICAS_IN, REPLICAS_OUT};
pub use groups::{GroupsError, ReplicaGroups};
pub use operation::{Collective, REMOTE_OPERATION, ReduceOp};
pub use pairs::SourceTargetPairs;
pub(crate) use tensor::remote_device;
pub use tensor::{
    all_gather, all_reduce, all_to_all, copy_to_group, from_replicas, int_from_replicas,
    into_local_replicas, into_replicas, optimization_barrier, permute, reduce_scatter,
    replica_count, split,
};

use burn_backend::tensor::{FloatTensor, IntTensor};
use burn_backend::{Backend, ExecutionError, TensorData};

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
