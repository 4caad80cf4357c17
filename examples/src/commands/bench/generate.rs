//! `hlat bench generate`: greedy generation timed on several backends in one run: the prompt
//! pass (prefill) and each new token (decode), with the programs compiled along the way, and a
//! Hugging Face `generate` row when torch and transformers are installed.

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::Device;
use clap::Args;
use hlat::generate::{GenerationOptions, Sampling, generate};
use hlat::{Hlat, HlatConfig};
use serde::{Deserialize, Serialize};

use super::backends::{
    self, BackendName, BenchDevice, Comparison, emit_result, median, peak_resident_bytes,
    reference_device, same_weights, worker_backend,
};
use super::peers::{self, GenerationRun};
use super::report;
use super::train::{batch_rows, load_config};
use crate::commands::ranges::at_least_one;

/// Arguments of `hlat bench generate`.
#[derive(Args, Clone)]
pub struct GenerateBenchArgs {
    /// The model and the backends compared.
    #[command(flatten)]
    pub comparison: Comparison,
    /// Tokens of the prompt.
    #[arg(long, default_value_t = 32, value_parser = at_least_one::<usize>())]
    pub prompt_len: usize,
    /// Tokens generated per run (greedy, no stop token): the first comes from the prompt pass,
    /// each other from one decoding step.
    #[arg(long, default_value_t = 40, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..))]
    pub new_tokens: usize,
    /// Untimed runs before measuring (compiles happen there). Two: a process's second run
    /// also releases the first run's key/value cache, which the first run did not.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Timed runs.
    #[arg(long, default_value_t = 3, value_parser = at_least_one::<usize>())]
    pub runs: usize,
    /// Also time Hugging Face `generate` on the same model shape (greedy, KV cache, PyTorch
    /// eager), when torch and transformers are installed.
    #[arg(long)]
    pub with_transformers: bool,
    /// The Python interpreter of the transformers row.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Where to write the JSON results: a file there is replaced, a path inside another
    /// command's output folder (a training run, a model) refused.
    #[arg(long, default_value = "bench-generate.json")]
    pub json: PathBuf,
    /// Internal: measure one backend in this process and print its result.
    #[arg(long, hide = true)]
    pub worker: bool,
}

/// One backend's (or transformers') measurement of greedy generation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenerateMeasurement {
    /// The backend measured.
    pub backend: String,
    /// Median seconds of the prompt pass, up to the first new token read back.
    pub prefill_seconds: f64,
    /// Prompt tokens per second at that median.
    pub prefill_tokens_per_second: f64,
    /// Median seconds per new token after the first (one decoding step each).
    pub decode_seconds_per_token: f64,
    /// New tokens per second at that median.
    pub decode_tokens_per_second: f64,
    /// Programs compiled during the warmup runs (Trainium executors that compile).
    pub warmup_compiles: u64,
    /// Programs compiled during the timed runs (a fixed set of programs compiles none).
    pub timed_compiles: u64,
    /// Seconds spent compiling.
    pub compile_seconds: f64,
    /// Peak resident memory of the process, bytes.
    pub peak_rss_bytes: u64,
    /// The ids the last run generated (every Rust backend runs the same weights).
    pub tokens: Vec<u32>,
    /// What ran.
    pub version: String,
}

/// A full `hlat bench generate` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenerateReport {
    /// The command line that produced the report.
    pub command: String,
    /// Preset measured.
    pub preset: String,
    /// The model measured.
    pub model: HlatConfig,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// New tokens per run.
    pub new_tokens: usize,
    /// Untimed runs per backend.
    pub warmup: usize,
    /// Timed runs per backend.
    pub runs: usize,
    /// The baseline of the ratios.
    pub baseline: String,
    /// One entry per backend that ran.
    pub results: Vec<GenerateMeasurement>,
    /// Backends that could not run, with the reason.
    pub failures: Vec<(String, String)>,
    /// A description of the machine.
    pub machine: String,
    /// How this `hlat` binary was built.
    pub build: String,
}

/// The prompt every backend (and transformers) generates from: the benchmark's token rows.
fn prompt(config: &HlatConfig, prompt_len: usize) -> Vec<u32> {
    batch_rows(config.vocab_size, 1, prompt_len - 1).remove(0)
}

/// Runs `hlat bench generate`.
pub fn run(args: GenerateBenchArgs) -> anyhow::Result<()> {
    let config = load_config(&args.comparison.preset)?;
    let total = args.prompt_len + args.new_tokens;
    if total > config.max_seq_len {
        anyhow::bail!(
            "--prompt-len {} plus --new-tokens {} exceed the context of {} ({} tokens)",
            args.prompt_len,
            args.new_tokens,
            args.comparison.preset,
            config.max_seq_len
        );
    }
    if args.worker {
        let backend = worker_backend(&args.comparison.backends)?;
        return emit_result(&measure_backend(backend, &config, &args)?);
    }
    let (mut results, mut failures) = backends::measure_each::<GenerateMeasurement>(
        &args.comparison.backends,
        &[],
        "generation",
    )?;
    if args.with_transformers {
        eprintln!("measuring generation in transformers...");
        let run = GenerationRun {
            config: &config,
            prompt_len: args.prompt_len,
            new_tokens: args.new_tokens,
            warmup: args.warmup,
            runs: args.runs,
        };
        match peers::run_generation(&args.python, &run) {
            Ok(peer) => results.push(GenerateMeasurement {
                backend: "transformers".to_string(),
                prefill_seconds: peer.prefill_seconds,
                prefill_tokens_per_second: args.prompt_len as f64 / peer.prefill_seconds,
                decode_seconds_per_token: peer.decode_seconds_per_token,
                decode_tokens_per_second: 1.0 / peer.decode_seconds_per_token,
                warmup_compiles: 0,
                timed_compiles: 0,
                compile_seconds: 0.0,
                peak_rss_bytes: peer.peak_rss_bytes,
                tokens: Vec::new(),
                version: peer.version,
            }),
            Err(error) => {
                eprintln!("transformers: {error:#}");
                failures.push(("transformers".to_string(), format!("{error:#}")));
            }
        }
    }
    let report = GenerateReport {
        command: report::command_line(),
        preset: args.comparison.preset.clone(),
        model: config,
        prompt_len: args.prompt_len,
        new_tokens: args.new_tokens,
        warmup: args.warmup,
        runs: args.runs,
        baseline: args.comparison.baseline.clone(),
        results,
        failures,
        machine: report::machine_description(),
        build: report::build_description(),
    };
    report::publish(&report::generate_table(&report), &report, &args.json)?;
    Ok(())
}

fn measure_backend(
    backend: BackendName,
    config: &HlatConfig,
    args: &GenerateBenchArgs,
) -> anyhow::Result<GenerateMeasurement> {
    measure(backend, backend.device(1)?, config, args)
}

/// The model every backend generates with: drawn once on Flex from a fixed seed (see
/// [`same_weights`]), so greedy decoding can be compared token by token.
fn shared_model(config: &HlatConfig, device: &Device) -> anyhow::Result<Hlat> {
    let reference = config.try_init(&reference_device(7, device))?;
    Ok(same_weights(reference, device))
}

fn measure(
    backend: BackendName,
    bench: BenchDevice,
    config: &HlatConfig,
    args: &GenerateBenchArgs,
) -> anyhow::Result<GenerateMeasurement> {
    let model = shared_model(config, &bench.device)?;
    // The weights are uploaded now: on a lazy backend they would otherwise join the first
    // prompt pass.
    bench.sync()?;
    let prompt = prompt(config, args.prompt_len);
    let options = GenerationOptions {
        max_new_tokens: args.new_tokens,
        sampling: Sampling::Greedy,
        seed: 0,
        stop_ids: Vec::new(),
    };
    let start_stats = bench.stats();
    let mut timed_stats = start_stats;
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    let mut tokens = Vec::new();
    for run in 0..args.warmup + args.runs {
        if run == args.warmup {
            timed_stats = bench.stats();
        }
        // Each token is chosen from logits read back to the host: the times below include the
        // work of the lazy backends.
        let start = Instant::now();
        let mut arrivals = Vec::with_capacity(args.new_tokens);
        tokens = generate(&model, &prompt, &options, |_| arrivals.push(Instant::now()))?;
        if run >= args.warmup {
            let first = arrivals[0];
            let last = arrivals[arrivals.len() - 1];
            prefill.push((first - start).as_secs_f64());
            decode.push((last - first).as_secs_f64() / (arrivals.len() - 1) as f64);
        }
    }
    let end = bench.stats();
    bench.report_host_fallbacks();
    let prefill_seconds = median(&prefill);
    let decode_seconds_per_token = median(&decode);
    Ok(GenerateMeasurement {
        backend: backend.name().to_string(),
        prefill_seconds,
        prefill_tokens_per_second: args.prompt_len as f64 / prefill_seconds,
        decode_seconds_per_token,
        decode_tokens_per_second: 1.0 / decode_seconds_per_token,
        warmup_compiles: timed_stats.compiles - start_stats.compiles,
        timed_compiles: end.compiles - timed_stats.compiles,
        compile_seconds: end.compile_seconds - start_stats.compile_seconds,
        peak_rss_bytes: peak_resident_bytes().unwrap_or(0),
        tokens,
        version: backend.description().to_string(),
    })
}
