//! Reading the documents of one input file, streamed: plain text, JSON lines (plain, gzip or
//! zstd) and Parquet (see [`super::inputs`] for how a file's format is found).
//!
//! - A text file is one document as a whole.
//! - A JSONL file holds one JSON object per line; the string at the [`TextField`] (`text` by
//!   default, or a dotted path into nested objects) is a document. Blank lines are skipped.
//!   Lines are read one at a time, decompressed on the fly, so no file needs to fit in memory.
//! - A Parquet file is read row group by row group, in batches of rows ([`super::parquet_input`]).
//!
//! Empty and null texts are left out. Invalid UTF-8 is an error naming the file and the line
//! (or row group and row) and byte offset, unless it is asked to be skipped: then the document
//! holding it is skipped and counted.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::DataError;
use super::inputs::{Compression, InputFile, InputFormat};
use super::text_field::TextField;

/// How documents are read.
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// The field holding the text in JSONL objects and Parquet rows.
    pub text_field: TextField,
    /// Skip (and report) documents that are not valid UTF-8 instead of failing.
    pub skip_invalid_utf8: bool,
}

/// What reading a file yields, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A document's text (never empty).
    Text(String),
    /// A document skipped because it is not valid UTF-8 (only with `skip_invalid_utf8`).
    InvalidUtf8,
}

/// Calls `visit` with every item of `file` in order until it returns `Break` or fails. Adds the
/// file bytes read (compressed bytes for compressed files) to `bytes_read` as it goes, for
/// progress. Returns `Break` when `visit` stopped early.
pub fn for_each_item(
    file: &InputFile,
    options: &ReadOptions,
    bytes_read: &Arc<AtomicU64>,
    mut visit: impl FnMut(Item) -> Result<ControlFlow<()>, DataError>,
) -> Result<ControlFlow<()>, DataError> {
    let path = file.path.as_path();
    match file.format {
        InputFormat::Parquet => {
            super::parquet_input::for_each_item(path, options, bytes_read, visit)
        }
        InputFormat::Text(compression) => {
            let mut reader = open(path, compression, bytes_read)?;
            let mut bytes = Vec::new();
            reader
                .read_to_end(&mut bytes)
                .map_err(|error| read_error(path, compression, 0, error))?;
            match decode_utf8(path, String::new(), bytes, 0, options.skip_invalid_utf8)? {
                Some(text) if text.is_empty() => Ok(ControlFlow::Continue(())),
                Some(text) => visit(Item::Text(text)),
                None => visit(Item::InvalidUtf8),
            }
        }
        InputFormat::Jsonl(compression) => {
            let mut reader = open(path, compression, bytes_read)?;
            let mut offset = 0u64;
            let mut line = Vec::new();
            for number in 1u64.. {
                line.clear();
                let read = reader
                    .read_until(b'\n', &mut line)
                    .map_err(|error| read_error(path, compression, number - 1, error))?;
                if read == 0 {
                    break;
                }
                let line_offset = offset;
                offset += read as u64;
                let item = match std::str::from_utf8(&line) {
                    Ok(text) => match jsonl_text(path, number, text, &options.text_field)? {
                        Some(text) => Item::Text(text),
                        None => continue,
                    },
                    Err(_) => {
                        let location = format!("line {number}: ");
                        let bytes = std::mem::take(&mut line);
                        match decode_utf8(
                            path,
                            location,
                            bytes,
                            line_offset,
                            options.skip_invalid_utf8,
                        )? {
                            Some(_) => unreachable!("the line was found invalid"),
                            None => Item::InvalidUtf8,
                        }
                    }
                };
                if visit(item)?.is_break() {
                    return Ok(ControlFlow::Break(()));
                }
            }
            Ok(ControlFlow::Continue(()))
        }
    }
}

/// A reader of `path`'s decompressed bytes that counts the file bytes it reads.
fn open(
    path: &Path,
    compression: Compression,
    bytes_read: &Arc<AtomicU64>,
) -> Result<Box<dyn BufRead + Send>, DataError> {
    let file = File::open(path).map_err(|error| DataError::io(path, error))?;
    let counted = BufReader::with_capacity(
        1 << 20,
        CountingReader {
            inner: file,
            count: Arc::clone(bytes_read),
        },
    );
    Ok(match compression {
        Compression::None => Box::new(counted),
        Compression::Gzip => Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::bufread::MultiGzDecoder::new(counted),
        )),
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::with_buffer(counted)
                .map_err(|error| DataError::io(path, error))?;
            Box::new(BufReader::with_capacity(1 << 20, decoder))
        }
    })
}

/// A read error: a decompression error names the compression and the lines read before it.
fn read_error(
    path: &Path,
    compression: Compression,
    line: u64,
    error: std::io::Error,
) -> DataError {
    match compression {
        Compression::None => DataError::io(path, error),
        _ => DataError::Decompress {
            path: path.to_path_buf(),
            compression: compression.name(),
            line,
            error,
        },
    }
}

/// A reader adding the bytes it reads to a shared counter.
struct CountingReader<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.count.fetch_add(read as u64, Ordering::Relaxed);
        Ok(read)
    }
}

/// The non-empty text of JSONL line `number` of `path`; `None` for a blank line or an empty or
/// null text.
fn jsonl_text(
    path: &Path,
    number: u64,
    line: &str,
    field: &TextField,
) -> Result<Option<String>, DataError> {
    if line.trim().is_empty() {
        return Ok(None);
    }
    let bad_line = |problem: String| DataError::BadJsonLine {
        path: path.to_path_buf(),
        line: number as usize,
        problem,
    };
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|error| bad_line(format!("bad JSON: {error}")))?;
    match field.lookup(&value) {
        None => Err(bad_line(format!("no field `{field}`"))),
        Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(text)) if text.is_empty() => Ok(None),
        Some(serde_json::Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(bad_line(format!("field `{field}` is not a string"))),
    }
}

/// `bytes` as text; `None` when they are not UTF-8 and skipping was asked, an error naming the
/// file, `location` and offset (`offset` is where `bytes` start) otherwise.
pub(super) fn decode_utf8(
    path: &Path,
    location: String,
    bytes: Vec<u8>,
    offset: u64,
    skip_invalid_utf8: bool,
) -> Result<Option<String>, DataError> {
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Some(text)),
        Err(_) if skip_invalid_utf8 => Ok(None),
        Err(error) => Err(DataError::InvalidUtf8 {
            path: path.to_path_buf(),
            location,
            offset: offset + error.utf8_error().valid_up_to() as u64,
        }),
    }
}
