//! Setting a pretraining run up: the model (fresh from a preset, imported for continual
//! pretraining, or resumed from the newest checkpoint) split for the run's layout, the optimizer
//! and schedule, and the counters and sampler position it starts from.

use std::path::Path;

use burn::tensor::Device;
use hlat::checkpoint::run_folder::MODEL_DIR;
use hlat::fully_sharded::FullySharded;
use hlat::lora::LoraConfig;
use hlat::{Hlat, HlatConfig};

use crate::checkpoint_state::{load_optimizer, read_state};
use crate::config::TrainConfig;
use crate::data::{SamplerState, TextTokenizer};
use crate::error::TrainError;
use crate::language_model::LanguageModel;
use crate::optimizer::{AdamWSettings, HlatAdamW, HlatOptimizer};
use crate::parallel::ParallelLayout;
use crate::precision::cast_params;
use crate::progress::TrainingProgress;
use crate::schedule::WarmupCosine;

use super::data::data_error;
use super::{ADAPTER_DIR, PretrainOptions};

/// Everything a run starts from besides its data.
pub(super) struct RunStart {
    /// The model, split as the run's layout says.
    pub model: LanguageModel,
    /// The optimizer with its state (fresh, or the checkpoint's resharded to the layout).
    pub optimizer: HlatOptimizer,
    /// The learning-rate schedule this run follows.
    pub schedule: WarmupCosine,
    /// Step and token counters.
    pub progress: TrainingProgress,
    /// The seed of the per-step randomness.
    pub seed: u64,
    /// Where the training sampler stands.
    pub sampler: SamplerState,
    /// Training FLOPs per token of the model at the run's sequence length.
    pub flops_per_token: f64,
}

/// Sets the run up on `device` (an autodiff device: the run trains there), resuming from
/// `resume_from` (a complete checkpoint folder) when given.
pub(super) fn start_run(
    options: &PretrainOptions,
    tokenizer: Option<&TextTokenizer>,
    vocab_size: usize,
    resume_from: Option<&Path>,
    device: &Device,
) -> Result<RunStart, TrainError> {
    let config = &options.config;
    let layout = config.layout();
    let resumed = resume_from.map(read_state).transpose()?;
    let hlat = match resume_from {
        Some(dir) => {
            log::info!("resuming from {}", dir.display());
            load_model(&dir.join(MODEL_DIR), device)?
        }
        None => initial_model(options, tokenizer, device)?,
    };
    check_fit(hlat.config(), config, vocab_size)?;
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

    let hlat = match &config.lora {
        Some(lora) => {
            // A resumed run continues from its checkpoint's adapter, a fresh one from
            // `init_adapter` when given.
            let adapter = match resume_from {
                Some(dir) => Some(dir.join(ADAPTER_DIR)),
                None => options.init_adapter.clone(),
            };
            attach_lora(hlat, lora, adapter.as_deref(), config.seed, device)?
        }
        None => hlat,
    };
    refuse_unsupported_mixture(hlat.config(), config)?;
    let model = split_for_tensor_parallel(hlat, config)?;
    let pipeline = layout
        .pipeline_parallel(
            model.hlat.config().num_layers,
            config.pipeline_layers.clone(),
            config.virtual_stages,
        )
        .map_err(|reason| TrainError::Mismatch(format!("pipeline_parallel: {reason}")))?;
    let hlat = match &pipeline {
        Some(pipeline) => model
            .hlat
            .into_stages(pipeline)
            .map_err(|reason| TrainError::Mismatch(format!("pipeline_layers: {reason}")))?,
        None => model.hlat,
    };
    let model = LanguageModel {
        hlat,
        checkpointing: config.activation_checkpointing,
        pipeline,
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
    let optimizer = HlatOptimizer::new(
        HlatAdamW::new(AdamWSettings::from_config(config)).partitioned_for(&layout),
    );
    let fresh_sampler = SamplerState {
        epoch: 0,
        position: 0,
        seed: config.seed,
    };
    let (Some(dir), Some(state)) = (resume_from, resumed) else {
        let (model, optimizer) = split_experts(model, optimizer, &layout);
        let model = shard_fully(model, config);
        return Ok(RunStart {
            model,
            optimizer,
            schedule,
            progress: TrainingProgress::default(),
            seed: config.seed,
            sampler: fresh_sampler,
            flops_per_token,
        });
    };
    if state.precision != config.precision {
        return Err(TrainError::Checkpoint {
            path: dir.to_path_buf(),
            message: format!(
                "was trained in {} precision, this run asks for {}",
                state.precision, config.precision
            ),
        });
    }
    let optimizer = load_optimizer(
        dir,
        state.processes,
        optimizer,
        &model,
        &layout,
        model.pipeline.as_ref(),
        device,
    )?;
    let (model, optimizer) = split_experts(model, optimizer, &layout);
    let model = shard_fully(model, config);
    if state.schedule != schedule {
        let next = state.progress.step + 1;
        log::warn!(
            "{}: the learning-rate schedule changed (--max-steps is the schedule's length): the \
             checkpoint was trained on {}, this run follows {schedule}; step {next} uses lr \
             {:.3e} instead of {:.3e}",
            dir.display(),
            state.schedule,
            schedule.lr(next),
            state.schedule.lr(next),
        );
    }
    Ok(RunStart {
        model,
        optimizer,
        schedule,
        progress: state.progress,
        seed: state.seed,
        sampler: state.sampler,
        flops_per_token,
    })
}

/// `hlat` as the run computes with it: the run's capacity factor, parameters in the run's
/// precision, split over the tensor-parallel ranks.
fn split_for_tensor_parallel(
    hlat: Hlat,
    config: &TrainConfig,
) -> Result<LanguageModel, TrainError> {
    let layout = config.layout();
    let hlat = hlat.with_moe_capacity_factor(config.moe_capacity_factor);
    let hlat = cast_params(hlat, config.precision.param_dtype());
    Ok(match layout.tensor_parallel() {
        Some(parallel) => {
            hlat::parallel::check_degree(hlat.config(), layout.tensor)
                .map_err(|reason| TrainError::Mismatch(format!("tensor_parallel: {reason}")))?;
            let hlat = hlat.shard(&parallel);
            LanguageModel::sharded(hlat, config.precision.compute_cast(), parallel)
        }
        None => LanguageModel::new(hlat, config.precision.compute_cast()),
    })
}

/// The frozen reference model of a preference run, from the model folder `dir` (Hugging Face,
/// native, or a run folder's checkpoint `model/` already resolved), laid out on `device`
/// (without autodiff) as the run lays its policy out, without adapters and dropless (its
/// log-probabilities must not depend on which pairs share its batches). A LoRA run's checkpoint
/// is refused (its `model/` lacks the adapter), as is a model the rows do not fit.
pub(super) fn reference_model(
    dir: &Path,
    config: &TrainConfig,
    vocab_size: usize,
    device: &Device,
) -> Result<LanguageModel, TrainError> {
    log::info!("reference model: {}", dir.display());
    super::refuse_lora_checkpoint(dir, &format!("reference model {}", dir.display()))?;
    let (_, hlat, _) = hlat::checkpoint::load_any(dir, device)
        .map_err(|error| TrainError::Model(format!("{}: {error}", dir.display())))?;
    check_fit(hlat.config(), config, vocab_size).map_err(|error| {
        TrainError::Mismatch(format!("reference model {}: {error}", dir.display()))
    })?;
    let dropless = TrainConfig {
        moe_capacity_factor: None,
        ..config.clone()
    };
    let model = split_for_tensor_parallel(hlat, &dropless)?;
    Ok(match config.layout().expert_parallel() {
        Some(parallel) => LanguageModel {
            hlat: model.hlat.split_experts(&parallel),
            ..model
        },
        None => model,
    })
}

/// `hlat` with its weights frozen and LoRA adapters attached: fresh ones (PEFT's
/// initialisation, drawn from `seed`), or those of the PEFT adapter folder `adapter_dir` (a
/// resumed checkpoint's `adapter/`, or `hlat finetune --adapter`), which must have the run's
/// shape.
fn attach_lora(
    hlat: Hlat,
    lora: &LoraConfig,
    adapter_dir: Option<&Path>,
    seed: u64,
    device: &Device,
) -> Result<Hlat, TrainError> {
    let Some(adapter_dir) = adapter_dir else {
        device.seed(seed);
        log::info!(
            "LoRA: rank {}, alpha {}, dropout {}, targets {}; the model's weights are frozen",
            lora.rank,
            lora.alpha,
            lora.dropout,
            lora.targets
                .iter()
                .map(|target| target.short_name())
                .collect::<Vec<_>>()
                .join(",")
        );
        return Ok(hlat.with_lora(lora, device));
    };
    let adapter_dir = adapter_dir.to_path_buf();
    let (stored, hlat) =
        hlat::hf::adapter::load_adapter(hlat, &adapter_dir, device).map_err(|error| {
            TrainError::Checkpoint {
                path: adapter_dir.clone(),
                message: error.to_string(),
            }
        })?;
    if (stored.rank, stored.alpha, &stored.targets, stored.rslora)
        != (lora.rank, lora.alpha, &lora.targets, lora.rslora)
    {
        return Err(TrainError::Checkpoint {
            path: adapter_dir,
            message: format!(
                "holds an adapter of rank {}, alpha {}, targets {:?}; this run asks for rank {}, \
                 alpha {}, targets {:?}",
                stored.rank, stored.alpha, stored.targets, lora.rank, lora.alpha, lora.targets
            ),
        });
    }
    Ok(hlat)
}

/// A native checkpoint folder's model.
fn load_model(dir: &Path, device: &Device) -> Result<Hlat, TrainError> {
    hlat::checkpoint::load_native(dir, device)
        .map(|(_, model)| model)
        .map_err(|error| TrainError::Model(format!("{}: {error}", dir.display())))
}

/// The model a fresh run starts from: `--init-from-hf`'s checkpoint, or the preset sized to the
/// tokenizer's vocabulary and special tokens.
fn initial_model(
    options: &PretrainOptions,
    tokenizer: Option<&TextTokenizer>,
    device: &Device,
) -> Result<Hlat, TrainError> {
    if let Some(dir) = &options.init_from {
        log::info!("starting from {}", dir.display());
        return hlat::checkpoint::load_any(dir, device)
            .map(|(_, model, _)| model)
            .map_err(|error| TrainError::Model(format!("{}: {error}", dir.display())));
    }
    let mut model_config = HlatConfig::preset(&options.config.preset)
        .map_err(|error| TrainError::Model(error.to_string()))?;
    if let Some(tokenizer) = tokenizer {
        model_config.vocab_size = tokenizer.vocab_size();
        model_config.eos_token_id = tokenizer.eos_id().map_err(data_error)?;
        // A tokenizer without BOS (Qwen's) names its EOS in the model's `bos_token_id`, as
        // Qwen's config.json does.
        model_config.bos_token_id = tokenizer.bos_id().unwrap_or(model_config.eos_token_id);
        model_config.pad_token_id = tokenizer.pad_id().ok();
    }
    model_config
        .validate()
        .map_err(|error| TrainError::Model(error.to_string()))?;
    device.seed(options.config.seed);
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

/// `model` with its experts split over `layout`'s expert-parallel groups, and the optimizer
/// state of the whole set of experts (a resumed checkpoint's) split with them; unchanged
/// without expert parallelism.
fn split_experts(
    model: LanguageModel,
    optimizer: HlatOptimizer,
    layout: &ParallelLayout,
) -> (LanguageModel, HlatOptimizer) {
    let Some(parallel) = layout.expert_parallel() else {
        return (model, optimizer);
    };
    let whole = model.hlat.clone();
    let hlat = model.hlat.split_experts(&parallel);
    let mut record = optimizer.to_record();
    crate::parallel::reshard_expert_states(
        &hlat,
        &whole,
        &mut record,
        (
            crate::parallel::ExpertStates::Split,
            layout.zero1_of_experts().as_ref(),
        ),
    );
    (
        LanguageModel { hlat, ..model },
        optimizer.load_record(record),
    )
}

/// `model` with its parameters cut into this rank's slices over the data-parallel groups under
/// fully sharded data parallelism (the optimizer state, fresh or a checkpoint's split as
/// ZeRO-1's, already has the slices' shapes); unchanged otherwise.
fn shard_fully(model: LanguageModel, config: &TrainConfig) -> LanguageModel {
    let Some(groups) = config.layout().fully_sharded_groups() else {
        return model;
    };
    if config.zero1 {
        log::warn!(
            "fsdp replaces zero1: the optimizer state is partitioned over the data-parallel \
             replicas with the parameters"
        );
    }
    let (hlat, sharded) = FullySharded::shard(model.hlat, groups);
    log::info!(
        "fsdp: each replica keeps 1/{} of every parameter ({} elements), gathering each layer's \
         whole just before it runs",
        sharded.shards.degree(),
        sharded.slice_elements(),
    );
    LanguageModel {
        hlat,
        fully_sharded: Some(sharded),
        ..model
    }
}

/// What a mixture-of-experts model does not train with, refused by the setting's name before
/// anything runs: LoRA adapters PEFT could not load ([`LoraConfig::check_for_mixture`]), and
/// expert parallelism of a dense model or of experts it does not divide. (Pipeline stages that
/// would pad a mixture, or mix dense and sparse layers in a slot, are refused when the model is
/// cut: `Hlat::into_stages`.)
fn refuse_unsupported_mixture(model: &HlatConfig, config: &TrainConfig) -> Result<(), TrainError> {
    let Some(moe) = &model.moe else {
        if config.expert_parallel > 1 {
            return Err(TrainError::Mismatch(format!(
                "expert_parallel: the {} model is dense (no experts to split)",
                model.family
            )));
        }
        return match config.moe_capacity_factor {
            Some(_) => Err(TrainError::Mismatch(format!(
                "moe_capacity_factor: the {} model is dense (no mixture of experts to route)",
                model.family
            ))),
            None => Ok(()),
        };
    };
    if !moe.num_experts.is_multiple_of(config.expert_parallel) {
        return Err(TrainError::Mismatch(format!(
            "expert_parallel: the {} model's {} experts do not divide by the expert-parallel \
             degree {}",
            model.family, moe.num_experts, config.expert_parallel
        )));
    }
    if let Some(lora) = &config.lora
        && let Err(reason) = lora.check_for_mixture()
    {
        return Err(TrainError::Mismatch(format!(
            "lora targets: a mixture-of-experts model ({}): {reason}",
            model.family
        )));
    }
    Ok(())
}
