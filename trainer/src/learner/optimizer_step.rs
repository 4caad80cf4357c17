//! [`OptimizerStep`]: HLAT's optimizer step on a burn-train `Learner`, the one training step of
//! the project. [`super::HlatStrategy`] runs it inside the `Learner`'s training loop (`hlat
//! pretrain`, `hlat finetune`, Burn users); `hlat bench train` and the tests run it on a
//! `Learner` of their own ([`OptimizerStep::learner`]), step by step.

use burn::module::Module;
use burn::train::Learner;

use burn_trainium::profile::phase;

use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::language_model::{LanguageModel, LmBatch};
use crate::learner::SharedOptimizer;
use crate::optimizer::{AdamWSettings, HlatAdamW, HlatOptimizer};
use crate::parallel::ParallelLayout;
use crate::progress::{StepReport, TrainingProgress};
use crate::schedule::{WarmupCosine, WarmupCosineScheduler};
use crate::step_gradients::step_gradients;

/// One optimizer step of HLAT's recipe: the learning-rate scheduler stepped once, the
/// micro-batches' gradients averaged over them and over the data-parallel replicas (or
/// reduce-scattered under ZeRO-1) and clipped to the global norm ([`step_gradients`]), the step
/// counted, and the update applied unless the loss or the gradient is not finite (the run stops
/// after too many such steps in a row).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerStep {
    /// Global-norm clipping bound (0: off).
    pub clip_grad_norm: f64,
    /// Seed of the per-step randomness (stochastic rounding).
    pub seed: u64,
    /// Consecutive non-finite steps after which the run stops.
    pub max_consecutive_skips: u32,
    /// How the replicas of the device share each step (the optimizer must be made for it:
    /// `HlatAdamW::partitioned_for(layout)`, as [`OptimizerStep::learner`] makes it).
    pub layout: ParallelLayout,
}

impl OptimizerStep {
    /// The step `config` describes: its clipping bound, seed, limit of skipped steps and layout.
    pub fn from_config(config: &TrainConfig) -> Self {
        Self {
            clip_grad_norm: config.clip_grad_norm,
            seed: config.seed,
            max_consecutive_skips: config.max_consecutive_skips,
            layout: config.layout(),
        }
    }

    /// A `Learner` of `model` at step 0 for this step: HLAT's AdamW with `settings` (its state
    /// partitioned under the layout's ZeRO-1) and `schedule`.
    pub fn learner(
        &self,
        model: LanguageModel,
        settings: AdamWSettings,
        schedule: WarmupCosine,
    ) -> Learner<LanguageModel> {
        let adamw = HlatAdamW::new(settings).partitioned_for(&self.layout);
        // Bound parameter by parameter, so that split experts get their own partition.
        let optimizer = SharedOptimizer::new(HlatOptimizer::new(adamw)).module_optimizer(&model);
        Learner::new(model, optimizer, WarmupCosineScheduler::new(schedule))
    }

    /// Runs the step after `progress` on `learner` over `micro_batches` (each already cut per
    /// replica, see `LmBatch::for_layout`), counting it in `progress`.
    ///
    /// A non-finite loss or gradient norm skips the update; the step still counts (its data is
    /// consumed and the schedule advances). The `max_consecutive_skips`-th of them in a row is
    /// [`TrainError::NonFinite`]; a failed read back is [`TrainError::Device`].
    ///
    /// # Panics
    /// When `micro_batches` is empty, or the learner's model is not on an autodiff device
    /// (`Device::autodiff`).
    pub fn run(
        &self,
        learner: &mut Learner<LanguageModel>,
        progress: &mut TrainingProgress,
        micro_batches: Vec<LmBatch>,
    ) -> Result<StepReport, TrainError> {
        learner.lr_step();
        let lr = learner.lr_current().base();
        let model = learner.model();
        let step = progress.step + 1;
        let update = step_gradients(&model, micro_batches, &self.layout, self.clip_grad_norm)?;
        let report = progress.record(step, lr, &update, self.max_consecutive_skips)?;
        if !report.skipped {
            let _span = tracing::info_span!(phase::OPTIMIZER).entered();
            model.devices()[0].seed(step_seed(self.seed, step));
            learner.optimizer_step(update.grads);
        }
        Ok(report)
    }
}

/// Seed of the randomness of one step: a SplitMix64 mix of the run seed and the step, so that
/// a resumed run draws the same numbers as an uninterrupted one.
pub fn step_seed(seed: u64, step: u64) -> u64 {
    crate::data::rng::mix(seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}
