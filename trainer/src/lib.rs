//! HLAT training: the data pipeline, Burn learner wiring, optimizer and schedule, parallelism.
//!
//! The pieces of a run, top to bottom:
//! - [`pretrain::pretrain`] is the job behind `hlat pretrain`: data, model setup (fresh, imported
//!   or resumed), then burn-train's `Learner` with [`learner::HlatStrategy`], writing metrics
//!   ([`metrics`]) and checkpoints ([`checkpoint_state`] beside the model, in the run folder of
//!   `hlat::checkpoint::run_folder`).
//! - [`learner::HlatStrategy`] is HLAT's recipe as a custom training strategy of the `Learner`;
//!   each of its optimizer steps is a [`learner::OptimizerStep`], the project's one training
//!   step (`hlat bench train` runs it on a `Learner` directly): the gradients of
//!   [`step_gradients`] (accumulation, the replicas' reduction, the global norm and clipping of
//!   [`clip`]), the step counted in [`progress`], non-finite steps skipped, the update.
//! - [`language_model::LanguageModel`] is the HLAT model as Burn's learner sees it (`TrainStep`,
//!   `InferenceStep`); [`optimizer::HlatAdamW`] is AdamW as torch computes it, with f32 state,
//!   optional norm exclusion from weight decay and bf16 stochastic rounding ([`rounding`]).
//! - [`config::TrainConfig`] holds HLAT's recipe; [`schedule::WarmupCosine`] its LR schedule;
//!   [`precision::Precision`] its three precision modes.
//! - [`data`] reads, packs, mixes and samples the training rows.
//! - [`finetune`] turns prompt/completion and chat records into masked rows (`hlat finetune`).
//! - [`eval`] measures a model: validation loss, perplexity, multiple-choice tasks.
//! - [`parallel`] arranges the replicas of a device into data- and tensor-parallel groups
//!   (sequence parallelism, ZeRO-1, memory per device).

pub mod align;
pub mod checkpoint_state;
pub mod clip;
pub mod config;
pub mod data;
pub mod data_spec;
pub mod error;
pub mod eval;
pub mod finetune;
pub mod language_model;
pub mod learner;
pub mod metrics;
pub mod optimizer;
pub mod parallel;
pub mod precision;
pub mod pretrain;
pub mod progress;
pub mod rounding;
pub mod schedule;
pub mod step_gradients;
