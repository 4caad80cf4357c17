//! Parallel training layouts in the style of NeuronX Distributed: the replicas of one device
//! (`xla:0-3`, `host:0-1`, a replicated `neuron` device) arranged as tensor-parallel groups
//! inside data-parallel groups, with the collectives of `burn_trainium::collective` compiled into
//! each step's program.
//!
//! Replica `r` is tensor-parallel rank `r % tensor` of data-parallel rank `r / tensor`: the
//! tensor-parallel groups are consecutive replicas (`[[0, 1], [2, 3]]` for dp 2 × tp 2), the
//! data-parallel groups the replicas of one tensor-parallel rank (`[[0, 2], [1, 3]]`).

mod gradients;
mod launch;
mod memory;
mod state;
mod zero;

pub use gradients::{BUCKET_BYTES, average_gradients, reduce_replicated_gradients};
pub use hlat::recompute::ActivationCheckpointing;
pub use launch::{DEFAULT_MASTER_PORT, LaunchError, Launcher, ProcessGroup, first_host};
pub use memory::{DeviceMemory, StepShape};
pub use state::{Reshard, reshard_optimizer_state};
pub use zero::{Zero1, scatter_gradients};

use burn::tensor::backend::AutodiffBackend;
use burn_trainium::collective::{CollectiveBackend, ReplicaGroups};
use hlat::parallel::TensorParallel;

/// A backend the trainer runs on: autodiff, with collectives on it and on its inner backend
/// (every backend of this project: `Autodiff<Trainium>`, `Autodiff<NdArray>`, `Autodiff<Flex>`).
pub trait TrainingBackend:
    AutodiffBackend<InnerBackend: CollectiveBackend> + CollectiveBackend
{
}

impl<B> TrainingBackend for B where
    B: AutodiffBackend<InnerBackend: CollectiveBackend> + CollectiveBackend
{
}

/// How the replicas of the training device share the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParallelLayout {
    /// Data-parallel degree: each model replica takes its slice of the global batch.
    pub data: usize,
    /// Tensor-parallel degree: the ranks that split one model replica's weights.
    pub tensor: usize,
    /// Norms and residuals on slices of the sequence (needs `tensor > 1`).
    pub sequence_parallel: bool,
    /// Optimizer state partitioned over the data-parallel groups (ZeRO-1; needs `data > 1`).
    pub zero1: bool,
}

impl ParallelLayout {
    /// One device, no parallelism.
    pub const SINGLE: ParallelLayout = ParallelLayout {
        data: 1,
        tensor: 1,
        sequence_parallel: false,
        zero1: false,
    };

    /// The replicas the layout needs.
    pub fn replicas(&self) -> usize {
        self.data * self.tensor
    }

    /// The data-parallel groups: the replicas holding the same tensor-parallel rank.
    pub fn data_groups(&self) -> ReplicaGroups {
        ReplicaGroups::strided(self.replicas(), self.tensor)
            .expect("a layout's groups are well formed")
    }

    /// The tensor-parallel groups: the consecutive replicas of one model replica.
    pub fn tensor_groups(&self) -> ReplicaGroups {
        ReplicaGroups::contiguous(self.replicas(), self.tensor)
            .expect("a layout's groups are well formed")
    }

    /// How the model is split, when it is.
    pub fn tensor_parallel(&self) -> Option<TensorParallel> {
        (self.tensor > 1).then(|| TensorParallel {
            groups: self.tensor_groups(),
            sequence_parallel: self.sequence_parallel,
        })
    }

    /// How the optimizer state is partitioned, when it is.
    pub fn zero1(&self) -> Option<Zero1> {
        (self.zero1 && self.data > 1).then(|| Zero1 {
            groups: self.data_groups(),
        })
    }
}

/// Cuts `rows` into `parts` contiguous slices of equal length, one per data-parallel replica.
///
/// # Panics
/// When `rows` does not divide into `parts` (the configuration is validated before).
pub fn split_rows(rows: &[Vec<u32>], parts: usize) -> Vec<&[Vec<u32>]> {
    assert!(
        rows.len().is_multiple_of(parts),
        "{} rows do not divide into {parts} replicas",
        rows.len()
    );
    rows.chunks(rows.len() / parts).collect()
}
