//! Preference pairs as a batch of the language model: each pair is two rows, its chosen then
//! its rejected sequence, padded to one width (their padding left out of every loss), with the
//! mask of each row's completion targets and, for DPO, the reference model's summed completion
//! log-probabilities of each row ([`PreferenceBatch`]). Pairs stay whole on one data-parallel
//! rank.

use burn::tensor::{Device, Tensor, TensorData};
use burn_trainium::collective;
use serde::{Deserialize, Serialize};

use super::loss::{DpoLoss, PairLogProbs, PreferenceLoss, dpo, orpo};
use super::records::{PreferenceExample, PreferenceSequence};
use crate::language_model::{LmBatch, NOT_A_TARGET};
use crate::parallel::ParallelLayout;

/// What preference pairs are trained with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "method")]
pub enum PreferenceObjective {
    /// DPO against the reference log-probabilities of [`PreferenceBatch::reference`].
    Dpo {
        /// `β`.
        beta: f64,
        /// Which of TRL's losses.
        loss: DpoLoss,
    },
    /// ORPO: the chosen rows' negative log-likelihood, minus `β` times the odds-ratio term.
    Orpo {
        /// `β`.
        beta: f64,
    },
}

/// The preference part of a batch whose rows are pairs, chosen then rejected.
#[derive(Debug, Clone)]
pub struct PreferenceBatch {
    /// What the pairs are trained with.
    pub objective: PreferenceObjective,
    /// 1 where a target is its row's completion, 0 on the prompt and padding, `[rows, seq]`.
    pub completion: Tensor<2>,
    /// The reference model's summed completion log-probability of each row, `[rows]` (DPO).
    pub reference: Option<Tensor<1>>,
    /// The chosen rows' targets ORPO's negative log-likelihood averages over, counted over the
    /// whole micro-batch and divided by the replicas: each replica divides its own sum by it,
    /// so that the replicas' mean is the micro-batch's token mean, as on one device.
    pub nll_targets: f64,
}

impl LmBatch {
    /// A batch of preference pairs whose data-parallel replica `r` holds `parts[r]` (the same
    /// number of pairs on every replica), each row `seq_len + 1` tokens wide (longer sequences
    /// are cut to their first tokens, as TRL's `keep_start` cuts them), padded with `pad_id`.
    /// `references[r]` holds the reference's summed completion log-probabilities of replica `r`'s
    /// rows (chosen, rejected, ...), which DPO needs.
    ///
    /// # Panics
    /// When the parts are empty or differ in length, or `references` does not match them.
    pub fn preference_pairs(
        parts: &[&[PreferenceExample]],
        seq_len: usize,
        pad_id: u32,
        objective: PreferenceObjective,
        references: Option<&[Vec<f32>]>,
        device: &Device,
    ) -> Self {
        let rows: Vec<Vec<Vec<u32>>> = parts
            .iter()
            .map(|pairs| {
                sequences(pairs)
                    .map(|sequence| padded_row(sequence, seq_len, pad_id))
                    .collect()
            })
            .collect();
        let row_parts: Vec<&[Vec<u32>]> = rows.iter().map(Vec::as_slice).collect();
        let mut batch = LmBatch::from_replica_rows(&row_parts, device);
        let completion: Vec<TensorData> = parts
            .iter()
            .map(|pairs| {
                let masks: Vec<f32> = sequences(pairs)
                    .flat_map(|sequence| completion_mask(sequence, seq_len))
                    .collect();
                TensorData::new(masks, [2 * pairs.len(), seq_len])
            })
            .collect();
        let reference = references.map(|references| {
            assert_eq!(
                references.len(),
                parts.len(),
                "one list of references per part"
            );
            let data = references
                .iter()
                .map(|values| TensorData::new(values.clone(), [values.len()]))
                .collect();
            collective::from_replicas(data, device)
        });
        let chosen_targets: usize = parts
            .iter()
            .map(|pairs| chosen_targets(pairs.iter(), seq_len))
            .sum();
        batch.preference = Some(PreferenceBatch {
            objective,
            completion: collective::from_replicas(completion, device),
            reference,
            nll_targets: (chosen_targets as f64 / parts.len() as f64).max(1.0),
        });
        batch
    }
}

impl LmBatch {
    /// [`LmBatch::preference_pairs`] of one micro-batch of `layout`: `pairs` (and the reference
    /// log-probabilities of their rows, `references`) cut into one contiguous slice per
    /// data-parallel rank; the tensor-parallel ranks of one model replica see the same pairs.
    ///
    /// # Panics
    /// When the pairs do not divide into the data-parallel ranks, or `layout` has pipeline
    /// stages (preference pairs are not pipelined).
    pub fn preference_pairs_for_layout(
        pairs: &[PreferenceExample],
        references: Option<&[f32]>,
        (seq_len, pad_id): (usize, u32),
        objective: PreferenceObjective,
        layout: &ParallelLayout,
        device: &Device,
    ) -> Self {
        assert_eq!(layout.pipeline, 1, "preference pairs are not pipelined");
        assert!(
            pairs.len().is_multiple_of(layout.data),
            "{} pairs do not divide into {} data-parallel ranks",
            pairs.len(),
            layout.data
        );
        let per_rank = pairs.len() / layout.data;
        let replicas = |rank: usize| std::iter::repeat_n(rank, layout.tensor);
        let ranks: Vec<usize> = (0..layout.data).flat_map(replicas).collect();
        let parts: Vec<&[PreferenceExample]> = ranks
            .iter()
            .map(|rank| &pairs[rank * per_rank..(rank + 1) * per_rank])
            .collect();
        let references: Option<Vec<Vec<f32>>> = references.map(|references| {
            ranks
                .iter()
                .map(|rank| references[2 * rank * per_rank..2 * (rank + 1) * per_rank].to_vec())
                .collect()
        });
        Self::preference_pairs(
            &parts,
            seq_len,
            pad_id,
            objective,
            references.as_deref(),
            device,
        )
    }
}

/// Every target of the chosen rows of `pairs` but padding, prompt included, as TRL counts them
/// for ORPO's negative log-likelihood.
pub fn chosen_targets<'a>(
    pairs: impl IntoIterator<Item = &'a PreferenceExample>,
    seq_len: usize,
) -> usize {
    pairs
        .into_iter()
        .map(|pair| pair.chosen.ids.len().min(seq_len + 1) - 1)
        .sum()
}

/// The sequences of `pairs` in row order: chosen, rejected, chosen, ...
fn sequences(pairs: &[PreferenceExample]) -> impl Iterator<Item = &PreferenceSequence> {
    pairs.iter().flat_map(|pair| [&pair.chosen, &pair.rejected])
}

/// `sequence` as a row of `seq_len + 1` tokens: cut, or padded with `pad_id` marked as no
/// target.
fn padded_row(sequence: &PreferenceSequence, seq_len: usize, pad_id: u32) -> Vec<u32> {
    let width = seq_len + 1;
    let mut row: Vec<u32> = sequence.ids.iter().copied().take(width).collect();
    row.resize(width, pad_id | NOT_A_TARGET);
    row
}

/// For each of the `seq_len` targets of `sequence`'s row (target `j` is token `j + 1`), 1 when it
/// is a completion token within the row.
fn completion_mask(sequence: &PreferenceSequence, seq_len: usize) -> Vec<f32> {
    (1..=seq_len)
        .map(|position| {
            let completion = position >= sequence.prompt_len && position < sequence.ids.len();
            f32::from(u8::from(completion))
        })
        .collect()
}

/// The preference loss of a batch of pairs from its rows' per-target log-probabilities
/// `log_probs` `[rows, seq]` (0 on ignored targets) and the mask of the targets that count
/// (`kept`, `[rows, seq]`: not padding).
pub fn preference_loss(
    preference: &PreferenceBatch,
    log_probs: Tensor<2>,
    kept: Tensor<2>,
) -> PreferenceLoss {
    let [rows, _] = log_probs.dims();
    let completion = preference.completion.clone();
    let sums = masked_row_sums(log_probs.clone(), completion.clone());
    match preference.objective {
        PreferenceObjective::Dpo { beta, loss } => {
            let reference = preference
                .reference
                .clone()
                .expect("a DPO batch carries its reference log-probabilities");
            dpo(pairs(sums), pairs(reference), beta, loss)
        }
        PreferenceObjective::Orpo { beta } => {
            let counts = completion.sum_dim(1).reshape([rows]).clamp_min(1.0);
            let means = sums / counts;
            // The chosen rows' every target that is not padding, prompt included, as TRL does.
            let kept_sums = masked_row_sums(log_probs, kept);
            let nll = pairs(kept_sums)
                .chosen
                .sum()
                .neg()
                .div_scalar(preference.nll_targets);
            orpo(pairs(means), nll, beta).0
        }
    }
}

/// Per-row values `[2 · pairs]` (chosen, rejected, ...) as pairs.
fn pairs(values: Tensor<1>) -> PairLogProbs {
    let [rows] = values.dims();
    let pairs = values.reshape([rows / 2, 2]);
    let column = |index| pairs.clone().narrow(1, index, 1).reshape([rows / 2]);
    PairLogProbs {
        chosen: column(0),
        rejected: column(1),
    }
}

/// Each row's sum `[rows]` of `log_probs` `[rows, seq]` where `mask` is 1: under a completion
/// mask, the summed completion log-probabilities DPO compares with the reference's (and the
/// reference pass records).
pub fn masked_row_sums(log_probs: Tensor<2>, completion: Tensor<2>) -> Tensor<1> {
    let [rows, _] = log_probs.dims();
    (log_probs * completion).sum_dim(1).reshape([rows])
}
