//! `hlat bench train`: the HLAT training step, timed on several backends in one run.

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::{Autodiff, Flex, NdArray};
use burn_trainium::{Trainium, TrainiumDevice};
use clap::Args;
use hlat::HlatConfig;
use hlat_train::config::TrainConfig;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::parallel::TrainingBackend;
use hlat_train::precision::{Precision, cast_params};
use hlat_train::schedule::WarmupCosine;
use hlat_train::step::{LanguageModel, LmBatch};
use hlat_train::trainer::Trainer;
use serde::{Deserialize, Serialize};

use super::backends::{
    self, BackendName, Comparison, emit_result, median, peak_resident_bytes, reset_peak_resident,
    resident_bytes, trainium_stats, worker_backend,
};
use super::peak::{self, Peak, PeakProbe};
use super::peers::{self, Framework, PeerStep};
use super::report;
use crate::commands::micros_per;

/// Arguments of `hlat bench train`.
#[derive(Args, Clone)]
pub struct TrainBenchArgs {
    /// The model and the backends compared.
    #[command(flatten)]
    pub comparison: Comparison,
    /// Sequences per step (at the first `--seq-len`).
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
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-train.json")]
    pub json: PathBuf,
    /// Also write a Markdown report (and a PNG plot beside it) to this path.
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
}

/// One backend's (or peer's) measurement of the training step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainMeasurement {
    /// The backend measured.
    pub backend: String,
    /// Tokens per sequence of the step measured.
    pub seq_len: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Median seconds per training step.
    pub median_step_seconds: f64,
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
    let longest = args.seq_len.iter().max().copied().unwrap_or(1) as usize;
    config.max_seq_len = config.max_seq_len.max(longest);
    if args.worker {
        let backend = worker_backend(&args.comparison.backends)?;
        return emit_result(&measure_backend(backend, &config, &args)?);
    }
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for (seq_len, batch) in args.layouts()? {
        let overrides = [
            ("--seq-len", seq_len.to_string()),
            ("--batch", batch.to_string()),
        ];
        let (measured, failed) = backends::measure_each::<TrainMeasurement>(
            &args.comparison.backends,
            &overrides,
            &format!("the training step ({batch} × {seq_len} tokens)"),
        )?;
        results.extend(measured);
        failures.extend(failed);
        measure_peers(&args, &config, seq_len, batch, &mut results, &mut failures);
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
    report::publish(&report::train_table(&report), &report, &args.json)?;
    if let Some(path) = &args.report {
        report::write_train_report(&report, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
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
    for framework in peers
        .into_iter()
        .filter_map(|(on, framework)| on.then_some(framework))
    {
        eprintln!("measuring the training step in {}...", framework.name());
        let step = PeerStep {
            config,
            batch,
            seq_len,
            warmup: args.warmup,
            steps: args.steps(),
            precision: &args.precision,
        };
        match peers::run(&args.python, framework, &step) {
            Ok(peer) => results.push(TrainMeasurement {
                backend: framework.name().to_string(),
                seq_len,
                batch,
                median_step_seconds: peer.median_step_seconds,
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
                version: peer.version,
            }),
            Err(error) => {
                eprintln!("{}: {error:#}", framework.name());
                failures.push((framework.name().to_string(), format!("{error:#}")));
            }
        }
    }
}

fn measure_backend(
    backend: BackendName,
    config: &HlatConfig,
    args: &TrainBenchArgs,
) -> anyhow::Result<TrainMeasurement> {
    match backend {
        BackendName::TrainiumHost => {
            measure::<Autodiff<Trainium>>(backend, TrainiumDevice::HOST, config, args)
        }
        BackendName::TrainiumXla => {
            measure::<Autodiff<Trainium>>(backend, backends::xla_device()?, config, args)
        }
        BackendName::NdArray => {
            measure::<Autodiff<NdArray>>(backend, Default::default(), config, args)
        }
        BackendName::Flex => measure::<Autodiff<Flex>>(backend, Default::default(), config, args),
    }
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

fn measure<B: TrainingBackend>(
    backend: BackendName,
    device: B::Device,
    config: &HlatConfig,
    args: &TrainBenchArgs,
) -> anyhow::Result<TrainMeasurement>
where
    B::Device: 'static,
{
    let precision: Precision = args.precision.parse().map_err(anyhow::Error::msg)?;
    let matmul_peak = match args.peak_flops {
        Some(_) => None,
        None => Some(peak::probe::<B::InnerBackend>(&device)?),
    };
    let probe_stats = trainium_stats(&device).unwrap_or_default();
    B::seed(&device, 7);
    let model = cast_params(config.try_init::<B>(&device)?, precision.param_dtype());
    let recipe = TrainConfig::default();
    let total_steps = (args.warmup + args.steps()) as u64;
    // The learning rate changes every step, as under HLAT's schedule.
    let schedule = WarmupCosine {
        peak: recipe.lr,
        warmup_steps: total_steps,
        decay_steps: 0,
        min_ratio: recipe.min_lr_ratio,
    };
    let mut trainer = Trainer::new(
        LanguageModel::new(model, precision.compute_cast()),
        AdamWSettings::from_config(&recipe),
        schedule,
        recipe.clip_grad_norm,
        recipe.seed,
        recipe.max_consecutive_skips,
    );
    let rows = batch_rows(config.vocab_size, args.batch(), args.seq_len());
    B::sync(&device)?;
    let resident_at_start_bytes = resident_bytes().unwrap_or(0);
    let peak_before_start = peak_resident_bytes().unwrap_or(0);
    if let Err(error) = reset_peak_resident() {
        log::warn!("the peak since the start is the whole process's: {error}");
    }

    let mut step_seconds = Vec::new();
    let mut final_loss = f64::NAN;
    let mut timed_start = probe_stats;
    for step in 0..args.warmup + args.steps() {
        if step == args.warmup {
            timed_start = trainium_stats(&device).unwrap_or_default();
        }
        let start = Instant::now();
        // `train_step` reads the loss and gradient norm back; the sync runs the update too.
        let report = trainer.train_step(vec![LmBatch::from_rows(&rows, &device)])?;
        B::sync(&device)?;
        final_loss = report.loss;
        if step >= args.warmup {
            step_seconds.push(start.elapsed().as_secs_f64());
        }
    }
    let peak_since_start = peak_resident_bytes().unwrap_or(0);
    let median_step_seconds = median(&step_seconds);
    let tokens_per_second = (args.batch() * args.seq_len()) as f64 / median_step_seconds;
    let end = trainium_stats(&device).unwrap_or_default();
    backends::report_host_fallbacks(&device);
    let start = timed_start;
    let operations = end.operations_captured - start.operations_captured;
    Ok(TrainMeasurement {
        backend: backend.name().to_string(),
        seq_len: args.seq_len(),
        batch: args.batch(),
        median_step_seconds,
        tokens_per_second,
        mfu: None,
        warmup_compiles: start.compiles - probe_stats.compiles,
        timed_compiles: end.compiles - start.compiles,
        compile_seconds: end.compile_seconds - probe_stats.compile_seconds,
        host_fallbacks: end.host_fallbacks - start.host_fallbacks,
        operations_per_step: operations / args.steps,
        capture_micros_per_operation: micros_per(
            end.capture_seconds - start.capture_seconds,
            operations,
        ),
        prepare_micros_per_segment: micros_per(
            end.prepare_seconds - start.prepare_seconds,
            end.segments_run - start.segments_run,
        ),
        warmup_prepare_micros_per_segment: micros_per(
            start.prepare_seconds - probe_stats.prepare_seconds,
            start.segments_run - probe_stats.segments_run,
        ),
        peak_rss_bytes: peak_before_start.max(peak_since_start),
        resident_at_start_bytes,
        peak_since_start_bytes: peak_since_start,
        final_loss,
        matmul_peak,
        version: backend.description().to_string(),
    })
}

/// Deterministic rows of `seq_len + 1` token ids for the benchmark batch.
pub(super) fn batch_rows(vocab_size: usize, batch: usize, seq_len: usize) -> Vec<Vec<u32>> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab_size as u64) as u32
    };
    (0..batch)
        .map(|_| (0..=seq_len).map(|_| next()).collect())
        .collect()
}
