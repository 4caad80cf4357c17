//! `hlat pretrain`: pretrain or continue pretraining an HLAT model.
//!
//! Without arguments it trains the `hlat-tiny` preset on the built-in corpus on the default
//! device (`TRAINIUM_DEVICE`, else the host executor) into `runs/hlat-tiny`, in a few minutes on
//! two CPU cores. Running it again in a folder that holds a checkpoint resumes from the newest one.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use burn::backend::{Autodiff, NdArray};
use burn_trainium::distributed::Peers;
use burn_trainium::neuron::{NeuronProcess, process_environment};
use burn_trainium::{ExecutorKind, Trainium, TrainiumDevice};
use clap::Args;
use hlat_train::checkpoint::ProcessShare;
use hlat_train::config::TrainConfig;
use hlat_train::data_spec::parse_data_spec;
use hlat_train::parallel::{ActivationCheckpointing, ProcessGroup};
use hlat_train::precision::Precision;
use hlat_train::pretrain::{CompileTotals, DataChoice, DeviceInfo, PretrainOptions, pretrain};

/// The job this process trains in: alone, or as one rank of a job torchrun or Slurm started.
///
/// Every rank runs the same program on the same global batch (SPMD) over one replicated `host`
/// device whose replicas are spread over the processes (`burn_trainium::distributed`). Rank 0
/// writes the output folder; rank R writes `OUT/ranks/rank-RR` (the same checkpoints, so that a
/// restart after a lost process resumes from the newest step every rank completed, and keeps at
/// least two checkpoints: ranks are at most one checkpoint apart).
struct Job {
    process: ProcessGroup,
}

impl Job {
    fn new(process: ProcessGroup) -> Self {
        Self { process }
    }

    fn is_multi_process(&self) -> bool {
        self.process.world_size > 1
    }

    /// Run settings a rank of a multi-process job needs: no progress display beside rank 0's,
    /// and two checkpoints kept.
    fn adjust(&self, config: &mut TrainConfig) {
        if !self.is_multi_process() {
            return;
        }
        if self.process.rank != 0 {
            config.progress = false;
        }
        if config.keep_checkpoints < 2 {
            log::info!(
                "keeping 2 checkpoints instead of {}: the ranks of a job may be one checkpoint \
                 apart when one of them is lost",
                config.keep_checkpoints
            );
            config.keep_checkpoints = 2;
        }
    }

    /// The share of each checkpoint this process writes.
    fn share(&self) -> ProcessShare {
        ProcessShare {
            rank: self.process.rank,
            processes: self.process.world_size,
        }
    }

    /// Joins the other processes, when there are any; they must train on a replicated Trainium
    /// device (`host`, `neuron`, or `xla` with a PJRT plugin that joins processes; ndarray runs
    /// in one process). A `neuron` process first gets its NeuronCores and the collectives'
    /// meeting point ([`burn_trainium::neuron::process_environment`]), unless the launcher set
    /// them.
    fn join(&self, device: &DeviceChoice) -> anyhow::Result<()> {
        if !self.is_multi_process() {
            return Ok(());
        }
        let process = &self.process;
        let spanning = match device {
            DeviceChoice::Trainium(device)
                if usize::from(device.replicas).is_multiple_of(process.world_size) =>
            {
                device
            }
            _ => bail!(
                "{} started process {} of {}: a job of several processes trains on a `host` or \
                 `neuron` device (or `xla` with a PJRT plugin that joins processes) whose \
                 replicas (--dp × --tp × --pp) divide among the processes, e.g. --device host:0 --dp {}; \
                 ndarray runs in one process (one process drives every replica of its device: \
                 --device xla:0-3)",
                process.launcher,
                process.rank,
                process.world_size,
                process.world_size
            ),
        };
        if spanning.executor == ExecutorKind::Neuron {
            self.set_neuron_environment(spanning)?;
        }
        burn_trainium::distributed::join(Peers {
            rank: process.rank,
            world_size: process.world_size,
            master_addr: process.master_addr.clone(),
            master_port: process.master_port,
        })
        .with_context(|| {
            format!(
                "{} process {} of {}",
                process.launcher, process.rank, process.world_size
            )
        })
    }

    /// Sets the Neuron runtime's variables for this process (its cores, where the collectives
    /// meet), each unless already set.
    fn set_neuron_environment(&self, device: &TrainiumDevice) -> anyhow::Result<()> {
        let process = &self.process;
        let settings = process_environment(&NeuronProcess {
            local_rank: process.local_rank,
            local_replicas: usize::from(device.replicas) / process.world_size,
            first_core: usize::from(device.index),
            master_addr: process.master_addr.clone(),
            master_port: process.master_port,
        })
        .map_err(|reason| anyhow::anyhow!("{device} in process {}: {reason}", process.rank))?;
        for (variable, value) in settings {
            match std::env::var(variable) {
                Ok(set) => log::info!("{variable}={set} (as set)"),
                Err(_) => {
                    log::info!("{variable}={value}");
                    // SAFETY: called before the job's connections start; the command has
                    // started no other thread yet (the device and its runtime open later).
                    unsafe { std::env::set_var(variable, value) };
                }
            }
        }
        Ok(())
    }
}

/// Arguments of `hlat pretrain`.
#[derive(Args)]
pub struct PretrainArgs {
    /// Training configuration (TOML, fields of `hlat_train::config::TrainConfig`); fields it
    /// leaves out take HLAT's recipe. Without it the quick CPU profile is used.
    #[arg(long, value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// Model preset trained from scratch (hlat-tiny, hlat-test, hlat-7b, hlat-70b, bench-tiny).
    #[arg(long)]
    preset: Option<String>,
    /// Output folder for checkpoints, metrics.jsonl and train.toml [default: runs/PRESET].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The run's length in optimizer steps, and so the learning-rate schedule's: warmup, then
    /// cosine decay until this step (unless the config sets `decay_steps`). A finished run
    /// started again with a larger value continues on the schedule of the new length (the
    /// learning rate at the resumed step is logged).
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<u64>())]
    max_steps: Option<u64>,
    /// Start from this Hugging Face (or native) checkpoint: continual pretraining.
    #[arg(long, value_name = "DIR")]
    init_from_hf: Option<PathBuf>,
    /// Prepared shard folders with mixing weights: `[NAME=]FOLDER[:WEIGHT],...`, e.g.
    /// `domain=shards/a:0.99,general=shards/b:0.01` [default: the built-in corpus].
    #[arg(long, value_name = "SPEC")]
    data: Option<String>,
    /// Device: `ndarray`, or a Trainium device such as `host:0`, `xla:0`, `neuron:0`
    /// [default: TRAINIUM_DEVICE, else host:0].
    #[arg(long)]
    pub device: Option<String>,
    /// Precision: f32, bf16-sr (bf16 parameters, stochastic rounding) or bf16-mixed (bf16
    /// compute, f32 master weights).
    #[arg(long)]
    precision: Option<Precision>,
    /// Seed of initialisation, data order and stochastic rounding.
    #[arg(long)]
    seed: Option<u64>,
    /// Peak learning rate.
    #[arg(long, value_parser = super::ranges::positive)]
    lr: Option<f64>,
    /// Linear warmup steps.
    #[arg(long, value_name = "N")]
    warmup_steps: Option<u64>,
    /// Tokens per optimizer step (gradient accumulation fills it with micro-batches).
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    batch_tokens: Option<usize>,
    /// Rows per forward/backward pass, on each data-parallel replica.
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    micro_batch_rows: Option<usize>,
    /// Data-parallel degree: train on the first N replicas of the device's executor (`--device
    /// xla --dp 4` uses xla:0-3), each on its slice of the global batch, gradients averaged by an
    /// all-reduce in the step's program. The global batch stays the configured one: without
    /// --micro-batch-rows, each replica's micro-batch is 1/N of the configured micro-batch.
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    dp: Option<usize>,
    /// Tensor-parallel degree: each model replica's weights split over M replicas (column- and
    /// row-parallel projections, vocabulary-parallel embedding and loss); with --dp N the device
    /// has N × M replicas.
    #[arg(long, value_name = "M", value_parser = super::ranges::at_least_one::<usize>())]
    tp: Option<usize>,
    /// Pipeline parallelism.
    #[command(flatten)]
    pipeline: super::pipeline_args::PipelineArgs,
    /// Sequence parallelism inside each tensor-parallel group (norms and residuals on slices of
    /// the sequence).
    #[arg(long)]
    sequence_parallel: bool,
    /// ZeRO-1: the AdamW state partitioned over the --dp replicas (gradients reduce-scattered,
    /// each replica updates its slice, parameters all-gathered).
    #[arg(long)]
    zero1: bool,
    /// What the backward pass recomputes instead of keeping: none, full (each layer from its
    /// input) or selective (the attention core and the MLP activation).
    #[arg(long, value_name = "MODE")]
    activation_checkpointing: Option<ActivationCheckpointing>,
    /// Tokens per row.
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    seq_len: Option<usize>,
    /// Save a checkpoint every N steps (and at the end).
    #[arg(long, value_name = "N")]
    checkpoint_every: Option<u64>,
    /// Checkpoints kept.
    #[arg(long, value_name = "K", value_parser = super::ranges::at_least_one::<usize>())]
    keep_checkpoints: Option<usize>,
    /// Measure validation loss every M steps (0: never).
    #[arg(long, value_name = "M")]
    eval_every: Option<u64>,
    /// Peak FLOP/s of the device, for MFU.
    #[arg(long, value_name = "FLOPS", value_parser = super::ranges::positive)]
    peak_flops: Option<f64>,
    /// Hide the progress display (Burn's dashboard in a terminal, else a progress bar).
    #[arg(long)]
    no_progress: bool,
}

/// Runs `hlat pretrain`; returns the Trainium device it trained on (none on ndarray).
pub fn run(args: PretrainArgs) -> anyhow::Result<Option<TrainiumDevice>> {
    // Under torchrun or srun the processes train one job together (see `Job`).
    let process = ProcessGroup::from_env()?;
    let mut config = match &args.config {
        Some(path) => TrainConfig::load_toml(path, &TrainConfig::default())?,
        None => TrainConfig::quickstart(),
    };
    if let Some(v) = args.max_steps {
        config.max_steps = v;
    }
    if let Some(v) = args.precision {
        config.precision = v;
    }
    if let Some(v) = args.seed {
        config.seed = v;
    }
    if let Some(v) = args.lr {
        config.lr = v;
    }
    if let Some(v) = args.warmup_steps {
        config.warmup_steps = v;
    }
    if let Some(v) = args.batch_tokens {
        config.batch_tokens = v;
    }
    if let Some(v) = args.micro_batch_rows {
        config.micro_batch_rows = v;
    }
    if let Some(v) = args.dp {
        if args.micro_batch_rows.is_none() && v > 0 && config.micro_batch_rows.is_multiple_of(v) {
            // The same global batch and accumulation, cut across the replicas.
            config.micro_batch_rows /= v;
        }
        config.data_parallel = v;
    }
    if let Some(v) = args.tp {
        config.tensor_parallel = v;
    }
    args.pipeline.apply(&mut config);
    if args.sequence_parallel {
        config.sequence_parallel = true;
    }
    if args.zero1 {
        config.zero1 = true;
    }
    if let Some(mode) = args.activation_checkpointing {
        config.activation_checkpointing = mode;
    }
    if let Some(v) = args.seq_len {
        config.seq_len = v;
    }
    if let Some(v) = args.checkpoint_every {
        config.checkpoint_every = v;
    }
    if let Some(v) = args.keep_checkpoints {
        config.keep_checkpoints = v;
    }
    if let Some(v) = args.eval_every {
        config.eval_every = v;
    }
    if let Some(v) = args.peak_flops {
        config.peak_flops = Some(v);
    }
    if let Some(preset) = args.preset {
        config.preset = preset;
    }
    if args.no_progress {
        config.progress = false;
    }
    let job = Job::new(process);
    job.adjust(&mut config);
    config.validate()?;
    let data = match &args.data {
        Some(spec) => DataChoice::Shards(parse_data_spec(spec)?),
        None => DataChoice::Builtin,
    };
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from("runs").join(&config.preset));
    let options = PretrainOptions {
        config,
        out,
        data,
        init_from: args.init_from_hf,
        share: job.share(),
    };
    let device = DeviceChoice::parse(args.device.as_deref())?
        .with_replicas(options.config.layout().replicas())?;
    job.join(&device)?;
    let mut options = options;
    if let DeviceChoice::Trainium(device) = &device
        && device.executor == ExecutorKind::Neuron
        && options.config.peak_flops.is_none()
    {
        // MFU against the published peak of the job's NeuronCores (BF16 unless f32).
        let bf16 = options.config.precision.param_dtype() != burn::tensor::DType::F32
            || options.config.precision.compute_cast().is_some();
        options.config.peak_flops = Some(burn_trainium::neuron::neuron_peak_flops(
            usize::from(device.replicas),
            bf16,
        ));
    }
    let trained_on = match &device {
        DeviceChoice::Trainium(device) => Some(*device),
        DeviceChoice::NdArray => None,
    };
    let summary = match device.checked()? {
        DeviceChoice::NdArray => pretrain::<Autodiff<NdArray>>(
            &options,
            &Default::default(),
            DeviceInfo { compiles: None },
        )?,
        DeviceChoice::Trainium(device) => {
            let compiles = move || {
                let stats = burn_trainium::stats(&device);
                CompileTotals {
                    programs: stats.compiles,
                    seconds: stats.compile_seconds,
                }
            };
            pretrain::<Autodiff<Trainium>>(
                &options,
                &device,
                DeviceInfo {
                    compiles: Some(Arc::new(compiles)),
                },
            )?
        }
    };
    if let Some(report) = trained_on
        .as_ref()
        .and_then(burn_trainium::host_fallback_report)
    {
        log::warn!("{report}: these operations ran on the host, not the device");
        println!("{report}");
    }
    match (summary.losses.first(), summary.losses.last()) {
        (Some(first), Some(last)) => println!(
            "trained steps {}..{}: loss {first:.4} -> {last:.4}",
            summary.start_step + 1,
            summary.end_step
        ),
        _ => println!("nothing to train: already at step {}", summary.end_step),
    }
    if summary.end_step < options.config.max_steps {
        println!(
            "stopped at step {} of {}: run the same command again to continue",
            summary.end_step, options.config.max_steps
        );
    }
    if let Some(val_loss) = summary.val_loss {
        println!(
            "validation loss {val_loss:.4}, perplexity {:.2}",
            val_loss.exp()
        );
    }
    if let Some(dir) = summary.checkpoint {
        println!("checkpoint: {}", dir.display());
    }
    // The per-source plot is a view of metrics.jsonl: a machine without a font still has those.
    match super::validation_plot::draw(&options.own_out()) {
        Ok(Some(path)) => println!("validation plot: {}", path.display()),
        Ok(None) => {}
        Err(error) => log::warn!("no validation plot: {error:#}"),
    }
    println!("model: {}", options.out.display());
    burn_trainium::distributed::leave();
    Ok(trained_on)
}

/// The device a command runs on.
pub enum DeviceChoice {
    /// Burn's NdArray backend on the CPU.
    NdArray,
    /// A Trainium device (host, xla or neuron executor).
    Trainium(TrainiumDevice),
}

impl DeviceChoice {
    /// This device standing for `replicas` replicas: the first `replicas` devices of its
    /// executor from its index on (`xla:0` with 4 replicas is `xla:0-3`).
    pub fn with_replicas(self, replicas: usize) -> anyhow::Result<Self> {
        match self {
            DeviceChoice::NdArray if replicas == 1 => Ok(self),
            DeviceChoice::NdArray => bail!(
                "{replicas} replicas (--dp × --tp × --pp): ndarray is a single device; parallel training \
                 needs a Trainium device (--device host, xla or neuron)"
            ),
            DeviceChoice::Trainium(device) => {
                let count = u16::try_from(replicas)
                    .ok()
                    .filter(|count| (1..=burn_trainium::MAX_REPLICAS).contains(count))
                    .with_context(|| {
                        format!(
                            "{replicas} replicas (--dp × --tp × --pp): a device stands for 1 to {}",
                            burn_trainium::MAX_REPLICAS
                        )
                    })?;
                if device.replicas > 1 && device.replicas != count {
                    bail!(
                        "device {device} stands for {} replicas, the layout needs {replicas}",
                        device.replicas
                    );
                }
                Ok(DeviceChoice::Trainium(device.with_replicas(count)))
            }
        }
    }

    /// The same choice once its executor has been opened once: a missing plugin or runtime, or a
    /// device index the executor does not have, is an error naming the device, before any work.
    pub fn checked(self) -> anyhow::Result<Self> {
        if let DeviceChoice::Trainium(device) = &self {
            burn_trainium::check_device(device).with_context(|| format!("device {device}"))?;
        }
        Ok(self)
    }

    /// `ndarray`, a Trainium device name, or `None` for the device `TRAINIUM_DEVICE` names.
    pub fn parse(name: Option<&str>) -> anyhow::Result<Self> {
        match name {
            Some("ndarray") => Ok(DeviceChoice::NdArray),
            Some(name) => Ok(DeviceChoice::Trainium(
                name.parse().with_context(|| format!("--device {name}"))?,
            )),
            None => Ok(DeviceChoice::Trainium(TrainiumDevice::from_env()?)),
        }
    }
}
