//! Models trained one optimizer step at a time through HLAT's optimizer step
//! ([`OptimizerStep`], the step `hlat pretrain` runs inside burn-train's training loop), and the
//! layout the tests share out over every kind of parallelism at once.

use burn::train::Learner;
use hlat_train::error::TrainError;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::OptimizerStep;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::parallel::ParallelLayout;
use hlat_train::progress::{StepReport, TrainingProgress};
use hlat_train::schedule::WarmupCosine;

/// Data parallel 2 × tensor parallel 2 with sequence parallelism and ZeRO-1: the smallest layout
/// with every kind of parallelism of one pipeline stage.
pub const EVERY_PARALLELISM: ParallelLayout = ParallelLayout {
    data: 2,
    expert: 1,
    tensor: 2,
    pipeline: 1,
    sequence_parallel: true,
    zero1: true,
};

/// A model trained step by step: a burn-train `Learner`, the optimizer step it runs and the
/// counters of the steps so far.
pub struct Training {
    /// The step each [`Training::train`] runs.
    pub step: OptimizerStep,
    /// The model, its optimizer and its learning-rate scheduler.
    pub learner: Learner<LanguageModel>,
    /// The steps so far.
    pub progress: TrainingProgress,
}

impl Training {
    /// `model` at step 0, trained by `step` with HLAT's AdamW (`settings`) and `schedule`.
    pub fn new(
        model: LanguageModel,
        settings: AdamWSettings,
        schedule: WarmupCosine,
        step: OptimizerStep,
    ) -> Self {
        Self {
            learner: step.learner(model, settings, schedule),
            step,
            progress: TrainingProgress::default(),
        }
    }

    /// The next optimizer step, over `micro_batches`.
    pub fn train(&mut self, micro_batches: Vec<LmBatch>) -> Result<StepReport, TrainError> {
        self.step
            .run(&mut self.learner, &mut self.progress, micro_batches)
    }

    /// The model as the steps so far left it.
    pub fn model(&self) -> LanguageModel {
        self.learner.model()
    }
}
