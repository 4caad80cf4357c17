//! Megatron-LM / NeuronX Distributed indexed datasets (`PREFIX.bin` + `PREFIX.idx`, "MMIDIDX"),
//! read as a token stream and written by `hlat data ingest --format megatron`.
//!
//! The layout is that of Megatron-LM's `megatron/core/datasets/indexed_dataset.py`
//! (`_IndexWriter`); every number is little-endian:
//!
//! | `.idx` bytes         | field                                                         |
//! |----------------------|---------------------------------------------------------------|
//! | 9                    | magic `MMIDIDX\x00\x00`                                       |
//! | 8 (u64)              | version, 1                                                    |
//! | 1 (u8)               | token dtype code: 8 = uint16, 4 = int32 (others are refused)  |
//! | 8 (u64)              | sequence count N                                              |
//! | 8 (u64)              | document count D (documents + 1)                              |
//! | 4·N (i32)            | sequence lengths, in tokens                                   |
//! | 8·N (i64)            | sequence pointers: byte offsets in `.bin`                     |
//! | 8·D (i64)            | document indices: 0, then the sequence count after each document |
//! | N (i8), optional     | sequence modes (multimodal datasets; ignored)                 |
//!
//! `.bin` holds the sequences' tokens one after another in that dtype. Read here, the sequences
//! must lie in order, without gaps (as every Megatron writer and merger stores them): the token
//! stream is then `.bin` itself, memory-mapped. Megatron's `preprocess_data.py --append-eod`
//! ends every document with EOD, as this project's shards end every document with EOS; this
//! reader takes the tokens as they are. The index names no vocabulary: the vocabulary size
//! reported is the largest id plus one.
//!
//! The writer stores one sequence per document, the document's tokens followed by EOS, in
//! uint16 when the vocabulary has fewer than 65500 tokens and int32 otherwise (Megatron's
//! choice), into `PREFIX.bin.tmp`, with the lengths in `PREFIX.lengths.tmp`; committing writes
//! `PREFIX.idx` and renames `.bin` then `.idx` into place, so an index always describes a
//! complete `.bin`.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::error::DataError;
use super::shard::{ShardHeader, Split, TokenShard};
use super::sink::{DocumentSink, SinkPosition};

/// The first bytes of every `.idx` file.
pub const MEGATRON_MAGIC: [u8; 9] = *b"MMIDIDX\x00\x00";
/// The index version Megatron writes and this module reads.
pub const MEGATRON_VERSION: u64 = 1;
/// Megatron's dtype code of uint16.
pub const DTYPE_UINT16: u8 = 8;
/// Megatron's dtype code of int32.
pub const DTYPE_INT32: u8 = 4;
/// The bytes of the `.idx` header before the lengths.
const HEADER_BYTES: usize = 9 + 8 + 1 + 8 + 8;

/// `prefix` with `.extension` appended (a prefix may itself hold dots).
pub fn with_suffix(prefix: &Path, extension: &str) -> PathBuf {
    let mut path = prefix.as_os_str().to_os_string();
    path.push(".");
    path.push(extension);
    PathBuf::from(path)
}

/// The Megatron dataset prefix holding `split` of a `--data` source, if it is one: the source
/// itself when `SOURCE.idx` exists (its training split; asking its validation split is an
/// error, since Megatron datasets are split by the trainer), or `SOURCE/train` /
/// `SOURCE/val` when that `.idx` exists in a folder without token shards.
pub fn split_prefix(source: &Path, split: Split) -> Result<Option<PathBuf>, DataError> {
    if with_suffix(source, "idx").is_file() {
        return match split {
            Split::Train => Ok(Some(source.to_path_buf())),
            Split::Validation => Err(DataError::EmptyInput(format!(
                "{} is a Megatron indexed dataset prefix: it has no validation split",
                source.display()
            ))),
        };
    }
    if source.is_dir() && !split.shard_path(source, 0).exists() {
        let prefix = source.join(split_name(split));
        if with_suffix(&prefix, "idx").is_file() {
            return Ok(Some(prefix));
        }
    }
    Ok(None)
}

/// The prefix name of a split in a folder written with `--format megatron`.
pub fn split_name(split: Split) -> &'static str {
    match split {
        Split::Train => "train",
        Split::Validation => "val",
    }
}

fn map(path: &Path) -> Result<Mmap, DataError> {
    let file = File::open(path).map_err(|error| DataError::io(path, error))?;
    // SAFETY: read-only mapping of a dataset that is not modified while training reads it.
    unsafe { Mmap::map(&file) }.map_err(|error| DataError::io(path, error))
}

/// Opens the dataset `PREFIX.idx` + `PREFIX.bin` as one token shard (see the
/// [module](self) documentation for what is checked).
pub fn open(prefix: &Path) -> Result<TokenShard, DataError> {
    let idx_path = with_suffix(prefix, "idx");
    let bin_path = with_suffix(prefix, "bin");
    let bad = |path: &Path, problem: String| DataError::BadMegatron {
        path: path.to_path_buf(),
        problem,
    };
    let index = map(&idx_path)?;
    if index.len() < HEADER_BYTES {
        return Err(bad(
            &idx_path,
            format!(
                "{} bytes is shorter than the {HEADER_BYTES}-byte header",
                index.len()
            ),
        ));
    }
    if index[..9] != MEGATRON_MAGIC {
        return Err(bad(
            &idx_path,
            "it does not start with the magic `MMIDIDX`".into(),
        ));
    }
    let u64_at = |at: usize| u64::from_le_bytes(index[at..at + 8].try_into().unwrap());
    let version = u64_at(9);
    if version != MEGATRON_VERSION {
        return Err(bad(
            &idx_path,
            format!("version {version} is not the supported {MEGATRON_VERSION}"),
        ));
    }
    let code = index[17];
    let width = match code {
        DTYPE_UINT16 => 2,
        DTYPE_INT32 => 4,
        other => {
            return Err(bad(
                &idx_path,
                format!(
                    "token dtype code {other} is not uint16 ({DTYPE_UINT16}) or int32 \
                     ({DTYPE_INT32}), the token types Megatron writes"
                ),
            ));
        }
    };
    let sequences = u64_at(18) as usize;
    let documents = u64_at(26) as usize;
    let lengths_at = HEADER_BYTES;
    let pointers_at = lengths_at + 4 * sequences;
    let documents_at = pointers_at + 8 * sequences;
    let end = documents_at + 8 * documents;
    if index.len() != end && index.len() != end + sequences {
        return Err(bad(
            &idx_path,
            format!(
                "{} bytes, but {sequences} sequences and {documents} document indices take {end} \
                 (or {} with sequence modes)",
                index.len(),
                end + sequences
            ),
        ));
    }
    let mut bytes = 0u64;
    for sequence in 0..sequences {
        let at = lengths_at + 4 * sequence;
        let length = i32::from_le_bytes(index[at..at + 4].try_into().unwrap());
        let pointer = u64_at(pointers_at + 8 * sequence);
        if length < 0 {
            return Err(bad(
                &idx_path,
                format!("sequence {sequence} has length {length}"),
            ));
        }
        if pointer != bytes {
            return Err(bad(
                &idx_path,
                format!(
                    "sequence {sequence} starts at byte {pointer}, not {bytes} right after the \
                     one before: only datasets with their sequences in order, without gaps, \
                     are read"
                ),
            ));
        }
        bytes += length as u64 * width as u64;
    }
    let document_index = |document: usize| u64_at(documents_at + 8 * document);
    if documents > 0 {
        if document_index(0) != 0 || document_index(documents - 1) != sequences as u64 {
            return Err(bad(
                &idx_path,
                format!(
                    "the document indices run from {} to {}, not from 0 to the {sequences} \
                     sequences",
                    document_index(0),
                    document_index(documents - 1)
                ),
            ));
        }
        if let Some(document) =
            (1..documents).find(|&document| document_index(document) < document_index(document - 1))
        {
            return Err(bad(
                &idx_path,
                format!("document index {document} decreases"),
            ));
        }
    }
    let bin_size = fs::metadata(&bin_path)
        .map_err(|error| DataError::io(&bin_path, error))?
        .len();
    if bin_size != bytes {
        return Err(bad(
            &bin_path,
            format!(
                "{bin_size} bytes, but its index {} describes {bytes}",
                idx_path.display()
            ),
        ));
    }
    if bytes == 0 {
        return Err(DataError::EmptyInput(format!(
            "{} holds no token",
            bin_path.display()
        )));
    }
    let data = map(&bin_path)?;
    let mut largest = 0u32;
    for (position, token) in data.chunks_exact(width).enumerate() {
        let id = if width == 2 {
            u32::from(u16::from_le_bytes([token[0], token[1]]))
        } else {
            let id = i32::from_le_bytes(token.try_into().unwrap());
            u32::try_from(id).map_err(|_| {
                bad(
                    &bin_path,
                    format!("token {position} is the negative id {id}"),
                )
            })?
        };
        largest = largest.max(id);
    }
    let header = ShardHeader {
        token_width: width as u32,
        token_count: bytes / width as u64,
        vocab_size: largest + 1,
    };
    Ok(TokenShard::from_parts(bin_path, header, data, 0))
}

/// Writes one Megatron indexed dataset, one document per sequence (see the [module](self)
/// documentation).
pub struct MegatronWriter {
    prefix: PathBuf,
    vocab_size: u32,
    width: usize,
    code: u8,
    bin: BufWriter<File>,
    lengths: BufWriter<File>,
    documents: u64,
    tokens: u64,
    keep: bool,
}

impl MegatronWriter {
    /// A writer of `PREFIX.bin` and `PREFIX.idx` for a vocabulary of `vocab_size` tokens.
    pub fn new(prefix: &Path, vocab_size: usize) -> Result<Self, DataError> {
        Self::open(prefix, vocab_size, None)
    }

    /// A writer continuing an unfinished dataset at `position` (from [`DocumentSink::sync`]).
    pub fn resume(
        prefix: &Path,
        vocab_size: usize,
        position: SinkPosition,
    ) -> Result<Self, DataError> {
        Self::open(prefix, vocab_size, Some(position))
    }

    fn open(
        prefix: &Path,
        vocab_size: usize,
        resume: Option<SinkPosition>,
    ) -> Result<Self, DataError> {
        let vocab_size = u32::try_from(vocab_size)
            .ok()
            .filter(|&size| size <= i32::MAX as u32)
            .ok_or_else(|| {
                DataError::setting(
                    "vocabulary size",
                    format!("{vocab_size} does not fit in int32"),
                )
            })?;
        let (width, code) = if vocab_size < 65500 {
            (2, DTYPE_UINT16)
        } else {
            (4, DTYPE_INT32)
        };
        let open = |path: PathBuf, length: Option<u64>| -> Result<BufWriter<File>, DataError> {
            let io_error = |error| DataError::io(&path, error);
            let mut file = match length {
                None => File::create(&path).map_err(io_error)?,
                Some(length) => {
                    let file = fs::OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(io_error)?;
                    if file.metadata().map_err(io_error)?.len() < length {
                        return Err(io_error(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "shorter than the unfinished ingest recorded",
                        )));
                    }
                    file.set_len(length).map_err(io_error)?;
                    file
                }
            };
            file.seek(SeekFrom::End(0)).map_err(io_error)?;
            Ok(BufWriter::with_capacity(1 << 20, file))
        };
        let position = resume.unwrap_or_default();
        let bin = open(
            with_suffix(prefix, "bin.tmp"),
            resume.map(|p| p.tokens * width as u64),
        )?;
        let lengths = open(
            with_suffix(prefix, "lengths.tmp"),
            resume.map(|p| p.documents * 4),
        )?;
        Ok(Self {
            prefix: prefix.to_path_buf(),
            vocab_size,
            width,
            code,
            bin,
            lengths,
            documents: position.documents,
            tokens: position.tokens,
            keep: false,
        })
    }

    fn write_index(&mut self) -> Result<PathBuf, DataError> {
        let lengths_path = with_suffix(&self.prefix, "lengths.tmp");
        let idx_path = with_suffix(&self.prefix, "idx.tmp");
        let io_error = |path: &Path| {
            let path = path.to_path_buf();
            move |error| DataError::io(&path, error)
        };
        self.lengths.flush().map_err(io_error(&lengths_path))?;
        let mut out = BufWriter::new(File::create(&idx_path).map_err(io_error(&idx_path))?);
        let mut header = Vec::with_capacity(HEADER_BYTES);
        header.extend_from_slice(&MEGATRON_MAGIC);
        header.extend_from_slice(&MEGATRON_VERSION.to_le_bytes());
        header.push(self.code);
        header.extend_from_slice(&self.documents.to_le_bytes());
        header.extend_from_slice(&(self.documents + 1).to_le_bytes());
        out.write_all(&header).map_err(io_error(&idx_path))?;
        // The lengths as they are, then the pointers computed from them.
        let read_lengths = || -> Result<BufReader<File>, DataError> {
            let file = File::open(&lengths_path).map_err(io_error(&lengths_path))?;
            Ok(BufReader::with_capacity(1 << 20, file))
        };
        std::io::copy(&mut read_lengths()?, &mut out).map_err(io_error(&idx_path))?;
        let mut lengths = read_lengths()?;
        let mut pointer = 0i64;
        let mut length = [0u8; 4];
        for _ in 0..self.documents {
            lengths
                .read_exact(&mut length)
                .map_err(io_error(&lengths_path))?;
            out.write_all(&pointer.to_le_bytes())
                .map_err(io_error(&idx_path))?;
            pointer += i64::from(i32::from_le_bytes(length)) * self.width as i64;
        }
        for document in 0..=self.documents {
            out.write_all(&(document as i64).to_le_bytes())
                .map_err(io_error(&idx_path))?;
        }
        let file = out
            .into_inner()
            .map_err(|error| DataError::io(&idx_path, error.into_error()))?;
        file.sync_all().map_err(io_error(&idx_path))?;
        Ok(idx_path)
    }
}

impl DocumentSink for MegatronWriter {
    fn write_document(&mut self, tokens: &[u32], eos: u32) -> Result<(), DataError> {
        let length = i32::try_from(tokens.len() + 1).map_err(|_| {
            DataError::setting(
                "document length",
                format!("{} tokens do not fit a Megatron int32 length", tokens.len()),
            )
        })?;
        let mut bytes = Vec::with_capacity((tokens.len() + 1) * self.width);
        for &token in tokens.iter().chain([&eos]) {
            if token >= self.vocab_size {
                return Err(DataError::setting(
                    "token",
                    format!(
                        "id {token} is outside the vocabulary of {}",
                        self.vocab_size
                    ),
                ));
            }
            if self.width == 2 {
                bytes.extend_from_slice(&(token as u16).to_le_bytes());
            } else {
                bytes.extend_from_slice(&(token as i32).to_le_bytes());
            }
        }
        let bin_path = with_suffix(&self.prefix, "bin.tmp");
        self.bin
            .write_all(&bytes)
            .map_err(|error| DataError::io(&bin_path, error))?;
        let lengths_path = with_suffix(&self.prefix, "lengths.tmp");
        self.lengths
            .write_all(&length.to_le_bytes())
            .map_err(|error| DataError::io(&lengths_path, error))?;
        self.documents += 1;
        self.tokens += tokens.len() as u64 + 1;
        Ok(())
    }

    fn total_tokens(&self) -> u64 {
        self.tokens
    }

    fn sync(&mut self) -> Result<SinkPosition, DataError> {
        for (writer, suffix) in [
            (&mut self.bin, "bin.tmp"),
            (&mut self.lengths, "lengths.tmp"),
        ] {
            let path = with_suffix(&self.prefix, suffix);
            writer
                .flush()
                .map_err(|error| DataError::io(&path, error))?;
            writer
                .get_ref()
                .sync_data()
                .map_err(|error| DataError::io(&path, error))?;
        }
        Ok(SinkPosition {
            documents: self.documents,
            tokens: self.tokens,
            finished_files: 0,
            open_tokens: self.tokens,
        })
    }

    fn commit(mut self: Box<Self>) -> Result<Vec<PathBuf>, DataError> {
        if self.documents == 0 {
            return Ok(Vec::new());
        }
        let bin_tmp = with_suffix(&self.prefix, "bin.tmp");
        self.bin
            .flush()
            .and_then(|()| self.bin.get_ref().sync_all())
            .map_err(|error| DataError::io(&bin_tmp, error))?;
        let idx_tmp = self.write_index()?;
        let bin = with_suffix(&self.prefix, "bin");
        let idx = with_suffix(&self.prefix, "idx");
        fs::rename(&bin_tmp, &bin).map_err(|error| DataError::io(&bin, error))?;
        fs::rename(&idx_tmp, &idx).map_err(|error| DataError::io(&idx, error))?;
        Ok(vec![bin, idx])
    }

    fn keep_unfinished(&mut self) {
        self.keep = true;
    }
}

impl Drop for MegatronWriter {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for suffix in ["bin.tmp", "lengths.tmp", "idx.tmp"] {
            let _ = fs::remove_file(with_suffix(&self.prefix, suffix));
        }
    }
}
