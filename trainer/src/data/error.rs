//! The error type of the data pipeline.

use std::path::PathBuf;

/// Everything that can go wrong while preparing or reading training data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file or folder could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying I/O error (part of the message, so not repeated as a source).
        error: std::io::Error,
    },
    /// The inputs hold no document with any text.
    #[error("empty input: {0}")]
    EmptyInput(String),
    /// A document is not valid UTF-8.
    #[error(
        "{path}: {location}invalid UTF-8 at byte offset {offset} (pass --skip-invalid-utf8 to skip such documents)"
    )]
    InvalidUtf8 {
        /// The file.
        path: PathBuf,
        /// Where in the file, ending in `": "` (`"line 3: "`, `"row group 1, row 5: "`), or
        /// empty for a text file.
        location: String,
        /// The offset of the first byte that is not valid UTF-8: from the start of the
        /// (decompressed) file for text and JSONL, from the start of the value for Parquet.
        offset: u64,
    },
    /// A compressed file that cannot be decompressed: corrupt or truncated.
    #[error("{path}: corrupt or truncated {compression} data after line {line}: {error}")]
    Decompress {
        /// The file.
        path: PathBuf,
        /// The compression: gzip or zstd.
        compression: &'static str,
        /// The lines read in full before the failure.
        line: u64,
        /// The decompressor's error.
        error: std::io::Error,
    },
    /// A Parquet file that cannot be read, or lacks the text column.
    #[error("{path}: {}{problem}", row_group.map(|group| format!("row group {group}: ")).unwrap_or_default())]
    BadParquet {
        /// The file.
        path: PathBuf,
        /// The row group (counted from 0), when the problem is in one.
        row_group: Option<usize>,
        /// What is wrong.
        problem: String,
    },
    /// A Megatron indexed dataset (`PREFIX.idx` + `PREFIX.bin`) that cannot be read.
    #[error("bad Megatron indexed dataset {path}: {problem}")]
    BadMegatron {
        /// The `.idx` or `.bin` file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// An ingest stopped on purpose (tests of resuming), its unfinished output left in place.
    #[doc(hidden)]
    #[error("ingest interrupted after {0} batches")]
    Interrupted(u64),
    /// A JSONL line is not a JSON object with a string field `text`.
    #[error("{path}: line {line}: {problem}")]
    BadJsonLine {
        /// The file.
        path: PathBuf,
        /// The line number, counted from 1.
        line: usize,
        /// What is wrong with the line.
        problem: String,
    },
    /// A token shard whose header or length is wrong.
    #[error("bad token shard {path}: {problem}")]
    BadShard {
        /// The shard file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The tokenizer library failed (loading, training, encoding or saving).
    #[error("tokenizer {context}: {message}")]
    Tokenizer {
        /// What was being done, with the file when there is one.
        context: String,
        /// The library's message.
        message: String,
    },
    /// The tokenizer lacks a special token the pipeline needs.
    #[error("{tokenizer} has no {role} token: {reason}")]
    MissingSpecialToken {
        /// The tokenizer's file (or "the tokenizer" when it has none).
        tokenizer: String,
        /// The token's role: BOS, EOS or padding.
        role: &'static str,
        /// Where it was looked for.
        reason: String,
    },
    /// A `tokenizer_config.json` that cannot be read as one, or names a token its tokenizer
    /// does not hold.
    #[error("{path}: {problem}")]
    TokenizerConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// An output that would overwrite earlier results.
    #[error("{path} already holds {what}; choose an empty output folder")]
    OutputExists {
        /// The output folder.
        path: PathBuf,
        /// What it holds.
        what: &'static str,
    },
    /// A setting or argument out of its valid range.
    #[error("invalid {name}: {problem}")]
    InvalidSetting {
        /// The setting.
        name: &'static str,
        /// Why its value is not valid.
        problem: String,
    },
}

impl DataError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            error,
        }
    }

    /// An [`DataError::InvalidSetting`] for `name`.
    pub fn setting(name: &'static str, problem: impl Into<String>) -> Self {
        Self::InvalidSetting {
            name,
            problem: problem.into(),
        }
    }
}
