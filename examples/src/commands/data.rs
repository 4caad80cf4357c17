//! `hlat data`: train tokenizers, encode text, ingest documents into token shards.

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use hlat_train::data::documents::ReadOptions;
use hlat_train::data::sample::{SampleLimits, train_tokenizer_on_sample};
use hlat_train::data::{Dedup, IngestConfig, OutputFormat, TextField, TextTokenizer, ingest};

use super::output_folder;

/// How `hlat data ingest` names itself in the output folders it records.
const INGEST_COMMAND: &str = "data ingest";

/// Arguments of `hlat data`.
#[derive(Args)]
pub struct DataArgs {
    #[command(subcommand)]
    command: DataCommand,
}

#[derive(Subcommand)]
enum DataCommand {
    /// Train a byte-level BPE tokenizer on a streamed sample of the inputs (any format `ingest`
    /// reads) and save it as tokenizer.json.
    TrainTokenizer(TrainTokenizerArgs),
    /// Read lines from standard input and print each one's token ids as a JSON array.
    Encode(EncodeArgs),
    /// Tokenize Parquet, JSONL (plain, .gz, .zst) and text files, folders or glob patterns on all
    /// cores into token shards or a Megatron indexed dataset.
    Ingest(IngestArgs),
}

#[derive(Args)]
struct TrainTokenizerArgs {
    /// Input files, folders or glob patterns, as for `hlat data ingest`.
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    /// The field holding the text in JSONL and Parquet inputs (a dotted path for nested fields).
    #[arg(long, default_value = "text", value_parser = parse_text_field)]
    text_field: TextField,
    /// Train on the first N documents only.
    #[arg(long, value_parser = super::ranges::at_least_one::<u64>())]
    max_documents: Option<u64>,
    /// Train on the first documents holding this many bytes of text only.
    #[arg(long, value_parser = super::ranges::at_least_one::<u64>())]
    max_bytes: Option<u64>,
    /// The vocabulary size, special tokens (<pad>, <s>, </s>) included.
    #[arg(long, value_parser = super::ranges::at_least_one::<usize>())]
    vocab_size: usize,
    /// Where to write the tokenizer.json (must not exist).
    #[arg(long)]
    out: PathBuf,
    /// Skip documents that are not valid UTF-8 instead of failing.
    #[arg(long)]
    skip_invalid_utf8: bool,
}

#[derive(Args)]
struct EncodeArgs {
    /// A Hugging Face tokenizer.json.
    #[arg(long)]
    tokenizer: PathBuf,
}

#[derive(Args)]
struct IngestArgs {
    /// A Hugging Face tokenizer.json. It must have an EOS token, put after every document: the
    /// `eos_token` of the tokenizer_config.json beside it, if any (copied beside the shards).
    #[arg(long)]
    tokenizer: PathBuf,
    /// Input files, folders or glob patterns: Parquet, JSONL (`.jsonl`, `.ndjson`, `.json`, each
    /// also `.gz` or `.zst`; compression is found from the bytes) and text files (one document
    /// each), mixed as needed.
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    /// The output folder for train-NNNNN.bin and val-NNNNN.bin, or with `--format megatron`
    /// train.bin/.idx and val.bin/.idx (must hold no output yet; an unfinished ingest of the same
    /// command continues; another command's folder, such as a training run or a model, is
    /// refused and left as it is).
    #[arg(long)]
    out: PathBuf,
    /// The output format: `shards` (this project's) or `megatron` (Megatron-LM / NeuronX
    /// Distributed indexed datasets).
    #[arg(long, default_value = "shards", value_parser = parse_format)]
    format: OutputFormat,
    /// The field holding the text in JSONL and Parquet inputs (a dotted path for nested fields,
    /// e.g. `meta.body`).
    #[arg(long, default_value = "text", value_parser = parse_text_field)]
    text_field: TextField,
    /// Skip (and count) documents shorter than this many characters.
    #[arg(long, default_value_t = 0)]
    min_chars: usize,
    /// `exact`: skip (and count) documents whose exact content was seen before.
    #[arg(long, default_value = "none", value_parser = parse_dedup)]
    dedup: Dedup,
    /// Threads tokenizing (default: all cores). The output is the same for any number.
    #[arg(long, value_parser = super::ranges::at_least_one::<usize>())]
    threads: Option<usize>,
    /// The most tokens per shard file.
    #[arg(long, default_value_t = 100_000_000, value_parser = super::ranges::at_least_one::<usize>())]
    shard_tokens: usize,
    /// The fraction of documents held out for validation.
    #[arg(long, default_value_t = 0.01, value_parser = super::ranges::fraction)]
    val_fraction: f64,
    /// Skip documents that are not valid UTF-8 (and count them) instead of failing.
    #[arg(long)]
    skip_invalid_utf8: bool,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

fn parse_text_field(text: &str) -> Result<TextField, String> {
    TextField::parse(text).map_err(|error| error.to_string())
}

fn parse_format(text: &str) -> Result<OutputFormat, String> {
    text.parse()
        .map_err(|error: hlat_train::data::DataError| error.to_string())
}

fn parse_dedup(text: &str) -> Result<Dedup, String> {
    text.parse()
        .map_err(|error: hlat_train::data::DataError| error.to_string())
}

/// Runs `hlat data`.
pub fn run(args: DataArgs) -> anyhow::Result<()> {
    match args.command {
        DataCommand::TrainTokenizer(args) => train_tokenizer(args),
        DataCommand::Encode(args) => encode(args),
        DataCommand::Ingest(args) => ingest_files(args),
    }
}

fn train_tokenizer(args: TrainTokenizerArgs) -> anyhow::Result<()> {
    if args.out.exists() {
        bail!(
            "{} already exists; choose another --out",
            args.out.display()
        );
    }
    let options = ReadOptions {
        text_field: args.text_field,
        skip_invalid_utf8: args.skip_invalid_utf8,
    };
    let limits = SampleLimits {
        max_documents: args.max_documents,
        max_bytes: args.max_bytes,
    };
    log::info!(
        "training a {}-token byte-level BPE on a streamed sample",
        args.vocab_size
    );
    let (tokenizer, sample) =
        train_tokenizer_on_sample(&args.input, &options, limits, args.vocab_size)?;
    if sample.skipped_invalid_utf8 > 0 {
        log::warn!(
            "skipped {} document(s) of invalid UTF-8",
            sample.skipped_invalid_utf8
        );
    }
    tokenizer.save(&args.out)?;
    log::info!(
        "wrote {}: trained on {} documents ({} bytes)",
        args.out.display(),
        sample.documents,
        sample.bytes
    );
    Ok(())
}

fn encode(args: EncodeArgs) -> anyhow::Result<()> {
    let tokenizer = TextTokenizer::from_file(&args.tokenizer)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    for (number, line) in std::io::stdin().lock().lines().enumerate() {
        let line =
            line.with_context(|| format!("reading line {} of standard input", number + 1))?;
        let ids = tokenizer.encode(&line, true)?;
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", ids.join(", "))?;
    }
    out.flush()?;
    Ok(())
}

fn ingest_files(args: IngestArgs) -> anyhow::Result<()> {
    output_folder::check(&args.out, INGEST_COMMAND, None, "--out")?;
    let tokenizer = TextTokenizer::from_file(&args.tokenizer)?;
    let config = IngestConfig {
        shard_tokens: args.shard_tokens,
        validation_fraction: args.val_fraction,
        skip_invalid_utf8: args.skip_invalid_utf8,
        text_field: args.text_field,
        min_chars: args.min_chars,
        dedup: args.dedup,
        format: args.format,
        threads: args.threads,
        show_progress: !args.no_progress,
        ..IngestConfig::new(args.input, args.out.clone())
    };
    let summary = ingest(&tokenizer, &config)?;
    output_folder::record(&args.out, INGEST_COMMAND, None, "--out")?;
    println!(
        "{}: {} train documents ({} tokens, {} files), {} validation documents ({} tokens, {} files), {} skipped as invalid UTF-8, {} shorter than --min-chars, {} duplicates; {} bytes of text",
        args.out.display(),
        summary.train_documents,
        summary.train_tokens,
        summary.train_shards.len(),
        summary.validation_documents,
        summary.validation_tokens,
        summary.validation_shards.len(),
        summary.skipped_invalid_utf8,
        summary.skipped_short,
        summary.skipped_duplicates,
        summary.text_bytes
    );
    Ok(())
}
