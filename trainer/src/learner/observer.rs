//! [`StepObserver`]: what a run does besides training (metrics files, checkpoints), told by
//! [`super::HlatStrategy`] after every optimizer step and at the end.

use crate::error::TrainError;
use crate::language_model::LanguageModel;
use crate::progress::{StepReport, TrainingProgress};

/// One finished optimizer step, as the strategy reports it.
pub struct ObservedStep<'a> {
    /// The model after the step's update.
    pub model: &'a LanguageModel,
    /// The counters after the step.
    pub progress: TrainingProgress,
    /// What the step did.
    pub report: StepReport,
    /// Wall time of the step (its validation excluded).
    pub seconds: f64,
    /// Mean validation loss, on the steps that validated.
    pub val_loss: Option<f64>,
}

/// How training ended.
pub struct RunEnd<'a> {
    /// The model at the end.
    pub model: &'a LanguageModel,
    /// The counters at the end.
    pub progress: TrainingProgress,
    /// The error that stopped training (too many non-finite steps in a row, or one returned by
    /// [`StepObserver::after_step`]); `None` when it finished or was interrupted.
    pub failure: Option<TrainError>,
}

/// Told of every optimizer step and of the end of training.
pub trait StepObserver: Send + Sync {
    /// After each optimizer step. An error stops training and is handed to [`StepObserver::end`].
    fn after_step(&self, step: ObservedStep<'_>) -> Result<(), TrainError>;

    /// Once, when training ends for any reason.
    fn end(&self, end: RunEnd<'_>);
}
