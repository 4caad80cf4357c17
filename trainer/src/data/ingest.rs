//! Ingest: documents from text, JSONL (plain, gzip, zstd) and Parquet files, tokenized on all
//! cores, into token shards or a Megatron indexed dataset.
//!
//! A reader thread streams the documents in a stable order (see [`super::inputs`] and
//! [`super::documents`]), drops those too short or seen before ([`super::filter`]) and hands
//! batches of about [`BATCH_BYTES`] of text to the tokenizer, which encodes each batch on all
//! cores (or `threads`) while the next one is read; documents are written in input order, each
//! followed by EOS, to the train or validation split ([`is_validation`] of the document's
//! index). Memory is bounded by two batches in flight and the reader's buffers (a Parquet page,
//! 1 MiB of decompressed input), not by the corpus, and the output is the same whatever the
//! number of threads.
//!
//! Output formats ([`OutputFormat`]): token shards (`train-00000.bin`..., `val-00000.bin`...; see
//! [`super::shard`]), or Megatron datasets `train.bin`/`train.idx` and `val.bin`/`val.idx`
//! ([`super::megatron`]). The tokenizer is saved beside them as [`TOKENIZER_FILE`], with the
//! [`TOKENIZER_CONFIG_FILE`] it was read with (which names its special tokens: EOS is the
//! document separator), so the folder describes itself.
//!
//! Nothing is renamed into place before every input has been read. After every batch, what was
//! written is synced and [`STATE_FILE`] records how far the ingest got (and, with
//! deduplication, [`SEEN_FILE`] the hashes kept); an ingest that was killed and is started again
//! with the same inputs (same sizes and modification times), tokenizer and settings continues
//! from there, and one with anything else is refused, naming the state file. A failed ingest (a
//! bad input) removes everything it wrote.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Instant, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use super::documents::{Item, ReadOptions, for_each_item};
use super::error::DataError;
use super::filter::{Dedup, DocumentFilter, Verdict};
use super::inputs::{InputFile, list_input_files};
use super::megatron::{MegatronWriter, split_name, with_suffix};
use super::shard::{ShardWriter, Split};
use super::sink::{DocumentSink, SinkPosition};
use super::split::is_validation;
use super::text_field::TextField;
use super::tokenizer::{TOKENIZER_CONFIG_FILE, TextTokenizer};

/// The tokenizer's file in a shard folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The record of an unfinished ingest in its output folder.
pub const STATE_FILE: &str = "ingest-state.json";
/// The content hashes an unfinished ingest with `--dedup exact` has kept (16 bytes each).
pub const SEEN_FILE: &str = "ingest-seen.bin";

/// The default bytes of text tokenized together in one parallel batch.
pub const BATCH_BYTES: usize = 8 << 20;

/// The form of ingest's output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputFormat {
    /// This project's token shards.
    #[default]
    Shards,
    /// Megatron-LM / NeuronX Distributed indexed datasets, `train` and `val` prefixes.
    Megatron,
}

impl std::str::FromStr for OutputFormat {
    type Err = DataError;

    fn from_str(text: &str) -> Result<Self, DataError> {
        match text {
            "shards" => Ok(Self::Shards),
            "megatron" => Ok(Self::Megatron),
            other => Err(DataError::setting(
                "format",
                format!("`{other}` is neither `shards` nor `megatron`"),
            )),
        }
    }
}

/// What to ingest and how.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Input files, folders or glob patterns.
    pub inputs: Vec<PathBuf>,
    /// The output folder (created if missing; must hold no output yet, or this ingest's own
    /// unfinished one).
    pub out_dir: PathBuf,
    /// The most tokens per shard file (token shards only).
    pub shard_tokens: usize,
    /// The fraction of documents held out for validation, in `[0, 1)`.
    pub validation_fraction: f64,
    /// The seed choosing the validation documents.
    pub split_seed: u64,
    /// Skip (and count) documents that are not valid UTF-8 instead of failing.
    pub skip_invalid_utf8: bool,
    /// The field holding the text in JSONL and Parquet inputs.
    pub text_field: TextField,
    /// Skip documents shorter than this many characters.
    pub min_chars: usize,
    /// Deduplication of documents.
    pub dedup: Dedup,
    /// The output format.
    pub format: OutputFormat,
    /// Threads tokenizing; `None` for all cores. The output does not depend on it.
    pub threads: Option<usize>,
    /// The bytes of text tokenized together in one parallel batch (and between two records of
    /// the state a killed ingest resumes from); memory holds about three batches. The output
    /// does not depend on it.
    pub batch_bytes: usize,
    /// Draw a progress bar on standard error.
    pub show_progress: bool,
    /// Stop after this many batches as if killed, leaving the unfinished output (tests).
    #[doc(hidden)]
    pub interrupt_after_batches: Option<u64>,
}

impl IngestConfig {
    /// A configuration with 100M-token shards, 1% validation, split seed 0, failing on invalid
    /// UTF-8, the `text` field, no filtering, all cores, with a progress bar.
    pub fn new(inputs: Vec<PathBuf>, out_dir: PathBuf) -> Self {
        Self {
            inputs,
            out_dir,
            shard_tokens: 100_000_000,
            validation_fraction: 0.01,
            split_seed: 0,
            skip_invalid_utf8: false,
            text_field: TextField::default(),
            min_chars: 0,
            dedup: Dedup::None,
            format: OutputFormat::Shards,
            threads: None,
            batch_bytes: BATCH_BYTES,
            show_progress: true,
            interrupt_after_batches: None,
        }
    }
}

/// What an ingest produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IngestSummary {
    /// Documents in the training split.
    pub train_documents: u64,
    /// Documents in the validation split.
    pub validation_documents: u64,
    /// Tokens in the training split, EOS included.
    pub train_tokens: u64,
    /// Tokens in the validation split, EOS included.
    pub validation_tokens: u64,
    /// Documents skipped because they were not valid UTF-8.
    pub skipped_invalid_utf8: u64,
    /// Documents skipped as shorter than `min_chars`.
    pub skipped_short: u64,
    /// Documents skipped as exact duplicates.
    pub skipped_duplicates: u64,
    /// Bytes of text read (UTF-8, kept or not).
    pub text_bytes: u64,
    /// The documents an unfinished ingest had read before this run continued it (0 when it
    /// started from the beginning).
    pub resumed_after_documents: u64,
    /// The training files written (shards, or a Megatron `.bin` and `.idx`).
    pub train_shards: Vec<PathBuf>,
    /// The validation files written.
    pub validation_shards: Vec<PathBuf>,
}

/// The record of an unfinished ingest ([`STATE_FILE`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct IngestState {
    /// What identifies the ingest: inputs, tokenizer and settings.
    fingerprint: serde_json::Value,
    /// Input items (documents and invalid ones) read, kept or not.
    items_read: u64,
    /// Hashes in [`SEEN_FILE`].
    seen: u64,
    summary: IngestSummary,
    train: SinkPosition,
    validation: SinkPosition,
}

/// Tokenizes the documents of `config.inputs` into `config.out_dir`.
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
    if config.threads == Some(0) {
        return Err(DataError::setting("threads", "0 threads"));
    }
    let eos = tokenizer.eos_id()?;
    let files = list_input_files(&config.inputs)?;
    let tokenizer_json = tokenizer.to_json()?;
    let fingerprint = fingerprint(&files, &tokenizer_json, config)?;
    let resume = prepare_output(
        config,
        &tokenizer_json,
        tokenizer.config_json(),
        &fingerprint,
    )?;
    let pool = {
        let mut builder = rayon::ThreadPoolBuilder::new();
        if let Some(threads) = config.threads {
            builder = builder.num_threads(threads);
        }
        builder
            .build()
            .map_err(|error| DataError::setting("threads", error.to_string()))?
    };
    let resuming = resume.is_some();
    let mut run = match Run::start(tokenizer, config, eos, fingerprint, resume) {
        Ok(run) => run,
        Err(error) => {
            if !resuming {
                remove_state(&config.out_dir);
            }
            return Err(error);
        }
    };
    let result = run.read_and_write(&files, &pool);
    match result {
        Ok(()) => run.finish(tokenizer, &tokenizer_json),
        Err(DataError::Interrupted(batches)) => {
            run.train.keep_unfinished();
            run.validation.keep_unfinished();
            Err(DataError::Interrupted(batches))
        }
        Err(error) => {
            drop(run);
            remove_state(&config.out_dir);
            Err(error)
        }
    }
}

/// What identifies an ingest, for resuming: every input's path, size and modification time, the
/// tokenizer and every setting that changes the output.
fn fingerprint(
    files: &[InputFile],
    tokenizer_json: &str,
    config: &IngestConfig,
) -> Result<serde_json::Value, DataError> {
    let inputs = files
        .iter()
        .map(|file| {
            let metadata =
                fs::metadata(&file.path).map_err(|error| DataError::io(&file.path, error))?;
            let modified = metadata
                .modified()
                .ok()
                .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |time| time.as_nanos() as u64);
            Ok(serde_json::json!([file.path, metadata.len(), modified]))
        })
        .collect::<Result<Vec<_>, DataError>>()?;
    Ok(serde_json::json!({
        "inputs": inputs,
        "tokenizer_xxh3": format!("{:032x}", xxhash_rust::xxh3::xxh3_128(tokenizer_json.as_bytes())),
        "shard_tokens": config.shard_tokens,
        "validation_fraction": config.validation_fraction,
        "split_seed": config.split_seed,
        "skip_invalid_utf8": config.skip_invalid_utf8,
        "text_field": config.text_field.to_string(),
        "min_chars": config.min_chars,
        "dedup": format!("{:?}", config.dedup),
        "format": config.format,
    }))
}

/// Creates the output folder, refusing one that already holds output or another tokenizer (the
/// tokenizer the shards are made with may already be there, as from `hlat data train-tokenizer
/// --out DIR/tokenizer.json`), or a `tokenizer_config.json` other than the tokenizer's. Returns
/// the state of this ingest's own unfinished run, when there is one; refuses another's.
fn prepare_output(
    config: &IngestConfig,
    tokenizer_json: &str,
    config_json: Option<&str>,
    fingerprint: &serde_json::Value,
) -> Result<Option<IngestState>, DataError> {
    let out_dir = &config.out_dir;
    fs::create_dir_all(out_dir).map_err(|error| DataError::io(out_dir, error))?;
    let holds_output = [Split::Train, Split::Validation].iter().any(|&split| {
        split.shard_path(out_dir, 0).exists()
            || with_suffix(&out_dir.join(split_name(split)), "idx").exists()
    });
    if holds_output {
        return Err(DataError::OutputExists {
            path: out_dir.to_path_buf(),
            what: "token shards or a Megatron dataset",
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
    let state_path = out_dir.join(STATE_FILE);
    if !state_path.exists() {
        let unfinished = [Split::Train, Split::Validation].iter().any(|&split| {
            split
                .shard_path(out_dir, 0)
                .with_extension("bin.tmp")
                .exists()
                || with_suffix(&out_dir.join(split_name(split)), "bin.tmp").exists()
        });
        if unfinished {
            return Err(DataError::OutputExists {
                path: out_dir.to_path_buf(),
                what: "unfinished output without the ingest-state.json that would resume it",
            });
        }
        return Ok(None);
    }
    let text =
        fs::read_to_string(&state_path).map_err(|error| DataError::io(&state_path, error))?;
    let state: IngestState = serde_json::from_str(&text).map_err(|error| {
        DataError::io(
            &state_path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, error.to_string()),
        )
    })?;
    if &state.fingerprint != fingerprint {
        return Err(DataError::OutputExists {
            path: out_dir.to_path_buf(),
            what: "the unfinished ingest (ingest-state.json) of other inputs, tokenizer or \
                   settings: run that command again to finish it, or remove the folder",
        });
    }
    log::info!(
        "{}: continuing the unfinished ingest after {} documents",
        out_dir.display(),
        state.items_read
    );
    Ok(Some(state))
}

fn remove_state(out_dir: &Path) {
    let _ = fs::remove_file(out_dir.join(STATE_FILE));
    let _ = fs::remove_file(out_dir.join(SEEN_FILE));
}

/// A batch of documents the reader hands to the tokenizer.
#[derive(Default)]
struct Batch {
    texts: Vec<String>,
    bytes: usize,
    /// Items read once this batch is written (kept or not).
    items_read: u64,
    skipped_invalid_utf8: u64,
    skipped_short: u64,
    skipped_duplicates: u64,
    text_bytes: u64,
    /// Hashes of the kept documents, with deduplication.
    seen: Vec<u128>,
}

/// A running ingest: the two splits being written and where it stands.
struct Run<'a> {
    tokenizer: &'a TextTokenizer,
    config: &'a IngestConfig,
    eos: u32,
    fingerprint: serde_json::Value,
    train: Box<dyn DocumentSink>,
    validation: Box<dyn DocumentSink>,
    summary: IngestSummary,
    items_read: u64,
    seen_count: u64,
    /// The hashes already kept, read back when resuming.
    seen_before: Vec<u128>,
    seen_file: Option<BufWriter<File>>,
    started: Instant,
}

impl<'a> Run<'a> {
    fn start(
        tokenizer: &'a TextTokenizer,
        config: &'a IngestConfig,
        eos: u32,
        fingerprint: serde_json::Value,
        resume: Option<IngestState>,
    ) -> Result<Self, DataError> {
        let out = &config.out_dir;
        let vocab = tokenizer.vocab_size();
        let sink = |split: Split,
                    position: Option<SinkPosition>|
         -> Result<Box<dyn DocumentSink>, DataError> {
            Ok(match (config.format, position) {
                (OutputFormat::Shards, None) => {
                    Box::new(ShardWriter::new(out, split, config.shard_tokens, vocab)?)
                }
                (OutputFormat::Shards, Some(position)) => Box::new(ShardWriter::resume(
                    out,
                    split,
                    config.shard_tokens,
                    vocab,
                    position,
                )?),
                (OutputFormat::Megatron, None) => {
                    Box::new(MegatronWriter::new(&out.join(split_name(split)), vocab)?)
                }
                (OutputFormat::Megatron, Some(position)) => Box::new(MegatronWriter::resume(
                    &out.join(split_name(split)),
                    vocab,
                    position,
                )?),
            })
        };
        let seen_path = out.join(SEEN_FILE);
        let (mut run_summary, items_read, seen_count, seen_before) = match &resume {
            None => (IngestSummary::default(), 0, 0, Vec::new()),
            Some(state) => {
                let seen = if config.dedup == Dedup::Exact {
                    read_seen(&seen_path, state.seen)?
                } else {
                    Vec::new()
                };
                (state.summary.clone(), state.items_read, state.seen, seen)
            }
        };
        run_summary.resumed_after_documents = items_read;
        // The state is written before any output, so that no unfinished output lacks one.
        let (train, validation) = match &resume {
            None => {
                let state = IngestState {
                    fingerprint: fingerprint.clone(),
                    items_read: 0,
                    seen: 0,
                    summary: IngestSummary::default(),
                    train: SinkPosition::default(),
                    validation: SinkPosition::default(),
                };
                write_state_file(out, &state)?;
                (sink(Split::Train, None)?, sink(Split::Validation, None)?)
            }
            Some(state) => (
                sink(Split::Train, Some(state.train))?,
                sink(Split::Validation, Some(state.validation))?,
            ),
        };
        let seen_file = if config.dedup == Dedup::Exact {
            let file = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&seen_path)
                .map_err(|error| DataError::io(&seen_path, error))?;
            file.set_len(seen_count * 16)
                .map_err(|error| DataError::io(&seen_path, error))?;
            Some(BufWriter::new(file))
        } else {
            None
        };
        Ok(Self {
            tokenizer,
            config,
            eos,
            fingerprint,
            train,
            validation,
            summary: run_summary,
            items_read,
            seen_count,
            seen_before,
            seen_file,
            started: Instant::now(),
        })
    }

    /// Reads every file on a reader thread and writes its documents, batch by batch.
    fn read_and_write(
        &mut self,
        files: &[InputFile],
        pool: &rayon::ThreadPool,
    ) -> Result<(), DataError> {
        let bytes_read = Arc::new(AtomicU64::new(0));
        let progress = Progress::new(files, self.config.show_progress);
        let options = ReadOptions {
            text_field: self.config.text_field.clone(),
            skip_invalid_utf8: self.config.skip_invalid_utf8,
        };
        let mut filter = DocumentFilter::new(self.config.min_chars, self.config.dedup);
        filter.extend_seen(std::mem::take(&mut self.seen_before));
        let skip = self.items_read;
        let (sender, receiver) = mpsc::sync_channel::<Result<Batch, DataError>>(1);
        std::thread::scope(|scope| {
            let reader_bytes = Arc::clone(&bytes_read);
            let batch_bytes = self.config.batch_bytes;
            scope.spawn(move || {
                read_batches(
                    files,
                    &options,
                    filter,
                    skip,
                    batch_bytes,
                    &reader_bytes,
                    &sender,
                )
            });
            let mut batches = 0u64;
            for batch in receiver {
                let batch = batch?;
                self.write_batch(batch, pool)?;
                batches += 1;
                progress.update(
                    bytes_read.load(Ordering::Relaxed),
                    &self.summary,
                    self.started,
                );
                if self.config.interrupt_after_batches == Some(batches) {
                    return Err(DataError::Interrupted(batches));
                }
            }
            Ok(())
        })?;
        progress.finish();
        Ok(())
    }

    /// Tokenizes a batch on the pool, writes it in document order, and records the new state.
    fn write_batch(&mut self, batch: Batch, pool: &rayon::ThreadPool) -> Result<(), DataError> {
        let encoded = pool.install(|| self.tokenizer.encode_documents(&batch.texts))?;
        for tokens in encoded {
            let index = self.summary.train_documents + self.summary.validation_documents;
            let validation = is_validation(
                self.config.split_seed,
                index,
                self.config.validation_fraction,
            );
            let (sink, count) = if validation {
                (&mut self.validation, &mut self.summary.validation_documents)
            } else {
                (&mut self.train, &mut self.summary.train_documents)
            };
            sink.write_document(&tokens, self.eos)?;
            *count += 1;
        }
        self.summary.train_tokens = self.train.total_tokens();
        self.summary.validation_tokens = self.validation.total_tokens();
        self.summary.skipped_invalid_utf8 += batch.skipped_invalid_utf8;
        self.summary.skipped_short += batch.skipped_short;
        self.summary.skipped_duplicates += batch.skipped_duplicates;
        self.summary.text_bytes += batch.text_bytes;
        self.items_read = batch.items_read;
        if let Some(file) = &mut self.seen_file {
            let path = self.config.out_dir.join(SEEN_FILE);
            for hash in &batch.seen {
                file.write_all(&hash.to_le_bytes())
                    .map_err(|error| DataError::io(&path, error))?;
            }
            file.flush()
                .and_then(|()| file.get_ref().sync_data())
                .map_err(|error| DataError::io(&path, error))?;
            self.seen_count += batch.seen.len() as u64;
        }
        let train = self.train.sync()?;
        let validation = self.validation.sync()?;
        let state = IngestState {
            fingerprint: self.fingerprint.clone(),
            items_read: self.items_read,
            seen: self.seen_count,
            summary: self.summary.clone(),
            train,
            validation,
        };
        write_state_file(&self.config.out_dir, &state)
    }

    /// Saves the tokenizer, commits both splits and removes the state.
    fn finish(
        self,
        tokenizer: &TextTokenizer,
        tokenizer_json: &str,
    ) -> Result<IngestSummary, DataError> {
        let Run {
            mut train,
            mut validation,
            mut summary,
            config,
            started,
            seen_file,
            ..
        } = self;
        drop(seen_file);
        if summary.train_documents + summary.validation_documents == 0 {
            drop((train, validation));
            remove_state(&config.out_dir);
            return Err(DataError::EmptyInput(format!(
                "no document with text in {:?} ({} skipped as invalid UTF-8, {} shorter than \
                 {} characters, {} duplicates)",
                config.inputs,
                summary.skipped_invalid_utf8,
                summary.skipped_short,
                config.min_chars,
                summary.skipped_duplicates
            )));
        }
        // The tokenizer first, each file whole or not at all: should a write fail (a full
        // disk), the shards are not committed yet and the same command resumes from the state.
        let tokenizer_files = [(TOKENIZER_FILE, Some(tokenizer_json))]
            .into_iter()
            .chain([(TOKENIZER_CONFIG_FILE, tokenizer.config_json())]);
        for (name, text) in tokenizer_files {
            if let Some(text) = text {
                let path = config.out_dir.join(name);
                if let Err(error) = burn_trainium::write_atomically(&path, text.as_bytes()) {
                    train.keep_unfinished();
                    validation.keep_unfinished();
                    return Err(DataError::io(&path, error));
                }
            }
        }
        summary.train_shards = train.commit()?;
        summary.validation_shards = validation.commit()?;
        remove_state(&config.out_dir);
        let seconds = started.elapsed().as_secs_f64().max(1e-9);
        let documents = summary.train_documents + summary.validation_documents;
        let tokens = summary.train_tokens + summary.validation_tokens;
        log::info!(
            "ingested {:.1} MB of text in {seconds:.1} s: {:.2} MB/s, {:.0} documents/s, {:.0} \
             tokens/s",
            summary.text_bytes as f64 / 1e6,
            summary.text_bytes as f64 / 1e6 / seconds,
            documents as f64 / seconds,
            tokens as f64 / seconds
        );
        Ok(summary)
    }
}

/// Writes [`STATE_FILE`] atomically (a temporary file renamed over it).
fn write_state_file(out_dir: &Path, state: &IngestState) -> Result<(), DataError> {
    let path = out_dir.join(STATE_FILE);
    let temporary = out_dir.join(format!("{STATE_FILE}.tmp"));
    let text = serde_json::to_string_pretty(state).expect("the state serializes");
    let io_error = |error| DataError::io(&path, error);
    let mut file = File::create(&temporary).map_err(io_error)?;
    file.write_all(text.as_bytes()).map_err(io_error)?;
    file.sync_data().map_err(io_error)?;
    fs::rename(&temporary, &path).map_err(io_error)
}

/// The first `count` hashes of [`SEEN_FILE`].
fn read_seen(path: &Path, count: u64) -> Result<Vec<u128>, DataError> {
    let io_error = |error| DataError::io(path, error);
    let mut reader = BufReader::new(File::open(path).map_err(io_error)?);
    let mut hashes = Vec::with_capacity(count as usize);
    let mut bytes = [0u8; 16];
    for _ in 0..count {
        reader.read_exact(&mut bytes).map_err(io_error)?;
        hashes.push(u128::from_le_bytes(bytes));
    }
    Ok(hashes)
}

/// The reader thread: reads every file's items, skips the first `skip` (those an unfinished
/// ingest had written), filters, and sends batches. Stops when the receiver is gone.
fn read_batches(
    files: &[InputFile],
    options: &ReadOptions,
    mut filter: DocumentFilter,
    skip: u64,
    batch_bytes: usize,
    bytes_read: &Arc<AtomicU64>,
    sender: &mpsc::SyncSender<Result<Batch, DataError>>,
) {
    let mut items = 0u64;
    let mut batch = Batch::default();
    let result = (|| {
        for file in files {
            let flow = for_each_item(file, options, bytes_read, |item| {
                items += 1;
                if items <= skip {
                    return Ok(ControlFlow::Continue(()));
                }
                batch.items_read = items;
                match item {
                    Item::InvalidUtf8 => {
                        log::warn!(
                            "{}: skipped a document of invalid UTF-8",
                            file.path.display()
                        );
                        batch.skipped_invalid_utf8 += 1;
                    }
                    Item::Text(text) => {
                        batch.text_bytes += text.len() as u64;
                        match filter.check(&text) {
                            Verdict::Short => batch.skipped_short += 1,
                            Verdict::Duplicate => batch.skipped_duplicates += 1,
                            Verdict::Keep(hash) => {
                                batch.seen.extend(hash);
                                batch.bytes += text.len();
                                batch.texts.push(text);
                            }
                        }
                    }
                }
                if batch.bytes >= batch_bytes {
                    let full = std::mem::take(&mut batch);
                    if sender.send(Ok(full)).is_err() {
                        return Ok(ControlFlow::Break(()));
                    }
                }
                Ok(ControlFlow::Continue(()))
            })?;
            if flow.is_break() {
                return Ok(());
            }
        }
        if batch.items_read > 0 {
            let _ = sender.send(Ok(std::mem::take(&mut batch)));
        }
        Ok(())
    })();
    if let Err(error) = result {
        let _ = sender.send(Err(error));
    }
}

/// The progress bar: input bytes read (compressed bytes for compressed files), with MB/s,
/// documents/s and tokens/s.
struct Progress {
    bar: ProgressBar,
}

impl Progress {
    fn new(files: &[InputFile], show: bool) -> Self {
        if !show {
            return Self {
                bar: ProgressBar::hidden(),
            };
        }
        let total = files
            .iter()
            .map(|file| fs::metadata(&file.path).map_or(0, |metadata| metadata.len()))
            .sum();
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left) {msg}",
            )
            .expect("the progress template is valid"),
        );
        Self { bar }
    }

    fn update(&self, bytes: u64, summary: &IngestSummary, started: Instant) {
        if self.bar.is_hidden() {
            return;
        }
        let seconds = started.elapsed().as_secs_f64().max(1e-9);
        let documents = summary.train_documents + summary.validation_documents;
        let tokens = summary.train_tokens + summary.validation_tokens;
        self.bar.set_position(bytes);
        self.bar.set_message(format!(
            "{:.2} MB/s of text, {:.0} docs/s, {:.0} tokens/s",
            summary.text_bytes as f64 / 1e6 / seconds,
            documents as f64 / seconds,
            tokens as f64 / seconds
        ));
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
