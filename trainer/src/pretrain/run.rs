//! [`PretrainRun`]: what `hlat pretrain` does around the training steps of the Learner: one line
//! of `metrics.jsonl` per step, checkpoints every N steps, at the end and when interrupted, and
//! the summary the caller gets back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use burn::module::Module;
use burn::tensor::Device;
use hlat::checkpoint::run_folder::RunFolder;

use crate::checkpoint_state::{CheckpointState, ProcessShare, sync};
use crate::config::TrainConfig;
use crate::data::TextTokenizer;
use crate::error::TrainError;
use crate::eval::mean_loss;
use crate::language_model::LanguageModel;
use crate::learner::{ObservedStep, RunEnd, SharedOptimizer, StepLoader, StepObserver};
use crate::metrics::{MetricsLog, StepMetrics};
use crate::progress::TrainingProgress;
use crate::schedule::WarmupCosine;

use super::PretrainSummary;
use super::snapshot::CheckpointSnapshot;
use super::writer::{CheckpointWriter, WriteFailure, WriteOutcome, Written};

/// What the run's device (Trainium) has compiled so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CompileTotals {
    /// Programs compiled.
    pub programs: u64,
    /// Seconds spent compiling them.
    pub seconds: f64,
}

/// Reads the device's [`CompileTotals`], for the metrics.
pub type CompileCounter = Arc<dyn Fn() -> CompileTotals + Send + Sync>;

/// What a run writes besides the model's updates.
pub(super) struct RunOutputs {
    /// This process's checkpoints.
    pub folder: RunFolder,
    /// The share of each checkpoint this process writes.
    pub share: ProcessShare,
    /// The id of this start of the job, recorded in every checkpoint.
    pub job: String,
    /// The run's configuration.
    pub config: TrainConfig,
    /// The Learner's optimizer, whose state the checkpoints hold.
    pub optimizer: SharedOptimizer,
    /// The training rows, for the sampler position at a checkpoint.
    pub loader: StepLoader,
    /// The schedule the run follows.
    pub schedule: WarmupCosine,
    /// The seed of the per-step randomness.
    pub seed: u64,
    /// Saved with every checkpoint's model.
    pub tokenizer: Option<TextTokenizer>,
    /// The model the run started from, recorded in the adapters' `adapter_config.json`.
    pub base_model: Option<String>,
    /// `metrics.jsonl`.
    pub metrics: MetricsLog,
    /// Training FLOPs per token, for MFU.
    pub flops_per_token: f64,
    /// Compiled programs so far, when the device counts them.
    pub compiles: Option<CompileCounter>,
    /// When the run started (before its data and model were prepared).
    pub started: std::time::Instant,
    /// Validation rows of each source of a data mixture, measured apart at every validation.
    pub source_validation: super::data::RowsBySource,
    /// The device validation batches go to.
    pub device: Device,
}

/// The observer of a pretraining run (see the module documentation).
pub(super) struct PretrainRun {
    state: Mutex<RunState>,
}

struct RunState {
    outputs: RunOutputs,
    summary: PretrainSummary,
    /// Publishes the checkpoints.
    writer: CheckpointWriter,
    /// The step of the newest checkpoint taken (the resumed one's at the start), written or
    /// being written.
    checkpointed_step: u64,
    /// The step of the newest checkpoint written by this run.
    written_step: Option<u64>,
    /// Checkpoints that could not be written in a run that goes on without them.
    failed_checkpoints: usize,
    failure: Option<TrainError>,
}

impl PretrainRun {
    /// A run starting at `start_step`.
    pub fn new(outputs: RunOutputs, start_step: u64) -> Self {
        let summary = PretrainSummary {
            start_step,
            end_step: start_step,
            losses: Vec::new(),
            grad_norms: Vec::new(),
            val_loss: None,
            checkpoint: None,
        };
        let writer = CheckpointWriter::new(
            outputs.folder.clone(),
            outputs.config.keep_checkpoints,
            outputs.config.async_checkpoint,
        );
        Self {
            state: Mutex::new(RunState {
                outputs,
                summary,
                writer,
                checkpointed_step: start_step,
                written_step: None,
                failed_checkpoints: 0,
                failure: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RunState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The run's summary, or the error that stopped it.
    pub fn finish(&self) -> Result<PretrainSummary, TrainError> {
        let mut state = self.lock();
        match state.failure.take() {
            Some(error) => Err(error),
            None => Ok(state.summary.clone()),
        }
    }
}

impl RunOutputs {
    /// The validation perplexity of `model` on each data source, as the mixed validation is
    /// measured (batches of `micro_batch_rows` rows, the last one padded).
    fn source_perplexities(
        &self,
        model: &LanguageModel,
    ) -> Result<BTreeMap<String, f64>, TrainError> {
        let model = model.valid();
        let mut perplexities = BTreeMap::new();
        for (name, rows) in &self.source_validation {
            if rows.is_empty() {
                continue;
            }
            let loss = mean_loss(&model, rows, self.config.micro_batch_rows, &self.device)?;
            log::info!("validation perplexity of `{name}`: {:.2}", loss.exp());
            perplexities.insert(name.clone(), loss.exp());
        }
        Ok(perplexities)
    }
}

impl RunState {
    /// Takes the checkpoint of `model` after `progress`: copies it into host memory and
    /// publishes it, in the background when the run asks for it. Returns the seconds the step
    /// loop was held (waiting for the previous background write, the copy, and the write when it
    /// is not in the background).
    fn checkpoint(
        &mut self,
        model: &LanguageModel,
        progress: TrainingProgress,
    ) -> Result<f64, TrainError> {
        let started = Instant::now();
        // One staging copy at a time: the previous background write finishes before this
        // checkpoint is copied (the memory `hlat info` plans).
        self.wait_for_writes()?;
        let copy_started = Instant::now();
        let outputs = &self.outputs;
        // Every process runs what the step left queued (its parameter update) now, so that the
        // programs of the checkpoint start at the same point everywhere, whatever this process
        // then reads.
        sync(model).map_err(|error| {
            TrainError::Model(format!("finishing step {}: {error}", progress.step))
        })?;
        let steps_done = progress.step - self.summary.start_step;
        let state = CheckpointState {
            progress,
            schedule: outputs.schedule,
            sampler: outputs.loader.sampler_state_after(steps_done),
            seed: outputs.seed,
            precision: outputs.config.precision,
            processes: outputs.share.processes,
            job: outputs.job.clone(),
        };
        let _span = tracing::info_span!(burn_trainium::profile::phase::CHECKPOINT).entered();
        let snapshot = CheckpointSnapshot::read(outputs, model, state)?;
        if self.writer.in_background() {
            log::info!(
                "step {}: checkpoint copied to host memory ({:.1} MiB) in {:.2} s; writing it in \
                 the background",
                progress.step,
                snapshot.bytes() as f64 / (1024.0 * 1024.0),
                copy_started.elapsed().as_secs_f64()
            );
        }
        self.checkpointed_step = progress.step;
        for outcome in self.writer.publish(snapshot) {
            self.record(outcome)?;
        }
        Ok(started.elapsed().as_secs_f64())
    }

    /// Takes the outcome of a background write that has finished, if any.
    fn collect_finished(&mut self) -> Result<(), TrainError> {
        match self.writer.finished() {
            Some(outcome) => self.record(outcome),
            None => Ok(()),
        }
    }

    /// Waits for the background write under way, if any, and takes its outcome.
    fn wait_for_writes(&mut self) -> Result<(), TrainError> {
        match self.writer.wait() {
            Some(outcome) => self.record(outcome),
            None => Ok(()),
        }
    }

    /// Records a checkpoint write's outcome: a written checkpoint becomes the summary's; a
    /// failed one stops the run, unless it goes on without checkpoints
    /// (`continue_on_checkpoint_error`).
    fn record(&mut self, outcome: WriteOutcome) -> Result<(), TrainError> {
        match outcome {
            Ok(Written { step, dir }) => {
                log::info!("step {step}: checkpoint {}", dir.display());
                self.summary.checkpoint = Some(dir);
                self.written_step = Some(step);
                Ok(())
            }
            Err(WriteFailure { step, error }) => {
                if !self.outputs.config.continue_on_checkpoint_error {
                    return Err(TrainError::CheckpointWrite {
                        step,
                        error: Box::new(error),
                    });
                }
                log::error!(
                    "the checkpoint of step {step} was not written, training goes on without \
                     it (--continue-on-checkpoint-error): {error}"
                );
                self.failed_checkpoints += 1;
                Ok(())
            }
        }
    }
}

impl StepObserver for PretrainRun {
    fn after_step(&self, observed: ObservedStep<'_>) -> Result<(), TrainError> {
        let mut state = self.lock();
        // A background write that failed stops the run at the next step.
        state.collect_finished()?;
        let report = observed.report;
        let step = report.step;
        // What the step compiled, not counting the checkpoint's own programs (the next step's
        // line counts those).
        let compiled = state.outputs.compiles.as_ref().map(|count| count());
        let by_source = match observed.val_loss {
            Some(_) if !state.outputs.source_validation.is_empty() => {
                Some(state.outputs.source_perplexities(observed.model)?)
            }
            _ => None,
        };
        let every = state.outputs.config.checkpoint_every;
        let checkpoint_seconds = if step == state.outputs.config.max_steps
            || (every > 0 && step.is_multiple_of(every))
        {
            Some(state.checkpoint(observed.model, observed.progress)?)
        } else {
            None
        };
        let outputs = &mut state.outputs;
        let tokens_per_s = report.tokens as f64 / observed.seconds;
        let metrics = StepMetrics {
            step,
            loss: report.loss,
            load_balancing_loss: report.load_balancing_loss,
            rewards_chosen: report.preference.map(|rewards| rewards.rewards_chosen),
            rewards_rejected: report.preference.map(|rewards| rewards.rewards_rejected),
            rewards_margins: report.preference.map(|rewards| rewards.margins),
            rewards_accuracies: report.preference.map(|rewards| rewards.accuracy),
            perplexity: report.loss.exp(),
            lr: report.lr,
            grad_norm: report.grad_norm,
            tokens: report.tokens,
            tokens_seen: observed.progress.tokens_seen,
            tokens_per_s,
            mfu: outputs
                .config
                .peak_flops
                .map(|peak| tokens_per_s * outputs.flops_per_token / peak),
            compiles: compiled.map(|totals| totals.programs),
            compile_seconds: compiled.map(|totals| totals.seconds),
            elapsed_seconds: outputs.started.elapsed().as_secs_f64(),
            skipped: report.skipped,
            val_loss: observed.val_loss,
            val_perplexity: observed.val_loss.map(f64::exp),
            val_perplexity_by_source: by_source,
            checkpoint_seconds,
        };
        outputs.metrics.append(&metrics)?;
        if let Some(val_loss) = observed.val_loss {
            log::info!(
                "step {step}: validation loss {val_loss:.4}, perplexity {:.2}",
                val_loss.exp()
            );
            state.summary.val_loss = Some(val_loss);
        }
        state.summary.losses.push(report.loss);
        state.summary.grad_norms.push(report.grad_norm);
        state.summary.end_step = step;
        Ok(())
    }

    fn end(&self, end: RunEnd<'_>) {
        let mut state = self.lock();
        state.failure = end.failure;
        if state.failure.is_none() && end.progress.step > state.checkpointed_step {
            // Interrupted between checkpoints: keep what was trained.
            log::info!(
                "interrupted at step {}: saving a checkpoint",
                end.progress.step
            );
            if let Err(error) = state.checkpoint(end.model, end.progress) {
                state.failure = Some(error);
            }
        }
        // Whatever ended the run, the checkpoint being written is completed before it returns.
        if let Err(error) = state.wait_for_writes() {
            state.failure.get_or_insert(error);
        }
        let last = state.checkpointed_step;
        if state.failure.is_none()
            && state.failed_checkpoints > 0
            && state.written_step != Some(last)
        {
            // Going on without checkpoints ends here: a run never ends without its last one.
            let written = match state.written_step {
                Some(step) => format!("the newest written is step {step}'s"),
                None => "none was written".to_string(),
            };
            state.failure = Some(TrainError::CheckpointWrite {
                step: last,
                error: Box::new(TrainError::Checkpoint {
                    path: state.outputs.folder.step_dir(last),
                    message: format!(
                        "a run goes on without its checkpoints but never ends without its last \
                         one (see the log above); {written}"
                    ),
                }),
            });
        }
    }
}
