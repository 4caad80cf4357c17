//! [`SftRows`]: fine-tuning examples as the rows of a run, one example per row, padded to one
//! bucket length so that every step runs the same program. The tokens whose prediction the loss
//! leaves out (the prompt, the first token, the padding) carry [`NOT_A_TARGET`]; the trainer's
//! batches turn them into ignored targets (`hlat_train::language_model`).
//!
//! Padding rather than packing: a row holds one example from position 0, so its attention and
//! positions are the example's alone (causal attention never looks at the padding after it),
//! and a batch's loss is the examples' token-weighted loss one by one.

use crate::data::RowSource;
use crate::language_model::NOT_A_TARGET;

use super::records::SftExample;

/// The shortest bucket length.
pub const MIN_BUCKET: usize = 16;

/// The sequence length of a run over sequences of `lengths` tokens (fine-tuning examples, or
/// preference pairs' sides): the smallest power of two (at least [`MIN_BUCKET`]) that holds the
/// longest sequence's predictions, at most `limit`. Longer sequences are cut to it (see
/// [`SftRows::new`]).
pub fn bucket_len(lengths: impl IntoIterator<Item = usize>, limit: usize) -> usize {
    let longest = lengths
        .into_iter()
        .map(|length| length.saturating_sub(1))
        .max()
        .unwrap_or(1);
    longest.next_power_of_two().max(MIN_BUCKET).min(limit)
}

/// Examples as rows of `seq_len + 1` tokens (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct SftRows {
    rows: Vec<Vec<u32>>,
    trained_tokens: usize,
}

impl SftRows {
    /// One row per example, padded with `pad_id` (not a target) or cut to `seq_len + 1` tokens;
    /// an example left with nothing to train on after the cut is dropped (and counted in the
    /// second value, its line in the log).
    pub fn new(examples: &[SftExample], seq_len: usize, pad_id: u32) -> (Self, usize) {
        let width = seq_len + 1;
        let mut rows = Vec::with_capacity(examples.len());
        let (mut dropped, mut trained_tokens) = (0, 0);
        for example in examples {
            let kept = example.ids.len().min(width);
            let trained = example.trained[..kept].iter().filter(|&&t| t).count();
            if trained == 0 {
                log::warn!(
                    "line {}: nothing left to train on in the first {width} tokens; skipped",
                    example.line
                );
                dropped += 1;
                continue;
            }
            trained_tokens += trained;
            let mut row: Vec<u32> = example.ids[..kept]
                .iter()
                .zip(&example.trained)
                .enumerate()
                .map(|(position, (&id, &trained))| {
                    if trained && position > 0 {
                        id
                    } else {
                        id | NOT_A_TARGET
                    }
                })
                .collect();
            row.resize(width, pad_id | NOT_A_TARGET);
            rows.push(row);
        }
        (
            Self {
                rows,
                trained_tokens,
            },
            dropped,
        )
    }

    /// The rows.
    pub fn rows(&self) -> &[Vec<u32>] {
        &self.rows
    }

    /// Tokens the loss counts over all rows.
    pub fn trained_tokens(&self) -> usize {
        self.trained_tokens
    }
}

impl RowSource for SftRows {
    fn row_len(&self) -> usize {
        self.rows.first().map_or(1, Vec::len)
    }

    fn num_rows(&self) -> usize {
        self.rows.len()
    }

    fn row(&self, index: usize) -> Vec<u32> {
        self.rows[index].clone()
    }
}
