//! One optimizer step: accumulate micro-batch gradients, measure the global norm, skip the
//! update on a non-finite loss or gradient, clip, and let the optimizer update the model.
//!
//! burn-train 0.21's `Learner` drives epochs of a `DataLoader`: it steps the LR scheduler once per
//! micro-batch, sums accumulated gradients without averaging, has no place for a global-norm
//! clip or a non-finite check between accumulation and update, and checkpoints per epoch without
//! the data sampler. So this step loop is ours, while the model side stays Burn's:
//! [`TrainStep::step`] computes each micro-batch's gradients, [`TrainStep::optimize`] applies
//! the update through a regular `burn::optim::Optimizer`, and validation runs
//! `InferenceStep::step` on `model.valid()`.

use burn::module::Module;
use burn::optim::GradientsAccumulator;
use burn::tensor::{ElementConversion, Tensor};
use burn::train::TrainStep;
use serde::{Deserialize, Serialize};

use burn_trainium::collective::{self, CollectiveBackend, ReduceOp};

use crate::clip::{clip_coefficient, grad_sum_of_squares, scale_grads};
use crate::error::TrainError;
use crate::optimizer::{AdamWSettings, HlatAdamW, HlatOptimizer};
use crate::parallel::{
    ParallelLayout, TrainingBackend, average_gradients, reduce_replicated_gradients,
    scatter_gradients,
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
        assert!(!micro_batches.is_empty(), "an optimizer step needs a batch");
        let step = self.progress.step + 1;
        let lr = self.schedule.lr(step);
        let count = micro_batches.len();

        let mut accumulator = GradientsAccumulator::new();
        let mut loss_sum: Option<Tensor<B::InnerBackend, 1>> = None;
        let mut tokens = 0;
        for batch in micro_batches {
            let output = self.model.step(batch);
            accumulator.accumulate(&self.model, output.grads);
            tokens += output.item.tokens;
            let loss = output.item.loss.inner();
            loss_sum = Some(match loss_sum {
                Some(sum) => sum + loss,
                None => loss,
            });
        }
        let mut grads = accumulator.grads();
        let mut loss_sum = loss_sum.expect("at least one micro-batch");
        if self.layout.sequence_parallel && self.layout.tensor > 1 {
            let groups = self.layout.tensor_groups();
            reduce_replicated_gradients::<B, _>(&self.model, &mut grads, &groups);
        }
        let zero1 = self.layout.zero1();
        if self.layout.data > 1 {
            let groups = self.layout.data_groups();
            match &zero1 {
                Some(zero1) => scatter_gradients::<B, _>(&self.model, &mut grads, zero1),
                None => average_gradients::<B, _>(&self.model, &mut grads, &groups),
            }
            loss_sum = collective::all_reduce(loss_sum, ReduceOp::Mean, &groups);
            tokens *= self.layout.data;
        }
        let tensor_groups = (self.layout.tensor > 1).then(|| self.layout.tensor_groups());
        let mut squares = grad_sum_of_squares::<B, _>(&self.model, &grads, tensor_groups.as_ref())
            .unwrap_or_else(|| loss_sum.zeros_like());
        if let Some(zero1) = &zero1 {
            // Each data-parallel rank holds a slice of every gradient: the norm stays global.
            squares = collective::all_reduce(squares, ReduceOp::Sum, &zero1.groups);
        }
        // One read back per step: the summed loss and the summed squared gradient.
        let values = Tensor::cat(vec![loss_sum, squares], 0).into_data();
        let values: Vec<f64> = values.iter::<f32>().map(|value| value.elem()).collect();
        let loss = values[0] / count as f64;
        let grad_norm = values[1].sqrt() / count as f64;

        self.progress.step = step;
        self.progress.tokens_seen += tokens as u64;
        let finite = loss.is_finite() && grad_norm.is_finite();
        if finite {
            self.progress.consecutive_skips = 0;
            let factor = clip_coefficient(grad_norm, self.clip_grad_norm) / count as f64;
            scale_grads::<B, _>(&self.model, &mut grads, factor);
            B::seed(&self.device(), step_seed(self.seed, step));
            self.model = self.model.clone().optimize(&mut self.optimizer, lr, grads);
        } else {
            self.progress.skipped_steps += 1;
            self.progress.consecutive_skips += 1;
            log::warn!("step {step}: loss {loss}, gradient norm {grad_norm}; update skipped");
            if self.progress.consecutive_skips >= self.max_consecutive_skips {
                return Err(TrainError::NonFinite {
                    step,
                    count: self.progress.consecutive_skips,
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

    /// The device the model lives on.
    pub fn device(&self) -> B::Device {
        self.model.devices()[0].clone()
    }
}

/// Mean loss of `model` (in inference mode) over batches.
pub fn evaluate<B: CollectiveBackend>(model: &LanguageModel<B>, batches: Vec<LmBatch<B>>) -> f64 {
    use burn::train::InferenceStep;
    let mut weighted = 0.0;
    let mut tokens = 0;
    for batch in batches {
        let output = InferenceStep::step(model, batch);
        let loss: f64 = output.loss.into_scalar().elem();
        weighted += loss * output.tokens as f64;
        tokens += output.tokens;
    }
    weighted / tokens.max(1) as f64
}

/// Seed of the randomness of one step: a SplitMix64 mix of the run seed and the step, so that
/// a resumed run draws the same numbers as an uninterrupted one.
pub fn step_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
