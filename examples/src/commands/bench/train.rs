//! `hlat bench train`: the HLAT training step, timed on several backends in one run.

use std::path::PathBuf;
use std::time::Instant;

use burn_trainium::{MAX_REPLICAS, Stats};
use clap::Args;
use hlat::HlatConfig;
use hlat::pipeline::{PipelineParallel, PipelineSchedule, bubble_fraction};
use hlat::rng::SplitMix64;
use hlat_train::config::TrainConfig;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::OptimizerStep;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::precision::cast_params;
use hlat_train::progress::TrainingProgress;
use hlat_train::schedule::WarmupCosine;
use serde::{Deserialize, Serialize};

use super::backends::{
    self, BackendName, Comparison, emit_result, median, peak_resident_bytes, reset_peak_resident,
    resident_bytes, worker_backend,
};
use super::peak::{self, Peak, PeakProbe};
use super::peers::{self, Framework, PeerAllocator, PeerStep};
use super::report;
use crate::commands::micros_per;
use crate::commands::pipeline_args::PipelineArgs;

/// Arguments of `hlat bench train`.
#[derive(Args, Clone)]
pub struct TrainBenchArgs {
    /// The model and the backends compared.
    #[command(flatten)]
    pub comparison: Comparison,
    /// Sequences per step (at the first `--seq-len`); with `--micro-batches`, per micro-batch.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// Tokens per sequence; a comma-separated list measures each length with the same tokens
    /// per step (`--batch` × the first length), e.g. `--seq-len 1024,4096`. Lengths beyond the
    /// preset's context extend it.
    #[arg(long, default_value = "256", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..))]
    pub seq_len: Vec<u64>,
    /// Untimed steps before measuring (compiles happen there).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    /// Precision mode of the trainer: f32, bf16-sr (bf16 parameters, stochastic rounding) or
    /// bf16-mixed (bf16 compute, f32 master weights).
    #[arg(long, default_value = "f32")]
    pub precision: String,
    /// Peak FLOP/s the MFU column divides by [default: measured in this run, the fastest f32
    /// matmul of the backends measured]; a given peak skips that measurement.
    #[arg(long, value_parser = crate::commands::ranges::positive)]
    pub peak_flops: Option<f64>,
    /// Also run the same model and step in PyTorch (Hugging Face `LlamaForCausalLM`, eager),
    /// when torch and transformers are installed.
    #[arg(long)]
    pub with_pytorch: bool,
    /// Also run the same model and step in JAX (one `jit` of the whole step), when jax is
    /// installed.
    #[arg(long)]
    pub with_jax: bool,
    /// The Python interpreter of the peers.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// The device the PyTorch peer trains on: `cpu`, or `cuda` (the GPU a CUDA PJRT plugin
    /// drives for `xla`), where `bf16-mixed` autocasts on the GPU.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub peer_device: String,
    /// Also measure the PyTorch peer compiled with `torch.compile` (a row beside eager).
    #[arg(long, requires = "with_pytorch")]
    pub peer_compile: bool,
    /// The allocator settings of the peers, comma-separated: `hlat` (default: hlat's own, one
    /// arena, no mmap, no trim, so the table compares compilers, not allocators), `default`
    /// (glibc's), or both (`hlat,default`: one row each).
    #[arg(
        long,
        value_name = "SETTINGS",
        value_delimiter = ',',
        default_value = "hlat"
    )]
    pub peer_allocator: Vec<PeerAllocator>,
    /// The layers cut into pipeline stages over the replicas of each backend's device
    /// (`--pp 2` on `xla` trains on xla:0-1), as `hlat pretrain` does.
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Micro-batch counts to measure side by side, comma-separated (e.g. `1,2,4,8`): each is a
    /// row, whose optimizer step accumulates that many micro-batches of `--batch` sequences
    /// (the pipeline's m), with the bubble its schedule predicts. One worker per backend
    /// alternates the rows step by step.
    #[arg(long, value_name = "M,M,...", value_delimiter = ',', value_parser = crate::commands::ranges::at_least_one::<usize>())]
    pub micro_batches: Option<Vec<usize>>,
    /// Where to write the JSON results: a file there is replaced, a path inside another
    /// command's output folder (a training run, a model) refused.
    #[arg(long, default_value = "bench-train.json")]
    pub json: PathBuf,
    /// A mixture of experts' capacity factor in the measured step (as `hlat pretrain
    /// --moe-capacity-factor`); default: dropless.
    #[arg(long, value_name = "F", value_parser = crate::commands::ranges::positive)]
    pub moe_capacity_factor: Option<f64>,
    /// Also write a Markdown report (and a PNG plot beside it) to this path: a new file, or a
    /// report an earlier run wrote, replaced whole; any other file is refused.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Internal: measure one backend in this process and print its result.
    #[arg(long, hide = true)]
    pub worker: bool,
}

impl TrainBenchArgs {
    fn batch(&self) -> usize {
        self.batch as usize
    }

    /// The first length (the only one a worker is given).
    fn seq_len(&self) -> usize {
        self.seq_len[0] as usize
    }

    /// Each length with its batch: the same tokens per step as `--batch` at the first length.
    fn layouts(&self) -> anyhow::Result<Vec<(usize, usize)>> {
        let tokens = self.batch() * self.seq_len();
        self.seq_len
            .iter()
            .map(|&length| {
                let length = length as usize;
                if !tokens.is_multiple_of(length) {
                    anyhow::bail!(
                        "--seq-len {length}: the {tokens} tokens per step (--batch {} × {}) are \
                         not a whole number of {length}-token sequences",
                        self.batch(),
                        self.seq_len()
                    );
                }
                Ok((length, tokens / length))
            })
            .collect()
    }

    fn steps(&self) -> usize {
        self.steps as usize
    }

    /// The micro-batch counts measured: `--micro-batches`, else one.
    fn micro_batch_counts(&self) -> Vec<usize> {
        self.micro_batches.clone().unwrap_or_else(|| vec![1])
    }

    /// Replicas of each backend's device: one per pipeline stage.
    fn replicas(&self) -> usize {
        self.pipeline.pp.unwrap_or(1)
    }

    /// The recipe of a step of `micro_batches` micro-batches of `batch` sequences of `seq_len`
    /// tokens: `hlat pretrain`'s defaults with this bench's precision and pipeline flags, checked
    /// as `hlat pretrain` checks them.
    fn recipe(
        &self,
        seq_len: usize,
        batch: usize,
        micro_batches: usize,
    ) -> anyhow::Result<TrainConfig> {
        let mut recipe = TrainConfig::default();
        self.pipeline.apply(&mut recipe);
        recipe.precision = self.precision.parse().map_err(anyhow::Error::msg)?;
        recipe.seq_len = seq_len;
        recipe.micro_batch_rows = batch;
        recipe.batch_tokens = micro_batches * batch * seq_len;
        recipe.validate()?;
        Ok(recipe)
    }
}

/// How `recipe`'s layout cuts the layers of `config` into pipeline stages (`None` without
/// `--pp`), as `hlat pretrain` cuts them.
fn pipeline_stages(
    config: &HlatConfig,
    recipe: &TrainConfig,
) -> anyhow::Result<Option<PipelineParallel>> {
    recipe
        .layout()
        .pipeline_parallel(
            config.num_layers,
            recipe.pipeline_layers.clone(),
            recipe.virtual_stages,
        )
        .map_err(|reason| anyhow::anyhow!("--pp: {reason}"))
}

/// The bubble `pipeline`'s schedule predicts for `micro_batches` micro-batches (0 unpipelined).
fn predicted_bubble(pipeline: Option<&PipelineParallel>, micro_batches: usize) -> f64 {
    pipeline.map_or(0.0, |pipeline| {
        bubble_fraction(pipeline.stages(), pipeline.virtual_stages, micro_batches)
    })
}

/// The pipeline stages a report measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineBench {
    /// Pipeline stages `p` (replicas of each backend's device).
    pub stages: usize,
    /// The schedule the stages run.
    pub schedule: PipelineSchedule,
    /// Chunks of layers per stage (`V`; 1 for 1F1B).
    pub virtual_stages: usize,
    /// Decoder layers each stage holds.
    pub layers_per_stage: Vec<usize>,
}

impl PipelineBench {
    fn of(pipeline: &PipelineParallel) -> Self {
        Self {
            stages: pipeline.stages(),
            schedule: pipeline.schedule(),
            virtual_stages: pipeline.virtual_stages,
            layers_per_stage: (0..pipeline.stages())
                .map(|stage| pipeline.stage_layers(stage).len())
                .collect(),
        }
    }
}

/// One backend's (or peer's) measurement of the training step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainMeasurement {
    /// The backend measured.
    pub backend: String,
    /// Tokens per sequence of the step measured.
    pub seq_len: usize,
    /// Sequences per step (over all its micro-batches).
    pub batch: usize,
    /// Micro-batches the step accumulates (the pipeline's m).
    #[serde(default = "one")]
    pub micro_batches: usize,
    /// Pipeline stages of the model (1: not pipelined).
    #[serde(default = "one")]
    pub pipeline_stages: usize,
    /// The bubble the pipeline schedule predicts for this step: `(p - 1) / (m·V + p - 1)` (0
    /// unpipelined).
    #[serde(default)]
    pub predicted_bubble: f64,
    /// Median seconds per training step.
    pub median_step_seconds: f64,
    /// The median step over its micro-batches.
    #[serde(default)]
    pub seconds_per_micro_batch: f64,
    /// With `--micro-batches`: the backend's best seconds per micro-batch (over the rows at this
    /// length) divided by this row's (1 for the best row; set by the parent).
    #[serde(default)]
    pub measured_efficiency: Option<f64>,
    /// With `--micro-batches`: this row's `1 - bubble` divided by that of the backend's best row
    /// (what the schedule predicts for `measured_efficiency`; set by the parent).
    #[serde(default)]
    pub predicted_efficiency: Option<f64>,
    /// Tokens processed per second at the median step time.
    pub tokens_per_second: f64,
    /// Model FLOPs utilisation against the report's peak (set by the parent).
    pub mfu: Option<f64>,
    /// Programs compiled during the warmup steps.
    pub warmup_compiles: u64,
    /// Programs compiled during the timed steps (a well-behaved step compiles nothing there).
    pub timed_compiles: u64,
    /// Seconds spent compiling, warmup and timed steps together.
    pub compile_seconds: f64,
    /// Operations that fell back to the host during the timed steps.
    pub host_fallbacks: u64,
    /// Operations captured per timed step (Trainium only).
    pub operations_per_step: u64,
    /// Microseconds of capture overhead per captured operation (Trainium only).
    pub capture_micros_per_operation: f64,
    /// Microseconds per segment of the timed steps spent fingerprinting, lowering and looking
    /// up the compile cache (Trainium executors that compile): a repeated segment reuses the
    /// lowering of the first like it.
    pub prepare_micros_per_segment: f64,
    /// The same during the warmup steps, whose segments are new and lowered.
    #[serde(default)]
    pub warmup_prepare_micros_per_segment: f64,
    /// Peak resident memory of the process, bytes.
    pub peak_rss_bytes: u64,
    /// Resident memory of the process before the first step, once the weights are on the device
    /// (the process, its libraries and the weights; JAX also holds its optimizer state by then),
    /// bytes; 0 where not measured. The peak beyond it is what the steps add: activations,
    /// gradients, optimizer state, scratch and, on compiling backends, the compiler's own.
    #[serde(default)]
    pub resident_at_start_bytes: u64,
    /// Peak resident memory from the start on, bytes (the Rust backends reset the process's
    /// peak there, so the matmul probe and model initialisation before it do not count; 0 where
    /// only the whole process's peak is known).
    #[serde(default)]
    pub peak_since_start_bytes: u64,
    /// The loss after the last step (a sanity check that every backend trains the same model).
    pub final_loss: f64,
    /// The backend's best f32 matmul rate on this machine (Rust backends).
    pub matmul_peak: Option<PeakProbe>,
    /// What ran: the Rust backend, or the peer's framework versions.
    pub version: String,
}

fn one() -> usize {
    1
}

/// A full `hlat bench train` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainReport {
    /// The command line that produced the report.
    pub command: String,
    /// Preset measured.
    pub preset: String,
    /// The model measured.
    pub model: HlatConfig,
    /// Precision measured.
    pub precision: String,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence (the first length measured).
    pub seq_len: usize,
    /// Every length measured, with the same tokens per step.
    pub seq_lens: Vec<usize>,
    /// The micro-batch counts measured with `--micro-batches` (empty without it: one micro-batch
    /// of `batch` sequences).
    #[serde(default)]
    pub micro_batches: Vec<usize>,
    /// The pipeline stages (with `--pp`).
    #[serde(default)]
    pub pipeline: Option<PipelineBench>,
    /// Untimed steps per backend.
    pub warmup: usize,
    /// Timed steps per backend.
    pub steps: usize,
    /// Training FLOPs per token (`6·N + 12·L·H·T`, see `HlatConfig::train_flops_per_token`).
    pub flops_per_token: f64,
    /// The peak the MFU column divides by, and where it comes from.
    pub peak: Option<Peak>,
    /// The baseline of the ratios.
    pub baseline: String,
    /// One entry per backend that ran.
    pub results: Vec<TrainMeasurement>,
    /// Backends that could not run, with the reason.
    pub failures: Vec<(String, String)>,
    /// A description of the machine.
    pub machine: String,
    /// How this `hlat` binary was built.
    pub build: String,
}

/// Runs `hlat bench train`.
pub fn run(args: TrainBenchArgs) -> anyhow::Result<()> {
    let mut config = load_config(&args.comparison.preset)?;
    anyhow::ensure!(
        args.moe_capacity_factor.is_none() || config.moe.is_some(),
        "--moe-capacity-factor: the {} model is dense (no mixture of experts to route)",
        config.family
    );
    let longest = args.seq_len.iter().max().copied().unwrap_or(1) as usize;
    config.max_seq_len = config.max_seq_len.max(longest);
    if args.worker {
        let backend = worker_backend(&args.comparison.backends)?;
        return emit_result(&measure_backend(backend, &config, &args)?);
    }
    let layouts = args.layouts()?;
    // Every step's recipe is checked before any worker starts.
    for &(seq_len, batch) in &layouts {
        for micro_batches in args.micro_batch_counts() {
            args.recipe(seq_len, batch, micro_batches)?;
        }
    }
    let pipeline = pipeline_stages(&config, &args.recipe(args.seq_len(), args.batch(), 1)?)?;
    let one_device_step = args.micro_batches.is_none() && pipeline.is_none();
    anyhow::ensure!(
        one_device_step || !(args.with_pytorch || args.with_jax),
        "--with-pytorch and --with-jax measure one device and one micro-batch: leave them out \
         with --pp or --micro-batches"
    );
    // Only Trainium's devices stand for several replicas.
    let (backends, refused): (Vec<BackendName>, Vec<BackendName>) =
        backends::parse_backends(&args.comparison.backends)?
            .into_iter()
            .partition(|&backend| {
                args.replicas() == 1
                    || matches!(
                        backend,
                        BackendName::TrainiumHost | BackendName::TrainiumXla
                    )
            });
    let mut results = Vec::new();
    let mut failures: backends::Failures = refused
        .iter()
        .map(|backend| {
            (
                backend.name().to_string(),
                format!(
                    "--pp {} needs {} replicas of one device, and {backend} is a single device \
                     (use host or xla)",
                    args.replicas(),
                    args.replicas()
                ),
            )
        })
        .collect();
    let backends = backends
        .iter()
        .map(|backend| backend.name())
        .collect::<Vec<_>>()
        .join(",");
    for (seq_len, batch) in layouts {
        let overrides = [
            ("--seq-len", seq_len.to_string()),
            ("--batch", batch.to_string()),
        ];
        if !backends.is_empty() {
            let steps = match &args.micro_batches {
                Some(counts) => format!(
                    "the training step ({counts:?} micro-batches of {batch} × {seq_len} tokens, \
                     alternated)"
                ),
                None => format!("the training step ({batch} × {seq_len} tokens)"),
            };
            let (measured, failed) =
                backends::measure_each::<Vec<TrainMeasurement>>(&backends, &overrides, &steps)?;
            results.extend(measured.into_iter().flatten());
            failures.extend(failed);
        }
        measure_peers(&args, &config, seq_len, batch, &mut results, &mut failures);
    }
    if args.micro_batches.is_some() {
        set_efficiencies(&mut results);
    }
    let probes: Vec<(String, PeakProbe)> = results
        .iter()
        .filter_map(|result| {
            result
                .matmul_peak
                .map(|probe| (result.backend.clone(), probe))
        })
        .collect();
    let peak = Peak::choose(args.peak_flops, &probes);
    let flops_per_token = config.train_flops_per_token(args.seq_len());
    for result in &mut results {
        let flops_per_token = config.train_flops_per_token(result.seq_len);
        result.mfu = peak
            .as_ref()
            .map(|peak| result.tokens_per_second * flops_per_token / peak.flops_per_second);
    }
    let report = TrainReport {
        command: report::command_line(),
        preset: args.comparison.preset.clone(),
        model: config,
        precision: args.precision.clone(),
        batch: args.batch(),
        seq_len: args.seq_len(),
        seq_lens: args.seq_len.iter().map(|&length| length as usize).collect(),
        micro_batches: args.micro_batches.clone().unwrap_or_default(),
        pipeline: pipeline.as_ref().map(PipelineBench::of),
        warmup: args.warmup,
        steps: args.steps(),
        flops_per_token,
        peak,
        baseline: args.comparison.baseline.clone(),
        results,
        failures,
        machine: report::machine_description(),
        build: report::build_description(),
    };
    let mut table = report::train_table(&report);
    if !report.micro_batches.is_empty() {
        table.push('\n');
        table.push_str(&report::micro_batch_table(&report));
    }
    report::publish(&table, &report, &args.json)?;
    if let Some(path) = &args.report {
        report::write_train_report(&report, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Sets each row's measured and predicted efficiency against the best row (the least time per
/// micro-batch) of its backend at its length.
fn set_efficiencies(results: &mut [TrainMeasurement]) {
    let best: Vec<Option<(f64, f64)>> = results
        .iter()
        .map(|result| {
            results
                .iter()
                .filter(|other| other.backend == result.backend && other.seq_len == result.seq_len)
                .min_by(|a, b| {
                    a.seconds_per_micro_batch
                        .total_cmp(&b.seconds_per_micro_batch)
                })
                .map(|best| (best.seconds_per_micro_batch, best.predicted_bubble))
        })
        .collect();
    for (result, best) in results.iter_mut().zip(best) {
        if let Some((seconds, bubble)) = best {
            result.measured_efficiency = Some(seconds / result.seconds_per_micro_batch);
            result.predicted_efficiency = Some((1.0 - result.predicted_bubble) / (1.0 - bubble));
        }
    }
}

/// Runs the PyTorch and JAX peers asked for on `batch` sequences of `seq_len` tokens.
fn measure_peers(
    args: &TrainBenchArgs,
    config: &HlatConfig,
    seq_len: usize,
    batch: usize,
    results: &mut Vec<TrainMeasurement>,
    failures: &mut backends::Failures,
) {
    let peers = [
        (args.with_pytorch, Framework::PyTorch),
        (args.with_jax, Framework::Jax),
    ];
    let runs = peers
        .into_iter()
        .filter_map(|(on, framework)| on.then_some(framework))
        .flat_map(|framework| {
            args.peer_allocator
                .iter()
                .map(move |&allocator| (framework, allocator))
        })
        .flat_map(|(framework, allocator)| {
            // Only PyTorch has an eager mode to compile; JAX's step is one `jit` already.
            let compiled: &[bool] = match framework {
                Framework::PyTorch if args.peer_compile => &[false, true],
                _ => &[false],
            };
            compiled
                .iter()
                .map(move |&compiled| (framework, allocator, compiled))
        });
    for (framework, allocator, compiled) in runs {
        let mut name = allocator.row_name(framework);
        if framework == Framework::PyTorch && args.peer_device != "cpu" {
            name = format!("{name} on {}", args.peer_device);
        }
        if compiled {
            name = format!("{name}, torch.compile");
        }
        eprintln!("measuring the training step in {name}...");
        let step = PeerStep {
            config,
            batch,
            seq_len,
            warmup: args.warmup,
            steps: args.steps(),
            precision: &args.precision,
            allocator,
            device: &args.peer_device,
            compiled,
        };
        match peers::run(&args.python, framework, &step) {
            Ok(peer) => results.push(TrainMeasurement {
                backend: name.clone(),
                seq_len,
                batch,
                micro_batches: 1,
                pipeline_stages: 1,
                predicted_bubble: 0.0,
                median_step_seconds: peer.median_step_seconds,
                seconds_per_micro_batch: peer.median_step_seconds,
                measured_efficiency: None,
                predicted_efficiency: None,
                tokens_per_second: (batch * seq_len) as f64 / peer.median_step_seconds,
                mfu: None,
                warmup_compiles: peer.compiles,
                timed_compiles: 0,
                compile_seconds: peer.compile_seconds,
                host_fallbacks: 0,
                operations_per_step: 0,
                capture_micros_per_operation: 0.0,
                prepare_micros_per_segment: 0.0,
                warmup_prepare_micros_per_segment: 0.0,
                peak_rss_bytes: peer.peak_rss_bytes,
                resident_at_start_bytes: peer.resident_at_start_bytes,
                peak_since_start_bytes: 0,
                final_loss: peer.final_loss,
                matmul_peak: None,
                version: format!("{}; allocator: {}", peer.version, allocator.describe()),
            }),
            Err(error) => {
                eprintln!("{name}: {error:#}");
                failures.push((name, format!("{error:#}")));
            }
        }
    }
}

fn measure_backend(
    backend: BackendName,
    config: &HlatConfig,
    args: &TrainBenchArgs,
) -> anyhow::Result<Vec<TrainMeasurement>> {
    // A pipelined step runs on as many replicas of the device as it has stages; the matmul peak
    // is measured on the first alone.
    let replicas = u16::try_from(args.replicas())
        .ok()
        .filter(|&replicas| replicas <= MAX_REPLICAS)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--pp {}: a device stands for 1 to {MAX_REPLICAS} replicas",
                args.replicas()
            )
        })?;
    let single = |name: &str| {
        anyhow::ensure!(
            replicas == 1,
            "--pp {replicas}: {name} is a single device (use host or xla)"
        );
        Ok(())
    };
    if matches!(
        backend,
        BackendName::NdArray | BackendName::Flex | BackendName::RemoteFlex
    ) {
        single(backend.name())?;
    }
    measure(backend, replicas, config, args)
}

/// A preset name or a config JSON file.
pub fn load_config(preset: &str) -> anyhow::Result<HlatConfig> {
    let path = std::path::Path::new(preset);
    let config = if path.is_file() {
        HlatConfig::load(path)?
    } else {
        HlatConfig::preset(preset)?
    };
    Ok(config)
}

/// What the Trainium counters moved by over some steps.
#[derive(Debug, Clone, Copy, Default)]
struct Counted {
    compiles: u64,
    compile_seconds: f64,
    host_fallbacks: u64,
    operations: u64,
    capture_seconds: f64,
    prepare_seconds: f64,
    segments: u64,
}

impl Counted {
    /// Adds what the counters moved by from `before` to `after`.
    fn add(&mut self, before: &Stats, after: &Stats) {
        self.compiles += after.compiles - before.compiles;
        self.compile_seconds += after.compile_seconds - before.compile_seconds;
        self.host_fallbacks += after.host_fallbacks - before.host_fallbacks;
        self.operations += after.operations_captured - before.operations_captured;
        self.capture_seconds += after.capture_seconds - before.capture_seconds;
        self.prepare_seconds += after.prepare_seconds - before.prepare_seconds;
        self.segments += after.segments_run - before.segments_run;
    }
}

/// One row of a worker: a micro-batch count, its data and what its steps measured.
struct Row {
    micro_batches: usize,
    /// `micro_batches × batch` rows of `seq_len + 1` tokens.
    rows: Vec<Vec<u32>>,
    step_seconds: Vec<f64>,
    warmup: Counted,
    timed: Counted,
    final_loss: f64,
}

/// Measures the training step on `backend`'s device of `replicas` replicas (the matmul peak is
/// measured on its first replica alone),
/// one row per micro-batch count, through `hlat pretrain`'s optimizer step. One Learner runs
/// every row: each round of steps takes each row once, starting one row further each round, so
/// that the rows share the machine's state (load, clocks, caches) as evenly as they can.
fn measure(
    backend: BackendName,
    replicas: u16,
    config: &HlatConfig,
    args: &TrainBenchArgs,
) -> anyhow::Result<Vec<TrainMeasurement>> {
    let counts = args.micro_batch_counts();
    let (seq_len, batch) = (args.seq_len(), args.batch());
    let recipe = args.recipe(seq_len, batch, counts[0])?;
    let precision = recipe.precision;
    let layout = recipe.layout();
    let matmul_peak = match args.peak_flops {
        Some(_) => None,
        None => Some(peak::probe(&backend.device(1)?.device)?),
    };
    let mut bench = backend.device(replicas)?;
    bench.device = bench.device.autodiff();
    let device = &bench.device;
    device.seed(7);
    let model = config
        .try_init(device)?
        .with_moe_capacity_factor(args.moe_capacity_factor);
    let model = cast_params(model, precision.param_dtype());
    // The model split as `hlat pretrain` splits it (trainer/src/pretrain/setup.rs).
    let model = LanguageModel::new(model, precision.compute_cast());
    let pipeline = pipeline_stages(config, &recipe)?;
    let hlat = match &pipeline {
        Some(pipeline) => model
            .hlat
            .into_stages(pipeline)
            .map_err(|reason| anyhow::anyhow!("--pp-layers: {reason}"))?,
        None => model.hlat,
    };
    let stages = pipeline.as_ref().map_or(1, PipelineParallel::stages);
    let bubbles: Vec<f64> = counts
        .iter()
        .map(|&count| predicted_bubble(pipeline.as_ref(), count))
        .collect();
    let model = LanguageModel {
        hlat,
        checkpointing: recipe.activation_checkpointing,
        pipeline,
        ..model
    };
    let total_steps = ((args.warmup + args.steps()) * counts.len()) as u64;
    // The learning rate changes every step, as under HLAT's schedule.
    let schedule = WarmupCosine {
        peak: recipe.lr,
        warmup_steps: total_steps,
        decay_steps: 0,
        min_ratio: recipe.min_lr_ratio,
    };
    // `hlat pretrain`'s optimizer step, on a Learner of the bench's own.
    let step = OptimizerStep::from_config(&recipe);
    let mut learner = step.learner(model, AdamWSettings::from_config(&recipe), schedule);
    let mut progress = TrainingProgress::default();
    // The same data at the start of every row: its first micro-batch is the same.
    let mut rows: Vec<Row> = counts
        .iter()
        .map(|&micro_batches| Row {
            micro_batches,
            rows: batch_rows(config.vocab_size, micro_batches * batch, seq_len),
            step_seconds: Vec::new(),
            warmup: Counted::default(),
            timed: Counted::default(),
            final_loss: f64::NAN,
        })
        .collect();
    let upload = |rows: &[Vec<u32>]| {
        if layout.replicas() == 1 {
            LmBatch::from_rows(rows, device)
        } else {
            LmBatch::for_layout(rows, &layout, device)
        }
    };
    bench.sync()?;
    let resident_at_start_bytes = resident_bytes().unwrap_or(0);
    let peak_before_start = peak_resident_bytes().unwrap_or(0);
    if let Err(error) = reset_peak_resident() {
        log::warn!("the peak since the start is the whole process's: {error}");
    }

    for round in 0..args.warmup + args.steps() {
        for offset in 0..rows.len() {
            let index = (round + offset) % rows.len();
            let row = &mut rows[index];
            let before = bench.stats();
            let start = Instant::now();
            let micro_batches = row.rows.chunks(batch).map(&upload).collect();
            // The step reads the loss and gradient norm back; the sync runs the update too.
            let report = step.run(&mut learner, &mut progress, micro_batches)?;
            bench.sync()?;
            let seconds = start.elapsed().as_secs_f64();
            let after = bench.stats();
            row.final_loss = report.loss;
            if round < args.warmup {
                row.warmup.add(&before, &after);
            } else {
                row.timed.add(&before, &after);
                row.step_seconds.push(seconds);
            }
        }
    }
    let peak_since_start = peak_resident_bytes().unwrap_or(0);
    bench.report_host_fallbacks();
    Ok(rows
        .into_iter()
        .zip(bubbles)
        .map(|(row, predicted_bubble)| {
            let median_step_seconds = median(&row.step_seconds);
            let (warmup, timed) = (row.warmup, row.timed);
            TrainMeasurement {
                backend: backend.name().to_string(),
                seq_len,
                batch: row.rows.len(),
                micro_batches: row.micro_batches,
                pipeline_stages: stages,
                predicted_bubble,
                median_step_seconds,
                seconds_per_micro_batch: median_step_seconds / row.micro_batches as f64,
                measured_efficiency: None,
                predicted_efficiency: None,
                tokens_per_second: (row.rows.len() * seq_len) as f64 / median_step_seconds,
                mfu: None,
                warmup_compiles: warmup.compiles,
                timed_compiles: timed.compiles,
                compile_seconds: warmup.compile_seconds + timed.compile_seconds,
                host_fallbacks: timed.host_fallbacks,
                operations_per_step: timed.operations / args.steps,
                capture_micros_per_operation: micros_per(timed.capture_seconds, timed.operations),
                prepare_micros_per_segment: micros_per(timed.prepare_seconds, timed.segments),
                warmup_prepare_micros_per_segment: micros_per(
                    warmup.prepare_seconds,
                    warmup.segments,
                ),
                peak_rss_bytes: peak_before_start.max(peak_since_start),
                resident_at_start_bytes,
                peak_since_start_bytes: peak_since_start,
                final_loss: row.final_loss,
                matmul_peak,
                version: backend.description().to_string(),
            }
        })
        .collect())
}

/// The seed of the benchmark's token rows (`batch_rows`; scripts/bench_peer.py draws the same).
const ROWS_SEED: u64 = 0x2545_F491_4F6C_DD1D;

/// Deterministic rows of `seq_len + 1` token ids for the benchmark batch, drawn from the
/// project's SplitMix64.
pub(super) fn batch_rows(vocab_size: usize, batch: usize, seq_len: usize) -> Vec<Vec<u32>> {
    let mut rng = SplitMix64::new(ROWS_SEED);
    (0..batch)
        .map(|_| {
            (0..=seq_len)
                .map(|_| rng.below(vocab_size as u64) as u32)
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    /// scripts/bench_peer.py's `batch_rows(100, 1, 5)`: the peers train on the same tokens.
    #[test]
    fn the_rows_are_the_python_peers_rows() {
        assert_eq!(
            super::batch_rows(100, 1, 5),
            vec![vec![76, 12, 1, 50, 62, 24]]
        );
    }
}
