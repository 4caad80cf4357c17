//! `hlat data`: train tokenizers, encode text, ingest documents into token shards.

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use hlat_train::data::documents::read_inputs;
use hlat_train::data::{IngestConfig, TextTokenizer, ingest};

/// Arguments of `hlat data`.
#[derive(Args)]
pub struct DataArgs {
    #[command(subcommand)]
    command: DataCommand,
}

#[derive(Subcommand)]
enum DataCommand {
    /// Train a byte-level BPE tokenizer on text or JSONL files and save it as tokenizer.json.
    TrainTokenizer(TrainTokenizerArgs),
    /// Read lines from standard input and print each one's token ids as a JSON array.
    Encode(EncodeArgs),
    /// Tokenize text and JSONL files (or folders) on all cores into token shards.
    Ingest(IngestArgs),
}

#[derive(Args)]
struct TrainTokenizerArgs {
    /// Text files (one document each), JSONL files (a `text` field per line) or folders.
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
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
    /// Text files (one document each), JSONL files (a `text` field per line) or folders.
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    /// The output folder for train-NNNNN.bin and val-NNNNN.bin (must hold no shard yet).
    #[arg(long)]
    out: PathBuf,
    /// The most tokens per shard file.
    #[arg(long, default_value_t = 100_000_000, value_parser = super::ranges::at_least_one::<usize>())]
    shard_tokens: usize,
    /// The fraction of documents held out for validation.
    #[arg(long, default_value_t = 0.01, value_parser = super::ranges::fraction)]
    val_fraction: f64,
    /// Skip documents that are not valid UTF-8 (and count them) instead of failing.
    #[arg(long)]
    skip_invalid_utf8: bool,
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
    let documents = read_inputs(&args.input, args.skip_invalid_utf8)?;
    if documents.skipped_invalid_utf8 > 0 {
        log::warn!(
            "skipped {} document(s) of invalid UTF-8",
            documents.skipped_invalid_utf8
        );
    }
    log::info!(
        "training a {}-token byte-level BPE on {} documents",
        args.vocab_size,
        documents.texts.len()
    );
    let tokenizer = TextTokenizer::train_byte_level_bpe(&documents.texts, args.vocab_size)?;
    tokenizer.save(&args.out)?;
    log::info!("wrote {}", args.out.display());
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
    let tokenizer = TextTokenizer::from_file(&args.tokenizer)?;
    let config = IngestConfig {
        shard_tokens: args.shard_tokens,
        validation_fraction: args.val_fraction,
        skip_invalid_utf8: args.skip_invalid_utf8,
        ..IngestConfig::new(args.input, args.out.clone())
    };
    let summary = ingest(&tokenizer, &config)?;
    println!(
        "{}: {} train documents ({} tokens, {} shards), {} validation documents ({} tokens, {} shards), {} skipped as invalid UTF-8",
        args.out.display(),
        summary.train_documents,
        summary.train_tokens,
        summary.train_shards.len(),
        summary.validation_documents,
        summary.validation_tokens,
        summary.validation_shards.len(),
        summary.skipped_invalid_utf8
    );
    Ok(())
}
