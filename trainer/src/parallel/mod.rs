//! Parallel training layouts in the style of NeuronX Distributed: the replicas of one device
//! (`xla:0-3`, `host:0-1`, a replicated `neuron` device) arranged as tensor-parallel groups
//! inside data-parallel groups, with the collectives of `burn_trainium::collective` compiled into
//! each step's program.
//!
//! Replica `r` is tensor-parallel rank `r % tensor` of data-parallel rank `(r / tensor) % data`
//! of pipeline stage `r / (tensor × data)` (Megatron's order, pipeline outermost): the
//! tensor-parallel groups are consecutive replicas (`[[0, 1], [2, 3]]` for dp 2 × tp 2), the
//! data-parallel groups the replicas of one tensor-parallel rank within a stage (`[[0, 2], [1,
//! 3]]`), the pipeline groups the replicas of one data- and tensor-parallel rank across stages.

mod experts;
mod gradients;
mod launch;
mod memory;
mod pipeline;
mod state;
mod zero;

pub use experts::{
    ExpertStates, move_expert_gradients, reduce_gradients_with_experts, reshard_expert_states,
};
pub use gradients::{BUCKET_BYTES, average_gradients, reduce_replicated_gradients};
pub use hlat::recompute::ActivationCheckpointing;
pub use launch::{DEFAULT_MASTER_PORT, LaunchError, Launcher, ProcessGroup, first_host};
pub use memory::{CheckpointStaging, DeviceMemory, LoraShape, PipelineShape, StepShape};
pub(crate) use pipeline::{gather_stage_states, scatter_stage_states};
pub use pipeline::{move_stage_gradients, sum_shared_gradients};
pub use state::{Reshard, reshard_optimizer_state};
pub use zero::{Zero1, scatter_gradients};

use burn_trainium::collective::ReplicaGroups;
use hlat::expert_parallel::ExpertParallel;
use hlat::parallel::TensorParallel;
use hlat::pipeline::PipelineParallel;

/// How the replicas of the training device share the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParallelLayout {
    /// Data-parallel degree: each model replica takes its slice of the global batch.
    pub data: usize,
    /// Expert-parallel degree: the consecutive ranks of each data-parallel group a mixture's
    /// experts are split over (it divides `data`).
    pub expert: usize,
    /// Tensor-parallel degree: the ranks that split one model replica's weights.
    pub tensor: usize,
    /// Pipeline-parallel degree: the stages one model replica's layers are cut into.
    pub pipeline: usize,
    /// Norms and residuals on slices of the sequence (needs `tensor > 1`).
    pub sequence_parallel: bool,
    /// Optimizer state partitioned over the data-parallel groups (ZeRO-1; needs `data > 1`).
    pub zero1: bool,
    /// Parameters, gradients and optimizer state partitioned over the data-parallel groups
    /// (fully sharded data parallelism; needs `data > 1`, and implies ZeRO-1's partitioning of
    /// the optimizer state).
    pub fsdp: bool,
}

impl ParallelLayout {
    /// One device, no parallelism.
    pub const SINGLE: ParallelLayout = ParallelLayout {
        data: 1,
        expert: 1,
        tensor: 1,
        pipeline: 1,
        sequence_parallel: false,
        zero1: false,
        fsdp: false,
    };

    /// The replicas the layout needs.
    pub fn replicas(&self) -> usize {
        self.data * self.tensor * self.pipeline
    }

    /// The data-parallel groups: the replicas of one stage holding the same tensor-parallel
    /// rank.
    pub fn data_groups(&self) -> ReplicaGroups {
        let stage = self.data * self.tensor;
        let groups = (0..self.pipeline)
            .flat_map(|first_stage| {
                (0..self.tensor).map(move |rank| {
                    (0..self.data)
                        .map(|data| first_stage * stage + data * self.tensor + rank)
                        .collect()
                })
            })
            .collect();
        ReplicaGroups::new(groups).expect("a layout's groups are well formed")
    }

    /// The expert-parallel groups: consecutive members of each data-parallel group, `expert` of
    /// them, holding one whole set of experts between them.
    pub fn expert_groups(&self) -> ReplicaGroups {
        let groups = self
            .data_groups()
            .groups()
            .iter()
            .flat_map(|group| group.chunks(self.expert).map(<[usize]>::to_vec))
            .collect();
        ReplicaGroups::new(groups).expect("a layout's groups are well formed")
    }

    /// The expert-data-parallel groups: the members of each data-parallel group that hold the
    /// same experts (the same position in their expert-parallel group).
    pub fn expert_data_groups(&self) -> ReplicaGroups {
        let groups = self
            .data_groups()
            .groups()
            .iter()
            .flat_map(|group| {
                (0..self.expert).map(move |position| {
                    group
                        .iter()
                        .skip(position)
                        .step_by(self.expert)
                        .copied()
                        .collect()
                })
            })
            .collect();
        ReplicaGroups::new(groups).expect("a layout's groups are well formed")
    }

    /// How a mixture's experts are split, when they are.
    pub fn expert_parallel(&self) -> Option<ExpertParallel> {
        (self.expert > 1).then(|| ExpertParallel {
            groups: self.expert_groups(),
        })
    }

    /// The pipeline groups: the replicas of one data- and tensor-parallel rank, one per stage in
    /// stage order.
    pub fn pipeline_groups(&self) -> ReplicaGroups {
        ReplicaGroups::strided(self.replicas(), self.data * self.tensor)
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

    /// How the decoder layers are cut into the stages of this layout, when they are:
    /// `chunk_layers` lists the layers of each virtual stage (`None`: evenly), `virtual_stages`
    /// the chunks per stage (interleaved schedule above 1).
    pub fn pipeline_parallel(
        &self,
        num_layers: usize,
        chunk_layers: Option<Vec<usize>>,
        virtual_stages: usize,
    ) -> Result<Option<PipelineParallel>, String> {
        if self.pipeline == 1 {
            return Ok(None);
        }
        let groups = self.pipeline_groups();
        let pipeline = match chunk_layers {
            Some(layers) => {
                PipelineParallel::with_layers(groups, layers, num_layers, virtual_stages)?
            }
            None => {
                let parts = self.pipeline * virtual_stages.max(1);
                if num_layers < parts {
                    return Err(format!(
                        "{num_layers} layers cannot fill {parts} pipeline stages"
                    ));
                }
                PipelineParallel::even(groups, num_layers, virtual_stages)?
            }
        };
        Ok(Some(pipeline))
    }

    /// How the optimizer state of the replicated parameters is partitioned, when it is: over
    /// the data-parallel groups, under ZeRO-1 and under fully sharded data parallelism (whose
    /// optimizer state has ZeRO-1's layout).
    pub fn zero1(&self) -> Option<Zero1> {
        ((self.zero1 || self.fsdp) && self.data > 1).then(|| Zero1 {
            groups: self.data_groups(),
        })
    }

    /// The groups the parameters are sharded over under fully sharded data parallelism, when
    /// they are: the data-parallel groups.
    pub fn fully_sharded_groups(&self) -> Option<ReplicaGroups> {
        (self.fsdp && self.data > 1).then(|| self.data_groups())
    }

    /// How the optimizer state of a mixture's split experts is partitioned, when it is: over the
    /// replicas holding the same experts ([`ParallelLayout::expert_data_groups`]); `None`
    /// without expert parallelism (unsplit experts are partitioned as [`ParallelLayout::zero1`]
    /// says: `HlatAdamW::partitioned_for`) or when each expert is held by one replica only.
    pub fn zero1_of_experts(&self) -> Option<Zero1> {
        (self.zero1 && self.expert > 1 && self.data > self.expert).then(|| Zero1 {
            groups: self.expert_data_groups(),
        })
    }
}

/// Cuts `rows` into `parts` contiguous slices of equal length, one per data-parallel replica.
///
/// # Panics
/// When `rows` does not divide into `parts` (the configuration is validated before).
pub fn split_rows<T>(rows: &[T], parts: usize) -> Vec<&[T]> {
    assert!(
        rows.len().is_multiple_of(parts),
        "{} rows do not divide into {parts} replicas",
        rows.len()
    );
    rows.chunks(rows.len() / parts).collect()
}
