//! The pretraining job behind `hlat pretrain`, run on burn-train's `Learner` with
//! [`HlatStrategy`]: `data` chooses the rows, `setup` prepares the model (fresh from a
//! preset, imported from Hugging Face, or resumed from the newest checkpoint of the output
//! folder), and `run` writes metrics and checkpoints after the strategy's steps. Burn's
//! terminal dashboard renders in an interactive terminal (feature `dashboard`), a progress bar
//! elsewhere.

#[cfg(feature = "dashboard")]
mod dashboard;
mod data;
mod run;
mod setup;
mod signals;
mod snapshot;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::tensor::Device;
use burn::train::metric::LearningRateMetric;
use burn::train::{Learner, SupervisedTraining, TrainingStrategy};
use hlat::checkpoint::run_folder::{RunFolder, rank_output};

use crate::align::PreferencePairs;
use crate::align::run_state::{PinnedPairs, PinnedReference};
use crate::checkpoint_state::{ProcessShare, read_state};
use crate::error::TrainError;
use crate::learner::{
    HlatStrategy, OptimizerStep, ProgressRenderer, RewardMetric, RowsBatcher, RunFolderLogger,
    SharedOptimizer, StepLoader, TokenLossMetric,
};
use crate::metrics::MetricsLog;
use crate::schedule::WarmupCosineScheduler;

pub use data::{DataChoice, PreferenceData, validation_source};
pub use run::{CompileCounter, CompileTotals};

/// The file a run writes its configuration to.
pub const RUN_CONFIG_FILE: &str = "train.toml";
/// The PEFT adapter folder of a LoRA run's checkpoint (and, from `hlat finetune`, of its output
/// folder): the checkpoint's `model/` holds the frozen base weights alone.
pub const ADAPTER_DIR: &str = "adapter";
/// The tokenizer file inside a model folder or a shard folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Refuses `model` when it is the `model/` of a LoRA run's checkpoint: those weights are the
/// frozen base alone, so training or scoring with them would silently drop the adapter kept
/// beside them. `named` says how the caller was given the folder (a flag and its value).
pub fn refuse_lora_checkpoint(model: &Path, named: &str) -> Result<(), TrainError> {
    let Some(checkpoint) = model.parent() else {
        return Ok(());
    };
    let adapter = checkpoint.join(ADAPTER_DIR);
    if adapter.is_dir() {
        return Err(TrainError::Mismatch(format!(
            "{named}: a LoRA run, whose checkpoints hold the frozen base weights and the adapter \
             apart; name its base model and its adapter ({}) instead, or merge them (hlat convert \
             --merge-adapter)",
            adapter.display()
        )));
    }
    Ok(())
}

/// Everything `hlat pretrain` decides before training.
#[derive(Debug, Clone)]
pub struct PretrainOptions {
    /// Recipe and run settings.
    pub config: crate::config::TrainConfig,
    /// Output folder: `checkpoints/`, `metrics.jsonl`, `train.toml`, Burn's metric logs. In a
    /// job of several processes, the job's folder: rank 0 writes there, rank `R` into
    /// [`hlat::checkpoint::run_folder::rank_output`]`(out, R)`.
    pub out: PathBuf,
    /// Training data.
    pub data: DataChoice,
    /// A Hugging Face or native checkpoint to start from instead of a fresh preset.
    pub init_from: Option<PathBuf>,
    /// A PEFT LoRA adapter folder the run's adapters start from (`hlat finetune --adapter`),
    /// instead of fresh ones; a resumed run continues from its checkpoint's adapter instead.
    pub init_adapter: Option<PathBuf>,
    /// This process's place in its job ([`ProcessShare::WHOLE`] for a job of one): each
    /// process writes its share of every checkpoint, and a restarted job resumes from the newest
    /// checkpoint every process that wrote it completed.
    pub share: ProcessShare,
}

impl PretrainOptions {
    /// This process's output folder.
    pub fn own_out(&self) -> PathBuf {
        rank_output(&self.out, self.share.rank)
    }
}

/// What a pretraining run did.
#[derive(Debug, Clone, PartialEq)]
pub struct PretrainSummary {
    /// The step the run started from (0, or the resumed checkpoint's step).
    pub start_step: u64,
    /// The step the run ended at.
    pub end_step: u64,
    /// Training losses of the steps this run executed, in order.
    pub losses: Vec<f64>,
    /// Global gradient norms (before clipping) of those steps, in order.
    pub grad_norms: Vec<f64>,
    /// The last validation loss measured, if any.
    pub val_loss: Option<f64>,
    /// The last checkpoint written.
    pub checkpoint: Option<PathBuf>,
}

/// Hooks into the device the run trains on.
#[derive(Clone, Default)]
pub struct DeviceInfo {
    /// Compiled programs so far on the device (Trainium), for the metrics.
    pub compiles: Option<CompileCounter>,
}

/// What every process of a job starts from, as rank 0 decides it: the id of this start of the
/// job (recorded in its checkpoints) and the checkpoint to resume, the newest of the job's folder
/// that every process which wrote it completed (the model is rank 0's). Rank 0 reads the shared
/// storage alone and tells the others, so no process can see the folders differently.
fn agree_on_start(options: &PretrainOptions) -> Result<(String, Option<PathBuf>), TrainError> {
    let (job, resume_from) = if options.share.rank == 0 {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let job = format!("{:x}-{}", since_epoch.as_nanos(), std::process::id());
        let resume_from = RunFolder::new(&options.out)
            .newest_complete_in_every_rank(|dir| read_state(dir).map(|state| state.writers()))?;
        (job, resume_from)
    } else {
        (String::new(), None)
    };
    let decision = serde_json::to_vec(&(&job, &resume_from)).expect("paths serialize");
    let every =
        burn_trainium::distributed::share("hlat/pretrain/start", &decision).map_err(|error| {
            TrainError::Mismatch(format!("agreeing on where the job starts: {error}"))
        })?;
    if every.len() != options.share.processes {
        return Err(TrainError::Mismatch(format!(
            "process {} of a job of {} has not joined the others \
             (burn_trainium::distributed::join)",
            options.share.rank, options.share.processes
        )));
    }
    serde_json::from_slice(&every[0]).map_err(|error| {
        TrainError::Mismatch(format!("rank 0's start of the job does not parse: {error}"))
    })
}

/// Runs (or resumes) a pretraining job on `device` (with autodiff, `Device::autodiff`, whether
/// or not `device` has it).
pub fn pretrain(
    options: &PretrainOptions,
    device: &Device,
    info: DeviceInfo,
) -> Result<PretrainSummary, TrainError> {
    let device = &device.clone().autodiff();
    let started = std::time::Instant::now();
    let config = &options.config;
    config.validate()?;
    if let DataChoice::Preference(_) = &options.data {
        crate::align::pairs::check_config(config)?;
    }
    let layout = config.layout();
    let replicas = burn_trainium::collective::replica_count(device);
    if replicas != layout.replicas() {
        return Err(TrainError::Mismatch(format!(
            "data_parallel = {} × tensor_parallel = {} needs a device of {} replicas; the device \
             has {replicas}",
            layout.data,
            layout.tensor,
            layout.replicas()
        )));
    }
    // Tensor-parallel groups are consecutive replicas, and each must sit inside one process.
    let processes = options.share.processes;
    if processes > 1 && !(replicas / processes).is_multiple_of(layout.tensor) {
        return Err(TrainError::Mismatch(format!(
            "tensor_parallel = {} does not fit the {} replicas each of the job's {processes} \
             processes holds: a tensor-parallel group must stay inside one process",
            layout.tensor,
            replicas / processes
        )));
    }
    let out = options.own_out();
    std::fs::create_dir_all(&out).map_err(|source| TrainError::Io {
        path: out.clone(),
        source,
    })?;
    let folder = RunFolder::new(&out);
    let (job, resume_from) = agree_on_start(options)?;
    let mut data = data::prepare_data(&options.data, config)?;
    // DPO's reference pass runs before the policy is loaded, so that the device never holds
    // both models; a finished run skips it.
    let pairs = match data.pairs.take() {
        Some(pairs) => {
            let inner = device.clone().inner();
            Some(pin_pairs(pairs, options, (&out, data.vocab_size), &inner)?)
        }
        None => None,
    };
    if data.tokenizer.is_none()
        && let Some(dir) = &options.init_from
        && dir.join(TOKENIZER_FILE).is_file()
    {
        // Continual pretraining keeps the starting checkpoint's tokenizer with the model.
        data.tokenizer = Some(
            crate::data::TextTokenizer::from_file(dir.join(TOKENIZER_FILE))
                .map_err(data::data_error)?,
        );
    }
    let start = setup::start_run(
        options,
        data.tokenizer.as_ref(),
        data.vocab_size,
        resume_from.as_deref(),
        device,
    )?;
    config.save_toml(&out.join(RUN_CONFIG_FILE))?;

    let start_step = start.progress.step;
    let optimizer = SharedOptimizer::new(start.optimizer);
    let validation_device = device.clone().inner();
    let steps = config.max_steps.saturating_sub(start_step);
    let train = StepLoader::new(
        Arc::clone(&data.train),
        start.sampler,
        steps,
        config.rows_per_step(),
        config.micro_batch_rows,
        layout,
        device.clone(),
    );
    let train = match pairs {
        Some(pairs) => train.and_then(|train| train.with_pairs(Arc::new(pairs))),
        _ => train,
    }
    .map_err(data::data_error)?;
    let run = Arc::new(run::PretrainRun::new(
        run::RunOutputs {
            folder,
            share: options.share,
            job,
            config: config.clone(),
            optimizer: optimizer.clone(),
            loader: train.clone(),
            schedule: start.schedule,
            seed: start.seed,
            tokenizer: data.tokenizer,
            base_model: options
                .init_from
                .as_ref()
                .map(|dir| dir.display().to_string()),
            metrics: MetricsLog::open(&out, start_step)?,
            flops_per_token: start.flops_per_token,
            compiles: info.compiles,
            started,
            source_validation: if config.eval_every > 0 {
                data::per_source_validation(&options.data, config, config.eval_rows)?
            } else {
                Vec::new()
            },
            device: validation_device.clone(),
        },
        start_step,
    ));
    if start_step >= config.max_steps {
        log::info!(
            "{} is already at step {start_step} of {}; nothing to do",
            out.display(),
            config.max_steps
        );
        return run.finish();
    }
    let accumulation = train.accumulation();
    let validation_rows = match (&data.validation, config.eval_every) {
        (Some(rows), every) if every > 0 => data::validation_rows(rows.as_ref(), config.eval_rows),
        _ => Vec::new(),
    };
    let valid_rows = config.micro_batch_rows.max(1);
    let valid = DataLoaderBuilder::new(RowsBatcher { rows: valid_rows })
        .batch_size(valid_rows)
        .set_device(validation_device)
        .build(InMemDataset::new(validation_rows));

    let step = OptimizerStep {
        seed: start.seed,
        ..OptimizerStep::from_config(config)
    };
    let strategy = HlatStrategy {
        start: start.progress,
        validate_every: config.eval_every,
        observer: Some(run.clone()),
        ..HlatStrategy::new(step, device.clone())
    };
    let scheduler = WarmupCosineScheduler {
        schedule: start.schedule,
        step: start_step,
    };
    // Adam's moments exist before the first step, so that it runs the steady step's program.
    optimizer.create_states(&start.model);
    device.sync().map_err(|error| {
        TrainError::Device(format!("creating the optimizer's moments: {error}"))
    })?;
    let module_optimizer = optimizer.module_optimizer(&start.model);
    let learner = Learner::new(start.model, module_optimizer, scheduler);
    let training = SupervisedTraining::new(&out, Arc::new(train), valid)
        .with_metric_logger(RunFolderLogger::new(&out))
        .with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy)))
        .with_application_logger(None)
        .grads_accumulation(accumulation)
        .num_epochs(1)
        .metric_train_numeric(TokenLossMetric::new())
        .metric_valid_numeric(TokenLossMetric::new())
        .metric_train_numeric(LearningRateMetric::new());
    let training = match &options.data {
        DataChoice::Preference(_) => training
            .metric_train_numeric(RewardMetric::margins())
            .metric_train_numeric(RewardMetric::accuracy()),
        _ => training,
    };
    let progress = ProgressRenderer::new(start_step, config.max_steps, config.progress);
    #[cfg(feature = "dashboard")]
    let (training, _dashboard) = match dashboard::Dashboard::open(config.progress) {
        Some(dashboard) => {
            let renderer = dashboard.renderer(training.interrupter());
            (training.renderer(Box::new(renderer)), Some(dashboard))
        }
        None => (training.renderer(Box::new(progress)), None),
    };
    #[cfg(not(feature = "dashboard"))]
    let training = training.renderer(Box::new(progress));
    let _stop_on_signal = signals::StopOnSignal::install(training.interrupter())?;
    training.launch(learner);
    run.finish()
}

/// `pairs` as the run in `out` trains them: a preference run pins its objective, its pairs and,
/// for DPO, the reference model's log-probabilities in its folder before its first step
/// ([`PinnedPairs`]); started again, it checks that the command asks for the same run and reuses
/// them. Otherwise the log-probabilities are computed on `device` (the run's, without autodiff)
/// with the run's layout, from the run's `reference_model` or else its starting model, before
/// the policy is loaded: the device never holds both models.
fn pin_pairs(
    pairs: PreferencePairs,
    options: &PretrainOptions,
    (out, vocab_size): (&std::path::Path, usize),
    device: &Device,
) -> Result<PreferencePairs, TrainError> {
    let DataChoice::Preference(data) = &options.data else {
        unreachable!("pairs come from preference data");
    };
    let reference_dir = match pairs.lacks_references() {
        false => None,
        true => {
            let Some(dir) = data.reference_model.as_ref().or(options.init_from.as_ref()) else {
                return Err(TrainError::Mismatch(
                    "DPO needs a reference model: neither a reference nor a starting model is \
                     given"
                        .to_string(),
                ));
            };
            let failed = |error: &dyn std::fmt::Display| {
                TrainError::Model(format!("reference model {}: {error}", dir.display()))
            };
            let model = hlat::checkpoint::model_folder(dir).map_err(|error| failed(&error))?;
            Some(std::fs::canonicalize(&model).map_err(|error| failed(&error))?)
        }
    };
    let mut wanted = PinnedPairs::of(&pairs);
    if let Some(pinned) = PinnedPairs::read(out)? {
        pinned.check_same_run(&wanted, reference_dir.as_deref(), out)?;
        match (pinned.reference, &reference_dir) {
            (Some(reference), Some(_)) => {
                log::info!(
                    "reference log-probabilities of {} pairs: those of the run's first start ({})",
                    pairs.examples().len(),
                    reference.model.display()
                );
                return Ok(pairs.with_references(reference.log_probs));
            }
            (_, None) => return Ok(pairs),
            (None, Some(_)) => {}
        }
    }
    let pairs = match &reference_dir {
        None => pairs,
        Some(dir) => {
            let config = &options.config;
            let reference = setup::reference_model(dir, config, vocab_size, device)?;
            let log_probs = crate::align::reference::reference_log_probs(
                &reference,
                &pairs,
                config.micro_batch_rows / crate::align::pairs::ROWS_PER_PAIR,
                &config.layout(),
                device,
            )?;
            wanted.reference = Some(PinnedReference {
                model: dir.clone(),
                log_probs: log_probs.clone(),
            });
            pairs.with_references(log_probs)
        }
    };
    wanted.write(out)?;
    Ok(pairs)
}
