//! Pipeline parallelism: the decoder layers cut into stages over the replicas of a device, run as
//! one SPMD program.
//!
//! Every replica runs the same program on its own stage's weights. The layers of a model are cut
//! into `p × V` *virtual stages* of consecutive layers; stage `s` holds virtual stages `s`,
//! `p + s`, … (one without `--virtual-stages`), each as a *chunk* of layer slots padded with
//! all-zero layers to the longest chunk (a zero layer is the identity, and its gradient is zero).
//! The token embedding, the final norm and the LM head are held by every stage: the first stage
//! uses the embedding, the last the head, and their gradients are summed over the pipeline group
//! (a tied embedding thus gets both ends' gradients).
//!
//! Activations move to the next stage and gradients to the previous one as `collective::permute`
//! (HLO `collective-permute`) inside the program; the ticks of [`schedule::Schedule`] say who runs
//! what. A stage keeps only the inputs of its chunks between their forward and backward passes
//! and runs each chunk again in its backward pass, since in one SPMD program every stage runs the
//! same instructions while 1F1B has each stage backpropagate a different micro-batch.

pub mod schedule;
mod stages;
mod step;

use std::fmt;
use std::str::FromStr;

use burn_trainium::collective::{ReplicaGroups, SourceTargetPairs};
use serde::{Deserialize, Serialize};

pub use schedule::{Schedule, bubble_fraction};
pub use step::MicroBatch;

/// The order the stages run micro-batches in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PipelineSchedule {
    /// One forward, one backward: each stage alternates, keeping at most `2p - 1` chunk inputs.
    #[default]
    #[serde(rename = "1f1b")]
    OneForwardOneBackward,
    /// 1F1B over `V` chunks per stage taken round-robin (Megatron's interleaved schedule): the
    /// bubble shrinks by about `V`.
    #[serde(rename = "interleaved")]
    Interleaved,
}

impl FromStr for PipelineSchedule {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "1f1b" => Ok(Self::OneForwardOneBackward),
            "interleaved" => Ok(Self::Interleaved),
            other => Err(format!(
                "unknown pipeline schedule `{other}` (expected 1f1b or interleaved)"
            )),
        }
    }
}

impl PipelineSchedule {
    /// Checks that `virtual_stages` chunks per stage fit this schedule: one for 1F1B, two or more
    /// for the interleaved schedule.
    pub fn check(self, virtual_stages: usize) -> Result<(), String> {
        match (self, virtual_stages) {
            (_, 0) => Err("--virtual-stages must be positive".into()),
            (Self::OneForwardOneBackward, 2..) => Err(format!(
                "--virtual-stages {virtual_stages} needs the interleaved schedule \
                 (--pp-schedule interleaved)"
            )),
            (Self::Interleaved, 1) => Err(
                "--pp-schedule interleaved needs 2 or more chunks per stage (--virtual-stages V)"
                    .into(),
            ),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for PipelineSchedule {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Self::OneForwardOneBackward => "1f1b",
            Self::Interleaved => "interleaved",
        })
    }
}

/// How the layers of a model are cut into pipeline stages over replica groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineParallel {
    /// The pipeline groups: one replica per stage, in stage order.
    pub groups: ReplicaGroups,
    /// Chunks per stage (`V`; 1 for 1F1B).
    pub virtual_stages: usize,
    /// The layers of each virtual stage `k = chunk · p + stage`, in order (`p × V` entries).
    pub chunk_layers: Vec<usize>,
}

impl PipelineParallel {
    /// `num_layers` layers cut as evenly as they go into `p × virtual_stages` virtual stages (the
    /// first ones one layer longer when they do not divide).
    pub fn even(
        groups: ReplicaGroups,
        num_layers: usize,
        virtual_stages: usize,
    ) -> Result<Self, String> {
        let parts = groups.group_size() * virtual_stages.max(1);
        let layers = (0..parts)
            .map(|part| num_layers / parts + usize::from(part < num_layers % parts))
            .collect();
        Self::with_layers(groups, layers, num_layers, virtual_stages)
    }

    /// Virtual stages of the given numbers of layers (`--pp-layers`), which must add up to
    /// `num_layers`, one entry per virtual stage, none empty.
    pub fn with_layers(
        groups: ReplicaGroups,
        chunk_layers: Vec<usize>,
        num_layers: usize,
        virtual_stages: usize,
    ) -> Result<Self, String> {
        let virtual_stages = virtual_stages.max(1);
        let parts = groups.group_size() * virtual_stages;
        if chunk_layers.len() != parts {
            return Err(format!(
                "--pp-layers lists {} stages, the layout has {parts} ({} stages × {virtual_stages} \
                 virtual stages)",
                chunk_layers.len(),
                groups.group_size()
            ));
        }
        if let Some(empty) = chunk_layers.iter().position(|&layers| layers == 0) {
            return Err(format!("--pp-layers gives virtual stage {empty} no layer"));
        }
        let total: usize = chunk_layers.iter().sum();
        if total != num_layers {
            return Err(format!(
                "--pp-layers adds up to {total} layers, the model has {num_layers}"
            ));
        }
        Ok(Self {
            groups,
            virtual_stages,
            chunk_layers,
        })
    }

    /// Pipeline stages `p`.
    pub fn stages(&self) -> usize {
        self.groups.group_size()
    }

    /// The schedule these stages run.
    pub fn schedule(&self) -> PipelineSchedule {
        if self.virtual_stages > 1 {
            PipelineSchedule::Interleaved
        } else {
            PipelineSchedule::OneForwardOneBackward
        }
    }

    /// Layer slots per chunk: the longest virtual stage.
    pub fn chunk_slots(&self) -> usize {
        self.chunk_layers.iter().copied().max().unwrap_or(0)
    }

    /// Layer slots each replica holds (`V` chunks).
    pub fn local_layers(&self) -> usize {
        self.virtual_stages * self.chunk_slots()
    }

    /// The model layer held in slot `slot` of stage `stage` (`None`: a padding layer).
    pub fn layer_at(&self, stage: usize, slot: usize) -> Option<usize> {
        let slots = self.chunk_slots();
        let (chunk, position) = (slot / slots, slot % slots);
        let virtual_stage = chunk * self.stages() + stage;
        let first: usize = self.chunk_layers[..virtual_stage].iter().sum();
        (position < self.chunk_layers[virtual_stage]).then_some(first + position)
    }

    /// The layers stage `stage` holds, in order.
    pub fn stage_layers(&self, stage: usize) -> Vec<usize> {
        (0..self.local_layers())
            .filter_map(|slot| self.layer_at(stage, slot))
            .collect()
    }

    /// Each stage passes to the next (the last to the first: the next chunk of an interleaved
    /// schedule).
    pub fn forward_pairs(&self) -> SourceTargetPairs {
        SourceTargetPairs::shift(&self.groups, 1, true)
    }

    /// Each stage passes gradients back to the previous one (the first to the last).
    pub fn backward_pairs(&self) -> SourceTargetPairs {
        SourceTargetPairs::shift(&self.groups, -1, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(stages: usize) -> ReplicaGroups {
        ReplicaGroups::all(stages)
    }

    #[test]
    fn layers_are_cut_evenly_or_as_listed() {
        let even = PipelineParallel::even(groups(2), 5, 1).unwrap();
        assert_eq!(even.chunk_layers, [3, 2]);
        assert_eq!(even.stage_layers(0), [0, 1, 2]);
        assert_eq!(even.stage_layers(1), [3, 4]);
        assert_eq!(even.layer_at(1, 2), None);
        let listed = PipelineParallel::with_layers(groups(2), vec![1, 3], 4, 1).unwrap();
        assert_eq!(listed.local_layers(), 3);
        assert_eq!(listed.stage_layers(0), [0]);
        assert!(PipelineParallel::with_layers(groups(2), vec![2, 3], 4, 1).is_err());
        assert!(PipelineParallel::with_layers(groups(2), vec![4, 0], 4, 1).is_err());
        assert!(PipelineParallel::with_layers(groups(2), vec![4], 4, 1).is_err());
    }

    #[test]
    fn virtual_stages_take_chunks_round_robin() {
        // 8 layers, 2 stages × 2 chunks: stage 0 holds layers 0-1 and 4-5.
        let interleaved = PipelineParallel::even(groups(2), 8, 2).unwrap();
        assert_eq!(interleaved.schedule(), PipelineSchedule::Interleaved);
        assert_eq!(interleaved.stage_layers(0), [0, 1, 4, 5]);
        assert_eq!(interleaved.stage_layers(1), [2, 3, 6, 7]);
        assert_eq!("interleaved".parse(), Ok(PipelineSchedule::Interleaved));
        assert!("gpipe".parse::<PipelineSchedule>().is_err());
    }
}
