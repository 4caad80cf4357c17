//! [`HlatStrategy`]: HLAT's recipe as a custom training strategy of burn-train's `Learner`.

use std::sync::Arc;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use burn::train::{
    EventProcessorTraining, InferenceStep, Interrupter, Learner, LearnerEvent,
    SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader, TrainingComponents,
    TrainingItem, ValidLoader,
};

use burn_trainium::profile::phase;

use super::observer::{ObservedStep, RunEnd, StepObserver};
use super::optimizer_step::OptimizerStep;
use crate::error::TrainError;
use crate::language_model::{LanguageModel, LmBatch, LmOutput};
use crate::progress::TrainingProgress;

/// HLAT's training recipe as a supervised learning strategy.
///
/// Each optimizer step takes `grads_accumulation` items of the training data loader (each one
/// micro-batch, already cut per replica) and runs them through [`OptimizerStep::run`]: the
/// learning-rate scheduler stepped once, gradients averaged over micro-batches and data-parallel
/// replicas (or reduce-scattered under ZeRO-1), global-norm clipping, non-finite steps skipped
/// (the run stops after too many in a row).
///
/// The strategy trains on its `device` with autodiff (`Device::autodiff`): it forks the
/// learner's model there, moves the training loader there and the validation loader to the same
/// device without autodiff. Each epoch is one training split of Burn's event processor, each
/// validation one validation split.
#[derive(Clone)]
pub struct HlatStrategy {
    /// The device the model trains on.
    pub device: Device,
    /// The optimizer step the strategy runs.
    pub step: OptimizerStep,
    /// The counters the run starts from: zero for a fresh run, a checkpoint's when resuming.
    pub start: TrainingProgress,
    /// Validate every this many optimizer steps, besides after the last step of each epoch
    /// (0: only then).
    pub validate_every: u64,
    /// Told of every optimizer step and of the end of training (metrics files, checkpoints).
    pub observer: Option<Arc<dyn StepObserver>>,
}

impl HlatStrategy {
    /// The recipe of `step` on `device` from step 0, validating after each epoch, with no
    /// observer.
    pub fn new(step: OptimizerStep, device: Device) -> Self {
        Self {
            device,
            step,
            start: TrainingProgress::default(),
            validate_every: 0,
            observer: None,
        }
    }
}

/// The next `count` items of a training loader (fewer at its end); a failed read is
/// [`TrainError::Data`].
fn take_items(
    items: &mut dyn Iterator<Item = Result<LmBatch, burn::data::dataset::DatasetError>>,
    count: usize,
) -> Result<Vec<LmBatch>, TrainError> {
    items
        .take(count)
        .map(|item| item.map_err(|error| TrainError::Data(error.to_string())))
        .collect()
}

impl SupervisedLearningStrategy<LanguageModel> for HlatStrategy {
    fn fit(
        &self,
        components: TrainingComponents<LanguageModel>,
        mut learner: Learner<LanguageModel>,
        dataloader_train: TrainLoader<LanguageModel>,
        dataloader_valid: ValidLoader<LanguageModel>,
        starting_epoch: usize,
    ) -> (
        LanguageModel,
        SupervisedTrainingEventProcessor<LanguageModel>,
    ) {
        let device = self.device.clone().autodiff();
        learner.fork(&device);
        let dataloader_train = dataloader_train.to_device(&device);
        let dataloader_valid = dataloader_valid.to_device(&device.clone().inner());
        let mut processor = components.event_processor;
        let mut checkpointer = components.checkpointer;
        let interrupter = components.interrupter;
        let accumulation = components.grad_accumulation.unwrap_or(1).max(1);
        let mut progress = self.start;
        let mut failure = None;
        'epochs: for epoch in starting_epoch..=components.num_epochs {
            interrupter.fail_on_error(processor.process_train(LearnerEvent::StartSplit {
                epoch_number: epoch,
                total_items: dataloader_train.num_items(),
            }));
            let mut items = dataloader_train.iter();
            let mut iteration = 0;
            let mut next = match take_items(&mut items, accumulation) {
                Ok(next) => next,
                Err(error) => {
                    failure = Some(error);
                    break 'epochs;
                }
            };
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
                    loss: Tensor::<1>::from_floats(
                        [report.loss as f32],
                        &model.devices()[0].clone().inner(),
                    ),
                    tokens: report.tokens,
                    load_balancing: None,
                    preference: report.preference.map(|rewards| {
                        Tensor::<1>::from_floats(
                            [
                                rewards.rewards_chosen as f32,
                                rewards.rewards_rejected as f32,
                                rewards.margins as f32,
                                rewards.accuracy as f32,
                            ],
                            &model.devices()[0].clone().inner(),
                        )
                    }),
                };
                let item = TrainingItem::new(
                    item,
                    items.progress(),
                    Some(iteration),
                    Some(report.lr.into()),
                );
                interrupter
                    .fail_on_error(processor.process_train(LearnerEvent::ProcessedItem(item)));
                let seconds = started.elapsed().as_secs_f64();

                next = match tracing::info_span!(phase::DATA)
                    .in_scope(|| take_items(&mut items, accumulation))
                {
                    Ok(next) => next,
                    Err(error) => {
                        failure = Some(error);
                        break 'epochs;
                    }
                };
                drop(step_span);
                let last = next.is_empty() || interrupter.should_stop();
                validated = last
                    || (self.validate_every > 0 && report.step.is_multiple_of(self.validate_every));
                let val_loss = if validated {
                    match validate(
                        &model,
                        &dataloader_valid,
                        &mut processor,
                        &interrupter,
                        epoch,
                    ) {
                        Ok(val_loss) => val_loss,
                        Err(error) => {
                            failure = Some(error);
                            break 'epochs;
                        }
                    }
                } else {
                    None
                };
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
            interrupter.fail_on_error(processor.process_train(LearnerEvent::EndSplit(epoch)));
            if !validated {
                // An epoch without steps.
                if let Err(error) = validate(
                    &learner.model(),
                    &dataloader_valid,
                    &mut processor,
                    &interrupter,
                    epoch,
                ) {
                    failure = Some(error);
                    break 'epochs;
                }
            }
            interrupter.fail_on_error(processor.process_train(LearnerEvent::EndEpoch(epoch)));
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

/// Runs the validation loader on `model` in inference mode as one validation split of epoch
/// `epoch`, reporting each batch to the event processor; returns the token-weighted mean loss
/// (`None` without validation data). A failed read of a loss or of the loader is an error.
fn validate(
    model: &LanguageModel,
    loader: &ValidLoader<LanguageModel>,
    processor: &mut SupervisedTrainingEventProcessor<LanguageModel>,
    interrupter: &Interrupter,
    epoch: usize,
) -> Result<Option<f64>, TrainError> {
    let _span = tracing::info_span!(phase::VALIDATION).entered();
    let model = model.valid();
    interrupter.fail_on_error(processor.process_valid(LearnerEvent::StartSplit {
        epoch_number: epoch,
        total_items: loader.num_items(),
    }));
    let mut items = loader.iter();
    let mut iteration = 0;
    let (mut weighted, mut tokens) = (0.0, 0);
    while let Some(batch) = items.next() {
        let batch = batch.map_err(|error| TrainError::Data(error.to_string()))?;
        iteration += 1;
        let output = InferenceStep::step(&model, batch);
        let loss = output.clone().read()?.loss;
        weighted += loss * output.tokens as f64;
        tokens += output.tokens;
        let item = TrainingItem::new(output, items.progress(), Some(iteration), None);
        interrupter.fail_on_error(processor.process_valid(LearnerEvent::ProcessedItem(item)));
    }
    interrupter.fail_on_error(processor.process_valid(LearnerEvent::EndSplit(epoch)));
    Ok((tokens > 0).then(|| weighted / tokens as f64))
}
