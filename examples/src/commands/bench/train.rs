//! `hlat bench train`: the HLAT training step, timed on several backends in one run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::AutodiffBackend;
use burn_trainium::{Trainium, TrainiumDevice};
use clap::Args;
use hlat::HlatConfig;
use hlat_train::config::TrainConfig;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::precision::{Precision, cast_params};
use hlat_train::schedule::WarmupCosine;
use hlat_train::step::{LanguageModel, LmBatch};
use hlat_train::trainer::Trainer;
use serde::{Deserialize, Serialize};

use super::backends::{
    self, BackendName, emit_result, median, parse_backends, peak_resident_bytes,
};
use super::report;

/// Arguments of `hlat bench train`.
#[derive(Args, Clone)]
pub struct TrainBenchArgs {
    /// Model preset (or a config JSON file).
    #[arg(long, default_value = "bench-tiny")]
    pub preset: String,
    /// Backends to compare, comma-separated: host, xla, ndarray, flex.
    #[arg(long, default_value = "host,xla,ndarray,flex")]
    pub backends: String,
    /// The backend the ratios are computed against.
    #[arg(long, default_value = "ndarray")]
    pub baseline: String,
    /// Sequences per step.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub seq_len: usize,
    /// Untimed steps before measuring (compiles happen there).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Precision mode of the trainer: f32, bf16-sr (bf16 parameters, stochastic rounding) or
    /// bf16-mixed (bf16 compute, f32 master weights).
    #[arg(long, default_value = "f32")]
    pub precision: String,
    /// Peak FLOP/s of the machine, for MFU (default: a nominal 100 GFLOP/s CPU core pair).
    #[arg(long, default_value_t = 1.0e11)]
    pub peak_flops: f64,
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

/// One backend's measurement of the training step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainMeasurement {
    /// The backend measured.
    pub backend: String,
    /// Median seconds per training step.
    pub median_step_seconds: f64,
    /// Tokens processed per second at the median step time.
    pub tokens_per_second: f64,
    /// Model FLOPs utilisation against the configured peak.
    pub mfu: f64,
    /// Programs compiled (Trainium executors), warmup included.
    pub compiles: u64,
    /// Operations that fell back to the host during the timed steps.
    pub host_fallbacks: u64,
    /// Operations captured per timed step (Trainium only).
    pub operations_per_step: u64,
    /// Microseconds of capture overhead per captured operation (Trainium only).
    pub capture_micros_per_operation: f64,
    /// Microseconds per segment spent hashing, lowering and looking up the compile cache
    /// (Trainium executors that compile).
    pub prepare_micros_per_segment: f64,
    /// Peak resident memory of the process, bytes.
    pub peak_rss_bytes: u64,
    /// The loss after the last step (a sanity check that every backend trains the same model).
    pub final_loss: f64,
}

/// A full `hlat bench train` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainReport {
    /// Preset measured.
    pub preset: String,
    /// Precision measured.
    pub precision: String,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Timed steps per backend.
    pub steps: usize,
    /// The baseline of the ratios.
    pub baseline: String,
    /// One entry per backend that ran.
    pub results: Vec<TrainMeasurement>,
    /// Backends that could not run, with the reason.
    pub failures: Vec<(String, String)>,
    /// A description of the machine.
    pub machine: String,
}

/// Runs `hlat bench train`.
pub fn run(args: TrainBenchArgs) -> anyhow::Result<()> {
    if args.worker {
        let backend = parse_backends(&args.backends)?;
        let [backend] = backend[..] else {
            anyhow::bail!(
                "a worker measures exactly one backend, got `{}`",
                args.backends
            );
        };
        return emit_result(&measure_backend(backend, &args)?);
    }

    let backends = parse_backends(&args.backends)?;
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for backend in backends {
        let mut arguments: Vec<String> = std::env::args().skip(1).collect();
        replace_flag(&mut arguments, "--backends", backend.name());
        eprintln!("measuring the training step on {backend}...");
        match backends::run_worker::<TrainMeasurement>(&arguments, &format!("the {backend} worker"))
        {
            Ok(measurement) => results.push(measurement),
            Err(error) => {
                eprintln!("{backend}: {error:#}");
                failures.push((backend.name().to_string(), format!("{error:#}")));
            }
        }
    }
    let report = TrainReport {
        preset: args.preset.clone(),
        precision: args.precision.clone(),
        batch: args.batch,
        seq_len: args.seq_len,
        steps: args.steps,
        baseline: args.baseline.clone(),
        results,
        failures,
        machine: report::machine_description(),
    };
    println!("{}", report::train_table(&report));
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    eprintln!("wrote {}", args.json.display());
    if let Some(path) = &args.report {
        report::write_train_report(&report, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Replaces (or appends) `--flag value` in an argument list.
fn replace_flag(arguments: &mut Vec<String>, flag: &str, value: &str) {
    let prefix = format!("{flag}=");
    arguments.retain(|argument| !argument.starts_with(&prefix));
    match arguments.iter().position(|argument| argument == flag) {
        Some(index) if index + 1 < arguments.len() => arguments[index + 1] = value.to_string(),
        _ => arguments.extend([flag.to_string(), value.to_string()]),
    }
}

fn measure_backend(
    backend: BackendName,
    args: &TrainBenchArgs,
) -> anyhow::Result<TrainMeasurement> {
    let config = load_config(&args.preset)?;
    match backend {
        BackendName::TrainiumHost => {
            measure::<Autodiff<Trainium>>(backend, TrainiumDevice::HOST, &config, args)
        }
        BackendName::TrainiumXla => {
            let device = TrainiumDevice::xla(0);
            burn_trainium::check_device(&device)?;
            measure::<Autodiff<Trainium>>(backend, device, &config, args)
        }
        BackendName::NdArray => {
            measure::<Autodiff<NdArray>>(backend, Default::default(), &config, args)
        }
        BackendName::Flex => measure::<Autodiff<Flex>>(backend, Default::default(), &config, args),
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

/// Trainium statistics when `device` is a Trainium device, for counters other backends lack.
fn trainium_stats<B: AutodiffBackend>(device: &B::Device) -> Option<burn_trainium::Stats> {
    (device as &dyn std::any::Any)
        .downcast_ref::<TrainiumDevice>()
        .map(burn_trainium::stats)
}

fn measure<B: AutodiffBackend>(
    backend: BackendName,
    device: B::Device,
    config: &HlatConfig,
    args: &TrainBenchArgs,
) -> anyhow::Result<TrainMeasurement>
where
    B::Device: 'static,
{
    let precision: Precision = args.precision.parse().map_err(anyhow::Error::msg)?;
    B::seed(&device, 7);
    let model = cast_params(config.try_init::<B>(&device)?, precision.param_dtype());
    let recipe = TrainConfig::default();
    let total_steps = (args.warmup + args.steps) as u64;
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
    let rows = batch_rows(config.vocab_size, args.batch, args.seq_len);

    let mut step_seconds = Vec::new();
    let mut final_loss = f64::NAN;
    let mut timed_start = None;
    for step in 0..args.warmup + args.steps {
        if step == args.warmup {
            timed_start = trainium_stats::<B>(&device);
        }
        let start = Instant::now();
        // `train_step` reads the loss and gradient norm back, so the step has fully run.
        let report = trainer.train_step(vec![LmBatch::from_rows(&rows, &device)])?;
        final_loss = report.loss;
        if step >= args.warmup {
            step_seconds.push(start.elapsed().as_secs_f64());
        }
    }
    let median_step_seconds = median(&step_seconds);
    let tokens_per_second = (args.batch * args.seq_len) as f64 / median_step_seconds;
    let flops_per_second = config.train_flops_per_token(args.seq_len) * tokens_per_second;
    let end = trainium_stats::<B>(&device).unwrap_or_default();
    let start = timed_start.unwrap_or_default();
    let operations = end.operations_captured - start.operations_captured;
    Ok(TrainMeasurement {
        backend: backend.name().to_string(),
        median_step_seconds,
        tokens_per_second,
        mfu: flops_per_second / args.peak_flops,
        compiles: end.compiles,
        host_fallbacks: end.host_fallbacks - start.host_fallbacks,
        operations_per_step: operations / args.steps.max(1) as u64,
        capture_micros_per_operation: micros_per(
            end.capture_seconds - start.capture_seconds,
            operations,
        ),
        prepare_micros_per_segment: micros_per(
            end.prepare_seconds - start.prepare_seconds,
            end.segments_run - start.segments_run,
        ),
        peak_rss_bytes: peak_resident_bytes().unwrap_or(0),
        final_loss,
    })
}

fn micros_per(seconds: f64, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        seconds * 1e6 / count as f64
    }
}

/// Deterministic rows of `seq_len + 1` token ids for the benchmark batch.
fn batch_rows(vocab_size: usize, batch: usize, seq_len: usize) -> Vec<Vec<u32>> {
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
