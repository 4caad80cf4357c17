//! Resumable shuffled sampling of rows.
//!
//! Every epoch visits every row once, in an order shuffled by the seed and the epoch number.
//! [`SamplerState`] (epoch, position within the epoch, seed) is all it takes to continue: a
//! sampler restored from the state saved at some step returns exactly the rows an uninterrupted
//! sampler would have returned from that step on.

use serde::{Deserialize, Serialize};

use super::error::DataError;
use super::rng::SplitMix64;
use super::rows::RowSource;

/// Where a [`Sampler`] stands; saved in checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    /// The epoch, counted from 0.
    pub epoch: u64,
    /// The number of rows of this epoch already returned.
    pub position: u64,
    /// The shuffling seed.
    pub seed: u64,
}

impl SamplerState {
    /// The state of a sampler over epochs of `rows_per_epoch` rows after `rows` more rows: what
    /// [`Sampler::state`] reports after drawing them (a finished epoch stays at its end until
    /// the next row is drawn).
    pub fn advanced(self, rows: u64, rows_per_epoch: u64) -> Self {
        let total = self.position + rows;
        if rows == 0 || rows_per_epoch == 0 {
            return self;
        }
        Self {
            epoch: self.epoch + (total - 1) / rows_per_epoch,
            position: (total - 1) % rows_per_epoch + 1,
            seed: self.seed,
        }
    }
}

/// Returns the rows of a [`RowSource`] in batches, shuffled anew each epoch.
pub struct Sampler<R> {
    source: R,
    state: SamplerState,
    /// The row order of `state.epoch`.
    order: Vec<u32>,
}

impl<R: RowSource> Sampler<R> {
    /// A sampler at the start of epoch 0.
    pub fn new(source: R, seed: u64) -> Result<Self, DataError> {
        let rows = source.num_rows();
        if rows == 0 {
            return Err(DataError::EmptyInput("the row source has no row".into()));
        }
        if u32::try_from(rows).is_err() {
            return Err(DataError::setting(
                "row count",
                format!(
                    "{rows} rows are more than the sampler's limit of {}",
                    u32::MAX
                ),
            ));
        }
        let state = SamplerState {
            epoch: 0,
            position: 0,
            seed,
        };
        let order = epoch_order(rows, seed, 0);
        Ok(Self {
            source,
            state,
            order,
        })
    }

    /// The next `batch_size` rows. A batch that reaches the end of an epoch continues with the
    /// start of the next one, so no row is skipped.
    pub fn next_batch(&mut self, batch_size: usize) -> Vec<Vec<u32>> {
        let mut batch = Vec::with_capacity(batch_size);
        while batch.len() < batch_size {
            if self.state.position as usize == self.order.len() {
                self.state.epoch += 1;
                self.state.position = 0;
                self.order = epoch_order(self.order.len(), self.state.seed, self.state.epoch);
            }
            let index = self.order[self.state.position as usize] as usize;
            batch.push(self.source.row(index));
            self.state.position += 1;
        }
        batch
    }

    /// The current state, to save in a checkpoint.
    pub fn state(&self) -> SamplerState {
        self.state
    }

    /// Continues from a saved state, whose seed replaces the one given to [`Sampler::new`].
    /// Fails when the state does not fit this row source.
    pub fn restore(&mut self, state: SamplerState) -> Result<(), DataError> {
        let rows = self.order.len();
        if state.position > rows as u64 {
            return Err(DataError::setting(
                "sampler state",
                format!(
                    "position {} is past the {rows} rows of an epoch; was it saved for other data?",
                    state.position
                ),
            ));
        }
        if (state.seed, state.epoch) != (self.state.seed, self.state.epoch) {
            self.order = epoch_order(rows, state.seed, state.epoch);
        }
        self.state = state;
        Ok(())
    }

    /// The number of rows in one epoch.
    pub fn rows_per_epoch(&self) -> usize {
        self.order.len()
    }

    /// The row source.
    pub fn source(&self) -> &R {
        &self.source
    }
}

/// The row order of `epoch`: a permutation of `0..rows` drawn from the seed and the epoch.
fn epoch_order(rows: usize, seed: u64, epoch: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..rows as u32).collect();
    SplitMix64::for_stream(seed, epoch).shuffle(&mut order);
    order
}
