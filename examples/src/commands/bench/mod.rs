//! `hlat bench`: side-by-side performance measurement of backends and executors.
//!
//! Every backend is measured in its own child process (the same `hlat` binary, started with the
//! hidden `--worker` flag), so that peak memory is per backend and one backend's threads or caches
//! don't disturb another. The parent collects one JSON line from each child, prints a table with
//! ratios against a chosen baseline, and writes a JSON file (and, on request, a Markdown report
//! with a PNG plot, written entirely by the tool). Every timed region ends with its result read
//! or the device synchronised, so lazy backends do the work inside it; compiles in the warmup
//! and in the timed steps are counted apart; MFU divides by a peak measured in the same run
//! (the fastest f32 matmul of the backends measured) unless `--peak-flops` is given. PyTorch and
//! JAX peers (`--with-pytorch`, `--with-jax`) run the same model and step side by side;
//! `hlat bench generate --with-transformers` adds Hugging Face `generate`.

mod backends;
mod cnn;
mod generate;
mod ingest;
mod learner;
mod ops;
mod peak;
mod peers;
mod report;
mod route;
mod serve;
mod train;
mod training_loop;
mod unrolled;

use clap::{Args, Subcommand};

/// Arguments of `hlat bench`.
#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The HLAT training step on several backends, after warmup.
    Train(Box<train::TrainBenchArgs>),
    /// Micro-benchmarks of the model's operations (matmul, softmax, RMSNorm, attention).
    Ops(ops::OpsBenchArgs),
    /// Greedy generation on several backends: prefill and decode tokens/s, and compiles.
    Generate(generate::GenerateBenchArgs),
    /// A training step of about ten thousand operations (an unrolled LSTM): time to the first
    /// step, compile seconds and steady step time.
    Unrolled(unrolled::UnrolledBenchArgs),
    /// A small CNN in Burn's MNIST style (conv2d, max-pool, adaptive average pool, linear)
    /// trained on generated images, on several backends and, with `--with-pytorch`, in PyTorch.
    Cnn(cnn::CnnBenchArgs),
    /// Training as Burn users write it (burn-train's `Learner` or the loop of Burn's examples, a
    /// `DataLoader`, loss and accuracy metrics, validation every epoch) for Burn's modern-lstm,
    /// a small recurrent model and a small CNN:
    /// cold and warm wall time, segments and transfers per iteration, compiles, host fallbacks.
    Learner(learner::LearnerBenchArgs),
    /// What Burn 0.22's remote route costs: microseconds per operation and per read on Flex,
    /// on Flex behind the route, and on the Trainium devices, side by side.
    Route(route::RouteBenchArgs),
    /// One device server under N client processes at once (as `hlat serve` runs it): steps per
    /// second, step latency, each client's losses against one alone, the server's live bytes.
    Serve(serve::ServeBenchArgs),
    /// `hlat data ingest` against Hugging Face `tokenizers` on the same documents: MB/s,
    /// tokens/s and peak memory, and peak memory at a multiple of the corpus.
    Ingest(ingest::IngestBenchArgs),
}

impl BenchCommand {
    /// The files the benchmark writes, each with its flag.
    fn outputs(&self) -> Vec<(&std::path::Path, &'static str)> {
        match self {
            BenchCommand::Train(args) => std::iter::once((args.json.as_path(), "--json"))
                .chain(args.report.as_deref().map(|report| (report, "--report")))
                .collect(),
            BenchCommand::Ops(args) => vec![(&args.json, "--json")],
            BenchCommand::Generate(args) => vec![(&args.json, "--json")],
            BenchCommand::Unrolled(args) => vec![(&args.json, "--json")],
            BenchCommand::Cnn(args) => vec![(&args.json, "--json")],
            BenchCommand::Learner(args) => vec![(&args.json, "--json")],
            BenchCommand::Route(args) => vec![(&args.json, "--json")],
            BenchCommand::Serve(args) => vec![(&args.json, "--json")],
            BenchCommand::Ingest(args) => args
                .json
                .iter()
                .map(|json| (json.as_path(), "--json"))
                .collect(),
        }
    }
}

/// Runs `hlat bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if cfg!(debug_assertions) {
        // Burn's generic kernels of `ndarray` and `flex` are instantiated in this crate, which
        // the dev profile leaves unoptimised: those rows would run several times slower.
        log::warn!(
            "this `hlat` is a dev build: the ndarray and flex rows run unoptimised kernels; \
             measure with `cargo run --release -p hlat-cli -- bench ...`"
        );
    }
    for (file, flag) in args.command.outputs() {
        super::output_folder::check_file_target(file, "bench", flag)?;
    }
    if let BenchCommand::Train(train) = &args.command
        && let Some(path) = &train.report
    {
        report::check_report_target(path)?;
    }
    match args.command {
        BenchCommand::Train(args) => train::run(*args),
        BenchCommand::Ops(args) => ops::run(args),
        BenchCommand::Generate(args) => generate::run(args),
        BenchCommand::Unrolled(args) => unrolled::run(args),
        BenchCommand::Cnn(args) => cnn::run(args),
        BenchCommand::Route(args) => route::run(args),
        BenchCommand::Serve(args) => serve::run(args),
        BenchCommand::Ingest(args) => ingest::run(args),
        BenchCommand::Learner(args) => learner::run(args),
    }
}
