//! One optimizer step: accumulate micro-batch gradients, measure the global norm, skip the
//! update on a non-finite loss or gradient, clip, and let the optimizer update the model.
//!
//! [`step_gradients`] is the recipe's step, shared by [`crate::learner::HlatStrategy`] (which
//! `hlat pretrain` and Burn users run inside burn-train's `Learner`) and by [`Trainer`], the same
//! step without the `Learner` (benchmarks, and the reference the tests compare the strategy
//! with). The model side stays Burn's: [`TrainStep::step`] computes each micro-batch's gradients,
//! [`TrainStep::optimize`] applies the update through a regular `burn::optim::Optimizer`.

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{ElementConversion, Tensor};
use burn::train::TrainStep;
use serde::{Deserialize, Serialize};

use burn_trainium::collective::{self, CollectiveBackend, ReduceOp};

use crate::clip::{clip_coefficient, grad_sum_of_squares, scale_grads};
use crate::error::TrainError;
use crate::optimizer::{AdamWSettings, HlatAdamW, HlatOptimizer};
use crate::parallel::{
    ParallelLayout, TrainingBackend, average_gradients, move_stage_gradients,
    reduce_replicated_gradients, scatter_gradients,
};
use crate::schedule::WarmupCosine;
use crate::step::{LanguageModel, LmBatch};

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The step number (1-based).
    pub step: u64,
    /// Mean loss over the step's micro-batches, before the update.
    pub loss: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// Global L2 norm of the averaged gradient, before clipping.
    pub grad_norm: f64,
    /// Target tokens in the step (over every data-parallel replica).
    pub tokens: usize,
    /// The update was skipped because the loss or the gradient was not finite.
    pub skipped: bool,
}

/// Counters that a checkpoint carries besides the model and the optimizer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainerProgress {
    /// Optimizer steps done (skipped ones included).
    pub step: u64,
    /// Target tokens consumed.
    pub tokens_seen: u64,
    /// Steps skipped for a non-finite loss or gradient since the start of the run.
    pub skipped_steps: u64,
    /// Skipped steps in a row up to now.
    pub consecutive_skips: u32,
}

/// The model, its optimizer and the schedule: everything that changes from step to step
/// except the data.
pub struct Trainer<B: TrainingBackend> {
    /// The model being trained.
    pub model: LanguageModel<B>,
    /// The optimizer and its state.
    pub optimizer: HlatOptimizer<LanguageModel<B>, B>,
    /// The learning-rate schedule.
    pub schedule: WarmupCosine,
    /// Global-norm clipping bound (0: off).
    pub clip_grad_norm: f64,
    /// Seed of the per-step randomness (stochastic rounding).
    pub seed: u64,
    /// Consecutive non-finite steps after which the run stops.
    pub max_consecutive_skips: u32,
    /// Step and token counters.
    pub progress: TrainerProgress,
    /// How the replicas of the device share the work ([`ParallelLayout::SINGLE`] by default;
    /// set with [`Trainer::with_layout`]).
    pub layout: ParallelLayout,
    /// The optimizer's hyper-parameters.
    settings: AdamWSettings,
}

impl<B: TrainingBackend> Trainer<B> {
    /// A trainer at step 0 with fresh optimizer state.
    pub fn new(
        model: LanguageModel<B>,
        settings: AdamWSettings,
        schedule: WarmupCosine,
        clip_grad_norm: f64,
        seed: u64,
        max_consecutive_skips: u32,
    ) -> Self {
        Self {
            model,
            optimizer: HlatAdamW::new(settings).init(),
            schedule,
            clip_grad_norm,
            seed,
            max_consecutive_skips,
            progress: TrainerProgress::default(),
            layout: ParallelLayout::SINGLE,
            settings,
        }
    }

    /// The same trainer sharing the work of each step over the replicas of its device as
    /// `layout` says, with fresh optimizer state (partitioned under ZeRO-1).
    pub fn with_layout(self, layout: ParallelLayout) -> Self {
        Self {
            optimizer: HlatAdamW::new(self.settings)
                .with_zero1(layout.zero1())
                .init(),
            layout,
            ..self
        }
    }

    /// Runs one optimizer step over `micro_batches` (their gradients are averaged, and averaged
    /// again over the data-parallel replicas, each of which holds its own slice of every
    /// micro-batch).
    ///
    /// A non-finite loss or gradient norm skips the update; the step still counts (its data is
    /// consumed and the schedule advances). After `max_consecutive_skips` of them in a row the
    /// step returns [`TrainError::NonFinite`].
    pub fn train_step(&mut self, micro_batches: Vec<LmBatch<B>>) -> Result<StepReport, TrainError> {
        let step = self.progress.step + 1;
        let lr = self.schedule.lr(step);
        let update = step_gradients(
            &self.model,
            micro_batches,
            &self.layout,
            self.clip_grad_norm,
        )?;
        let report = self
            .progress
            .record(step, lr, &update, self.max_consecutive_skips)?;
        if !report.skipped {
            B::seed(&self.device(), step_seed(self.seed, step));
            self.model = self
                .model
                .clone()
                .optimize(&mut self.optimizer, lr, update.grads);
        }
        Ok(report)
    }

    /// The device the model lives on.
    pub fn device(&self) -> B::Device {
        self.model.devices()[0].clone()
    }
}

/// One optimizer step's gradients as HLAT's recipe makes them, ready for the optimizer.
pub struct StepGradients {
    /// The micro-batches' gradients, averaged over them and over the data-parallel replicas
    /// (under ZeRO-1: this replica's slice), scaled by the global-norm clipping factor.
    pub grads: GradientsParams,
    /// Mean loss over the micro-batches and replicas, before the update.
    pub loss: f64,
    /// Global L2 norm of the averaged gradient, before clipping.
    pub grad_norm: f64,
    /// Target tokens in the step (over every data-parallel replica).
    pub tokens: usize,
}

impl StepGradients {
    /// Whether the loss and the gradient norm are finite (else the update must be skipped).
    pub fn is_finite(&self) -> bool {
        self.loss.is_finite() && self.grad_norm.is_finite()
    }
}

/// The gradients of `micro_batches` run one after the other through `model`'s `TrainStep`,
/// summed, with the sum of their losses and their target tokens.
fn accumulate<B: TrainingBackend>(
    model: &LanguageModel<B>,
    micro_batches: Vec<LmBatch<B>>,
) -> (GradientsParams, Tensor<B::InnerBackend, 1>, usize) {
    let mut accumulator = GradientsAccumulator::new();
    let mut loss_sum: Option<Tensor<B::InnerBackend, 1>> = None;
    let mut tokens = 0;
    for batch in micro_batches {
        let output = model.step(batch);
        accumulator.accumulate(model, output.grads);
        tokens += output.item.tokens;
        let loss = output.item.loss.inner();
        loss_sum = Some(match loss_sum {
            Some(sum) => sum + loss,
            None => loss,
        });
    }
    let loss_sum = loss_sum.expect("at least one micro-batch");
    (accumulator.grads(), loss_sum, tokens)
}

/// The forward and backward passes of `micro_batches` on `model`, their gradients combined over
/// the replicas as `layout` says (sequence-parallel norm gains summed over the tensor group,
/// data-parallel mean by bucketed all-reduce or, under ZeRO-1, reduce-scatter), measured with one
/// read back (loss and global norm) and clipped to `clip_grad_norm` (0: off). A failed read
/// (the device's error) is [`TrainError::Device`].
///
/// # Panics
/// When `micro_batches` is empty.
pub fn step_gradients<B: TrainingBackend>(
    model: &LanguageModel<B>,
    micro_batches: Vec<LmBatch<B>>,
    layout: &ParallelLayout,
    clip_grad_norm: f64,
) -> Result<StepGradients, TrainError> {
    assert!(!micro_batches.is_empty(), "an optimizer step needs a batch");
    let count = micro_batches.len();
    let (mut grads, mut loss_sum, mut tokens) = match &model.pipeline {
        Some(pipeline) => {
            let (loss_sum, grads, tokens) = model.pipeline_step(pipeline, micro_batches);
            (grads, loss_sum.inner(), tokens)
        }
        None => accumulate(model, micro_batches),
    };
    if layout.tensor > 1 {
        let groups = layout.tensor_groups();
        reduce_replicated_gradients::<B, _>(model, &mut grads, &groups, layout.sequence_parallel);
    }
    let zero1 = layout.zero1();
    if layout.data > 1 {
        let groups = layout.data_groups();
        match &zero1 {
            Some(zero1) => scatter_gradients::<B, _>(model, &mut grads, zero1),
            None => average_gradients::<B, _>(model, &mut grads, &groups),
        }
        loss_sum = collective::all_reduce(loss_sum, ReduceOp::Mean, &groups);
        tokens *= layout.data;
    }
    let tensor_groups = (layout.tensor > 1).then(|| layout.tensor_groups());
    let squares = match &model.pipeline {
        None => grad_sum_of_squares::<B, _>(model, &grads, tensor_groups.as_ref()),
        Some(pipeline) => {
            // Each stage's layers are its own: their squares add up over the pipeline group.
            let mut stage = GradientsParams::new();
            move_stage_gradients::<B, _>(model, &mut grads, &mut stage);
            let shared = grad_sum_of_squares::<B, _>(model, &grads, tensor_groups.as_ref());
            let local = grad_sum_of_squares::<B, _>(model, &stage, tensor_groups.as_ref())
                .map(|local| collective::all_reduce(local, ReduceOp::Sum, &pipeline.groups));
            move_stage_gradients::<B, _>(model, &mut stage, &mut grads);
            match (shared, local) {
                (Some(shared), Some(local)) => Some(shared + local),
                (one, other) => one.or(other),
            }
        }
    };
    let mut squares = squares.unwrap_or_else(|| loss_sum.zeros_like());
    if let Some(zero1) = &zero1 {
        // Each data-parallel rank holds a slice of every gradient: the norm stays global.
        squares = collective::all_reduce(squares, ReduceOp::Sum, &zero1.groups);
    }
    // One read back per step: the summed loss and the summed squared gradient.
    let values = Tensor::cat(vec![loss_sum, squares], 0).try_into_data()?;
    let values: Vec<f64> = values.iter::<f32>().map(|value| value.elem()).collect();
    let loss = values[0] / count as f64;
    let grad_norm = values[1].sqrt() / count as f64;
    if loss.is_finite() && grad_norm.is_finite() {
        let factor = clip_coefficient(grad_norm, clip_grad_norm) / count as f64;
        scale_grads::<B, _>(model, &mut grads, factor);
    }
    Ok(StepGradients {
        grads,
        loss,
        grad_norm,
        tokens,
    })
}

impl TrainerProgress {
    /// Counts optimizer step `step` (learning rate `lr`) whose gradients are `update`: its
    /// tokens, and whether it is skipped for a non-finite loss or gradient. Returns the step's
    /// report, or [`TrainError::NonFinite`] at the `max_consecutive_skips`-th skip in a row.
    pub fn record(
        &mut self,
        step: u64,
        lr: f64,
        update: &StepGradients,
        max_consecutive_skips: u32,
    ) -> Result<StepReport, TrainError> {
        let StepGradients {
            loss,
            grad_norm,
            tokens,
            ..
        } = *update;
        self.step = step;
        self.tokens_seen += tokens as u64;
        let finite = update.is_finite();
        if finite {
            self.consecutive_skips = 0;
        } else {
            self.skipped_steps += 1;
            self.consecutive_skips += 1;
            log::warn!("step {step}: loss {loss}, gradient norm {grad_norm}; update skipped");
            if self.consecutive_skips >= max_consecutive_skips {
                return Err(TrainError::NonFinite {
                    step,
                    count: self.consecutive_skips,
                    loss,
                    grad_norm,
                });
            }
        }
        Ok(StepReport {
            step,
            loss,
            lr,
            grad_norm,
            tokens,
            skipped: !finite,
        })
    }
}

/// Mean loss of `model` (in inference mode) over `rows`, in batches of exactly `batch_rows` rows
/// (the last one padded, so every batch has one shape and a compiled device one program), each
/// weighted by its target tokens; a failed read is [`TrainError::Device`].
pub fn evaluate<B: CollectiveBackend>(
    model: &LanguageModel<B>,
    rows: &[Vec<u32>],
    batch_rows: usize,
    device: &B::Device,
) -> Result<f64, TrainError> {
    use burn::train::InferenceStep;
    let batch_rows = batch_rows.max(1);
    let mut weighted = 0.0;
    let mut tokens = 0;
    for chunk in rows.chunks(batch_rows) {
        let batch = LmBatch::padded(chunk, batch_rows, device);
        let output = InferenceStep::step(model, batch);
        let loss: f64 = output.loss.try_into_scalar()?.elem();
        weighted += loss * output.tokens as f64;
        tokens += output.tokens;
    }
    Ok(weighted / tokens.max(1) as f64)
}

/// Seed of the randomness of one step: a SplitMix64 mix of the run seed and the step, so that
/// a resumed run draws the same numbers as an uninterrupted one.
pub fn step_seed(seed: u64, step: u64) -> u64 {
    crate::data::rng::mix(seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}
