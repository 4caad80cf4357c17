//! The `hlat` command line: pretrain, finetune, align, data, convert, generate, eval, merge, info,
//! compile, bench, cache, serve.

mod allocator;
mod commands;

use clap::{Parser, Subcommand};

/// HLAT: train LLaMA-style models on AWS Trainium (or anywhere) with Burn.
#[derive(Parser)]
#[command(name = "hlat", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Record where the time goes into DIR: a Chrome/Perfetto trace of every phase (`trace.json`,
    /// for ui.perfetto.dev or chrome://tracing) and a per-phase summary (`summary.json`, also
    /// printed at the end).
    #[arg(long, global = true, value_name = "DIR")]
    profile: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Pretrain or continue pretraining an HLAT model.
    Pretrain(commands::pretrain::PretrainArgs),
    /// Fine-tune a model on prompt/completion or chat records: every weight, or LoRA adapters
    /// written as a PEFT folder.
    ///
    /// `--data`: one JSON object per line, `{"prompt", "completion"}` or `{"messages": [{"role",
    /// "content"}, ...]}` (TRL's formats); the loss counts the completion and the assistant
    /// messages only.
    Finetune(commands::finetune::FinetuneArgs),
    /// Align a model to preference pairs by DPO or ORPO, as TRL computes them: every weight, or
    /// LoRA adapters written as a PEFT folder.
    ///
    /// `--data`: one JSON object per line, TRL's preference format: `{"prompt", "chosen",
    /// "rejected"}`, each plain text, or conversational (`prompt` a list of messages, `chosen`
    /// and `rejected` lists of the assistant's messages, rendered with the chat template); without
    /// `prompt` (or with a prompt of the other kind), the prompt is the completions' common
    /// beginning, extracted as TRL extracts it. A pair
    /// is two rows, its chosen and its rejected sequence, padded to one bucket length:
    /// `--micro-batch-rows` counts rows and must be even. DPO's reference log-probabilities are
    /// computed before training and pinned with the run's settings in `OUT/preference.json`.
    Align(commands::align::AlignArgs),
    /// Prepare data: tokenizers, encoding, token shards.
    Data(commands::data::DataArgs),
    /// Convert checkpoints between Hugging Face and native layouts.
    Convert(commands::convert::ConvertArgs),
    /// Generate text from a checkpoint.
    Generate(commands::generate::GenerateArgs),
    /// Evaluate a checkpoint: validation loss, perplexity of a text, multiple-choice accuracy.
    Eval(commands::eval::EvalArgs),
    /// Merge Hugging Face checkpoints of one architecture as mergekit 0.1.5 does, from its YAML
    /// configuration: linear, slerp, nuslerp, multislerp, karcher, model_stock,
    /// task_arithmetic, ties, dare_ties, dare_linear, breadcrumbs, breadcrumbs_ties, della,
    /// della_linear, sce, nearswap, arcee_fusion, passthrough, and `slices` frankenmerges.
    Merge(commands::merge::MergeArgs),
    /// Print a configuration, its parameter count and, for a parallel layout, its memory per
    /// device.
    Info(commands::info::InfoArgs),
    /// Compile a training run's programs ahead of time into the Neuron compile cache (or only
    /// check them against the Neuron lint), writing nothing into any run folder.
    Compile(commands::compile::CompileArgs),
    /// Measure performance side by side: training steps, operations, generation, Burn's
    /// Learner, data ingest, against other backends and PyTorch.
    Bench(commands::bench::BenchArgs),
    /// List and prune the compile caches (`xla` programs, Neuron NEFFs).
    Cache(commands::cache::CacheArgs),
    /// Serve Trainium devices to other processes as Burn remote devices (loopback only, unless
    /// a shared secret is given with --token-file); prints the address (`ws://...`), then
    /// serves until Ctrl+C or SIGTERM.
    Serve(commands::serve::ServeArgs),
}

/// The exit status of a command that reports an error (a bad flag, file, field or device, or a
/// failure while running), as clap's own usage errors, except a fault of the machine
/// ([`FAULT_STATUS`]); a panic (a bug) exits with 101.
const ERROR_STATUS: i32 = 2;

/// The exit status of a run stopped by a fault of the machine rather than of its input: a
/// checkpoint that could not be written (a full disk, an unwritable folder).
const FAULT_STATUS: i32 = 1;

/// The exit status `error` ends `hlat` with.
fn exit_status(error: &anyhow::Error) -> i32 {
    let fault = error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<hlat_train::error::TrainError>(),
            Some(hlat_train::error::TrainError::CheckpointWrite { .. })
        )
    });
    if fault { FAULT_STATUS } else { ERROR_STATUS }
}

/// Where the NeuronCores of a one-process job meet for their collectives unless the user says
/// (a process of a job of several gets rank 0's host, see `commands::pretrain`).
const DEFAULT_ROOT_COMM_ID: &str = "localhost:61234";

fn main() {
    let allocator = allocator::keep_freed_memory();
    let launched = hlat_train::parallel::ProcessGroup::from_env()
        .map_or(true, |process| process.world_size > 1);
    if !launched && std::env::var_os(burn_trainium::neuron::ROOT_COMM_ID_ENV).is_none() {
        // SAFETY: the first thing `main` does, before any other thread exists.
        unsafe {
            std::env::set_var(
                burn_trainium::neuron::ROOT_COMM_ID_ENV,
                DEFAULT_ROOT_COMM_ID,
            )
        };
    }
    // The in-process device servers' start (Burn's WebSocket server logs its loopback port at
    // `info`) is an implementation detail; `hlat serve` prints its own address.
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("info,burn_communication=warn"),
    )
    .init();
    log::debug!("allocator: {allocator}");
    let cli = Cli::parse();
    if cli.profile.is_none() {
        // Burn 0.22's server dependencies turn on tracing's `log` feature: without a tracing
        // subscriber, every span would also be logged at `info`.
        burn_trainium::profile::record_nothing();
    }
    let profile = match cli
        .profile
        .as_deref()
        .map(commands::profile::start)
        .transpose()
    {
        Ok(profile) => profile,
        Err(error) => {
            eprintln!("error: {}", error_text(&error));
            std::process::exit(ERROR_STATUS);
        }
    };
    let result = match cli.command {
        Command::Pretrain(args) => commands::pretrain::run(args),
        Command::Finetune(args) => commands::finetune::run(args),
        Command::Align(args) => commands::align::run(args),
        Command::Data(args) => commands::data::run(args),
        Command::Convert(args) => commands::convert::run(args),
        Command::Generate(args) => commands::generate::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Merge(args) => commands::merge::run(args),
        Command::Info(args) => commands::info::run(args),
        Command::Compile(args) => commands::compile::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Cache(args) => commands::cache::run(args),
        Command::Serve(args) => commands::serve::run(args),
    };
    let result = match profile {
        Some(profile) => result.and(commands::profile::finish(profile)),
        None => result,
    };
    if let Err(error) = result {
        eprintln!("error: {}", error_text(&error));
        std::process::exit(exit_status(&error));
    }
}

/// `error` and its causes joined by ": ", each cause once: an error whose message already holds
/// its cause's text (`{path}: {source}`) does not repeat it.
fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_its_errors_message_is_not_repeated() {
        /// A write error whose message holds its cause, as `{path}: {source}` errors do.
        #[derive(Debug)]
        struct Write(std::io::Error);
        impl std::fmt::Display for Write {
            fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(formatter, "model.safetensors: {}", self.0)
            }
        }
        impl std::error::Error for Write {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::other("File too large");
        let error = anyhow::Error::new(Write(io)).context("exporting to out");
        assert_eq!(
            error_text(&error),
            "exporting to out: model.safetensors: File too large"
        );
    }
}
