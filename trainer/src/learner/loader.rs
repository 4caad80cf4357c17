//! Burn data loaders of packed rows: [`LayoutBatcher`] and [`RowsBatcher`] make the items of
//! Burn's own loaders micro-batches; [`StepLoader`] feeds a run's optimizer steps (of rows, or of
//! preference pairs) from the resumable [`Sampler`], so a resumed run sees exactly the rows an
//! uninterrupted one would.

use std::collections::VecDeque;
use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderIterator, Progress};
use burn::data::dataset::DatasetError;
use burn::tensor::Device;

use crate::align::pairs::{PreferencePairs, ROWS_PER_PAIR};
use crate::data::{DataError, RowSource, Sampler, SamplerState};
use crate::language_model::LmBatch;
use crate::parallel::{ParallelLayout, split_rows};

/// Makes each item of a Burn data loader (`data × micro_batch_rows` packed rows of
/// `seq_len + 1` tokens) one micro-batch of `layout` (see [`LmBatch::for_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutBatcher {
    /// How the device's replicas share the rows.
    pub layout: ParallelLayout,
}

impl Batcher<Vec<u32>, LmBatch> for LayoutBatcher {
    fn batch(&self, rows: Vec<Vec<u32>>, device: &Device) -> LmBatch {
        LmBatch::for_layout(&rows, &self.layout, device)
    }
}

/// Makes each item of a Burn data loader one batch of `rows` rows that every replica of the
/// device sees whole (evaluation: the loss is the same on every replica), a short last item
/// padded to the same shape (see [`LmBatch::padded`]) so that it runs the same program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsBatcher {
    /// Rows per batch (the data loader's batch size).
    pub rows: usize,
}

impl Batcher<Vec<u32>, LmBatch> for RowsBatcher {
    fn batch(&self, rows: Vec<Vec<u32>>, device: &Device) -> LmBatch {
        LmBatch::padded(&rows, self.rows, device)
    }
}

/// The micro-batches of one optimizer step: `rows` cut into one contiguous slice per
/// data-parallel rank, each slice into micro-batches of `micro_batch_rows` rows; the
/// tensor-parallel ranks of one model replica see the same rows.
pub fn step_micro_batches(
    rows: &[Vec<u32>],
    micro_batch_rows: usize,
    layout: &ParallelLayout,
    device: &Device,
) -> Vec<LmBatch> {
    let slices = split_rows(rows, layout.data);
    let accumulation = slices[0].len() / micro_batch_rows;
    (0..accumulation)
        .map(|index| {
            let span = index * micro_batch_rows..(index + 1) * micro_batch_rows;
            let rows: Vec<Vec<u32>> = slices
                .iter()
                .flat_map(|slice| slice[span.clone()].iter().cloned())
                .collect();
            LmBatch::for_layout(&rows, layout, device)
        })
        .collect()
}

/// A run's training rows as a Burn data loader: `steps` optimizer steps drawn from a [`Sampler`]
/// that starts at `start`, each step `rows_per_step` rows cut into micro-batches (the loader's
/// items, `accumulation` per step) by [`step_micro_batches`], or, over preference pairs
/// ([`StepLoader::with_pairs`]), `rows_per_step / 2` pairs cut by
/// [`PreferencePairs::step_micro_batches`]. Every iteration starts again from `start`, so the
/// sequence is the same each time; progress counts rows.
pub struct StepLoader {
    source: Arc<dyn RowSource>,
    /// The preference pairs the sampler's rows index, when the run trains pairs.
    pairs: Option<Arc<PreferencePairs>>,
    start: SamplerState,
    rows_per_step: usize,
    micro_batch_rows: usize,
    layout: ParallelLayout,
    device: Device,
    /// The micro-batches this loader yields, counted from `start`.
    items: std::ops::Range<usize>,
}

impl Clone for StepLoader {
    fn clone(&self) -> Self {
        Self {
            source: Arc::clone(&self.source),
            pairs: self.pairs.clone(),
            start: self.start,
            rows_per_step: self.rows_per_step,
            micro_batch_rows: self.micro_batch_rows,
            layout: self.layout,
            device: self.device.clone(),
            items: self.items.clone(),
        }
    }
}

impl StepLoader {
    /// `steps` steps of `rows_per_step` rows from `source`, sampled from `start` on; each
    /// data-parallel rank's share of a step is cut into micro-batches of `micro_batch_rows` rows.
    pub fn new(
        source: Arc<dyn RowSource>,
        start: SamplerState,
        steps: u64,
        rows_per_step: usize,
        micro_batch_rows: usize,
        layout: ParallelLayout,
        device: Device,
    ) -> Result<Self, DataError> {
        let share = layout.data * micro_batch_rows;
        if share == 0 || rows_per_step == 0 || !rows_per_step.is_multiple_of(share) {
            return Err(DataError::setting(
                "rows per step",
                format!(
                    "{rows_per_step} rows do not divide into micro-batches of {micro_batch_rows} \
                     rows on {} data-parallel ranks",
                    layout.data
                ),
            ));
        }
        // Fails early when `start` does not fit the rows.
        let mut sampler = Sampler::new(Arc::clone(&source), start.seed)?;
        sampler.restore(start)?;
        let accumulation = rows_per_step / share;
        let items = steps as usize * accumulation;
        Ok(Self {
            source,
            pairs: None,
            start,
            rows_per_step,
            micro_batch_rows,
            layout,
            device,
            items: 0..items,
        })
    }

    /// The loader drawing the preference `pairs` instead (the loader's source must be the same
    /// pairs, as a `RowSource` of their indices): each step's `rows_per_step` rows are half as
    /// many pairs, each micro-batch's `micro_batch_rows` rows half as many pairs (a pair's two
    /// rows stay in one micro-batch).
    pub fn with_pairs(self, pairs: Arc<PreferencePairs>) -> Result<Self, DataError> {
        if !self.micro_batch_rows.is_multiple_of(ROWS_PER_PAIR) {
            return Err(DataError::setting(
                "micro_batch_rows",
                format!(
                    "{} rows do not hold whole preference pairs (a pair is its chosen and its \
                     rejected row)",
                    self.micro_batch_rows
                ),
            ));
        }
        if self.source.num_rows() != pairs.num_rows() {
            return Err(DataError::setting(
                "preference pairs",
                format!(
                    "the loader draws from {} rows, not the {} pairs' indices",
                    self.source.num_rows(),
                    pairs.num_rows()
                ),
            ));
        }
        Ok(Self {
            pairs: Some(pairs),
            ..self
        })
    }

    /// Micro-batches per optimizer step.
    pub fn accumulation(&self) -> usize {
        self.rows_per_step / (self.layout.data * self.micro_batch_rows)
    }

    /// Where the sampler stands after `steps` optimizer steps from the start (what a checkpoint
    /// after them saves).
    pub fn sampler_state_after(&self, steps: u64) -> SamplerState {
        self.start.advanced(
            steps * self.draws_per_step() as u64,
            self.source.num_rows() as u64,
        )
    }

    /// Rows the sampler draws per optimizer step: rows, or pairs' indices.
    fn draws_per_step(&self) -> usize {
        match self.pairs {
            Some(_) => self.rows_per_step / ROWS_PER_PAIR,
            None => self.rows_per_step,
        }
    }

    /// The micro-batches of one step whose sampler drew `rows`.
    fn step_micro_batches(&self, rows: &[Vec<u32>]) -> Vec<LmBatch> {
        let Some(pairs) = &self.pairs else {
            return step_micro_batches(rows, self.micro_batch_rows, &self.layout, &self.device);
        };
        let indices: Vec<usize> = rows.iter().map(|row| row[0] as usize).collect();
        let per_micro_batch = self.micro_batch_rows / ROWS_PER_PAIR;
        pairs.step_micro_batches(&indices, per_micro_batch, &self.layout, &self.device)
    }

    fn rows_per_item(&self) -> usize {
        self.layout.data * self.micro_batch_rows
    }
}

impl DataLoader<LmBatch> for StepLoader {
    fn iter<'a>(&'a self) -> Box<dyn DataLoaderIterator<LmBatch> + 'a> {
        let first_step = (self.items.start / self.accumulation()) as u64;
        let mut sampler = Sampler::new(Arc::clone(&self.source), self.start.seed)
            .expect("checked when the loader was made");
        sampler
            .restore(self.sampler_state_after(first_step))
            .expect("a state advanced from a valid one is valid");
        Box::new(StepIterator {
            loader: self,
            sampler,
            next: self.items.start,
            pending: VecDeque::new(),
        })
    }

    fn num_items(&self) -> usize {
        self.items.len() * self.rows_per_item()
    }

    fn to_device(&self, device: &Device) -> Arc<dyn DataLoader<LmBatch>> {
        Arc::new(Self {
            device: device.clone(),
            ..self.clone()
        })
    }

    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<LmBatch>> {
        let per_item = self.rows_per_item();
        let first = self.items.start + start / per_item;
        let last = (self.items.start + end.div_ceil(per_item)).min(self.items.end);
        Arc::new(Self {
            items: first..last.max(first),
            ..self.clone()
        })
    }
}

/// Iterates a [`StepLoader`]: draws a step's rows when its first micro-batch is asked for.
struct StepIterator<'a> {
    loader: &'a StepLoader,
    sampler: Sampler<Arc<dyn RowSource>>,
    /// Index of the next micro-batch.
    next: usize,
    /// The rest of the current step's micro-batches.
    pending: VecDeque<LmBatch>,
}

impl Iterator for StepIterator<'_> {
    type Item = Result<LmBatch, DatasetError>;

    fn next(&mut self) -> Option<Result<LmBatch, DatasetError>> {
        if self.next >= self.loader.items.end {
            return None;
        }
        if self.pending.is_empty() {
            let loader = self.loader;
            let rows = self.sampler.next_batch(loader.draws_per_step());
            let skip = self.next % loader.accumulation();
            self.pending = loader
                .step_micro_batches(&rows)
                .into_iter()
                .skip(skip)
                .collect();
        }
        self.next += 1;
        self.pending.pop_front().map(Ok)
    }
}

impl DataLoaderIterator<LmBatch> for StepIterator<'_> {
    fn progress(&self) -> Progress {
        let per_item = self.loader.rows_per_item();
        Progress::new(
            (self.next - self.loader.items.start) * per_item,
            self.loader.num_items(),
            Some("rows".to_string()),
        )
    }
}
