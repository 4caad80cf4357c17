//! [`PreferencePairs`]: the preference pairs of a run (`hlat align`), each two rows of one bucket
//! length, with what they are trained with and, for DPO, the reference model's log-probabilities
//! of every row. The run's sampler draws pairs, not rows: as a [`RowSource`] the pairs are rows
//! of one token, their index, which [`PreferencePairs::step_micro_batches`] turns back into
//! batches of chosen and rejected rows.

use std::sync::Arc;

use burn::tensor::Device;

use super::batch::{PreferenceObjective, chosen_targets};
use super::records::{PreferenceExample, PreferenceSequence};
use crate::config::TrainConfig;
use crate::data::RowSource;
use crate::error::TrainError;
use crate::language_model::LmBatch;
use crate::parallel::ParallelLayout;

/// The rows a pair trains as: its chosen and its rejected sequence.
pub const ROWS_PER_PAIR: usize = 2;

/// The pairs of a run (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct PreferencePairs {
    examples: Arc<[PreferenceExample]>,
    references: Option<Arc<[f32]>>,
    seq_len: usize,
    pad_id: u32,
    objective: PreferenceObjective,
}

impl PreferencePairs {
    /// The pairs of `examples` as rows of `seq_len` targets padded with `pad_id` (longer
    /// sequences are cut to their first tokens); a pair left without a completion token on
    /// either side after the cut is dropped (and counted in the second value, its line in the
    /// log).
    pub fn new(
        examples: &[PreferenceExample],
        seq_len: usize,
        pad_id: u32,
        objective: PreferenceObjective,
    ) -> (Self, usize) {
        let scored = |sequence: &PreferenceSequence| completion_targets(sequence, seq_len) > 0;
        let (kept, dropped): (Vec<_>, Vec<_>) = examples
            .iter()
            .cloned()
            .partition(|pair| scored(&pair.chosen) && scored(&pair.rejected));
        for pair in &dropped {
            log::warn!(
                "line {}: no completion token left in the first {} tokens of its chosen or \
                 rejected sequence; skipped",
                pair.line,
                seq_len + 1
            );
        }
        let pairs = Self {
            examples: kept.into(),
            references: None,
            seq_len,
            pad_id,
            objective,
        };
        (pairs, dropped.len())
    }

    /// The pairs with the reference model's summed completion log-probability of every row
    /// (chosen, rejected, ... in pair order), which DPO compares the policy's with.
    ///
    /// # Panics
    /// When there are not two values per pair.
    pub fn with_references(self, references: Vec<f32>) -> Self {
        assert_eq!(
            references.len(),
            ROWS_PER_PAIR * self.examples.len(),
            "one reference log-probability per row"
        );
        Self {
            references: Some(references.into()),
            ..self
        }
    }

    /// The pairs.
    pub fn examples(&self) -> &[PreferenceExample] {
        &self.examples
    }

    /// Targets per row.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// What the pairs are trained with.
    pub fn objective(&self) -> PreferenceObjective {
        self.objective
    }

    /// Whether the objective compares with a reference model (DPO) whose log-probabilities
    /// [`PreferencePairs::with_references`] has not given yet.
    pub fn lacks_references(&self) -> bool {
        matches!(self.objective, PreferenceObjective::Dpo { .. }) && self.references.is_none()
    }

    /// The targets the completion masks count over all pairs (the completion tokens scored).
    pub fn completion_tokens(&self) -> usize {
        self.examples
            .iter()
            .flat_map(|pair| [&pair.chosen, &pair.rejected])
            .map(|sequence| completion_targets(sequence, self.seq_len))
            .sum()
    }

    /// One past the largest token id of the pairs.
    pub fn vocab_size(&self) -> usize {
        self.examples
            .iter()
            .flat_map(|pair| pair.chosen.ids.iter().chain(&pair.rejected.ids))
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0)
    }

    /// A batch of `layout` holding the pairs at `indices` (their count divides into the
    /// data-parallel ranks, each rank a contiguous slice), with their reference log-probabilities
    /// when the pairs have them.
    pub fn batch(&self, indices: &[usize], layout: &ParallelLayout, device: &Device) -> LmBatch {
        let pairs: Vec<PreferenceExample> = indices
            .iter()
            .map(|&index| self.examples[index].clone())
            .collect();
        let references: Option<Vec<f32>> = self.references.as_ref().map(|references| {
            indices
                .iter()
                .flat_map(|&index| {
                    let first = ROWS_PER_PAIR * index;
                    references[first..first + ROWS_PER_PAIR].iter().copied()
                })
                .collect()
        });
        LmBatch::preference_pairs_for_layout(
            &pairs,
            references.as_deref(),
            (self.seq_len, self.pad_id),
            self.objective,
            layout,
            device,
        )
    }

    /// The micro-batches of one optimizer step drawing the pairs `indices`: one contiguous slice
    /// per data-parallel rank, each cut into micro-batches of `pairs_per_micro_batch` pairs (as
    /// `crate::learner::step_micro_batches` cuts rows). ORPO's negative log-likelihood is the
    /// step's token mean: each micro-batch divides its replicas' sums by the step's chosen
    /// targets over its micro-batches and replicas, so that neither the accumulation nor the
    /// data parallelism, which group the pairs differently, changes the step's loss (with one
    /// micro-batch on one device, TRL's batch mean).
    pub fn step_micro_batches(
        &self,
        indices: &[usize],
        pairs_per_micro_batch: usize,
        layout: &ParallelLayout,
        device: &Device,
    ) -> Vec<LmBatch> {
        let slices = crate::parallel::split_rows(indices, layout.data);
        let accumulation = slices[0].len() / pairs_per_micro_batch;
        let step_pairs = indices.iter().map(|&index| &self.examples[index]);
        let nll_targets = (chosen_targets(step_pairs, self.seq_len) as f64
            / (accumulation * layout.data) as f64)
            .max(1.0);
        (0..accumulation)
            .map(|index| {
                let span = index * pairs_per_micro_batch..(index + 1) * pairs_per_micro_batch;
                let indices: Vec<usize> = slices
                    .iter()
                    .flat_map(|slice| slice[span.clone()].iter().copied())
                    .collect();
                let mut batch = self.batch(&indices, layout, device);
                if let Some(preference) = &mut batch.preference {
                    preference.nll_targets = nll_targets;
                }
                batch
            })
            .collect()
    }
}

/// The pairs' indices as rows of one token, for the run's sampler.
impl RowSource for PreferencePairs {
    fn row_len(&self) -> usize {
        1
    }

    fn num_rows(&self) -> usize {
        self.examples.len()
    }

    fn row(&self, index: usize) -> Vec<u32> {
        vec![index as u32]
    }
}

/// The completion targets of `sequence`'s row of `seq_len` targets (target `j` is token
/// `j + 1`; the first token is never one).
pub(super) fn completion_targets(sequence: &PreferenceSequence, seq_len: usize) -> usize {
    let end = sequence.ids.len().min(seq_len + 1);
    end.saturating_sub(sequence.prompt_len.max(1))
}

/// What a run of preference pairs refuses, by the setting's name: micro-batches that would cut
/// a pair, pipeline stages (the pairs' loss is not the pipeline's), and validation (pairs have
/// no validation rows).
pub fn check_config(config: &TrainConfig) -> Result<(), TrainError> {
    if !config.micro_batch_rows.is_multiple_of(ROWS_PER_PAIR) {
        return Err(TrainError::Mismatch(format!(
            "micro_batch_rows: {} rows per replica do not hold whole preference pairs (a pair is \
             its chosen and its rejected row)",
            config.micro_batch_rows
        )));
    }
    if config.pipeline_parallel > 1 {
        return Err(TrainError::Mismatch(
            "pipeline_parallel: preference pairs are not trained through pipeline stages (use \
             data or tensor parallelism)"
                .to_string(),
        ));
    }
    if config.eval_every > 0 {
        return Err(TrainError::Mismatch(
            "eval_every: preference pairs have no validation rows (the rewards of every step are \
             in metrics.jsonl)"
                .to_string(),
        ));
    }
    Ok(())
}
