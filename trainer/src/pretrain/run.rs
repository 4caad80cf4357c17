//! [`PretrainRun`]: what `hlat pretrain` does around the training steps of the Learner: one line
//! of `metrics.jsonl` per step, checkpoints every N steps, at the end and when interrupted, and
//! the summary the caller gets back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use burn::module::Module;
use burn::tensor::{DType, Device};
use hlat::checkpoint::run_folder::{MODEL_DIR, RunFolder};

use crate::checkpoint_state::{CheckpointState, ProcessShare, save_optimizer, sync, write_state};
use crate::config::TrainConfig;
use crate::data::TextTokenizer;
use crate::error::TrainError;
use crate::eval::mean_loss;
use crate::language_model::LanguageModel;
use crate::learner::{ObservedStep, RunEnd, SharedOptimizer, StepLoader, StepObserver};
use crate::metrics::{MetricsLog, StepMetrics};
use crate::precision::cast_params;
use crate::progress::TrainingProgress;
use crate::schedule::WarmupCosine;

use super::PretrainSummary;

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
    /// The step of the newest checkpoint (the resumed one's at the start).
    checkpointed_step: u64,
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
        Self {
            state: Mutex::new(RunState {
                outputs,
                summary,
                checkpointed_step: start_step,
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
    /// Writes a checkpoint of `model` after `progress`.
    fn checkpoint(
        &mut self,
        model: &LanguageModel,
        progress: TrainingProgress,
    ) -> Result<PathBuf, TrainError> {
        let outputs = &self.outputs;
        let config = &outputs.config;
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
            precision: config.precision,
            processes: outputs.share.processes,
            job: outputs.job.clone(),
        };
        let _span = tracing::info_span!(burn_trainium::profile::phase::CHECKPOINT).entered();
        let dir = outputs
            .folder
            .publish(progress.step, config.keep_checkpoints, |dir| {
                let model_dir = dir.join(MODEL_DIR);
                // Experts split over ranks are saved whole, with their optimizer state.
                let mut record = outputs.optimizer.lock().to_record();
                let joined = join_experts(model, &mut record, &config.layout());
                let model = joined.as_ref().unwrap_or(model);
                // In f32 whatever the training precision (bf16 -> f32 is exact; the loader casts
                // back), so that any tool can read the model; a tensor-parallel model as one file
                // per rank, a pipelined one as one file per stage and rank, each read from the
                // replica that holds it (any layout resumes from any of them).
                write_model(outputs, model, &model_dir)?;
                write_adapter(outputs, model, &dir.join(super::ADAPTER_DIR))?;
                save_optimizer(
                    dir,
                    record,
                    model,
                    &config.layout(),
                    model.pipeline.as_ref(),
                    outputs.share,
                )?;
                write_state(dir, &state)
            })?;
        log::info!("step {}: checkpoint {}", progress.step, dir.display());
        self.summary.checkpoint = Some(dir.clone());
        self.checkpointed_step = progress.step;
        Ok(dir)
    }
}

/// `model` with the whole set of experts on every rank, and the experts' optimizer state in
/// `record` joined with them, when its experts are split (a collective every process runs);
/// `None` otherwise.
fn join_experts(
    model: &LanguageModel,
    record: &mut crate::optimizer::OptimizerRecord,
    layout: &crate::parallel::ParallelLayout,
) -> Option<LanguageModel> {
    model.hlat.expert_parallel()?;
    let joined = model.hlat.clone().join_experts();
    crate::parallel::reshard_expert_states(
        &model.hlat,
        &joined,
        record,
        (
            crate::parallel::ExpertStates::Join,
            layout.zero1_of_experts().as_ref(),
        ),
    );
    Some(LanguageModel {
        hlat: joined,
        ..model.clone()
    })
}

/// Writes the checkpoint's model into `model_dir`, in f32. Only rank 0 of a job writes (and
/// reads) it: its replicas hold every tensor-parallel rank, and the others queue nothing they
/// would not run.
///
/// A pipelined model is written as one file per stage and tensor-parallel rank, each read from
/// its stage's replica (`hlat::checkpoint::sharded::read_stages`), when rank 0's replicas hold
/// every stage (one process). When the stages span the job's processes, rank 0 cannot read the
/// others' replicas: every process then joins the stages on the device (`Hlat::from_stages`, a
/// collective over the pipeline groups that every process must run), and rank 0 writes the
/// joined model as a run without pipeline stages does.
fn write_model(
    outputs: &RunOutputs,
    model: &LanguageModel,
    model_dir: &Path,
) -> Result<(), TrainError> {
    let model_error =
        |error: hlat::checkpoint::CheckpointError| TrainError::Model(error.to_string());
    let tokenizer = outputs.tokenizer.as_ref().map(TextTokenizer::inner);
    let degree = model
        .tensor_parallel
        .as_ref()
        .map_or(1, |parallel| parallel.groups.group_size());
    let mut hlat = None;
    if let Some(pipeline) = &model.pipeline {
        let local = burn_trainium::collective::replica_count(&outputs.device)
            / outputs.share.processes.max(1);
        let replicas = hlat::checkpoint::sharded::stage_replicas(pipeline, degree);
        if replicas.iter().flatten().all(|&replica| replica < local) {
            if outputs.share.writes_model() {
                let staged = cast_params(model.hlat.valid(), DType::F32);
                hlat::checkpoint::sharded::read_stages(&staged, pipeline, degree, model_dir)
                    .and_then(|shards| shards.write(staged.config(), tokenizer, model_dir))
                    .map_err(model_error)?;
            }
            return Ok(());
        }
        let joined = cast_params(model.hlat.valid(), DType::F32).from_stages(pipeline);
        sync(model)
            .map_err(|error| TrainError::Model(format!("joining the pipeline stages: {error}")))?;
        hlat = Some(joined);
    }
    if !outputs.share.writes_model() {
        return Ok(());
    }
    // The base weights alone: the adapters go to their own PEFT folder (`write_adapter`).
    let hlat = hlat
        .unwrap_or_else(|| cast_params(model.hlat.valid(), DType::F32))
        .without_lora();
    match &model.tensor_parallel {
        Some(_) => hlat::checkpoint::sharded::read_ranks(&hlat, degree, model_dir)
            .and_then(|shards| shards.write(hlat.config(), tokenizer, model_dir)),
        None => {
            hlat::checkpoint::save_native_with_tokenizer(&hlat, hlat.config(), tokenizer, model_dir)
        }
    }
    .map_err(model_error)
}

/// Writes the LoRA adapters of `model` (a run with `lora` set) into `dir` as a PEFT adapter
/// folder, in f32. Under tensor parallelism the split factors are joined first (a collective
/// every process runs); rank 0 writes.
fn write_adapter(
    outputs: &RunOutputs,
    model: &LanguageModel,
    dir: &Path,
) -> Result<(), TrainError> {
    let Some(lora) = &outputs.config.lora else {
        return Ok(());
    };
    let hlat = cast_params(model.hlat.valid(), DType::F32);
    let hlat = match &model.tensor_parallel {
        Some(parallel) => hlat.unshard(parallel),
        None => hlat,
    };
    if !outputs.share.writes_model() {
        return Ok(());
    }
    hlat::hf::adapter::save_adapter(
        &hlat,
        lora,
        outputs.base_model.as_deref(),
        hlat::hf::WeightDtype::F32,
        dir,
    )
    .map_err(|error| TrainError::Model(format!("{}: {error}", dir.display())))
}

impl StepObserver for PretrainRun {
    fn after_step(&self, observed: ObservedStep<'_>) -> Result<(), TrainError> {
        let mut state = self.lock();
        let report = observed.report;
        let step = report.step;
        let outputs = &mut state.outputs;
        let tokens_per_s = report.tokens as f64 / observed.seconds;
        let compiled = outputs.compiles.as_ref().map(|count| count());
        let by_source = match observed.val_loss {
            Some(_) if !outputs.source_validation.is_empty() => {
                Some(outputs.source_perplexities(observed.model)?)
            }
            _ => None,
        };
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
        let every = state.outputs.config.checkpoint_every;
        if step == state.outputs.config.max_steps || (every > 0 && step.is_multiple_of(every)) {
            state.checkpoint(observed.model, observed.progress)?;
        }
        Ok(())
    }

    fn end(&self, end: RunEnd<'_>) {
        let mut state = self.lock();
        if let Some(error) = end.failure {
            state.failure = Some(error);
            return;
        }
        if end.progress.step > state.checkpointed_step {
            // Interrupted between checkpoints: keep what was trained.
            log::info!(
                "interrupted at step {}: saving a checkpoint",
                end.progress.step
            );
            if let Err(error) = state.checkpoint(end.model, end.progress) {
                state.failure = Some(error);
            }
        }
    }
}
