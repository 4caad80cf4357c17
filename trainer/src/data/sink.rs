//! Where ingest writes documents: one split (train or validation) in one output format, token
//! shards ([`super::shard::ShardWriter`]) or a Megatron indexed dataset
//! ([`super::megatron::MegatronWriter`]).
//!
//! A sink writes to temporary files and renames them into place only on
//! [`DocumentSink::commit`]; dropped before, it removes them, unless told to keep them for a
//! resumed ingest ([`DocumentSink::keep_unfinished`]). [`DocumentSink::sync`] makes everything
//! written so far durable and returns the [`SinkPosition`] a resumed ingest starts again from.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::DataError;

/// How far a sink has written, durably: what a resumed ingest continues from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkPosition {
    /// Documents written.
    pub documents: u64,
    /// Tokens written, EOS included.
    pub tokens: u64,
    /// Shard files finished (token shards; 0 for a Megatron dataset, which is one file).
    pub finished_files: u64,
    /// Tokens in the file being written.
    pub open_tokens: u64,
}

/// One split of ingest's output.
pub trait DocumentSink: Send {
    /// Appends one document's tokens followed by `eos`.
    fn write_document(&mut self, tokens: &[u32], eos: u32) -> Result<(), DataError>;

    /// The tokens written so far, EOS included.
    fn total_tokens(&self) -> u64;

    /// Flushes and syncs what was written; returns the position to resume from.
    fn sync(&mut self) -> Result<SinkPosition, DataError>;

    /// Finishes the output and renames it into place; returns the files written (none when
    /// no document was written).
    fn commit(self: Box<Self>) -> Result<Vec<PathBuf>, DataError>;

    /// Leaves the temporary files in place when dropped, for a resumed ingest.
    fn keep_unfinished(&mut self);
}
