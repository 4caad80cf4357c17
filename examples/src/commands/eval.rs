//! `hlat eval`: validation loss and perplexity of a checkpoint on a run's data; `hlat eval
//! perplexity` on token rows, text or shards; `hlat eval choice` on a multiple-choice task.

use std::path::{Path, PathBuf};

use anyhow::Context;
use burn::tensor::Device;
use clap::{Args, Subcommand};
use hlat::Hlat;
use hlat::checkpoint::load_any;
use hlat_train::config::TrainConfig;
use hlat_train::data::TextTokenizer;
use hlat_train::data_spec::parse_data_spec;
use hlat_train::eval::{
    ChoiceTask, evaluate_checkpoint, evaluate_choice, json_rows, perplexity_of_rows, shard_rows,
    text_rows,
};
use hlat_train::pretrain::{DataChoice, RUN_CONFIG_FILE};

use super::adapter_arg::AdapterArg;
use super::pretrain::DeviceChoice;

/// Arguments of `hlat eval`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct EvalArgs {
    /// Another evaluation than the validation loss of a run's data.
    #[command(subcommand)]
    task: Option<EvalTask>,
    #[command(flatten)]
    validation: ValidationArgs,
}

/// The evaluations beside the validation loss.
#[derive(Subcommand)]
enum EvalTask {
    /// Perplexity (exp of the mean next-token cross-entropy over every predicted token, rows
    /// evaluated independently) of token rows, a text (with bits per byte) or token shards.
    Perplexity(PerplexityArgs),
    /// Multiple-choice accuracy by log-likelihood (acc, acc_norm), as lm-evaluation-harness
    /// scores it.
    Choice(ChoiceArgs),
}

/// Arguments of `hlat eval` without a subcommand.
#[derive(Args)]
struct ValidationArgs {
    /// A training run folder, a native checkpoint or a Hugging Face folder.
    #[arg(long, value_name = "DIR", required = true)]
    model: Option<PathBuf>,
    /// Prepared shard folders with mixing weights (`[NAME=]FOLDER[:WEIGHT],...`); their
    /// validation splits are measured [default: the built-in corpus].
    #[arg(long, value_name = "SPEC")]
    data: Option<String>,
    /// Tokens per row [default: the run's, else 128].
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    seq_len: Option<usize>,
    /// Validation rows measured.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = super::ranges::at_least_one::<usize>())]
    rows: usize,
    #[command(flatten)]
    device: DeviceArg,
}

/// The device flag every evaluation takes.
#[derive(Args)]
struct DeviceArg {
    /// Device: `ndarray`, or a Trainium device such as `host:0`, `xla:0`
    /// [default: TRAINIUM_DEVICE, else host:0].
    #[arg(long)]
    device: Option<String>,
}

/// The flags `hlat eval perplexity` and `hlat eval choice` share: how they batch the rows they
/// score, on which device, with which adapter.
#[derive(Args)]
struct ScoringArgs {
    /// Rows per batch (every batch has this many rows).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = super::ranges::at_least_one::<usize>())]
    batch_rows: usize,
    #[command(flatten)]
    device: DeviceArg,
    #[command(flatten)]
    adapter: AdapterArg,
}

/// Arguments of `hlat eval perplexity`.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["ids", "text", "shards"])))]
struct PerplexityArgs {
    /// A training run folder, a native checkpoint or a Hugging Face folder.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// A JSON list of lists of token ids, each list one row.
    #[arg(long, value_name = "ROWS.json")]
    ids: Option<PathBuf>,
    /// A UTF-8 text, cut into rows of the model's context (each after BOS); also prints bits
    /// per byte.
    #[arg(long, value_name = "FILE")]
    text: Option<PathBuf>,
    /// The `tokenizer.json` of `--text` [default: the model's].
    #[arg(long, value_name = "T", requires = "text")]
    tokenizer: Option<PathBuf>,
    /// A shard folder (`hlat data ingest`): its validation split, in rows of the model's
    /// context.
    #[arg(long, value_name = "DIR")]
    shards: Option<PathBuf>,
    #[command(flatten)]
    scoring: ScoringArgs,
}

/// Arguments of `hlat eval choice`.
#[derive(Args)]
struct ChoiceArgs {
    /// A training run folder, a native checkpoint or a Hugging Face folder, with its
    /// `tokenizer.json`.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// The task: JSONL lines `{"context", "choices", "gold"}` (`"split": "train"` marks the
    /// few-shot examples).
    #[arg(long, value_name = "FILE.jsonl")]
    task: PathBuf,
    /// Few-shot examples before each question.
    #[arg(long, value_name = "K", default_value_t = 0)]
    shots: usize,
    #[command(flatten)]
    scoring: ScoringArgs,
}

/// Runs `hlat eval`.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    match args.task {
        Some(EvalTask::Perplexity(args)) => {
            let device = args.scoring.device.device.clone();
            on_device(device.as_deref(), Evaluation::Perplexity(args))
        }
        Some(EvalTask::Choice(args)) => {
            let device = args.scoring.device.device.clone();
            on_device(device.as_deref(), Evaluation::Choice(args))
        }
        None => validation(args.validation),
    }
}

/// An evaluation of a loaded model.
enum Evaluation {
    Perplexity(PerplexityArgs),
    Choice(ChoiceArgs),
}

/// Runs `evaluation` on the device `device` names.
fn on_device(device: Option<&str>, evaluation: Evaluation) -> anyhow::Result<()> {
    let device = DeviceChoice::parse(device)?.checked()?.device()?;
    evaluate(evaluation, &device)
}

fn load(dir: &Path, device: &Device) -> anyhow::Result<(Hlat, Option<TextTokenizer>)> {
    let (_, model, tokenizer) =
        load_any(dir, device).with_context(|| format!("loading {}", dir.display()))?;
    Ok((model, tokenizer.map(TextTokenizer::from)))
}

fn evaluate(evaluation: Evaluation, device: &Device) -> anyhow::Result<()> {
    match evaluation {
        Evaluation::Perplexity(args) => {
            let (model, own_tokenizer) = load(&args.model, device)?;
            let model = args.scoring.adapter.apply(model, device)?;
            let context = model.config().max_seq_len;
            let (rows, bytes) = match (&args.ids, &args.text, &args.shards) {
                (Some(path), _, _) => (json_rows(path)?, None),
                (_, Some(path), _) => {
                    let tokenizer = match &args.tokenizer {
                        Some(file) => TextTokenizer::from_file(file)?,
                        None => own_tokenizer.with_context(|| {
                            format!(
                                "{} has no tokenizer.json: give --tokenizer for --text",
                                args.model.display()
                            )
                        })?,
                    };
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    let bos = model.config().bos_token_id;
                    (
                        text_rows(&text, &tokenizer, bos, context)?,
                        Some(text.len()),
                    )
                }
                (_, _, Some(folder)) => (shard_rows(folder, context)?, None),
                _ => anyhow::bail!("give --ids, --text or --shards"),
            };
            let report = perplexity_of_rows(&model, &rows, bytes, args.scoring.batch_rows, device)?;
            println!("rows: {}", report.rows);
            println!("tokens: {}", report.tokens);
            println!("perplexity: {:.6}", report.perplexity);
            if let Some(bits) = report.bits_per_byte {
                println!("bits per byte: {bits:.6}");
            }
        }
        Evaluation::Choice(args) => {
            let (model, tokenizer) = load(&args.model, device)?;
            let model = args.scoring.adapter.apply(model, device)?;
            let tokenizer = tokenizer.with_context(|| {
                format!(
                    "{} has no tokenizer.json: a multiple-choice task is text",
                    args.model.display()
                )
            })?;
            let task = ChoiceTask::from_file(&args.task)?;
            let report = evaluate_choice(
                &model,
                &tokenizer,
                &task,
                args.shots,
                args.scoring.batch_rows,
                device,
            )?;
            println!("questions: {}", report.questions);
            println!("acc: {:.4} ± {:.4}", report.acc, report.acc_stderr);
            println!(
                "acc_norm: {:.4} ± {:.4}",
                report.acc_norm, report.acc_norm_stderr
            );
        }
    }
    Ok(())
}

/// `hlat eval` without a subcommand: the validation loss of a run's data.
fn validation(args: ValidationArgs) -> anyhow::Result<()> {
    let model = args.model.context("--model is required")?;
    // A run folder records its configuration, which fixes the validation split and row length.
    let run_config = model.join(RUN_CONFIG_FILE);
    let mut config = if run_config.is_file() {
        TrainConfig::load_toml(&run_config, &TrainConfig::default())?
    } else {
        TrainConfig::quickstart()
    };
    if let Some(seq_len) = args.seq_len {
        config.seq_len = seq_len;
    }
    let data = match &args.data {
        Some(spec) => DataChoice::Shards(parse_data_spec(spec)?),
        None => DataChoice::Builtin,
    };
    let device = DeviceChoice::parse(args.device.device.as_deref())?
        .checked()?
        .device()?;
    let report = evaluate_checkpoint(&model, &data, &config, args.rows, &device)?;
    println!(
        "rows: {}\ntokens: {}\nvalidation loss: {:.6}\nperplexity: {:.4}",
        report.rows, report.tokens, report.loss, report.perplexity
    );
    Ok(())
}
