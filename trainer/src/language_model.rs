//! [`LanguageModel`]: the HLAT model as Burn's `Learner` sees it (a module with `TrainStep` and
//! `InferenceStep`), and [`LmBatch`], the batches of packed rows it trains on.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{DType, Device, Int, Tensor, TensorData, TensorReadError};
use burn::train::{InferenceStep, ItemLazy, TrainOutput, TrainStep};
use burn_trainium::collective;
use hlat::Hlat;
use hlat::blocked_attention::attends_by_block;
use hlat::fully_sharded::FullySharded;
use hlat::parallel::{Exchange, TensorParallel, Unsharded};
use hlat::pipeline::PipelineParallel;
use hlat::recompute::{ActivationCheckpointing, HeadObjective, ObjectiveGradients};
use hlat::token_log_probs;

use crate::align::{PreferenceBatch, PreferenceLoss};
use crate::parallel::{ParallelLayout, split_rows, sum_shared_gradients};

/// An HLAT model wrapped for training: its next-token loss, optionally computed on a copy cast
/// to a lower precision (the f32 master weights of `bf16-mixed` stay in the wrapped model).
#[derive(Module, Debug)]
pub struct LanguageModel {
    /// The model (master weights).
    pub hlat: Hlat,
    /// The dtype the forward pass runs in when it differs from the stored parameters.
    #[module(skip)]
    pub compute_cast: Option<DType>,
    /// How the model is split across tensor-parallel ranks (`None`: whole on every replica).
    #[module(skip)]
    pub tensor_parallel: Option<TensorParallel>,
    /// What the backward pass recomputes instead of keeping (training only; not with
    /// `compute_cast`, whose cast parameters are not leaves of the graph). Over sequences longer
    /// than [`hlat::blocked_attention::ATTENTION_BLOCK`] the attention core is recomputed by
    /// blocks whatever this says (without `compute_cast`).
    #[module(skip)]
    pub checkpointing: ActivationCheckpointing,
    /// How the layers are cut into pipeline stages (`None`: every layer on every replica); the
    /// model holds its stage's layers (see `Hlat::into_stages`).
    #[module(skip)]
    pub pipeline: Option<PipelineParallel>,
    /// Under fully sharded data parallelism, how the model's parameters (this rank's slices)
    /// gather whole (`None`: the model holds them whole).
    #[module(skip)]
    pub fully_sharded: Option<FullySharded>,
}

/// The target of a padding row's positions: never a token id (vocabularies stay below 2^31),
/// and left out of the loss.
pub const PADDING_TARGET: u32 = i32::MAX as u32;

/// Marks a token of a row whose prediction is left out of the loss (fine-tuning's prompt
/// tokens and padding, `hlat_train::finetune`): the token is still an input (without the mark),
/// and its target becomes [`PADDING_TARGET`]. Token ids stay below 2^31, so the bit is free.
pub const NOT_A_TARGET: u32 = 1 << 31;

/// A batch of packed rows: inputs and the same rows shifted by one token as targets.
#[derive(Debug, Clone)]
pub struct LmBatch {
    /// Token ids `[rows, seq_len]`.
    pub inputs: Tensor<2, Int>,
    /// Next-token ids `[rows, seq_len]`.
    pub targets: Tensor<2, Int>,
    /// The target left out of the loss ([`PADDING_TARGET`] in batches padded to a fixed number
    /// of rows, see [`LmBatch::padded`]).
    pub ignore_id: Option<u32>,
    /// Padding rows at the end of the batch (on each replica).
    pub padding_rows: usize,
    /// When the rows are preference pairs (`crate::align`), what they are trained with.
    pub preference: Option<PreferenceBatch>,
}

/// The loss of one batch, still on the device until read ([`LmOutput::read`]).
#[derive(Debug, Clone)]
pub struct LmOutput {
    /// Mean next-token cross-entropy, `[1]`; in training, a mixture of experts' objective adds
    /// its weighted load-balancing loss ([`LanguageModel::objective`]).
    pub loss: Tensor<1>,
    /// Target tokens in the batch.
    pub tokens: usize,
    /// A mixture of experts' load-balancing loss (unweighted) in training, `[1]`.
    pub load_balancing: Option<Tensor<1>>,
    /// What TRL logs beside a preference loss in training (`PreferenceLoss::metrics`), `[4]`.
    pub preference: Option<Tensor<1>>,
}

/// [`LmOutput`] read back to the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LmOutputSync {
    /// Mean next-token cross-entropy.
    pub loss: f64,
    /// Target tokens in the batch.
    pub tokens: usize,
}

impl LanguageModel {
    /// Wraps a whole model; `compute_cast` is the forward-pass dtype of mixed precision.
    pub fn new(hlat: Hlat, compute_cast: Option<DType>) -> Self {
        Self {
            hlat,
            compute_cast,
            tensor_parallel: None,
            checkpointing: ActivationCheckpointing::None,
            pipeline: None,
            fully_sharded: None,
        }
    }
}

impl LanguageModel {
    /// Wraps a model split by `tensor_parallel` (see `Hlat::shard`).
    pub fn sharded(
        hlat: Hlat,
        compute_cast: Option<DType>,
        tensor_parallel: TensorParallel,
    ) -> Self {
        Self {
            hlat,
            compute_cast,
            tensor_parallel: Some(tensor_parallel),
            checkpointing: ActivationCheckpointing::None,
            pipeline: None,
            fully_sharded: None,
        }
    }

    /// How the layers exchange activations across tensor-parallel ranks.
    pub fn exchange(&self) -> &dyn Exchange {
        match &self.tensor_parallel {
            Some(parallel) => parallel,
            None => &Unsharded,
        }
    }

    /// Mean next-token cross-entropy of a batch, as f32 (the same on every tensor-parallel
    /// rank).
    pub fn loss(&self, batch: &LmBatch) -> Tensor<1> {
        let inputs = batch.inputs.clone();
        let targets = batch.targets.clone();
        let exchange = self.exchange();
        let loss = self.in_compute_dtype(|model| match &self.pipeline {
            Some(pipeline) => {
                model.pipeline_loss((inputs, targets), batch.ignore_id, exchange, pipeline)
            }
            None => model.loss_with(inputs, targets, batch.ignore_id, exchange),
        });
        loss.cast(DType::F32)
    }

    /// The training objective of a batch, as f32: [`LanguageModel::loss`] plus a mixture of
    /// experts' weighted load-balancing loss (`Hlat::objective_with`), and that load-balancing
    /// loss (`None` for a dense model).
    pub fn objective(&self, batch: &LmBatch) -> (Tensor<1>, Option<Tensor<1>>) {
        if let Some(preference) = &batch.preference {
            return (self.preference_loss(batch, preference).loss, None);
        }
        if self.hlat.config().moe.is_none() || self.pipeline.is_some() {
            return (self.loss(batch), None);
        }
        let inputs = batch.inputs.clone();
        let targets = batch.targets.clone();
        let exchange = self.exchange();
        let (objective, balance) = self.in_compute_dtype(|model| {
            model.objective_with(inputs, targets, batch.ignore_id, exchange)
        });
        (
            objective.cast(DType::F32),
            balance.map(|balance| balance.cast(DType::F32)),
        )
    }

    /// The preference loss of a batch of pairs (`crate::align`) and what TRL logs beside it, as
    /// f32: from each target's log-probability under the model (vocabulary-parallel under tensor
    /// parallelism, the same on every rank).
    ///
    /// # Panics
    /// On a model cut into pipeline stages (preference pairs are not pipelined).
    pub fn preference_loss(&self, batch: &LmBatch, preference: &PreferenceBatch) -> PreferenceLoss {
        let kept = kept_targets(batch);
        crate::align::batch::preference_loss(preference, self.token_log_probs(batch), kept)
    }

    /// Each target's log-probability under the model `[rows, seq]`, as f32, 0 on ignored
    /// targets (vocabulary-parallel under tensor parallelism, the same on every rank).
    ///
    /// # Panics
    /// On a model cut into pipeline stages (preference pairs are not pipelined).
    pub fn token_log_probs(&self, batch: &LmBatch) -> Tensor<2> {
        assert!(
            self.pipeline.is_none(),
            "preference pairs are not trained through pipeline stages"
        );
        let (inputs, targets) = (batch.inputs.clone(), batch.targets.clone());
        let exchange = self.exchange();
        self.in_compute_dtype(|model| {
            model.token_log_probs_with(inputs, targets, batch.ignore_id, exchange)
        })
        .cast(DType::F32)
    }

    /// `run` on the model in its compute dtype: a cast copy under mixed precision, else the
    /// model itself; under fully sharded data parallelism, gathered whole (after the cast, so
    /// that the all-gathers carry the compute dtype) in the graph of the slices.
    fn in_compute_dtype<T>(&self, run: impl FnOnce(&Hlat) -> T) -> T {
        let cast = self
            .compute_cast
            .map(|dtype| self.hlat.clone().map(&mut CastParams { dtype }));
        match (&self.fully_sharded, cast) {
            (Some(sharded), cast) => {
                run(&sharded.gather(cast.unwrap_or_else(|| self.hlat.clone())))
            }
            (None, Some(cast)) => run(&cast),
            (None, None) => run(&self.hlat),
        }
    }

    /// The model with its parameters gathered whole from this rank's slices (as leaves that
    /// train when the slices do), under fully sharded data parallelism; `None` when the model
    /// holds them whole. For what reads the whole model (a checkpoint).
    pub fn gathered(&self) -> Option<LanguageModel> {
        let sharded = self.fully_sharded.as_ref()?;
        Some(LanguageModel {
            hlat: sharded.gather_leaves(self.hlat.clone()),
            fully_sharded: None,
            ..self.clone()
        })
    }
}

impl LmBatch {
    /// Builds a batch from rows of `seq_len + 1` tokens each.
    ///
    /// # Panics
    /// If `rows` is empty or the rows differ in length or are shorter than 2 tokens.
    pub fn from_rows(rows: &[Vec<u32>], device: &Device) -> Self {
        Self::with_padding(rows, 0, None, device)
    }

    /// Builds a batch of exactly `bucket_rows` rows from `rows` (at most that many), the rest
    /// padding rows whose targets the loss leaves out: every batch of an evaluation has the same
    /// shape, so a ragged last batch runs the same program as the others.
    ///
    /// # Panics
    /// If `rows` is empty or longer than `bucket_rows`, or its rows differ in length or are
    /// shorter than 2 tokens.
    pub fn padded(rows: &[Vec<u32>], bucket_rows: usize, device: &Device) -> Self {
        assert!(
            rows.len() <= bucket_rows,
            "{} rows do not fit a batch of {bucket_rows}",
            rows.len()
        );
        Self::with_padding(rows, bucket_rows - rows.len(), Some(PADDING_TARGET), device)
    }

    /// `rows` then `padding_rows` padding rows, uploaded shifted (see [`shifted_blocks`]).
    fn with_padding(
        rows: &[Vec<u32>],
        padding_rows: usize,
        ignore_id: Option<u32>,
        device: &Device,
    ) -> Self {
        let (inputs, targets) = shifted_blocks(rows, row_width(rows), padding_rows);
        Self {
            inputs: Tensor::from_data(inputs, device),
            targets: Tensor::from_data(targets, device),
            ignore_id: ignore_id.or(masked_target(&[rows])),
            padding_rows,
            preference: None,
        }
    }

    /// Target tokens that count in the loss (on one replica): padding rows excluded.
    pub fn tokens(&self) -> usize {
        let [rows, seq_len] = self.targets.dims();
        (rows - self.padding_rows) * seq_len
    }
}

impl LmBatch {
    /// Builds a batch whose replica `r` holds `parts[r]` (rows of `seq_len + 1` tokens, the same
    /// number on every replica): the data-parallel slices of one micro-batch.
    ///
    /// # Panics
    /// If the parts are empty, differ in shape, or hold rows shorter than 2 tokens.
    pub fn from_replica_rows(parts: &[&[Vec<u32>]], device: &Device) -> Self {
        let width = row_width(parts[0]);
        let ignore_id = masked_target(parts);
        let (inputs, targets) = parts
            .iter()
            .map(|rows| shifted_blocks(rows, width, 0))
            .unzip();
        Self {
            inputs: collective::int_from_replicas(inputs, device),
            targets: collective::int_from_replicas(targets, device),
            ignore_id,
            padding_rows: 0,
            preference: None,
        }
    }
}

impl LmBatch {
    /// One micro-batch of a parallel layout: `rows` (`data × micro_batch_rows` rows of
    /// `seq_len + 1` tokens) cut into one contiguous slice per data-parallel rank; the
    /// tensor-parallel ranks and pipeline stages of one model replica see the same rows.
    ///
    /// # Panics
    /// When the rows do not divide into the data-parallel ranks (see [`LmBatch::from_replica_rows`]
    /// for the rest).
    pub fn for_layout(rows: &[Vec<u32>], layout: &ParallelLayout, device: &Device) -> Self {
        let stage: Vec<&[Vec<u32>]> = split_rows(rows, layout.data)
            .into_iter()
            .flat_map(|slice| std::iter::repeat_n(slice, layout.tensor))
            .collect();
        // Every stage gets the rows: the first embeds them, the last reads the targets.
        let parts = stage.repeat(layout.pipeline);
        Self::from_replica_rows(&parts, device)
    }
}

impl LanguageModel {
    /// `micro_batches` through the schedule of the stages this model is cut into: the sums of
    /// their objectives and of a mixture's load-balancing losses (the same on every replica,
    /// without graph), the gradients of this replica's parameters with the shared ones
    /// (embedding, final norm, head) summed over the stages, and their target tokens.
    ///
    /// # Panics
    /// When `micro_batches` is empty, or the model is not on an autodiff device
    /// (`Device::autodiff`).
    pub fn pipeline_step(
        &self,
        pipeline: &PipelineParallel,
        micro_batches: Vec<LmBatch>,
    ) -> (ObjectiveGradients, usize) {
        let tokens = micro_batches.iter().map(LmBatch::tokens).sum();
        let ignore_id = micro_batches[0].ignore_id;
        let batches: Vec<_> = micro_batches
            .into_iter()
            .map(|batch| (batch.inputs, batch.targets))
            .collect();
        let mut step = self.hlat.pipeline_loss_and_gradients(
            &batches,
            ignore_id,
            self.exchange(),
            pipeline,
            self.checkpointing,
            self.fully_sharded.as_ref(),
        );
        sum_shared_gradients(self, &mut step.gradients, &pipeline.groups);
        (step, tokens)
    }
}

impl TrainStep for LanguageModel {
    type Input = LmBatch;
    type Output = LmOutput;

    fn step(&self, batch: LmBatch) -> TrainOutput<LmOutput> {
        // Stages recompute what checkpointing asks for and, over a long sequence, the attention
        // core by blocks of queries (memory linear in the sequence). They need the parameters as
        // leaves of the graph: a cast compute copy (bf16-mixed) takes the plain backward pass,
        // where blocked attention keeps the tiles of its forward pass.
        if let Some(pipeline) = &self.pipeline {
            // One micro-batch through the stages' schedule (an optimizer step runs all of its
            // micro-batches through one, see `crate::step_gradients`).
            let (step, tokens) = self.pipeline_step(pipeline, vec![batch]);
            return TrainOutput {
                grads: step.gradients,
                item: LmOutput {
                    loss: step.objective,
                    tokens,
                    load_balancing: step.load_balancing,
                    preference: None,
                },
            };
        }
        let seq = batch.inputs.dims()[1];
        let staged = self.checkpointing != ActivationCheckpointing::None
            || (attends_by_block(seq) && self.compute_cast.is_none());
        if staged {
            let tokens = batch.tokens();
            let exchange = self.exchange();
            let (staged, preference) = match &batch.preference {
                None => {
                    let staged = self.hlat.loss_and_gradients(
                        batch.inputs,
                        batch.targets,
                        batch.ignore_id,
                        exchange,
                        self.checkpointing,
                        self.fully_sharded.as_ref(),
                    );
                    (staged, None)
                }
                Some(preference) => {
                    // The stages run as for rows; the head's objective is the pairs' loss (no
                    // load-balancing loss, as in `LanguageModel::preference_loss`).
                    let kept = kept_targets(&batch);
                    let mut metrics = None;
                    let of_logits = |logits| {
                        let log_probs = token_log_probs(
                            logits,
                            batch.targets.clone(),
                            batch.ignore_id,
                            exchange,
                        )
                        .cast(DType::F32);
                        let loss =
                            crate::align::batch::preference_loss(preference, log_probs, kept);
                        metrics = Some(loss.metrics());
                        loss.loss
                    };
                    let staged = self.hlat.head_objective_and_gradients(
                        batch.inputs.clone(),
                        exchange,
                        (self.checkpointing, self.fully_sharded.as_ref()),
                        HeadObjective {
                            load_balancing: false,
                            of_logits,
                        },
                    );
                    (staged, metrics)
                }
            };
            return TrainOutput {
                grads: staged.gradients,
                item: LmOutput {
                    loss: staged.objective.cast(DType::F32),
                    tokens,
                    load_balancing: staged
                        .load_balancing
                        .map(|balance| balance.cast(DType::F32)),
                    preference,
                },
            };
        }
        if let Some(preference) = &batch.preference {
            let loss = self.preference_loss(&batch, preference);
            let grads = loss.loss.backward();
            let output = LmOutput {
                preference: Some(loss.metrics()),
                loss: loss.loss.detach(),
                tokens: batch.tokens(),
                load_balancing: None,
            };
            return TrainOutput::new(self, grads, output);
        }
        let (loss, load_balancing) = self.objective(&batch);
        let grads = loss.backward();
        let output = LmOutput {
            loss: loss.detach(),
            tokens: batch.tokens(),
            load_balancing: load_balancing.map(|balance| balance.detach()),
            preference: None,
        };
        TrainOutput::new(self, grads, output)
    }
}

impl InferenceStep for LanguageModel {
    type Input = LmBatch;
    type Output = LmOutput;

    fn step(&self, batch: LmBatch) -> LmOutput {
        LmOutput {
            loss: self.loss(&batch),
            tokens: batch.tokens(),
            load_balancing: None,
            preference: None,
        }
    }
}

impl LmOutput {
    /// The loss read back to the host; a failed read is the device's error.
    pub fn read(self) -> Result<LmOutputSync, TensorReadError> {
        Ok(LmOutputSync {
            loss: self.loss.try_into_scalar::<f64>()?,
            tokens: self.tokens,
        })
    }
}

impl ItemLazy for LmOutput {
    /// Dispatches the work behind the loss (the metrics read it on their own thread) and leaves
    /// the autodiff graph behind.
    fn sync(self) -> Result<Self, burn_backend::ExecutionError> {
        self.loss.device().flush()?;
        Ok(Self {
            loss: self.loss.without_autodiff(),
            tokens: self.tokens,
            load_balancing: self.load_balancing.map(Tensor::without_autodiff),
            preference: self.preference.map(Tensor::without_autodiff),
        })
    }
}

/// The length of the first of `rows` (packed rows of `seq_len + 1` tokens).
///
/// # Panics
/// If `rows` is empty or its first row is shorter than 2 tokens.
fn row_width(rows: &[Vec<u32>]) -> usize {
    let width = rows[0].len();
    assert!(width >= 2, "rows need at least 2 tokens, got {width}");
    width
}

/// [`PADDING_TARGET`] when a token of `parts` is marked [`NOT_A_TARGET`] (its target is then
/// left out of the loss), `None` otherwise (pretraining's rows: every target counts).
fn masked_target(parts: &[&[Vec<u32>]]) -> Option<u32> {
    parts
        .iter()
        .flat_map(|rows| rows.iter().flatten())
        .any(|&id| id & NOT_A_TARGET != 0)
        .then_some(PADDING_TARGET)
}

/// `rows` (of `width` tokens) as two `[rows + padding_rows, width - 1]` blocks of token ids: the
/// inputs (each row without its last token) and the targets (each row without its first), then
/// `padding_rows` rows of input 0 and target [`PADDING_TARGET`]. A token marked
/// [`NOT_A_TARGET`] is an input without its mark and the target [`PADDING_TARGET`].
///
/// # Panics
/// If a row is not `width` tokens long.
fn shifted_blocks(
    rows: &[Vec<u32>],
    width: usize,
    padding_rows: usize,
) -> (TensorData, TensorData) {
    let seq_len = width - 1;
    let count = rows.len() + padding_rows;
    let mut inputs = Vec::with_capacity(count * seq_len);
    let mut targets = Vec::with_capacity(count * seq_len);
    for row in rows {
        assert_eq!(row.len(), width, "rows of one batch differ in length");
        // 32-bit ids: the vocabulary holds at most i32::MAX ids (no 64-bit integers reach the
        // device, which trn1 would narrow).
        inputs.extend(row[..seq_len].iter().map(|&id| (id & !NOT_A_TARGET) as i32));
        targets.extend(row[1..].iter().map(|&id| {
            if id & NOT_A_TARGET != 0 {
                PADDING_TARGET as i32
            } else {
                id as i32
            }
        }));
    }
    inputs.resize(count * seq_len, 0);
    targets.resize(count * seq_len, PADDING_TARGET as i32);
    (
        TensorData::new(inputs, [count, seq_len]),
        TensorData::new(targets, [count, seq_len]),
    )
}

/// Casts every float parameter, keeping it in the autodiff graph of the original.
struct CastParams {
    dtype: DType,
}

impl ModuleMapper for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.cast(self.dtype), mapper)
    }
}

/// 1 where a target of `batch` counts (is not its ignored id), 0 elsewhere, `[rows, seq]` in f32.
fn kept_targets(batch: &LmBatch) -> Tensor<2> {
    match batch.ignore_id {
        Some(ignore_id) => batch
            .targets
            .clone()
            .equal_elem(ignore_id as i64)
            .bool_not()
            .float(),
        None => batch.targets.clone().ones_like().float(),
    }
    .cast(DType::F32)
}
