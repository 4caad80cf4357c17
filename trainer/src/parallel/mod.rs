//! Parallel training layouts in the style of NeuronX Distributed: the replicas of one device
//! (`xla:0-3`, `host:0-1`, a replicated `neuron` device) arranged as data-parallel groups, with
//! the collectives of `burn_trainium::collective` compiled into each step's program.

mod gradients;

pub use gradients::{BUCKET_BYTES, average_gradients};

use burn::tensor::backend::AutodiffBackend;
use burn_trainium::collective::{CollectiveBackend, ReplicaGroups};

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
    /// Data-parallel degree: each replica takes its slice of the global batch.
    pub data: usize,
}

impl ParallelLayout {
    /// One device, no parallelism.
    pub const SINGLE: ParallelLayout = ParallelLayout { data: 1 };

    /// The replicas the layout needs.
    pub fn replicas(&self) -> usize {
        self.data
    }

    /// The data-parallel group: every replica.
    pub fn data_groups(&self) -> ReplicaGroups {
        ReplicaGroups::all(self.data)
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
