//! Models trained one optimizer step at a time through HLAT's optimizer step
//! ([`OptimizerStep`], the step `hlat pretrain` runs inside burn-train's training loop), the
//! layout the tests share out over every kind of parallelism at once, and the steps a run folder
//! logged ([`logged_steps`]).

use std::path::Path;

use burn::train::Learner;
use hlat_train::error::TrainError;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::OptimizerStep;
use hlat_train::metrics::{METRICS_FILE, StepMetrics};
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
    fsdp: false,
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

/// Every line of the `metrics.jsonl` of the run in `out`, in order.
///
/// # Panics
/// When the file is missing or a line does not parse.
pub fn logged_steps(out: &Path) -> Vec<StepMetrics> {
    let path = out.join(METRICS_FILE);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("{}: {line}: {error}", path.display()))
        })
        .collect()
}
