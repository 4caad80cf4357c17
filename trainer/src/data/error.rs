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
    /// A file is not valid UTF-8.
    #[error(
        "{path}: invalid UTF-8 at byte offset {offset} (pass --skip-invalid-utf8 to skip such documents)"
    )]
    InvalidUtf8 {
        /// The file.
        path: PathBuf,
        /// The offset, from the start of the file, of the first byte that is not valid UTF-8.
        offset: u64,
    },
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
