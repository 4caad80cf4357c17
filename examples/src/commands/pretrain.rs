//! `hlat pretrain`: pretrain or continue pretraining an HLAT model.
//!
//! Without arguments it trains the `hlat-tiny` preset on the built-in corpus on the default
//! device (`TRAINIUM_DEVICE`, else the host executor) into `runs/hlat-tiny`, in a few minutes on
//! two CPU cores. Running it again in a folder that holds a checkpoint resumes from the newest one.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use burn::tensor::Device;
use burn_trainium::distributed::Peers;
use burn_trainium::neuron::{NeuronProcess, process_environment};
use burn_trainium::{ExecutorKind, TrainiumDevice};
use clap::Args;
use hlat_train::checkpoint_state::ProcessShare;
use hlat_train::config::TrainConfig;
use hlat_train::data_spec::parse_data_spec;
use hlat_train::parallel::ProcessGroup;
use hlat_train::pretrain::{
    CompileCounter, CompileTotals, DataChoice, DeviceInfo, PretrainOptions, PretrainSummary,
    pretrain,
};

use super::train_args::TrainArgs;

/// The job this process trains in: alone, or as one rank of a job torchrun or Slurm started.
///
/// Every rank runs the same program on the same global batch (SPMD) over one replicated `host`
/// device whose replicas are spread over the processes (`burn_trainium::distributed`). Rank 0
/// writes the output folder; rank R writes `OUT/ranks/rank-RR` (the same checkpoints, so that a
/// restart after a lost process resumes from the newest step every rank completed, and keeps at
/// least two checkpoints: ranks are at most one checkpoint apart).
pub struct Job {
    process: ProcessGroup,
}

impl Job {
    /// This process's job: alone, or the one torchrun or Slurm started.
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            process: ProcessGroup::from_env()?,
        })
    }

    /// The options of a run of `config` (adjusted for the job, then checked) into `out`.
    pub fn options(
        &self,
        mut config: TrainConfig,
        out: PathBuf,
        data: DataChoice,
        init_from: Option<PathBuf>,
    ) -> anyhow::Result<PretrainOptions> {
        self.adjust(&mut config);
        config.validate()?;
        Ok(PretrainOptions {
            config,
            out,
            data,
            init_from,
            init_adapter: None,
            share: self.share(),
        })
    }

    /// This process's rank in its job (0 alone).
    pub fn rank(&self) -> usize {
        self.process.rank
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
        // A rank's writes may lag the others' by one checkpoint, and by one more when it
        // writes in the background (the others write the next one while it still writes its
        // previous one): keeping that many more, every rank still holds the newest checkpoint
        // all of them completed.
        let kept = if config.async_checkpoint { 3 } else { 2 };
        if config.keep_checkpoints < kept {
            log::info!(
                "keeping {kept} checkpoints instead of {}: the ranks of a job may be {} \
                 checkpoint(s) apart when one of them is lost",
                config.keep_checkpoints,
                kept - 1
            );
            config.keep_checkpoints = kept;
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

/// How `hlat pretrain` names itself in the run folders it records.
pub const PRETRAIN_COMMAND: &str = "pretrain";

/// What a pretraining run trains: the preset or starting checkpoint, the data and the training
/// flags (`hlat pretrain` trains it, `hlat compile` traces it).
#[derive(Args)]
pub struct RunArgs {
    /// Model preset trained from scratch (hlat-tiny, hlat-test, hlat-7b, hlat-70b, bench-tiny).
    #[arg(long)]
    preset: Option<String>,
    /// Start from this Hugging Face (or native) checkpoint: continual pretraining.
    #[arg(long, value_name = "DIR")]
    init_from_hf: Option<PathBuf>,
    /// Prepared shard folders with mixing weights: `[NAME=]FOLDER[:WEIGHT],...`, e.g.
    /// `domain=shards/a:0.99,general=shards/b:0.01` [default: the built-in corpus].
    #[arg(long, value_name = "SPEC")]
    data: Option<String>,
    /// The device, precision, parallel layout, schedule, checkpoint and resume flags.
    #[command(flatten)]
    pub train: TrainArgs,
}

impl RunArgs {
    /// The options of this run in `job`, written into `out` [default: `runs/PRESET`].
    pub fn options(&self, job: &Job, out: Option<PathBuf>) -> anyhow::Result<PretrainOptions> {
        let mut config = self.train.config(TrainConfig::quickstart())?;
        if let Some(preset) = &self.preset {
            config.preset.clone_from(preset);
        }
        let data = match &self.data {
            Some(spec) => DataChoice::Shards(parse_data_spec(spec)?),
            None => DataChoice::Builtin,
        };
        let out = out.unwrap_or_else(|| PathBuf::from("runs").join(&config.preset));
        job.options(config, out, data, self.init_from_hf.clone())
    }
}

/// Arguments of `hlat pretrain`.
#[derive(Args)]
pub struct PretrainArgs {
    /// Output folder for checkpoints, metrics.jsonl and train.toml [default: runs/PRESET].
    /// Running again into the same folder resumes from its newest checkpoint; a folder another
    /// command wrote (a fine-tuning run, a model, token shards) is refused and left as it is.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// What to train.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Runs `hlat pretrain`.
pub fn run(args: PretrainArgs) -> anyhow::Result<()> {
    // Under torchrun or srun the processes train one job together (see `Job`).
    let job = Job::from_env()?;
    let options = args.run.options(&job, args.out)?;
    super::output_folder::claim(
        &options.out,
        PRETRAIN_COMMAND,
        options.init_from.as_deref(),
        "--out",
    )?;
    let (summary, _) = train(&args.run.train, &job, options.clone())?;
    print_summary(&summary, &options);
    // The per-source plot is a view of metrics.jsonl: a machine without a font still has those.
    match super::validation_plot::draw(&options.own_out()) {
        Ok(Some(path)) => println!("validation plot: {}", path.display()),
        Ok(None) => {}
        Err(error) => log::warn!("no validation plot: {error:#}"),
    }
    println!("model: {}", options.out.display());
    burn_trainium::distributed::leave();
    Ok(())
}

/// Trains `options` on the device `train` names (joining the job's other processes first);
/// returns its summary and the Trainium device it trained on (none on ndarray). `hlat pretrain`
/// and `hlat finetune` run through it (and print [`print_summary`]), as does `hlat compile`'s
/// trace (whose losses no program computed).
pub fn train(
    train: &TrainArgs,
    job: &Job,
    options: PretrainOptions,
) -> anyhow::Result<(PretrainSummary, Option<TrainiumDevice>)> {
    let device = DeviceChoice::parse(train.device.as_deref())?
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
    let compiles = trained_on.map(|device| -> CompileCounter {
        Arc::new(move || {
            let stats = burn_trainium::stats(&device);
            CompileTotals {
                programs: stats.compiles,
                seconds: stats.compile_seconds,
            }
        })
    });
    let burn_device = device.checked()?.device()?;
    let summary = pretrain(&options, &burn_device, DeviceInfo { compiles })?;
    if let Some(report) = trained_on
        .as_ref()
        .and_then(burn_trainium::host_fallback_report)
    {
        log::warn!("{report}: these operations ran on the host, not the device");
        println!("{report}");
    }
    Ok((summary, trained_on))
}

/// Prints what a training run of `options` did: the steps and their losses, where it stopped,
/// the last validation loss and the checkpoint written.
pub fn print_summary(summary: &PretrainSummary, options: &PretrainOptions) {
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
    if let Some(dir) = &summary.checkpoint {
        println!("checkpoint: {}", dir.display());
    }
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

    /// The Burn device of this choice: Burn's NdArray device (deprecated in Burn 0.22, kept as
    /// the `ndarray` choice), or the Trainium device served in this process
    /// (`burn_trainium::device`).
    pub fn device(&self) -> anyhow::Result<Device> {
        match self {
            #[allow(deprecated)]
            DeviceChoice::NdArray => Ok(Device::ndarray()),
            DeviceChoice::Trainium(device) => super::served(device),
        }
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
