//! The pretraining job behind `hlat pretrain`: prepares the data, sets up the model (fresh from a
//! preset, imported from Hugging Face, or resumed from the newest checkpoint in the output
//! folder), then runs optimizer steps with validation, metrics and checkpoints.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::DType;
use hlat::{Hlat, HlatConfig};

use crate::checkpoint::{
    CheckpointState, MODEL_DIR, RunCheckpoints, load_optimizer, read_state, save_optimizer,
    write_state,
};
use crate::config::TrainConfig;
use crate::data::{
    BuiltinDataConfig, Mixture, PackedRows, RowSource, Sampler, ShardSet, Split, TextTokenizer,
    builtin_dataset,
};
use crate::data_spec::DataSource;
use crate::error::TrainError;
use crate::metrics::{LiveView, MetricsLog, StepMetrics};
use crate::optimizer::AdamWSettings;
use crate::parallel::{TrainingBackend, split_rows};
use crate::precision::cast_params;
use crate::schedule::WarmupCosine;
use crate::step::{LanguageModel, LmBatch};
use crate::trainer::{Trainer, evaluate};

/// The file a run writes its configuration to.
pub const RUN_CONFIG_FILE: &str = "train.toml";
/// The tokenizer file inside a model folder or a shard folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Training tokens of the built-in corpus.
const BUILTIN_TRAIN_TOKENS: usize = 512 * 1024;
/// Validation tokens of the built-in corpus.
const BUILTIN_VALIDATION_TOKENS: usize = 16 * 1024;

/// Where the training rows come from.
#[derive(Debug, Clone, PartialEq)]
pub enum DataChoice {
    /// The generated English-like corpus and its tokenizer (`data::builtin`).
    Builtin,
    /// Prepared shard folders, mixed by weight.
    Shards(Vec<DataSource>),
}

/// Everything `hlat pretrain` decides before training.
#[derive(Debug, Clone)]
pub struct PretrainOptions {
    /// Recipe and run settings.
    pub config: TrainConfig,
    /// Output folder: `checkpoints/`, `metrics.jsonl`, `train.toml`.
    pub out: PathBuf,
    /// Training data.
    pub data: DataChoice,
    /// A Hugging Face or native checkpoint to start from instead of a fresh preset.
    pub init_from: Option<PathBuf>,
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
pub struct DeviceInfo<'a> {
    /// Compiled programs so far on the device (Trainium), for the metrics.
    pub compiles: Option<&'a dyn Fn() -> u64>,
}

/// Training and validation rows with the tokenizer that made them.
struct PreparedData {
    train: Sampler<Box<dyn RowSource>>,
    validation: Option<Box<dyn RowSource>>,
    tokenizer: Option<TextTokenizer>,
    /// Exclusive upper bound of the token ids in the data.
    vocab_size: usize,
}

/// Runs (or resumes) a pretraining job on `device`.
pub fn pretrain<B: TrainingBackend>(
    options: &PretrainOptions,
    device: &B::Device,
    info: DeviceInfo<'_>,
) -> Result<PretrainSummary, TrainError> {
    let config = &options.config;
    config.validate()?;
    let layout = config.layout();
    let replicas = B::replica_count(device);
    if replicas != layout.replicas() {
        return Err(TrainError::Mismatch(format!(
            "data_parallel = {} × tensor_parallel = {} needs a device of {} replicas; the device \
             has {replicas}",
            layout.data,
            layout.tensor,
            layout.replicas()
        )));
    }
    let tensor_parallel = layout.tensor_parallel();
    std::fs::create_dir_all(&options.out).map_err(|source| TrainError::Io {
        path: options.out.clone(),
        source,
    })?;
    let checkpoints = RunCheckpoints::new(&options.out);
    let resume_from = checkpoints.newest()?;
    let mut data = prepare_data(&options.data, config)?;
    if data.tokenizer.is_none()
        && let Some(dir) = &options.init_from
        && dir.join(TOKENIZER_FILE).is_file()
    {
        // Continual pretraining keeps the starting checkpoint's tokenizer with the model.
        data.tokenizer =
            Some(TextTokenizer::from_file(dir.join(TOKENIZER_FILE)).map_err(data_error)?);
    }

    let (hlat, resumed) = match &resume_from {
        Some(dir) => {
            log::info!("resuming from {}", dir.display());
            let hlat = load_model::<B>(&dir.join(MODEL_DIR), device)?;
            (hlat, Some(read_state(dir)?))
        }
        None => (
            initial_model::<B>(options, data.tokenizer.as_ref(), device)?,
            None,
        ),
    };
    check_fit(hlat.config(), config, data.vocab_size)?;
    let flops_per_token = hlat.config().train_flops_per_token(config.seq_len);
    log::info!(
        "model: {} parameters, {} layers, hidden {}, vocab {}; {} steps of {} tokens ({} x {} rows \
         of {} tokens), precision {}",
        hlat.config().num_params(),
        hlat.config().num_layers,
        hlat.config().hidden_size,
        hlat.config().vocab_size,
        config.max_steps,
        config.batch_tokens,
        config.accumulation_steps(),
        config.micro_batch_rows,
        config.seq_len,
        config.precision,
    );

    let hlat = cast_params(hlat, config.precision.param_dtype());
    let model = match &tensor_parallel {
        Some(parallel) => {
            hlat::parallel::check_degree(hlat.config(), layout.tensor)
                .map_err(|reason| TrainError::Mismatch(format!("tensor_parallel: {reason}")))?;
            let hlat = hlat.shard(parallel);
            LanguageModel::sharded(hlat, config.precision.compute_cast(), parallel.clone())
        }
        None => LanguageModel::new(hlat, config.precision.compute_cast()),
    };
    let model = LanguageModel {
        checkpointing: config.activation_checkpointing,
        ..model
    };
    let schedule = WarmupCosine {
        peak: config.lr,
        warmup_steps: config.warmup_steps,
        decay_steps: config
            .decay_steps
            .unwrap_or(config.max_steps.saturating_sub(config.warmup_steps)),
        min_ratio: config.min_lr_ratio,
    };
    let trainer = Trainer::new(
        model,
        AdamWSettings::from_config(config),
        schedule,
        config.clip_grad_norm,
        config.seed,
        config.max_consecutive_skips,
    );
    let mut trainer = trainer.with_layout(layout);
    if let (Some(dir), Some(state)) = (&resume_from, resumed) {
        if state.precision != config.precision {
            return Err(TrainError::Checkpoint {
                path: dir.clone(),
                message: format!(
                    "was trained in {} precision, this run asks for {}",
                    state.precision, config.precision
                ),
            });
        }
        trainer.optimizer = load_optimizer(
            dir,
            trainer.optimizer,
            &trainer.model,
            &trainer.layout,
            device,
        )?;
        if state.schedule != trainer.schedule {
            let next = state.progress.step + 1;
            log::warn!(
                "{}: the learning-rate schedule changed (--max-steps is the schedule's length): \
                 the checkpoint was trained on {}, this run follows {}; step {next} uses lr {:.3e} \
                 instead of {:.3e}",
                dir.display(),
                state.schedule,
                trainer.schedule,
                trainer.schedule.lr(next),
                state.schedule.lr(next),
            );
        }
        trainer.progress = state.progress;
        trainer.seed = state.seed;
        data.train
            .restore(state.sampler)
            .map_err(|error| TrainError::Data(error.to_string()))?;
    }
    config.save_toml(&options.out.join(RUN_CONFIG_FILE))?;

    let start_step = trainer.progress.step;
    let mut summary = PretrainSummary {
        start_step,
        end_step: start_step,
        losses: Vec::new(),
        grad_norms: Vec::new(),
        val_loss: None,
        checkpoint: None,
    };
    if start_step >= config.max_steps {
        log::info!(
            "{} is already at step {start_step} of {}; nothing to do",
            options.out.display(),
            config.max_steps
        );
        return Ok(summary);
    }
    let validation = data
        .validation
        .as_ref()
        .map(|rows| validation_rows(rows.as_ref(), config.eval_rows));
    let mut metrics_log = MetricsLog::open(&options.out, start_step)?;
    let view = LiveView::new(start_step, config.max_steps, config.progress);

    while trainer.progress.step < config.max_steps {
        let rows = data.train.next_batch(config.rows_per_step());
        let micro_batches = micro_batches(&rows, config, device);
        let started = Instant::now();
        let report = trainer.train_step(micro_batches)?;
        let seconds = started.elapsed().as_secs_f64();
        let step = report.step;
        let last = step == config.max_steps;

        let val_loss = match &validation {
            Some(rows) if config.eval_every > 0 && (step % config.eval_every == 0 || last) => {
                let model = trainer.model.valid();
                let batches = rows
                    .chunks(config.micro_batch_rows)
                    .map(|chunk| LmBatch::from_rows(chunk, device))
                    .collect();
                Some(evaluate(&model, batches))
            }
            _ => None,
        };
        let tokens_per_s = report.tokens as f64 / seconds;
        let metrics = StepMetrics {
            step,
            loss: report.loss,
            perplexity: report.loss.exp(),
            lr: report.lr,
            grad_norm: report.grad_norm,
            tokens: report.tokens,
            tokens_seen: trainer.progress.tokens_seen,
            tokens_per_s,
            mfu: config
                .peak_flops
                .map(|peak| tokens_per_s * flops_per_token / peak),
            compiles: info.compiles.map(|count| count()),
            skipped: report.skipped,
            val_loss,
            val_perplexity: val_loss.map(f64::exp),
        };
        metrics_log.append(&metrics)?;
        view.update(&metrics);
        if let Some(val_loss) = val_loss {
            view.println(format!(
                "step {step}: validation loss {val_loss:.4}, perplexity {:.2}",
                val_loss.exp()
            ));
            summary.val_loss = Some(val_loss);
        }
        summary.losses.push(report.loss);
        summary.grad_norms.push(report.grad_norm);
        summary.end_step = step;

        if last || (config.checkpoint_every > 0 && step % config.checkpoint_every == 0) {
            let dir = save_checkpoint(
                &checkpoints,
                &trainer,
                &data,
                config.keep_checkpoints,
                config.precision,
            )?;
            view.println(format!("step {step}: checkpoint {}", dir.display()));
            summary.checkpoint = Some(dir);
        }
    }
    view.finish();
    Ok(summary)
}

/// The micro-batches of one step: `rows` cut into one contiguous slice per data-parallel rank,
/// each slice into micro-batches of `micro_batch_rows` rows; the tensor-parallel ranks of one
/// model replica see the same rows.
fn micro_batches<B: TrainingBackend>(
    rows: &[Vec<u32>],
    config: &TrainConfig,
    device: &B::Device,
) -> Vec<LmBatch<B>> {
    let slices = split_rows(rows, config.data_parallel);
    (0..config.accumulation_steps())
        .map(|index| {
            let span = index * config.micro_batch_rows..(index + 1) * config.micro_batch_rows;
            let rows: Vec<Vec<u32>> = slices
                .iter()
                .flat_map(|slice| slice[span.clone()].iter().cloned())
                .collect();
            LmBatch::for_layout(&rows, &config.layout(), device)
        })
        .collect()
}

/// Writes a checkpoint of the trainer and the sampler position.
fn save_checkpoint<B: TrainingBackend>(
    checkpoints: &RunCheckpoints,
    trainer: &Trainer<B>,
    data: &PreparedData,
    keep: usize,
    precision: crate::precision::Precision,
) -> Result<PathBuf, TrainError> {
    let state = CheckpointState {
        progress: trainer.progress,
        schedule: trainer.schedule,
        sampler: data.train.state(),
        seed: trainer.seed,
        precision,
    };
    checkpoints.publish(trainer.progress.step, keep, |dir| {
        let model_dir = dir.join(MODEL_DIR);
        // Saved whole (a tensor-parallel model is joined first, so any layout resumes from it)
        // and in f32 whatever the training precision (bf16 -> f32 is exact; the loader casts
        // back), so that any tool can read the model.
        let hlat = trainer.model.hlat.valid();
        let hlat = match &trainer.model.tensor_parallel {
            Some(parallel) => hlat.unshard(parallel),
            None => hlat,
        };
        let hlat = cast_params(hlat, DType::F32);
        hlat::checkpoint::save_native(&hlat, hlat.config(), &model_dir)
            .map_err(|error| TrainError::Model(error.to_string()))?;
        if let Some(tokenizer) = &data.tokenizer {
            tokenizer
                .save(model_dir.join(TOKENIZER_FILE))
                .map_err(|error| TrainError::Data(error.to_string()))?;
        }
        save_optimizer(dir, &trainer.optimizer, &trainer.model, &trainer.layout)?;
        write_state(dir, &state)
    })
}

/// A native checkpoint folder's model.
fn load_model<B: TrainingBackend>(dir: &Path, device: &B::Device) -> Result<Hlat<B>, TrainError> {
    hlat::checkpoint::load_native(dir, device)
        .map(|(_, model)| model)
        .map_err(|error| TrainError::Model(format!("{}: {error}", dir.display())))
}

/// The model a fresh run starts from: `--init-from-hf`'s checkpoint, or the preset sized to the
/// tokenizer's vocabulary and special tokens.
fn initial_model<B: TrainingBackend>(
    options: &PretrainOptions,
    tokenizer: Option<&TextTokenizer>,
    device: &B::Device,
) -> Result<Hlat<B>, TrainError> {
    if let Some(dir) = &options.init_from {
        log::info!("continual pretraining from {}", dir.display());
        return hlat::checkpoint::load_any::<B>(dir, device)
            .map(|(_, model, _)| model)
            .map_err(|error| TrainError::Model(format!("{}: {error}", dir.display())));
    }
    let mut model_config = HlatConfig::preset(&options.config.preset)
        .map_err(|error| TrainError::Model(error.to_string()))?;
    if let Some(tokenizer) = tokenizer {
        model_config.vocab_size = tokenizer.vocab_size();
        let special = |id: Result<u32, _>| {
            id.map_err(|error: crate::data::DataError| TrainError::Data(error.to_string()))
        };
        model_config.bos_token_id = special(tokenizer.bos_id())?;
        model_config.eos_token_id = special(tokenizer.eos_id())?;
        model_config.pad_token_id = tokenizer.pad_id().ok();
    }
    model_config
        .validate()
        .map_err(|error| TrainError::Model(error.to_string()))?;
    <B as burn::tensor::backend::Backend>::seed(device, options.config.seed);
    Ok(model_config.init(device))
}

/// Checks that the rows fit the model: sequence length and token ids.
fn check_fit(
    model: &HlatConfig,
    config: &TrainConfig,
    data_vocab: usize,
) -> Result<(), TrainError> {
    if config.seq_len > model.max_seq_len {
        return Err(TrainError::Mismatch(format!(
            "seq_len {} is longer than the model's context of {} tokens",
            config.seq_len, model.max_seq_len
        )));
    }
    if data_vocab > model.vocab_size {
        return Err(TrainError::Mismatch(format!(
            "the data uses a vocabulary of {data_vocab} tokens, the model has {}",
            model.vocab_size
        )));
    }
    Ok(())
}

/// The first `count` rows of the validation source (fewer if it has fewer).
fn validation_rows(rows: &dyn RowSource, count: usize) -> Vec<Vec<u32>> {
    (0..count.min(rows.num_rows()))
        .map(|index| rows.row(index))
        .collect()
}

/// The built-in corpus of a run: a fixed budget of training tokens (longer runs repeat it) and of
/// validation tokens, whatever the run's length, so that a resumed or extended run and `hlat
/// eval` see the same documents on the same side of the split.
fn builtin_config(config: &TrainConfig) -> BuiltinDataConfig {
    let row = config.seq_len + 1;
    BuiltinDataConfig {
        seq_len: config.seq_len,
        train_tokens: BUILTIN_TRAIN_TOKENS.max(row),
        validation_tokens: BUILTIN_VALIDATION_TOKENS.max(row),
        seed: config.seed,
    }
}

fn data_error(error: crate::data::DataError) -> TrainError {
    TrainError::Data(error.to_string())
}

/// Builds the training sampler, the validation rows and the tokenizer.
fn prepare_data(choice: &DataChoice, config: &TrainConfig) -> Result<PreparedData, TrainError> {
    match choice {
        DataChoice::Builtin => {
            let dataset = builtin_dataset(&builtin_config(config)).map_err(data_error)?;
            let vocab_size = dataset.tokenizer.vocab_size();
            let train: Box<dyn RowSource> = Box::new(dataset.train);
            Ok(PreparedData {
                train: Sampler::new(train, config.seed).map_err(data_error)?,
                validation: Some(Box::new(dataset.validation)),
                tokenizer: Some(dataset.tokenizer),
                vocab_size,
            })
        }
        DataChoice::Shards(sources) => {
            let mut train = Vec::new();
            let mut vocab_size = 0;
            for source in sources {
                let shards =
                    ShardSet::open_split(&source.folder, Split::Train).map_err(data_error)?;
                vocab_size = vocab_size.max(shards.vocab_size() as usize);
                let rows = PackedRows::new(shards, config.seq_len).map_err(data_error)?;
                log::info!(
                    "data `{}`: {} training rows, weight {}",
                    source.name,
                    rows.num_rows(),
                    source.weight
                );
                train.push((Box::new(rows) as Box<dyn RowSource>, source.weight));
            }
            let train = mix(train, config.seed).map_err(data_error)?;
            let validation = match shard_validation(sources, config) {
                Ok(rows) => Some(rows),
                Err(error) => {
                    log::warn!("no validation: {error}");
                    None
                }
            };
            let tokenizer_path = sources[0].folder.join(TOKENIZER_FILE);
            let tokenizer = if tokenizer_path.is_file() {
                Some(TextTokenizer::from_file(&tokenizer_path).map_err(data_error)?)
            } else {
                log::warn!(
                    "{} not found: the checkpoints will hold no tokenizer",
                    tokenizer_path.display()
                );
                None
            };
            Ok(PreparedData {
                train: Sampler::new(train, config.seed).map_err(data_error)?,
                validation,
                tokenizer,
                vocab_size,
            })
        }
    }
}

/// The validation rows of a data choice, as a run with `config` splits them.
pub fn validation_source(
    choice: &DataChoice,
    config: &TrainConfig,
) -> Result<Box<dyn RowSource>, TrainError> {
    match choice {
        DataChoice::Builtin => Ok(Box::new(
            builtin_dataset(&builtin_config(config))
                .map_err(data_error)?
                .validation,
        )),
        DataChoice::Shards(sources) => shard_validation(sources, config),
    }
}

/// The validation splits of shard folders, mixed by the same weights as training.
fn shard_validation(
    sources: &[DataSource],
    config: &TrainConfig,
) -> Result<Box<dyn RowSource>, TrainError> {
    let mut validation = Vec::new();
    for source in sources {
        let shards = ShardSet::open_split(&source.folder, Split::Validation).map_err(data_error)?;
        let rows = PackedRows::new(shards, config.seq_len).map_err(data_error)?;
        validation.push((Box::new(rows) as Box<dyn RowSource>, source.weight));
    }
    mix(validation, config.seed).map_err(data_error)
}

/// One source as is, several mixed by weight.
fn mix(
    mut sources: Vec<(Box<dyn RowSource>, f64)>,
    seed: u64,
) -> Result<Box<dyn RowSource>, crate::data::DataError> {
    if sources.len() == 1 {
        return Ok(sources.remove(0).0);
    }
    Ok(Box::new(Mixture::new(sources, seed)?))
}
