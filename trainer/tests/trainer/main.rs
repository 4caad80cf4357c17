//! The integration tests of `hlat-train`, in one binary: the data pipeline (`data_*`),
//! evaluation (`eval_*`) and the trainer (`train_*`).

mod data_builtin;
mod data_formats;
mod data_ingest;
mod data_mixing;
mod data_packing;
mod data_sampler;
mod data_tokenizer;
mod eval_scoring;
mod train_fixture;
mod train_learner;
mod train_optimizer;
mod train_precision;
mod train_pretrain;
mod train_recipe;
mod train_resume;
mod train_step;

// Tests that seed the `host` device or draw from it take turns (`exclusive_random`): the host
// executor draws from burn-flex's one process-wide generator, so a test drawing concurrently
// would change what another test's seed gives.
use test_support::fixtures::fixture;
use test_support::random::exclusive_random;

use burn::train::Learner;
use hlat_train::error::TrainError;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::{HlatComponents, OptimizerStep};
use hlat_train::optimizer::AdamWSettings;
use hlat_train::parallel::TrainingBackend;
use hlat_train::progress::{StepReport, TrainingProgress};
use hlat_train::schedule::WarmupCosine;

/// A model trained one optimizer step at a time through [`OptimizerStep`], the step `hlat
/// pretrain` runs inside burn-train's training loop.
struct Training<B: TrainingBackend> {
    step: OptimizerStep,
    learner: Learner<HlatComponents<B>>,
    progress: TrainingProgress,
}

impl<B: TrainingBackend> Training<B> {
    /// `model` at step 0, trained by `step` with HLAT's AdamW (`settings`) and `schedule`.
    fn new(
        model: LanguageModel<B>,
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
    fn train(&mut self, micro_batches: Vec<LmBatch<B>>) -> Result<StepReport, TrainError> {
        self.step
            .run(&mut self.learner, &mut self.progress, micro_batches)
    }

    /// The model as the steps so far left it.
    fn model(&self) -> LanguageModel<B> {
        self.learner.model()
    }
}
