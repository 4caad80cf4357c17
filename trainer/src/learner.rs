//! HLAT's recipe as a custom training strategy of burn-train's `Learner`
//! (`TrainingStrategy::Custom`): Burn users build a `Learner` and a `SupervisedTraining` as usual
//! and pass [`HlatStrategy`]; Burn's event processor, metrics, renderer, checkpointer and
//! interrupter keep working.
//!
//! Each optimizer step takes `grads_accumulation` items of the training data loader (each one
//! micro-batch, already cut per replica), steps the learning-rate scheduler once, and runs the
//! recipe of [`crate::trainer::step_gradients`]: gradients averaged over micro-batches and
//! data-parallel replicas (or reduce-scattered under ZeRO-1), global-norm clipping, non-finite
//! steps skipped (the run stops, through the interrupter, after too many in a row).

use burn::data::dataloader::Progress;
use burn::data::dataloader::batcher::Batcher;
use burn::module::{AutodiffModule, Module};
use burn::tensor::Tensor;
use burn::train::{
    EventProcessorTraining, InferenceStep, Learner, LearnerEvent, LearningComponentsMarker,
    SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader, TrainingComponents,
    TrainingItem, ValidLoader,
};
use burn_trainium::collective::CollectiveBackend;

use crate::optimizer::HlatOptimizer;
use crate::parallel::{ParallelLayout, TrainingBackend};
use crate::schedule::WarmupCosineScheduler;
use crate::step::{LanguageModel, LmBatch, LmOutput};
use crate::trainer::{TrainerProgress, step_gradients, step_seed};

/// Makes each item of a Burn data loader (`data × micro_batch_rows` packed rows of
/// `seq_len + 1` tokens) one micro-batch of `layout` (see [`LmBatch::for_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutBatcher {
    /// How the device's replicas share the rows.
    pub layout: ParallelLayout,
}

impl<B: CollectiveBackend> Batcher<B, Vec<u32>, LmBatch<B>> for LayoutBatcher {
    fn batch(&self, rows: Vec<Vec<u32>>, device: &B::Device) -> LmBatch<B> {
        LmBatch::for_layout(&rows, &self.layout, device)
    }
}

/// The learning components of an HLAT run on backend `B`.
pub type HlatComponents<B> = LearningComponentsMarker<
    B,
    WarmupCosineScheduler,
    LanguageModel<B>,
    HlatOptimizer<LanguageModel<B>, B>,
>;

/// HLAT's training recipe as a supervised learning strategy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HlatStrategy {
    /// Global-norm clipping bound (0: off).
    pub clip_grad_norm: f64,
    /// Seed of the per-step randomness (stochastic rounding).
    pub seed: u64,
    /// Consecutive non-finite steps after which the run stops.
    pub max_consecutive_skips: u32,
    /// How the replicas of the device share each step (the optimizer must be made for it:
    /// `HlatAdamW::with_zero1(layout.zero1())`).
    pub layout: ParallelLayout,
}

impl<B: TrainingBackend> SupervisedLearningStrategy<HlatComponents<B>> for HlatStrategy {
    fn fit(
        &self,
        components: TrainingComponents<HlatComponents<B>>,
        mut learner: Learner<HlatComponents<B>>,
        dataloader_train: TrainLoader<HlatComponents<B>>,
        dataloader_valid: ValidLoader<HlatComponents<B>>,
        starting_epoch: usize,
    ) -> (
        LanguageModel<B>,
        SupervisedTrainingEventProcessor<HlatComponents<B>>,
    ) {
        let mut processor = components.event_processor;
        let mut checkpointer = components.checkpointer;
        let interrupter = components.interrupter;
        let accumulation = components.grad_accumulation.unwrap_or(1).max(1);
        let mut progress = TrainerProgress::default();
        for epoch in starting_epoch..=components.num_epochs {
            let global = Progress::new(epoch, components.num_epochs);
            let mut items = dataloader_train.iter();
            let mut iteration = 0;
            loop {
                let micro_batches: Vec<_> = items.by_ref().take(accumulation).collect();
                if micro_batches.is_empty() {
                    break;
                }
                iteration += 1;
                learner.lr_step();
                let lr = learner.lr_current();
                let model = learner.model();
                let device = model.devices()[0].clone();
                let step = progress.step + 1;
                let update =
                    step_gradients(&model, micro_batches, &self.layout, self.clip_grad_norm);
                let item = LmOutput {
                    loss: Tensor::<B, 1>::from_floats([update.loss as f32], &device),
                    tokens: update.tokens,
                };
                match progress.record(step, lr, &update, self.max_consecutive_skips) {
                    Ok(report) if !report.skipped => {
                        B::seed(&device, step_seed(self.seed, step));
                        learner.optimizer_step(update.grads);
                    }
                    Ok(_) => {}
                    Err(error) => interrupter.stop(Some(&error.to_string())),
                }
                let item = TrainingItem::new(
                    item,
                    items.progress(),
                    global.clone(),
                    Some(iteration),
                    Some(lr),
                );
                processor.process_train(LearnerEvent::ProcessedItem(item));
                if interrupter.should_stop() {
                    break;
                }
            }
            processor.process_train(LearnerEvent::EndEpoch(epoch));
            if interrupter.should_stop() {
                log::info!(
                    "training interrupted: {}",
                    interrupter.get_message().unwrap_or_default()
                );
                break;
            }

            let model = learner.model().valid();
            let mut items = dataloader_valid.iter();
            let mut iteration = 0;
            while let Some(batch) = items.next() {
                iteration += 1;
                let item = TrainingItem::new(
                    InferenceStep::step(&model, batch),
                    items.progress(),
                    global.clone(),
                    Some(iteration),
                    None,
                );
                processor.process_valid(LearnerEvent::ProcessedItem(item));
            }
            processor.process_valid(LearnerEvent::EndEpoch(epoch));
            if let Some(checkpointer) = &mut checkpointer {
                checkpointer.checkpoint(&learner, epoch, &components.event_store);
            }
        }
        (learner.model(), processor)
    }
}
