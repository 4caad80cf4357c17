//! Which documents ingest keeps: a minimum length (`--min-chars`) and exact deduplication
//! (`--dedup exact`).
//!
//! A document shorter than the minimum (in Unicode scalar values, Rust's `chars`) is skipped and
//! counted. With exact deduplication, a document whose content hash (XXH3, 128 bits, of its
//! UTF-8 bytes) was seen before in the same run is skipped and counted: the first copy is kept,
//! in input order, so the result does not depend on the number of threads. The set of hashes
//! grows by 16 bytes per distinct document (plus the hash table's overhead): about 2.5 GB for
//! 100 million documents, the one part of ingest's memory that grows with the corpus.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::str::FromStr;

use xxhash_rust::xxh3::xxh3_128;

use super::error::DataError;

/// Deduplication of documents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dedup {
    /// Keep every document.
    #[default]
    None,
    /// Skip a document whose exact content was seen before.
    Exact,
}

impl FromStr for Dedup {
    type Err = DataError;

    fn from_str(text: &str) -> Result<Self, DataError> {
        match text {
            "none" => Ok(Self::None),
            "exact" => Ok(Self::Exact),
            other => Err(DataError::setting(
                "dedup",
                format!("`{other}` is neither `exact` nor `none`"),
            )),
        }
    }
}

/// What the filter decided for a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep it; with deduplication, its hash (now recorded as seen).
    Keep(Option<u128>),
    /// Shorter than the minimum.
    Short,
    /// The same content was seen before.
    Duplicate,
}

/// The minimum length and the hashes of the documents seen.
#[derive(Debug, Default)]
pub struct DocumentFilter {
    min_chars: usize,
    seen: Option<HashSet<u128, BuildHasherDefault<PassThrough>>>,
}

impl DocumentFilter {
    /// A filter of documents shorter than `min_chars` and, with [`Dedup::Exact`], of repeats.
    pub fn new(min_chars: usize, dedup: Dedup) -> Self {
        Self {
            min_chars,
            seen: (dedup == Dedup::Exact).then(HashSet::default),
        }
    }

    /// Records hashes seen before (those a resumed ingest had kept).
    pub fn extend_seen(&mut self, hashes: impl IntoIterator<Item = u128>) {
        if let Some(seen) = &mut self.seen {
            seen.extend(hashes);
        }
    }

    /// Decides for `text`, recording it as seen when it is kept.
    pub fn check(&mut self, text: &str) -> Verdict {
        // Counting characters stops at the minimum: long documents are not walked through.
        if self.min_chars > 0 && text.chars().take(self.min_chars).count() < self.min_chars {
            return Verdict::Short;
        }
        let Some(seen) = &mut self.seen else {
            return Verdict::Keep(None);
        };
        let hash = xxh3_128(text.as_bytes());
        if seen.insert(hash) {
            Verdict::Keep(Some(hash))
        } else {
            Verdict::Duplicate
        }
    }
}

/// A hasher for keys that are already hashes: their low 64 bits.
#[derive(Debug, Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u128(&mut self, value: u128) {
        self.0 = value as u64;
    }
}
