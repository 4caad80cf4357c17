//! HLAT's recipe on burn-train's `Learner` (`TrainingStrategy::Custom`): Burn users build a
//! `Learner` and a `SupervisedTraining` as usual and pass [`HlatStrategy`]; Burn's event
//! processor, metrics, renderer (its terminal dashboard), checkpointer and interrupter keep
//! working. Every optimizer step is an [`OptimizerStep`], the one training step of the project
//! (`hlat bench train` runs it on a `Learner` directly). `hlat pretrain` runs the strategy with a
//! [`StepLoader`] over its resumable sampler, a [`StepObserver`] writing `metrics.jsonl` and
//! checkpoints, and a [`SharedOptimizer`] so the checkpoints can hold the optimizer state.

mod loader;
mod metrics;
mod observer;
mod optimizer_step;
mod renderer;
mod run_logs;
mod shared_optimizer;
mod strategy;

pub use loader::{LayoutBatcher, RowsBatcher, StepLoader, step_micro_batches};
pub use metrics::{OutputMetric, OutputReading, Reward, RewardMetric, TokenLoss, TokenLossMetric};
pub use observer::{ObservedStep, RunEnd, StepObserver};
pub use optimizer_step::{OptimizerStep, step_seed};
pub use renderer::ProgressRenderer;
pub use run_logs::RunFolderLogger;
pub use shared_optimizer::SharedOptimizer;
pub use strategy::HlatStrategy;
