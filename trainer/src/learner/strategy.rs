//! [`HlatStrategy`]: HLAT's recipe as a custom training strategy of burn-train's `Learner`.

use std::sync::Arc;
use std::time::Instant;

use burn::data::dataloader::Progress;
use burn::module::{AutodiffModule, Module};
use burn::optim::Optimizer;
use burn::tensor::{ElementConversion, Tensor};
use burn::train::{
    EventProcessorTraining, InferenceStep, Learner, LearnerEvent, LearningComponentsMarker,
    SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader, TrainingComponents,
    TrainingItem, ValidLoader,
};

use burn_trainium::profile::phase;

use super::observer::{ObservedStep, RunEnd, StepObserver};
use super::optimizer_step::OptimizerStep;
use crate::language_model::{LanguageModel, LmOutput};
use crate::optimizer::HlatOptimizer;
use crate::parallel::TrainingBackend;
use crate::progress::TrainingProgress;
use crate::schedule::WarmupCosineScheduler;

/// The learning components of an HLAT run on backend `B` with optimizer `O` (HLAT's AdamW by
/// default).
pub type HlatComponents<B, O = HlatOptimizer<LanguageModel<B>, B>> =
    LearningComponentsMarker<B, WarmupCosineScheduler, LanguageModel<B>, O>;

/// HLAT's training recipe as a supervised learning strategy.
///
/// Each optimizer step takes `grads_accumulation` items of the training data loader (each one
/// micro-batch, already cut per replica) and runs them through [`OptimizerStep::run`]: the
/// learning-rate scheduler stepped once, gradients averaged over micro-batches and data-parallel
/// replicas (or reduce-scattered under ZeRO-1), global-norm clipping, non-finite steps skipped
/// (the run stops after too many in a row).
#[derive(Clone)]
pub struct HlatStrategy<B: TrainingBackend> {
    /// The optimizer step the strategy runs.
    pub step: OptimizerStep,
    /// The counters the run starts from: zero for a fresh run, a checkpoint's when resuming.
    pub start: TrainingProgress,
    /// Validate every this many optimizer steps, besides after the last step of each epoch
    /// (0: only then).
    pub validate_every: u64,
    /// Told of every optimizer step and of the end of training (metrics files, checkpoints).
    pub observer: Option<Arc<dyn StepObserver<B>>>,
}

impl<B: TrainingBackend> HlatStrategy<B> {
    /// The recipe of `step` from step 0, validating after each epoch, with no observer.
    pub fn new(step: OptimizerStep) -> Self {
        Self {
            step,
            start: TrainingProgress::default(),
            validate_every: 0,
            observer: None,
        }
    }
}

impl<B, O> SupervisedLearningStrategy<HlatComponents<B, O>> for HlatStrategy<B>
where
    B: TrainingBackend,
    O: Optimizer<LanguageModel<B>, B> + 'static,
{
    fn fit(
        &self,
        components: TrainingComponents<HlatComponents<B, O>>,
        mut learner: Learner<HlatComponents<B, O>>,
        dataloader_train: TrainLoader<HlatComponents<B, O>>,
        dataloader_valid: ValidLoader<HlatComponents<B, O>>,
        starting_epoch: usize,
    ) -> (
        LanguageModel<B>,
        SupervisedTrainingEventProcessor<HlatComponents<B, O>>,
    ) {
        let mut processor = components.event_processor;
        let mut checkpointer = components.checkpointer;
        let interrupter = components.interrupter;
        let accumulation = components.grad_accumulation.unwrap_or(1).max(1);
        let mut progress = self.start;
        let mut failure = None;
        'epochs: for epoch in starting_epoch..=components.num_epochs {
            let global = Progress::new(epoch, components.num_epochs);
            let mut items = dataloader_train.iter();
            let mut iteration = 0;
            let mut next: Vec<_> = items.by_ref().take(accumulation).collect();
            let mut validated = false;
            while !next.is_empty() {
                let step_span = tracing::info_span!(phase::STEP).entered();
                let micro_batches = std::mem::take(&mut next);
                let started = Instant::now();
                iteration += 1;
                let report = match self.step.run(&mut learner, &mut progress, micro_batches) {
                    Ok(report) => report,
                    Err(error) => {
                        failure = Some(error);
                        break 'epochs;
                    }
                };
                let model = learner.model();
                let item = LmOutput {
                    loss: Tensor::<B, 1>::from_floats([report.loss as f32], &model.devices()[0]),
                    tokens: report.tokens,
                };
                let item = TrainingItem::new(
                    item,
                    items.progress(),
                    global.clone(),
                    Some(iteration),
                    Some(report.lr),
                );
                processor.process_train(LearnerEvent::ProcessedItem(item));
                let seconds = started.elapsed().as_secs_f64();

                next = tracing::info_span!(phase::DATA)
                    .in_scope(|| items.by_ref().take(accumulation).collect());
                drop(step_span);
                let last = next.is_empty() || interrupter.should_stop();
                validated = last
                    || (self.validate_every > 0 && report.step.is_multiple_of(self.validate_every));
                let val_loss = validated
                    .then(|| validate::<B, O>(&model, &dataloader_valid, &mut processor, &global))
                    .flatten();
                if let Some(observer) = &self.observer {
                    let observed = ObservedStep {
                        model: &model,
                        progress,
                        report,
                        seconds,
                        val_loss,
                    };
                    if let Err(error) = observer.after_step(observed) {
                        failure = Some(error);
                        break 'epochs;
                    }
                }
                if interrupter.should_stop() {
                    break;
                }
            }
            processor.process_train(LearnerEvent::EndEpoch(epoch));
            if !validated {
                // An epoch without steps.
                validate::<B, O>(&learner.model(), &dataloader_valid, &mut processor, &global);
            }
            processor.process_valid(LearnerEvent::EndEpoch(epoch));
            if let Some(checkpointer) = &mut checkpointer {
                checkpointer.checkpoint(&learner, epoch, &components.event_store);
            }
            if interrupter.should_stop() {
                log::info!(
                    "training interrupted: {}",
                    interrupter.get_message().unwrap_or_default()
                );
                break;
            }
        }
        if let Some(error) = &failure {
            interrupter.stop(Some(&error.to_string()));
        }
        let model = learner.model();
        match &self.observer {
            Some(observer) => observer.end(RunEnd {
                model: &model,
                progress,
                failure,
            }),
            None => {
                if let Some(error) = failure {
                    log::error!("training stopped: {error}");
                }
            }
        }
        (model, processor)
    }
}

/// Runs the validation loader on `model` in inference mode, reporting each batch to the event
/// processor; returns the token-weighted mean loss (`None` without validation data).
fn validate<B, O>(
    model: &LanguageModel<B>,
    loader: &ValidLoader<HlatComponents<B, O>>,
    processor: &mut SupervisedTrainingEventProcessor<HlatComponents<B, O>>,
    global: &Progress,
) -> Option<f64>
where
    B: TrainingBackend,
    O: Optimizer<LanguageModel<B>, B> + 'static,
{
    let _span = tracing::info_span!(phase::VALIDATION).entered();
    let model = model.valid();
    let mut items = loader.iter();
    let mut iteration = 0;
    let (mut weighted, mut tokens) = (0.0, 0);
    while let Some(batch) = items.next() {
        iteration += 1;
        let output = InferenceStep::step(&model, batch);
        let loss: f64 = output.loss.clone().into_scalar().elem();
        weighted += loss * output.tokens as f64;
        tokens += output.tokens;
        let item = TrainingItem::new(
            output,
            items.progress(),
            global.clone(),
            Some(iteration),
            None,
        );
        processor.process_valid(LearnerEvent::ProcessedItem(item));
    }
    (tokens > 0).then(|| weighted / tokens as f64)
}
