//! The reference pass of a DPO run: the frozen reference model's summed completion
//! log-probability of every row of the run's pairs, computed once on the run's device before
//! training (TRL's `precompute_ref_log_probs`), so that training holds one model, not two.

use burn::tensor::Device;
use burn_trainium::collective;

use super::batch::masked_row_sums;
use super::pairs::{PreferencePairs, ROWS_PER_PAIR};
use crate::error::TrainError;
use crate::language_model::LanguageModel;
use crate::parallel::ParallelLayout;

/// The key under which the processes of a job exchange their reference log-probabilities.
const SHARE_KEY: &str = "hlat/align/reference";

/// Every row's summed completion log-probability (chosen, rejected, ... in pair order) of
/// `pairs` under `reference`, split as `layout` says on `device`, in batches of `pairs_per_rank`
/// pairs per data-parallel rank (the run's micro-batch, so the reference pass compiles the
/// training step's shapes; a short last batch repeats the last pair). In a job of several
/// processes each computes its replicas' rows and every process gets all of them.
pub fn reference_log_probs(
    reference: &LanguageModel,
    pairs: &PreferencePairs,
    pairs_per_rank: usize,
    layout: &ParallelLayout,
    device: &Device,
) -> Result<Vec<f32>, TrainError> {
    let count = pairs.examples().len();
    let per_batch = pairs_per_rank * layout.data;
    // (row, value bits) of the rows this process's replicas computed.
    let mut ours: Vec<(usize, u32)> = Vec::with_capacity(ROWS_PER_PAIR * count);
    for first in (0..count).step_by(per_batch) {
        let indices: Vec<usize> = (first..first + per_batch)
            .map(|index| index.min(count - 1))
            .collect();
        let batch = pairs.batch(&indices, layout, device);
        let completion = batch
            .preference
            .as_ref()
            .expect("a batch of pairs")
            .completion
            .clone();
        let sums = masked_row_sums(reference.token_log_probs(&batch), completion);
        let (first_replica, replicas) = collective::into_local_replicas(sums, usize::MAX)?;
        for (offset, data) in replicas.into_iter().enumerate() {
            let replica = first_replica + offset;
            if !replica.is_multiple_of(layout.tensor) {
                // The tensor-parallel ranks of one model replica compute the same rows.
                continue;
            }
            let rank = replica / layout.tensor;
            let values = data
                .convert::<f32>()
                .try_into_vec::<f32>()
                .map_err(|error| {
                    TrainError::Device(format!("reference log-probabilities: {error:?}"))
                })?;
            let rank_pairs = &indices[rank * pairs_per_rank..(rank + 1) * pairs_per_rank];
            for (slot, pair_values) in values.chunks(ROWS_PER_PAIR).enumerate() {
                let position = first + rank * pairs_per_rank + slot;
                if position >= count {
                    break;
                }
                let row = ROWS_PER_PAIR * rank_pairs[slot];
                for (side, value) in pair_values.iter().enumerate() {
                    ours.push((row + side, value.to_bits()));
                }
            }
        }
    }
    // Each row and its value as 8 little-endian bytes: 16 MiB a million pairs.
    let encoded: Vec<u8> = ours
        .iter()
        .flat_map(|&(row, bits)| {
            let row = u32::try_from(row).expect("fewer rows than the sampler's u32 indices");
            row.to_le_bytes().into_iter().chain(bits.to_le_bytes())
        })
        .collect();
    let every = burn_trainium::distributed::share(SHARE_KEY, &encoded).map_err(|error| {
        TrainError::Mismatch(format!("sharing the reference log-probabilities: {error}"))
    })?;
    let mut references = vec![f32::NAN; ROWS_PER_PAIR * count];
    for bytes in every {
        for entry in bytes.chunks_exact(8) {
            let word = |range: std::ops::Range<usize>| {
                u32::from_le_bytes(entry[range].try_into().expect("four bytes"))
            };
            if let Some(value) = references.get_mut(word(0..4) as usize) {
                *value = f32::from_bits(word(4..8));
            }
        }
    }
    if let Some(row) = references.iter().position(|value| !value.is_finite()) {
        return Err(TrainError::Mismatch(format!(
            "line {}: the reference model's log-probability of its {} completion is {} (or no \
             process computed it)",
            pairs.examples()[row / ROWS_PER_PAIR].line,
            if row % ROWS_PER_PAIR == 0 {
                "chosen"
            } else {
                "rejected"
            },
            references[row]
        )));
    }
    log::info!(
        "reference log-probabilities of {count} pairs: chosen mean {:.4}, rejected mean {:.4}",
        side_mean(&references, 0),
        side_mean(&references, 1)
    );
    Ok(references)
}

/// The mean of one side's values (0: chosen, 1: rejected) of per-row values.
fn side_mean(values: &[f32], side: usize) -> f64 {
    let side: Vec<f64> = values
        .iter()
        .skip(side)
        .step_by(ROWS_PER_PAIR)
        .map(|&value| f64::from(value))
        .collect();
    side.iter().sum::<f64>() / side.len().max(1) as f64
}
