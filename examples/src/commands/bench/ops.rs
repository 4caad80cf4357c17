//! `hlat bench ops`: micro-benchmarks of the model's operations, per backend.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Device, DeviceConfig, Distribution, FloatDType, IntDType, Tensor};
use clap::Args;
use serde::{Deserialize, Serialize};

use super::backends::{self, BackendName, emit_result, median, parse_backends, worker_backend};
use super::peak::{self, Peak, PeakProbe};
use super::report;
use super::train::load_config;

/// Arguments of `hlat bench ops`.
#[derive(Args, Clone)]
pub struct OpsBenchArgs {
    /// Model preset whose shapes are measured (or a config JSON file).
    #[arg(long, default_value = "bench-tiny")]
    pub preset: String,
    /// Backends to compare, comma-separated: host, xla, ndarray, flex.
    #[arg(long, default_value = "host,xla,ndarray,flex")]
    pub backends: String,
    /// Sequences in the measured batch.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub seq_len: u64,
    /// Timed repetitions of each operation (after two untimed ones).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub repeats: u64,
    /// Float precision: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub precision: String,
    /// Where to write the JSON results: a file there is replaced, a path inside another
    /// command's output folder (a training run, a model) refused.
    #[arg(long, default_value = "bench-ops.json")]
    pub json: PathBuf,
    /// Internal: measure one backend in this process and print its result.
    #[arg(long, hide = true)]
    pub worker: bool,
}

/// One operation measured on one backend.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpMeasurement {
    /// The backend.
    pub backend: String,
    /// The operation and its shape.
    pub operation: String,
    /// Median seconds per call.
    pub median_seconds: f64,
    /// Throughput: GFLOP/s for compute-bound operations, GB/s for memory-bound ones.
    pub throughput: f64,
    /// The unit of `throughput`.
    pub unit: String,
}

/// What one backend's worker reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackendOps {
    /// The backend.
    pub backend: String,
    /// Its best f32 matmul rate on this machine, probed before and after the operations.
    pub matmul_peak: PeakProbe,
    /// The operations measured.
    pub operations: Vec<OpMeasurement>,
}

/// A full `hlat bench ops` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpsReport {
    /// The command line that produced the report.
    pub command: String,
    /// The machine.
    pub machine: String,
    /// The fastest matmul of the backends measured: no compute-bound operation can beat it.
    pub peak: Option<Peak>,
    /// One entry per backend that ran.
    pub backends: Vec<BackendOps>,
}

/// Runs `hlat bench ops`.
pub fn run(args: OpsBenchArgs) -> anyhow::Result<()> {
    if args.worker {
        let backend = worker_backend(&args.backends)?;
        return emit_result(&measure_backend(backend, &args)?);
    }
    let backends = parse_backends(&args.backends)?;
    let mut measured = Vec::new();
    for backend in backends {
        let arguments = vec![
            "bench".to_string(),
            "ops".to_string(),
            "--preset".to_string(),
            args.preset.clone(),
            "--backends".to_string(),
            backend.name().to_string(),
            "--batch".to_string(),
            args.batch.to_string(),
            "--seq-len".to_string(),
            args.seq_len.to_string(),
            "--repeats".to_string(),
            args.repeats.to_string(),
            "--precision".to_string(),
            args.precision.clone(),
        ];
        eprintln!("measuring operations on {backend}...");
        match backends::run_worker::<BackendOps>(&arguments, &format!("the {backend} worker")) {
            Ok(result) => measured.push(result),
            Err(error) => eprintln!("{backend}: {error:#}"),
        }
    }
    let probes: Vec<(String, PeakProbe)> = measured
        .iter()
        .map(|result| (result.backend.clone(), result.matmul_peak))
        .collect();
    let report = OpsReport {
        command: report::command_line(),
        machine: report::machine_description(),
        peak: Peak::choose(None, &probes),
        backends: measured,
    };
    if let Some(peak) = &report.peak {
        println!(
            "peak: {:.2} GFLOP/s, {}\n",
            peak.flops_per_second / 1e9,
            peak.source
        );
    }
    println!("| backend | operation | median | throughput |");
    println!("| --- | --- | ---: | ---: |");
    for backend in &report.backends {
        for measurement in &backend.operations {
            println!(
                "| {} | {} | {:.3} ms | {:.2} {} |",
                measurement.backend,
                measurement.operation,
                measurement.median_seconds * 1e3,
                measurement.throughput,
                measurement.unit
            );
        }
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    Ok(())
}

fn measure_backend(backend: BackendName, args: &OpsBenchArgs) -> anyhow::Result<BackendOps> {
    measure_all(backend, backend.device(1)?.device, args)
}

/// Times `operation` and returns the median over `repeats` runs (after two untimed ones, where
/// compiles happen). Each timed region ends once the device has finished: the result is kept
/// alive across the sync, so a lazy backend computes it inside the region.
fn time<T>(device: &Device, repeats: u64, mut operation: impl FnMut() -> T) -> anyhow::Result<f64> {
    let mut samples = Vec::new();
    for run in 0..2 + repeats {
        let start = Instant::now();
        let result = operation();
        device.sync().context("synchronising the device")?;
        let seconds = start.elapsed().as_secs_f64();
        drop(result);
        if run >= 2 {
            samples.push(seconds);
        }
    }
    Ok(median(&samples))
}

fn measure_all(
    backend: BackendName,
    mut device: Device,
    args: &OpsBenchArgs,
) -> anyhow::Result<BackendOps> {
    let config = load_config(&args.preset)?;
    let precision = parse_precision(&args.precision)?;
    device
        .configure(
            DeviceConfig::default()
                .float_dtype(precision)
                .int_dtype(IntDType::I32),
        )
        .map_err(|error| {
            anyhow::anyhow!("{backend} cannot run in {}: {error:?}", args.precision)
        })?;
    let first_probe = peak::probe(&device)?;
    let element_bytes = if args.precision == "bf16" { 2.0 } else { 4.0 };
    let (batch, seq_len) = (args.batch as usize, args.seq_len as usize);
    let tokens = batch * seq_len;
    let (hidden, ffn, vocab) = (config.hidden_size, config.ffn_size, config.vocab_size);
    let heads = config.num_heads;
    let head_dim = hidden / heads;
    let random =
        |shape: Vec<usize>| Tensor::<2>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let mut results = Vec::new();
    let mut record = |operation: String, seconds: f64, amount: f64, unit: &str| {
        results.push(OpMeasurement {
            backend: backend.name().to_string(),
            operation,
            median_seconds: seconds,
            throughput: amount / seconds / 1e9,
            unit: unit.to_string(),
        });
    };

    for (name, n) in [
        ("qkv/o projection", hidden),
        ("ffn up", ffn),
        ("lm head", vocab),
    ] {
        let (activations, weight) = (random(vec![tokens, hidden]), random(vec![hidden, n]));
        let seconds = time(&device, args.repeats, || {
            activations.clone().matmul(weight.clone())
        })?;
        record(
            format!("matmul {name} [{tokens}x{hidden}]x[{hidden}x{n}]"),
            seconds,
            2.0 * (tokens * hidden * n) as f64,
            "GFLOP/s",
        );
    }

    let scores = Tensor::<3>::random(
        [batch * heads, seq_len, seq_len],
        Distribution::Normal(0.0, 1.0),
        &device,
    );
    let seconds = time(&device, args.repeats, || softmax(scores.clone(), 2))?;
    let scores_bytes = 2.0 * (batch * heads * seq_len * seq_len) as f64 * element_bytes;
    record(
        format!("softmax [{}x{}x{}]", batch * heads, seq_len, seq_len),
        seconds,
        scores_bytes,
        "GB/s",
    );

    let activations = random(vec![tokens, hidden]);
    let weight = Tensor::<1>::ones([hidden], &device);
    let seconds = time(&device, args.repeats, || {
        let x = activations.clone();
        let scale = (x.clone().powf_scalar(2.0).mean_dim(1) + config.rms_norm_eps)
            .sqrt()
            .recip();
        x * scale * weight.clone().unsqueeze()
    })?;
    record(
        format!("rmsnorm [{tokens}x{hidden}]"),
        seconds,
        2.0 * (tokens * hidden) as f64 * element_bytes,
        "GB/s",
    );

    let shape = [batch, heads, seq_len, head_dim];
    let (query, key, value) = (
        Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device),
        Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device),
        Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device),
    );
    let causal = Tensor::<2, Bool>::triu_mask([seq_len, seq_len], 1, &device).unsqueeze::<4>();
    let seconds = time(&device, args.repeats, || {
        let scores = query.clone().matmul(key.clone().swap_dims(2, 3)) / (head_dim as f64).sqrt();
        softmax(scores.mask_fill(causal.clone(), f32::NEG_INFINITY), 3).matmul(value.clone())
    })?;
    let attention_flops = 4.0 * (batch * heads * seq_len * seq_len * head_dim) as f64;
    record(
        format!(
            "causal attention [{}x{}x{}x{}]",
            batch, heads, seq_len, head_dim
        ),
        seconds,
        attention_flops,
        "GFLOP/s",
    );
    let last_probe = peak::probe(&device)?;
    let matmul_peak = if last_probe.flops_per_second > first_probe.flops_per_second {
        last_probe
    } else {
        first_probe
    };
    Ok(BackendOps {
        backend: backend.name().to_string(),
        matmul_peak,
        operations: results,
    })
}

/// The float precision named on the command line.
fn parse_precision(text: &str) -> anyhow::Result<FloatDType> {
    match text {
        "f32" => Ok(FloatDType::F32),
        "bf16" => Ok(FloatDType::BF16),
        other => anyhow::bail!("unknown precision `{other}` (expected f32 or bf16)"),
    }
}
