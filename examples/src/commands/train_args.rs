//! The flags of a training run that `hlat pretrain` and `hlat finetune` share: device,
//! precision, parallel layout, schedule, batch, checkpoints and resume, validation, progress.

use std::path::PathBuf;

use clap::Args;
use hlat_train::config::TrainConfig;
use hlat_train::parallel::ActivationCheckpointing;
use hlat_train::precision::Precision;

/// The shared flags of a training run (see the module documentation).
#[derive(Args)]
pub struct TrainArgs {
    /// Training configuration (TOML, fields of `hlat_train::config::TrainConfig`); fields it
    /// leaves out take HLAT's recipe. Without it the quick CPU profile is used.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// The run's length in optimizer steps, and so the learning-rate schedule's: warmup, then
    /// cosine decay until this step (unless the config sets `decay_steps`). A finished run
    /// started again with a larger value continues on the schedule of the new length (the
    /// learning rate at the resumed step is logged).
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<u64>())]
    pub max_steps: Option<u64>,
    /// Device: `ndarray`, or a Trainium device such as `host:0`, `xla:0`, `neuron:0`
    /// [default: TRAINIUM_DEVICE, else host:0].
    #[arg(long)]
    pub device: Option<String>,
    /// Precision: f32, bf16-sr (bf16 parameters, stochastic rounding) or bf16-mixed (bf16
    /// compute, f32 master weights).
    #[arg(long)]
    pub precision: Option<Precision>,
    /// Seed of initialisation, data order and stochastic rounding.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Peak learning rate.
    #[arg(long, value_parser = super::ranges::positive)]
    pub lr: Option<f64>,
    /// Linear warmup steps.
    #[arg(long, value_name = "N")]
    pub warmup_steps: Option<u64>,
    /// Tokens per optimizer step (gradient accumulation fills it with micro-batches).
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub batch_tokens: Option<usize>,
    /// Rows per forward/backward pass, on each data-parallel replica.
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub micro_batch_rows: Option<usize>,
    /// Data-parallel degree: train on the first N replicas of the device's executor (`--device
    /// xla --dp 4` uses xla:0-3), each on its slice of the global batch, gradients averaged by an
    /// all-reduce in the step's program. The global batch stays the configured one: without
    /// --micro-batch-rows, each replica's micro-batch is 1/N of the configured micro-batch.
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub dp: Option<usize>,
    /// Expert-parallel degree of a mixture of experts: its experts split over N of the --dp
    /// replicas (N divides --dp, as NeuronX Distributed lays expert parallelism out), each
    /// routing its own tokens, which reach their experts by all-to-all in the step's program.
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub ep: Option<usize>,
    /// Tensor-parallel degree: each model replica's weights split over M replicas (column- and
    /// row-parallel projections, vocabulary-parallel embedding and loss); with --dp N the device
    /// has N × M replicas.
    #[arg(long, value_name = "M", value_parser = super::ranges::at_least_one::<usize>())]
    pub tp: Option<usize>,
    /// Pipeline parallelism.
    #[command(flatten)]
    pub pipeline: super::pipeline_args::PipelineArgs,
    /// Sequence parallelism inside each tensor-parallel group (norms and residuals on slices of
    /// the sequence).
    #[arg(long)]
    pub sequence_parallel: bool,
    /// ZeRO-1: the AdamW state partitioned over the --dp replicas (gradients reduce-scattered,
    /// each replica updates its slice, parameters all-gathered).
    #[arg(long)]
    pub zero1: bool,
    /// Fully sharded data parallelism (FSDP2, ZeRO-3): parameters, gradients and AdamW state
    /// partitioned over the --dp replicas, each layer's weights all-gathered just before use and
    /// its gradients reduce-scattered (replaces --zero1).
    #[arg(long)]
    pub fsdp: bool,
    /// A mixture of experts' capacity factor: each expert takes at most F times its even share
    /// of the tokens, the rest dropped as GShard drops them (faster; default: dropless, exact).
    #[arg(long, value_name = "F", value_parser = super::ranges::positive)]
    pub moe_capacity_factor: Option<f64>,
    /// What the backward pass recomputes instead of keeping: none, full (each layer from its
    /// input) or selective (the attention core and the MLP activation).
    #[arg(long, value_name = "MODE")]
    pub activation_checkpointing: Option<ActivationCheckpointing>,
    /// Tokens per row.
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub seq_len: Option<usize>,
    /// Save a checkpoint every N steps (and at the end).
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<u64>,
    /// Checkpoints kept.
    #[arg(long, value_name = "K", value_parser = super::ranges::at_least_one::<usize>())]
    pub keep_checkpoints: Option<usize>,
    /// Write checkpoints in the background: training waits only while a checkpoint is copied
    /// into host memory (one write at a time; a run ends once its last one is written).
    #[arg(long)]
    pub async_checkpoint: bool,
    /// When a checkpoint cannot be written (a full disk, an unwritable folder), report it and
    /// train on instead of stopping; the run's last checkpoint must still be written.
    #[arg(long)]
    pub continue_on_checkpoint_error: bool,
    /// Measure validation loss every M steps (0: never).
    #[arg(long, value_name = "M")]
    pub eval_every: Option<u64>,
    /// Peak FLOP/s of the device, for MFU.
    #[arg(long, value_name = "FLOPS", value_parser = super::ranges::positive)]
    pub peak_flops: Option<f64>,
    /// Hide the progress display (Burn's dashboard in a terminal, else a progress bar).
    #[arg(long)]
    pub no_progress: bool,
}

impl TrainArgs {
    /// The run's configuration: `--config`'s TOML over `defaults` (or `defaults` alone), then
    /// the flags given.
    pub fn config(&self, defaults: TrainConfig) -> anyhow::Result<TrainConfig> {
        let mut config = match &self.config {
            Some(path) => TrainConfig::load_toml(path, &defaults)?,
            None => defaults,
        };
        self.apply(&mut config);
        Ok(config)
    }

    /// Sets the fields of `config` that the flags give.
    pub fn apply(&self, config: &mut TrainConfig) {
        if let Some(v) = self.max_steps {
            config.max_steps = v;
        }
        if let Some(v) = self.precision {
            config.precision = v;
        }
        if let Some(v) = self.seed {
            config.seed = v;
        }
        if let Some(v) = self.lr {
            config.lr = v;
        }
        if let Some(v) = self.warmup_steps {
            config.warmup_steps = v;
        }
        if let Some(v) = self.batch_tokens {
            config.batch_tokens = v;
        }
        if let Some(v) = self.micro_batch_rows {
            config.micro_batch_rows = v;
        }
        if let Some(v) = self.dp {
            if self.micro_batch_rows.is_none() && v > 0 && config.micro_batch_rows.is_multiple_of(v)
            {
                // The same global batch and accumulation, cut across the replicas.
                config.micro_batch_rows /= v;
            }
            config.data_parallel = v;
        }
        if let Some(v) = self.ep {
            config.expert_parallel = v;
        }
        if let Some(v) = self.tp {
            config.tensor_parallel = v;
        }
        self.pipeline.apply(config);
        if self.sequence_parallel {
            config.sequence_parallel = true;
        }
        if self.zero1 {
            config.zero1 = true;
        }
        if self.fsdp {
            config.fsdp = true;
        }
        if let Some(factor) = self.moe_capacity_factor {
            config.moe_capacity_factor = Some(factor);
        }
        if let Some(mode) = self.activation_checkpointing {
            config.activation_checkpointing = mode;
        }
        if let Some(v) = self.seq_len {
            config.seq_len = v;
        }
        if let Some(v) = self.checkpoint_every {
            config.checkpoint_every = v;
        }
        if let Some(v) = self.keep_checkpoints {
            config.keep_checkpoints = v;
        }
        if self.async_checkpoint {
            config.async_checkpoint = true;
        }
        if self.continue_on_checkpoint_error {
            config.continue_on_checkpoint_error = true;
        }
        if let Some(v) = self.eval_every {
            config.eval_every = v;
        }
        if let Some(v) = self.peak_flops {
            config.peak_flops = Some(v);
        }
        if self.no_progress {
            config.progress = false;
        }
    }
}
