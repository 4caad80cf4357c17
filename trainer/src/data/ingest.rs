//! Ingest: documents from text and JSONL files, tokenized on all cores, into token shards.
//!
//! Documents are read in a stable order (see [`super::documents`]), tokenized in parallel batches,
//! each followed by EOS, and written to the train or validation shards of the output folder
//! (`train-00000.bin`..., `val-00000.bin`...; see [`super::shard`]). The validation split holds
//! out whole documents, chosen by [`is_validation`] from the document's index. The tokenizer is
//! saved beside the shards as [`TOKENIZER_FILE`], with the [`TOKENIZER_CONFIG_FILE`] it was read
//! with (which names its special tokens: EOS is the document separator), so the folder describes
//! itself. Nothing is renamed into place before every input has been read, so a failed ingest
//! leaves no shard.

use std::fs;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use super::documents::{for_each_document, list_input_files};
use super::error::DataError;
use super::shard::{ShardWriter, Split};
use super::split::is_validation;
use super::tokenizer::{TOKENIZER_CONFIG_FILE, TextTokenizer};

/// The tokenizer's file in a shard folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// The bytes of text tokenized together in one parallel batch.
const BATCH_BYTES: usize = 16 << 20;

/// What to ingest and how.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Input files or folders.
    pub inputs: Vec<PathBuf>,
    /// The output folder (created if missing; must hold no shard yet).
    pub out_dir: PathBuf,
    /// The most tokens per shard file.
    pub shard_tokens: usize,
    /// The fraction of documents held out for validation, in `[0, 1)`.
    pub validation_fraction: f64,
    /// The seed choosing the validation documents.
    pub split_seed: u64,
    /// Skip (and count) documents that are not valid UTF-8 instead of failing.
    pub skip_invalid_utf8: bool,
    /// Draw a progress bar on standard error.
    pub show_progress: bool,
}

impl IngestConfig {
    /// A configuration with 100M-token shards, 1% validation, split seed 0, failing on invalid
    /// UTF-8, with a progress bar.
    pub fn new(inputs: Vec<PathBuf>, out_dir: PathBuf) -> Self {
        Self {
            inputs,
            out_dir,
            shard_tokens: 100_000_000,
            validation_fraction: 0.01,
            split_seed: 0,
            skip_invalid_utf8: false,
            show_progress: true,
        }
    }
}

/// What an ingest produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IngestSummary {
    /// Documents in the training split.
    pub train_documents: u64,
    /// Documents in the validation split.
    pub validation_documents: u64,
    /// Tokens in the training shards, EOS included.
    pub train_tokens: u64,
    /// Tokens in the validation shards, EOS included.
    pub validation_tokens: u64,
    /// Documents skipped because they were not valid UTF-8.
    pub skipped_invalid_utf8: u64,
    /// The training shards written.
    pub train_shards: Vec<PathBuf>,
    /// The validation shards written.
    pub validation_shards: Vec<PathBuf>,
}

/// Tokenizes the documents of `config.inputs` into shards in `config.out_dir`.
pub fn ingest(
    tokenizer: &TextTokenizer,
    config: &IngestConfig,
) -> Result<IngestSummary, DataError> {
    if !(0.0..1.0).contains(&config.validation_fraction) {
        return Err(DataError::setting(
            "validation fraction",
            format!("{} is not in [0, 1)", config.validation_fraction),
        ));
    }
    let eos = tokenizer.eos_id()?;
    let files = list_input_files(&config.inputs)?;
    let tokenizer_json = tokenizer.to_json()?;
    prepare_output(&config.out_dir, &tokenizer_json, tokenizer.config_json())?;
    let writer = |split| {
        ShardWriter::new(
            &config.out_dir,
            split,
            config.shard_tokens,
            tokenizer.vocab_size(),
        )
    };
    let mut ingest = Ingest {
        tokenizer,
        config,
        eos,
        train: writer(Split::Train)?,
        validation: writer(Split::Validation)?,
        summary: IngestSummary::default(),
        batch: Vec::new(),
        batch_bytes: 0,
    };
    let progress = progress_bar(&files, config.show_progress);
    let mut files_bytes = 0;
    for file in &files {
        let skipped = for_each_document(file, config.skip_invalid_utf8, |text| {
            progress.inc(text.len() as u64);
            ingest.push(text)
        })?;
        if skipped > 0 {
            log::warn!(
                "{}: skipped {skipped} document(s) of invalid UTF-8",
                file.display()
            );
        }
        ingest.summary.skipped_invalid_utf8 += skipped as u64;
        files_bytes += file_size(file);
        progress.set_position(files_bytes);
    }
    ingest.flush()?;
    progress.finish_and_clear();
    let Ingest {
        train,
        validation,
        mut summary,
        ..
    } = ingest;
    if summary.train_documents + summary.validation_documents == 0 {
        return Err(DataError::EmptyInput(format!(
            "no document with text in {:?} ({} skipped as invalid UTF-8)",
            config.inputs, summary.skipped_invalid_utf8
        )));
    }
    summary.train_tokens = train.total_tokens();
    summary.validation_tokens = validation.total_tokens();
    summary.train_shards = train.commit()?;
    summary.validation_shards = validation.commit()?;
    let tokenizer_path = config.out_dir.join(TOKENIZER_FILE);
    fs::write(&tokenizer_path, tokenizer_json)
        .map_err(|error| DataError::io(&tokenizer_path, error))?;
    if let Some(config_json) = tokenizer.config_json() {
        let config_path = config.out_dir.join(TOKENIZER_CONFIG_FILE);
        fs::write(&config_path, config_json).map_err(|error| DataError::io(&config_path, error))?;
    }
    Ok(summary)
}

/// Creates the output folder, refusing one that already holds shards or another tokenizer
/// (the tokenizer the shards were made with may already be there, as from
/// `hlat data train-tokenizer --out DIR/tokenizer.json`), or a `tokenizer_config.json` other
/// than the tokenizer's (it would name other special tokens for the shards).
fn prepare_output(
    out_dir: &Path,
    tokenizer_json: &str,
    config_json: Option<&str>,
) -> Result<(), DataError> {
    fs::create_dir_all(out_dir).map_err(|error| DataError::io(out_dir, error))?;
    let holds_shards = [Split::Train, Split::Validation]
        .iter()
        .any(|split| split.shard_path(out_dir, 0).exists());
    if holds_shards {
        return Err(DataError::OutputExists {
            path: out_dir.to_path_buf(),
            what: "token shards",
        });
    }
    let tokenizer_path = out_dir.join(TOKENIZER_FILE);
    if tokenizer_path.exists() {
        let existing = TextTokenizer::from_file(&tokenizer_path)?.to_json()?;
        if existing != tokenizer_json {
            return Err(DataError::OutputExists {
                path: out_dir.to_path_buf(),
                what: "a different tokenizer.json",
            });
        }
    }
    let config_path = out_dir.join(TOKENIZER_CONFIG_FILE);
    if config_path.exists() {
        let existing =
            fs::read_to_string(&config_path).map_err(|error| DataError::io(&config_path, error))?;
        if Some(existing.as_str()) != config_json {
            return Err(DataError::OutputExists {
                path: out_dir.to_path_buf(),
                what: "a tokenizer_config.json other than the tokenizer's",
            });
        }
    }
    Ok(())
}

/// The size of `file` for the progress bar (0 when it cannot be read: reading it will fail
/// with the reason).
fn file_size(file: &Path) -> u64 {
    fs::metadata(file).map_or(0, |metadata| metadata.len())
}

fn progress_bar(files: &[PathBuf], show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let total = files.iter().map(|file| file_size(file)).sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
        )
        .expect("the progress template is valid"),
    );
    bar
}

/// The state of a running ingest: the pending batch and the two writers.
struct Ingest<'a> {
    tokenizer: &'a TextTokenizer,
    config: &'a IngestConfig,
    eos: u32,
    train: ShardWriter,
    validation: ShardWriter,
    summary: IngestSummary,
    batch: Vec<String>,
    batch_bytes: usize,
}

impl Ingest<'_> {
    fn push(&mut self, text: String) -> Result<(), DataError> {
        self.batch_bytes += text.len();
        self.batch.push(text);
        if self.batch_bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Tokenizes the pending batch on all cores and writes it in document order.
    fn flush(&mut self) -> Result<(), DataError> {
        let encoded = self.tokenizer.encode_documents(&self.batch)?;
        self.batch.clear();
        self.batch_bytes = 0;
        for tokens in encoded {
            let index = self.summary.train_documents + self.summary.validation_documents;
            let (writer, count) = if is_validation(
                self.config.split_seed,
                index,
                self.config.validation_fraction,
            ) {
                (&mut self.validation, &mut self.summary.validation_documents)
            } else {
                (&mut self.train, &mut self.summary.train_documents)
            };
            writer.write(&tokens)?;
            writer.write(&[self.eos])?;
            *count += 1;
        }
        Ok(())
    }
}
