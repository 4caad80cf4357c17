//! The training configuration: HLAT's recipe as defaults, read from TOML and overridden by flags.

use std::path::{Path, PathBuf};

use hlat::pipeline::PipelineSchedule;
use hlat::recompute::ActivationCheckpointing;
use serde::{Deserialize, Serialize};

use crate::error::TrainError;
use crate::precision::Precision;

/// Everything that defines a training run except the model architecture and the data.
///
/// `TrainConfig::default()` is HLAT's recipe (arXiv 2404.10630): AdamW β 0.9/0.95, eps 1e-8,
/// weight decay 0.1 on every parameter, peak LR 3e-4, 2000 warmup steps then cosine decay to 10%
/// of the peak, global-norm clipping at 1.0, rows of 4096 tokens and a global batch of 4M tokens.
/// A TOML file holds any subset of these fields (same names); missing ones keep the recipe value,
/// unknown ones are an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Model preset trained from scratch when neither a checkpoint nor `--init-from-hf` is given.
    pub preset: String,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warmup steps from 0 to `lr`.
    pub warmup_steps: u64,
    /// Steps of the cosine decay after warmup; `None` decays over the rest of `max_steps`.
    pub decay_steps: Option<u64>,
    /// Final learning rate as a fraction of the peak.
    pub min_lr_ratio: f64,
    /// Optimizer steps of the run.
    pub max_steps: u64,
    /// AdamW β1.
    pub beta1: f64,
    /// AdamW β2.
    pub beta2: f64,
    /// AdamW ε (added to the bias-corrected √v, as torch does).
    pub eps: f64,
    /// Decoupled weight decay (`p -= lr * wd * p`).
    pub weight_decay: f64,
    /// Leaves the norm gains (the one-dimensional parameters) out of weight decay.
    pub exclude_norms_from_weight_decay: bool,
    /// Global gradient norm bound; 0 disables clipping.
    pub clip_grad_norm: f64,
    /// Tokens per row (the model sees `seq_len` inputs and `seq_len` shifted targets).
    pub seq_len: usize,
    /// Tokens per optimizer step (the global batch, over every data-parallel replica); must be a
    /// multiple of `seq_len * micro_batch_rows * data_parallel`.
    pub batch_tokens: usize,
    /// Rows per forward/backward pass on each data-parallel replica; the gradients of
    /// `batch_tokens / (seq_len * micro_batch_rows * data_parallel)` passes are accumulated into
    /// one optimizer step.
    pub micro_batch_rows: usize,
    /// Data-parallel degree: model replicas that each take their slice of the global batch and
    /// average their gradients with one bucketed all-reduce per step.
    pub data_parallel: usize,
    /// Expert-parallel degree: the data-parallel replicas a mixture's experts are split over
    /// (NeuronX Distributed's layout: expert-parallel ranks are data-parallel ranks, so it must
    /// divide `data_parallel`); tokens reach their experts by all-to-all in the step's program.
    pub expert_parallel: usize,
    /// Tensor-parallel degree: the device replicas that split one model replica's weights
    /// (Megatron's column- and row-parallel layers, vocabulary-parallel embedding and loss). The
    /// device has `data_parallel * tensor_parallel` replicas.
    pub tensor_parallel: usize,
    /// Pipeline-parallel degree: the stages the decoder layers are cut into, each on its own
    /// replicas (the device has `data_parallel * tensor_parallel * pipeline_parallel`).
    pub pipeline_parallel: usize,
    /// Layers of each (virtual) stage, in order; `None` cuts them evenly.
    pub pipeline_layers: Option<Vec<usize>>,
    /// The order the stages run the micro-batches in: `1f1b` or `interleaved`.
    pub pipeline_schedule: PipelineSchedule,
    /// Chunks of layers per stage under the interleaved schedule (1 otherwise).
    pub virtual_stages: usize,
    /// Sequence parallelism: norms and residuals on slices of the sequence inside each
    /// tensor-parallel group (needs `tensor_parallel > 1`; `seq_len` must divide by it).
    pub sequence_parallel: bool,
    /// ZeRO-1: the AdamW state partitioned over the data-parallel replicas (needs
    /// `data_parallel > 1`).
    pub zero1: bool,
    /// Fully sharded data parallelism (FSDP2, ZeRO-3): parameters, gradients and optimizer state
    /// partitioned over the data-parallel replicas, each layer's weights gathered just before
    /// use (needs `data_parallel > 1`; replaces `zero1`).
    pub fsdp: bool,
    /// What the backward pass recomputes instead of keeping: `none`, `full` (each layer from
    /// its input) or `selective` (the attention core and the MLP activation).
    pub activation_checkpointing: ActivationCheckpointing,
    /// Parameter and compute precision.
    pub precision: Precision,
    /// Seed of the model initialisation, the data order and the stochastic rounding.
    pub seed: u64,
    /// Save a checkpoint every this many steps (and always at the end); 0 saves only at the end.
    pub checkpoint_every: u64,
    /// Checkpoints kept; older ones are deleted.
    pub keep_checkpoints: usize,
    /// Write checkpoints in the background: the step loop waits only while the checkpoint is
    /// copied into host memory, then trains on while a thread writes it (one at a time; the next
    /// checkpoint waits for the previous write).
    pub async_checkpoint: bool,
    /// A checkpoint that cannot be written (a full disk, an unwritable folder) is reported and
    /// training goes on without it, instead of stopping the run; the run's last checkpoint must
    /// still be written.
    pub continue_on_checkpoint_error: bool,
    /// Measure validation loss every this many steps (and at the end); 0 disables validation.
    pub eval_every: u64,
    /// Validation rows measured each time.
    pub eval_rows: usize,
    /// The run stops with an error after this many consecutive non-finite steps.
    pub max_consecutive_skips: u32,
    /// Peak FLOP/s of the device, the denominator of MFU; `None` reports no MFU.
    pub peak_flops: Option<f64>,
    /// Show training live: Burn's dashboard in an interactive terminal (feature `dashboard`),
    /// else a progress bar.
    pub progress: bool,
    /// LoRA adapters (`hlat finetune --lora-rank`): the model's weights frozen, adapters of this
    /// shape trained on its projections; `None` trains every weight.
    pub lora: Option<hlat::lora::LoraConfig>,
    /// A mixture of experts' capacity factor: each expert takes at most this multiple of its
    /// even share of the tokens (`tokens · k / experts`), the assignments past it dropped as
    /// GShard drops them, for `capacity / tokens` of the dropless expert FLOPs; `None` routes
    /// dropless (every token to its experts, exactly as transformers computes it).
    pub moe_capacity_factor: Option<f64>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            preset: "hlat-7b".to_string(),
            lr: 3e-4,
            warmup_steps: 2000,
            decay_steps: None,
            min_lr_ratio: 0.1,
            max_steps: 250_000,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            exclude_norms_from_weight_decay: false,
            clip_grad_norm: 1.0,
            seq_len: 4096,
            batch_tokens: 4 * 1024 * 1024,
            micro_batch_rows: 1,
            data_parallel: 1,
            expert_parallel: 1,
            tensor_parallel: 1,
            pipeline_parallel: 1,
            pipeline_layers: None,
            pipeline_schedule: PipelineSchedule::OneForwardOneBackward,
            virtual_stages: 1,
            sequence_parallel: false,
            zero1: false,
            fsdp: false,
            activation_checkpointing: ActivationCheckpointing::None,
            precision: Precision::Bf16StochasticRounding,
            seed: 42,
            checkpoint_every: 1000,
            keep_checkpoints: 3,
            async_checkpoint: false,
            continue_on_checkpoint_error: false,
            eval_every: 1000,
            eval_rows: 64,
            max_consecutive_skips: 10,
            peak_flops: None,
            progress: true,
            lora: None,
            moe_capacity_factor: None,
        }
    }
}

impl TrainConfig {
    /// The profile of `hlat pretrain` without `--config`: the `hlat-tiny` preset on short rows,
    /// sized to show a clearly falling loss within minutes on two CPU cores. Every other value is
    /// HLAT's recipe.
    pub fn quickstart() -> Self {
        Self {
            preset: "hlat-tiny".to_string(),
            lr: 3e-3,
            warmup_steps: 20,
            max_steps: 200,
            seq_len: 128,
            batch_tokens: 16 * 128,
            micro_batch_rows: 16,
            precision: Precision::F32,
            checkpoint_every: 50,
            keep_checkpoints: 2,
            eval_every: 50,
            eval_rows: 32,
            ..Self::default()
        }
    }

    /// Reads a TOML file; fields it leaves out keep the value of `base`.
    pub fn load_toml(path: &Path, base: &TrainConfig) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let overrides: toml::Table = toml::from_str(&text).map_err(|error| TrainError::Config {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
        let mut merged = toml::Table::try_from(base).map_err(|error| TrainError::Config {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
        merged.extend(overrides);
        let config: TrainConfig =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|error: toml::de::Error| TrainError::Config {
                    path: path.to_path_buf(),
                    message: error.to_string(),
                })?;
        config.validate()?;
        Ok(config)
    }

    /// How the device's replicas share the work.
    pub fn layout(&self) -> crate::parallel::ParallelLayout {
        crate::parallel::ParallelLayout {
            data: self.data_parallel,
            expert: self.expert_parallel,
            tensor: self.tensor_parallel,
            pipeline: self.pipeline_parallel,
            sequence_parallel: self.sequence_parallel,
            zero1: self.zero1,
            fsdp: self.fsdp,
        }
    }

    /// Rows per optimizer step.
    pub fn rows_per_step(&self) -> usize {
        self.batch_tokens / self.seq_len
    }

    /// Forward/backward passes accumulated into one optimizer step (on each replica).
    pub fn accumulation_steps(&self) -> usize {
        self.rows_per_step() / (self.micro_batch_rows * self.data_parallel)
    }

    /// The layouts fully sharded data parallelism trains with: data-parallel replicas to shard
    /// over, without expert parallelism or the interleaved pipeline schedule (not supported with
    /// them yet: their ranks hold other parameters than their layers' slices name).
    fn check_fully_sharded(&self) -> Result<(), TrainError> {
        let invalid = |message: &str| {
            Err(TrainError::InvalidConfig {
                field: "fsdp",
                message: message.into(),
            })
        };
        if self.data_parallel == 1 {
            return invalid(
                "shards the parameters over the data-parallel replicas: needs a data-parallel \
                 degree above 1",
            );
        }
        if self.expert_parallel > 1 {
            return invalid("is not supported with expert parallelism yet");
        }
        if self.virtual_stages > 1 {
            return invalid("is not supported with the interleaved pipeline schedule yet");
        }
        Ok(())
    }

    /// Checks the values against each other; the error names the offending field.
    pub fn validate(&self) -> Result<(), TrainError> {
        let invalid = |field: &'static str, message: String| {
            Err(TrainError::InvalidConfig { field, message })
        };
        // Written so that NaN fails too.
        let positive = |value: f64| value.is_finite() && value > 0.0;
        let non_negative = |value: f64| value.is_finite() && value >= 0.0;
        if self.seq_len == 0 {
            return invalid("seq_len", "must be positive".into());
        }
        if self.micro_batch_rows == 0 {
            return invalid("micro_batch_rows", "must be positive".into());
        }
        if self.data_parallel == 0 {
            return invalid("data_parallel", "must be positive".into());
        }
        if self.tensor_parallel == 0 {
            return invalid("tensor_parallel", "must be positive".into());
        }
        if self.expert_parallel == 0 || !self.data_parallel.is_multiple_of(self.expert_parallel) {
            return invalid(
                "expert_parallel",
                format!(
                    "{} must divide data_parallel ({}): expert-parallel ranks are data-parallel \
                     ranks",
                    self.expert_parallel, self.data_parallel
                ),
            );
        }
        if self.pipeline_parallel == 0 {
            return invalid("pipeline_parallel", "must be positive".into());
        }
        if let Err(reason) = self.pipeline_schedule.check(self.virtual_stages) {
            return invalid("virtual_stages", reason);
        }
        if self.pipeline_parallel == 1
            && (self.pipeline_layers.is_some() || self.virtual_stages > 1)
        {
            return invalid(
                "pipeline_parallel",
                "--pp-layers and --virtual-stages need a pipeline-parallel degree above 1".into(),
            );
        }
        if self.pipeline_parallel > 1 && self.precision.compute_cast().is_some() {
            return invalid(
                "pipeline_parallel",
                format!(
                    "pipeline stages are not supported with precision {} yet (its compute copy \
                     of the parameters is not a leaf of the graph); use bf16-sr or f32",
                    self.precision
                ),
            );
        }
        if self.sequence_parallel && self.tensor_parallel == 1 {
            return invalid(
                "sequence_parallel",
                "needs a tensor-parallel degree above 1".into(),
            );
        }
        if let Some(factor) = self.moe_capacity_factor
            && !(factor.is_finite() && factor > 0.0)
        {
            return invalid(
                "moe_capacity_factor",
                format!("{factor} is not a finite positive number"),
            );
        }
        if self.zero1 && self.data_parallel == 1 {
            return invalid(
                "zero1",
                "partitions the optimizer state over data-parallel replicas: needs a \
                 data-parallel degree above 1"
                    .into(),
            );
        }
        if self.fsdp {
            self.check_fully_sharded()?;
        }
        if self.activation_checkpointing != ActivationCheckpointing::None
            && self.precision.compute_cast().is_some()
        {
            return invalid(
                "activation_checkpointing",
                format!(
                    "{} is not supported with precision {} yet (its bf16 compute copy of the \
                     parameters is not a leaf of the graph); use bf16-sr or f32",
                    self.activation_checkpointing, self.precision
                ),
            );
        }
        if self.sequence_parallel && !self.seq_len.is_multiple_of(self.tensor_parallel) {
            return invalid(
                "seq_len",
                format!(
                    "{} does not divide by the tensor-parallel degree {} (sequence parallelism)",
                    self.seq_len, self.tensor_parallel
                ),
            );
        }
        let micro_tokens = self
            .seq_len
            .checked_mul(self.micro_batch_rows)
            .and_then(|tokens| tokens.checked_mul(self.data_parallel));
        let Some(micro_tokens) = micro_tokens else {
            return invalid(
                "micro_batch_rows",
                "seq_len * micro_batch_rows * data_parallel overflows".into(),
            );
        };
        if self.batch_tokens == 0 || !self.batch_tokens.is_multiple_of(micro_tokens) {
            return invalid(
                "batch_tokens",
                format!(
                    "{} is not a positive multiple of seq_len * micro_batch_rows * data_parallel \
                     = {micro_tokens}",
                    self.batch_tokens
                ),
            );
        }
        if !positive(self.lr) {
            return invalid("lr", format!("{} is not a positive number", self.lr));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return invalid(
                "min_lr_ratio",
                format!("{} is not in [0, 1]", self.min_lr_ratio),
            );
        }
        for (field, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return invalid(field, format!("{beta} is not in [0, 1)"));
            }
        }
        if !positive(self.eps) {
            return invalid("eps", format!("{} is not positive", self.eps));
        }
        if !non_negative(self.weight_decay) {
            return invalid("weight_decay", format!("{} is negative", self.weight_decay));
        }
        if !non_negative(self.clip_grad_norm) {
            return invalid(
                "clip_grad_norm",
                format!("{} is negative", self.clip_grad_norm),
            );
        }
        if let Some(peak) = self.peak_flops
            && !positive(peak)
        {
            return invalid("peak_flops", format!("{peak} is not a positive number"));
        }
        if self.max_steps == 0 {
            return invalid("max_steps", "must be positive".into());
        }
        if self.keep_checkpoints == 0 {
            return invalid("keep_checkpoints", "must keep at least one".into());
        }
        if self.max_consecutive_skips == 0 {
            return invalid("max_consecutive_skips", "must be positive".into());
        }
        if let Some(lora) = &self.lora {
            if let Err(reason) = lora.validate() {
                return invalid("lora", reason);
            }
            if self.pipeline_parallel > 1 {
                return invalid(
                    "lora",
                    "LoRA adapters are not supported with pipeline parallelism (--pp) yet; use \
                     --dp and --tp"
                        .into(),
                );
            }
        }
        if self.eval_every > 0 && self.eval_rows == 0 {
            return invalid(
                "eval_rows",
                "must be positive when eval_every is set".into(),
            );
        }
        Ok(())
    }

    /// Writes the configuration as TOML (the run records what it was started with).
    pub fn save_toml(&self, path: &Path) -> Result<(), TrainError> {
        let text = toml::to_string_pretty(self).map_err(|error| TrainError::Config {
            path: PathBuf::from(path),
            message: error.to_string(),
        })?;
        Ok(hlat::checkpoint::run_folder::write_atomic(
            path,
            text.as_bytes(),
        )?)
    }
}
