//! Token shards: the on-disk form of a token stream, read memory-mapped.
//!
//! A shard is a 32-byte little-endian header followed by the tokens:
//!
//! | bytes  | field                                      |
//! |--------|--------------------------------------------|
//! | 0..8   | magic `HLATTOKS`                           |
//! | 8..12  | format version (1)                         |
//! | 12..16 | token width in bytes: 2 (u16) or 4 (u32)   |
//! | 16..24 | token count                                |
//! | 24..28 | vocabulary size                            |
//! | 28..32 | reserved, 0                                |
//!
//! Tokens are u16 when the vocabulary has at most 65536 tokens, u32 otherwise. A split (train or
//! validation) is a folder's `train-00000.bin`, `train-00001.bin`... read in order as one stream.
//!
//! [`ShardSet::open_split`] also reads a Megatron indexed dataset ([`super::megatron`]): a prefix
//! `PREFIX` of `PREFIX.bin` + `PREFIX.idx` (its training split; it has no validation split), or
//! a folder holding `train.bin`/`train.idx` and `val.bin`/`val.idx` as `hlat data ingest
//! --format megatron` writes them.

use std::fs::{self, File};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::error::DataError;
use super::sink::{DocumentSink, SinkPosition};
use super::tokens::TokenStream;

/// The first bytes of every shard.
pub const SHARD_MAGIC: [u8; 8] = *b"HLATTOKS";
/// The shard format version this crate writes and reads.
pub const SHARD_VERSION: u32 = 1;
/// The size of the shard header in bytes.
pub const SHARD_HEADER_BYTES: usize = 32;

/// Which part of a data set a shard belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Training data.
    Train,
    /// Held-out validation data.
    Validation,
}

impl Split {
    /// The prefix of this split's shard file names.
    pub fn file_prefix(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "val",
        }
    }

    /// The path of shard number `index` of this split in `folder`.
    pub fn shard_path(self, folder: &Path, index: usize) -> PathBuf {
        folder.join(format!("{}-{index:05}.bin", self.file_prefix()))
    }
}

/// The bytes per token for a vocabulary: 2 when every id fits in a u16, 4 otherwise.
pub fn token_width(vocab_size: usize) -> u32 {
    if vocab_size <= 1 << 16 { 2 } else { 4 }
}

/// The header of a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHeader {
    /// Bytes per token: 2 or 4.
    pub token_width: u32,
    /// The number of tokens after the header.
    pub token_count: u64,
    /// The size of the vocabulary the tokens come from.
    pub vocab_size: u32,
}

impl ShardHeader {
    fn to_bytes(self) -> [u8; SHARD_HEADER_BYTES] {
        let mut bytes = [0u8; SHARD_HEADER_BYTES];
        bytes[0..8].copy_from_slice(&SHARD_MAGIC);
        bytes[8..12].copy_from_slice(&SHARD_VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.token_width.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.token_count.to_le_bytes());
        bytes[24..28].copy_from_slice(&self.vocab_size.to_le_bytes());
        bytes
    }

    /// Parses and checks the header at the start of `bytes`, the whole content of `path`.
    fn parse(path: &Path, bytes: &[u8]) -> Result<Self, DataError> {
        let bad = |problem: String| DataError::BadShard {
            path: path.to_path_buf(),
            problem,
        };
        if bytes.len() < SHARD_HEADER_BYTES {
            return Err(bad(format!(
                "{} bytes is shorter than the {SHARD_HEADER_BYTES}-byte header",
                bytes.len()
            )));
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        if bytes[0..8] != SHARD_MAGIC {
            return Err(bad(format!(
                "magic {:?} is not {:?}",
                String::from_utf8_lossy(&bytes[0..8]),
                String::from_utf8_lossy(&SHARD_MAGIC)
            )));
        }
        let version = u32_at(8);
        if version != SHARD_VERSION {
            return Err(bad(format!(
                "format version {version} is not the supported {SHARD_VERSION}"
            )));
        }
        let header = Self {
            token_width: u32_at(12),
            token_count: u64::from_le_bytes(bytes[16..24].try_into().unwrap()),
            vocab_size: u32_at(24),
        };
        if header.token_width != 2 && header.token_width != 4 {
            return Err(bad(format!(
                "token width {} is neither 2 nor 4 bytes",
                header.token_width
            )));
        }
        let body = (bytes.len() - SHARD_HEADER_BYTES) as u64;
        let expected = header.token_count.checked_mul(header.token_width as u64);
        if expected != Some(body) {
            return Err(bad(format!(
                "the header announces {} tokens of {} bytes but the file holds {body} bytes of tokens",
                header.token_count, header.token_width
            )));
        }
        Ok(header)
    }
}

/// Checks every token id of a shard's body against the vocabulary of its header, so a corrupt
/// shard is refused when it is opened rather than failing a training step. A sequential read of
/// the mapped file (a u16 shard of a vocabulary of 65536 or more cannot hold a bad id and is not
/// read).
fn check_token_ids(path: &Path, header: ShardHeader, body: &[u8]) -> Result<(), DataError> {
    let bad = |problem: String| DataError::BadShard {
        path: path.to_path_buf(),
        problem,
    };
    if header.vocab_size == 0 {
        return Err(bad("the header announces a vocabulary of 0 tokens".into()));
    }
    let vocab = header.vocab_size;
    let width = header.token_width as usize;
    if width == 2 && vocab > u32::from(u16::MAX) {
        return Ok(());
    }
    match body
        .chunks_exact(width)
        .map(decode_token)
        .enumerate()
        .find(|&(_, id)| id >= vocab)
    {
        None => Ok(()),
        Some((position, id)) => Err(bad(format!(
            "token {position} (byte {}) is id {id}, outside the vocabulary of {vocab} tokens in \
             the header",
            SHARD_HEADER_BYTES + position * width
        ))),
    }
}

/// One little-endian token id of 2 or 4 bytes (the widths [`ShardHeader::parse`] accepts).
fn decode_token(bytes: &[u8]) -> u32 {
    match *bytes {
        [low, high] => u32::from(u16::from_le_bytes([low, high])),
        [a, b, c, d] => u32::from_le_bytes([a, b, c, d]),
        _ => panic!("a token id is 2 or 4 bytes, not {}", bytes.len()),
    }
}

/// A shard mapped into memory (or the `.bin` of a Megatron dataset, which has no header).
pub struct TokenShard {
    path: PathBuf,
    header: ShardHeader,
    map: Mmap,
    /// Where the tokens start in the file.
    body: usize,
}

impl TokenShard {
    /// Opens and checks the shard at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DataError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|error| DataError::io(path, error))?;
        // SAFETY: shards are written once, renamed into place, and never modified afterwards;
        // the mapping is read-only.
        let map = unsafe { Mmap::map(&file) }.map_err(|error| DataError::io(path, error))?;
        let header = ShardHeader::parse(path, &map)?;
        check_token_ids(path, header, &map[SHARD_HEADER_BYTES..])?;
        Ok(Self {
            path: path.to_path_buf(),
            header,
            map,
            body: SHARD_HEADER_BYTES,
        })
    }

    /// A mapped file of tokens without a header: `header` describes the body at `body..`.
    pub(super) fn from_parts(path: PathBuf, header: ShardHeader, map: Mmap, body: usize) -> Self {
        Self {
            path,
            header,
            map,
            body,
        }
    }

    /// The shard's header.
    pub fn header(&self) -> ShardHeader {
        self.header
    }

    /// The shard's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.header.token_count as usize
    }

    /// Whether the shard holds no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the tokens `start..start + out.len()` into `out`.
    pub fn copy_tokens(&self, start: usize, out: &mut [u32]) {
        let width = self.header.token_width as usize;
        let from = self.body + start * width;
        let bytes = &self.map[from..from + out.len() * width];
        for (token, encoded) in out.iter_mut().zip(bytes.chunks_exact(width)) {
            *token = decode_token(encoded);
        }
    }
}

/// The shards of one split, read in order as one [`TokenStream`].
pub struct ShardSet {
    shards: Vec<TokenShard>,
    /// `starts[i]` is the stream position of shard `i`'s first token; the last entry is the total.
    starts: Vec<usize>,
    vocab_size: u32,
}

impl ShardSet {
    /// Opens the shards of `split` in `folder` (`train-00000.bin`, `train-00001.bin`...), or a
    /// Megatron indexed dataset: `folder` as a prefix (`folder.idx` exists; training split
    /// only), or `folder/train.idx` / `folder/val.idx` (see the [module](self) documentation).
    pub fn open_split(folder: impl AsRef<Path>, split: Split) -> Result<Self, DataError> {
        let folder = folder.as_ref();
        if let Some(prefix) = super::megatron::split_prefix(folder, split)? {
            return Ok(Self::from_shards(vec![super::megatron::open(&prefix)?]));
        }
        let mut paths = Vec::new();
        while split.shard_path(folder, paths.len()).is_file() {
            paths.push(split.shard_path(folder, paths.len()));
        }
        if paths.is_empty() {
            return Err(DataError::EmptyInput(format!(
                "no {} shard in {} (expected {})",
                split.file_prefix(),
                folder.display(),
                split.shard_path(folder, 0).display()
            )));
        }
        Self::open(&paths)
    }

    /// Opens the shards at `paths`, in order. They must share one vocabulary size.
    pub fn open(paths: &[PathBuf]) -> Result<Self, DataError> {
        let shards = paths
            .iter()
            .map(TokenShard::open)
            .collect::<Result<Vec<_>, _>>()?;
        Self::check_and_join(shards)
    }

    /// One shard set of already opened shards (not empty).
    fn from_shards(shards: Vec<TokenShard>) -> Self {
        Self::check_and_join(shards).expect("one shard has one vocabulary")
    }

    fn check_and_join(shards: Vec<TokenShard>) -> Result<Self, DataError> {
        let Some(first) = shards.first() else {
            return Err(DataError::EmptyInput("no shard given".into()));
        };
        let vocab_size = first.header.vocab_size;
        if let Some(other) = shards.iter().find(|s| s.header.vocab_size != vocab_size) {
            return Err(DataError::BadShard {
                path: other.path.clone(),
                problem: format!(
                    "vocabulary size {} differs from the {vocab_size} of {}",
                    other.header.vocab_size,
                    first.path.display()
                ),
            });
        }
        let mut starts = vec![0];
        for shard in &shards {
            starts.push(starts.last().unwrap() + shard.len());
        }
        Ok(Self {
            shards,
            starts,
            vocab_size,
        })
    }

    /// The size of the vocabulary the tokens come from.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// The shards, in stream order.
    pub fn shards(&self) -> &[TokenShard] {
        &self.shards
    }
}

impl TokenStream for ShardSet {
    fn num_tokens(&self) -> usize {
        *self.starts.last().unwrap()
    }

    fn copy_tokens(&self, start: usize, out: &mut [u32]) {
        assert!(
            start + out.len() <= self.num_tokens(),
            "tokens {start}..{} past the end of {} tokens",
            start + out.len(),
            self.num_tokens()
        );
        let mut position = start;
        let mut done = 0;
        let mut shard = self.starts.partition_point(|&s| s <= position) - 1;
        while done < out.len() {
            let local = position - self.starts[shard];
            let take = (self.shards[shard].len() - local).min(out.len() - done);
            self.shards[shard].copy_tokens(local, &mut out[done..done + take]);
            done += take;
            position += take;
            shard += 1;
        }
    }
}

/// Writes one split as shards of at most `shard_tokens` tokens.
///
/// Shards are written to `*.bin.tmp` files and only renamed into place by [`ShardWriter::commit`];
/// a writer dropped before (on an error) removes its temporary files, so a failed run leaves no
/// half-written shard behind.
pub struct ShardWriter {
    folder: PathBuf,
    split: Split,
    shard_tokens: usize,
    vocab_size: u32,
    width: u32,
    open: Option<OpenShard>,
    finished: Vec<PathBuf>,
    total_tokens: u64,
    documents: u64,
    /// Leave the temporary files when dropped (a resumable ingest stopped).
    keep: bool,
}

struct OpenShard {
    path: PathBuf,
    file: BufWriter<File>,
    tokens: u64,
}

impl ShardWriter {
    /// A writer of `split` shards into `folder` for a vocabulary of `vocab_size` tokens.
    pub fn new(
        folder: &Path,
        split: Split,
        shard_tokens: usize,
        vocab_size: usize,
    ) -> Result<Self, DataError> {
        if shard_tokens == 0 {
            return Err(DataError::setting("shard size", "0 tokens per shard"));
        }
        let vocab_size = u32::try_from(vocab_size).map_err(|_| {
            DataError::setting(
                "vocabulary size",
                format!("{vocab_size} does not fit in u32"),
            )
        })?;
        Ok(Self {
            folder: folder.to_path_buf(),
            split,
            shard_tokens,
            vocab_size,
            width: token_width(vocab_size as usize),
            open: None,
            finished: Vec::new(),
            total_tokens: 0,
            documents: 0,
            keep: false,
        })
    }

    /// A writer continuing an unfinished split at `position` (from [`DocumentSink::sync`]): its
    /// finished temporary shards are kept, the open one cut back to the position, later ones
    /// removed.
    pub fn resume(
        folder: &Path,
        split: Split,
        shard_tokens: usize,
        vocab_size: usize,
        position: SinkPosition,
    ) -> Result<Self, DataError> {
        let mut writer = Self::new(folder, split, shard_tokens, vocab_size)?;
        let temporary = |index: u64| {
            split
                .shard_path(folder, index as usize)
                .with_extension("bin.tmp")
        };
        for index in 0..position.finished_files {
            let path = temporary(index);
            if !path.is_file() {
                return Err(DataError::io(
                    &path,
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "a finished shard of the unfinished ingest is missing",
                    ),
                ));
            }
            writer.finished.push(path);
        }
        if position.open_tokens > 0 {
            let path = temporary(position.finished_files);
            let io_error = |error| DataError::io(&path, error);
            let mut file = fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io_error)?;
            let length = SHARD_HEADER_BYTES as u64 + position.open_tokens * writer.width as u64;
            if file.metadata().map_err(io_error)?.len() < length {
                return Err(io_error(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "shorter than the unfinished ingest recorded",
                )));
            }
            file.set_len(length).map_err(io_error)?;
            file.seek(SeekFrom::End(0)).map_err(io_error)?;
            writer.open = Some(OpenShard {
                path: path.clone(),
                file: BufWriter::new(file),
                tokens: position.open_tokens,
            });
        }
        let first_later = position.finished_files + u64::from(position.open_tokens > 0);
        let mut later = first_later;
        while temporary(later).exists() {
            let path = temporary(later);
            fs::remove_file(&path).map_err(|error| DataError::io(&path, error))?;
            later += 1;
        }
        writer.total_tokens = position.tokens;
        writer.documents = position.documents;
        Ok(writer)
    }

    /// The number of tokens written so far.
    pub fn total_tokens(&self) -> u64 {
        self.total_tokens
    }

    /// Appends `tokens`, starting new shards as they fill up.
    pub fn write(&mut self, mut tokens: &[u32]) -> Result<(), DataError> {
        while !tokens.is_empty() {
            if self.open.is_none() {
                self.start_shard()?;
            }
            let open = self.open.as_mut().unwrap();
            let room = self.shard_tokens - open.tokens as usize;
            let (now, rest) = tokens.split_at(room.min(tokens.len()));
            if let Some(token) = now.iter().find(|&&token| token >= self.vocab_size) {
                return Err(DataError::setting(
                    "token",
                    format!(
                        "id {token} is outside the vocabulary of {}",
                        self.vocab_size
                    ),
                ));
            }
            let mut bytes = Vec::with_capacity(now.len() * self.width as usize);
            for &token in now {
                if self.width == 2 {
                    bytes.extend_from_slice(&(token as u16).to_le_bytes());
                } else {
                    bytes.extend_from_slice(&token.to_le_bytes());
                }
            }
            open.file
                .write_all(&bytes)
                .map_err(|error| DataError::io(&open.path, error))?;
            open.tokens += now.len() as u64;
            self.total_tokens += now.len() as u64;
            if open.tokens as usize == self.shard_tokens {
                self.finish_shard()?;
            }
            tokens = rest;
        }
        Ok(())
    }

    /// Finishes the last shard and renames every shard into place; returns their paths.
    pub fn commit(mut self) -> Result<Vec<PathBuf>, DataError> {
        self.finish_shard()?;
        let mut committed = Vec::with_capacity(self.finished.len());
        for temporary in std::mem::take(&mut self.finished) {
            let path = temporary.with_extension("");
            fs::rename(&temporary, &path).map_err(|error| DataError::io(&path, error))?;
            committed.push(path);
        }
        Ok(committed)
    }

    fn start_shard(&mut self) -> Result<(), DataError> {
        let index = self.finished.len();
        let path = self
            .split
            .shard_path(&self.folder, index)
            .with_extension("bin.tmp");
        let file = File::create(&path).map_err(|error| DataError::io(&path, error))?;
        let mut file = BufWriter::new(file);
        file.write_all(&[0u8; SHARD_HEADER_BYTES])
            .map_err(|error| DataError::io(&path, error))?;
        self.open = Some(OpenShard {
            path,
            file,
            tokens: 0,
        });
        Ok(())
    }

    /// Writes the header of the open shard, now that its token count is known, and closes it.
    fn finish_shard(&mut self) -> Result<(), DataError> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let path = open.path;
        // The path is recorded first so that a failure below still removes the file.
        self.finished.push(path.clone());
        let header = ShardHeader {
            token_width: self.width,
            token_count: open.tokens,
            vocab_size: self.vocab_size,
        };
        let io_error = |error| DataError::io(&path, error);
        let mut file = open
            .file
            .into_inner()
            .map_err(|error| io_error(error.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(io_error)?;
        file.write_all(&header.to_bytes()).map_err(io_error)?;
        file.sync_all().map_err(io_error)?;
        Ok(())
    }
}

impl DocumentSink for ShardWriter {
    fn write_document(&mut self, tokens: &[u32], eos: u32) -> Result<(), DataError> {
        self.write(tokens)?;
        self.write(&[eos])?;
        self.documents += 1;
        Ok(())
    }

    fn total_tokens(&self) -> u64 {
        self.total_tokens
    }

    fn sync(&mut self) -> Result<SinkPosition, DataError> {
        let open_tokens = match &mut self.open {
            Some(open) => {
                let io_error = |error| DataError::io(&open.path, error);
                open.file.flush().map_err(io_error)?;
                open.file.get_ref().sync_data().map_err(io_error)?;
                open.tokens
            }
            None => 0,
        };
        Ok(SinkPosition {
            documents: self.documents,
            tokens: self.total_tokens,
            finished_files: self.finished.len() as u64,
            open_tokens,
        })
    }

    fn commit(self: Box<Self>) -> Result<Vec<PathBuf>, DataError> {
        ShardWriter::commit(*self)
    }

    fn keep_unfinished(&mut self) {
        self.keep = true;
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let open = self.open.take().map(|open| open.path);
        for temporary in self.finished.iter().chain(open.iter()) {
            let _ = fs::remove_file(temporary);
        }
    }
}
