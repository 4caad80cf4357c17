//! The data pipeline: tokenizers, token shards, packing, mixing and resumable sampling.
//!
//! From text to training batches:
//!
//! 1. [`TextTokenizer`] loads any Hugging Face `tokenizer.json`
//!    ([`TextTokenizer::from_file`]) or trains a byte-level BPE one
//!    ([`TextTokenizer::train_byte_level_bpe`]).
//! 2. [`ingest()`] streams documents from text, JSONL (plain, gzip, zstd) and Parquet files
//!    ([`inputs`], [`documents`], [`parquet_input`]), filters them ([`filter`]), tokenizes them
//!    on all cores (SentencePiece-style BPE such as Llama 2's word by word, with the ids of the
//!    whole document: [`piece_encoding`]) and writes token shards ([`shard`]) or a Megatron
//!    indexed dataset ([`megatron`]): every document followed by EOS, whole documents held out
//!    for validation; a killed ingest continues where it stopped. [`ShardSet`] reads a split
//!    back (shards or a Megatron dataset), memory-mapped, as one [`TokenStream`].
//! 3. [`PackedRows`] cuts a token stream into rows of `seq_len + 1` tokens and is a
//!    [`RowSource`]; the tail that fills no row is dropped and counted ([`packing`]).
//! 4. [`Mixture`] combines row sources by weight, in tokens (e.g. 0.99 domain and 0.01 general).
//! 5. [`Sampler`] draws batches of rows, shuffled per epoch; its [`SamplerState`]
//!    (`epoch`, `position`, `seed`) goes into checkpoints, and [`Sampler::restore`] continues with
//!    exactly the rows an uninterrupted run would have seen.
//!
//! [`builtin_dataset`] skips steps 1 and 2 with a generated corpus and its own tokenizer
//! ([`builtin`]).
//!
//! ```no_run
//! use hlat_train::data::{
//!     PackedRows, RowSource, Sampler, ShardSet, Split, inputs_and_targets,
//! };
//!
//! let tokens = ShardSet::open_split("data/shards", Split::Train)?;
//! let rows = PackedRows::new(tokens, 4096)?;
//! let mut sampler = Sampler::new(rows, 42)?;
//! for row in sampler.next_batch(8) {
//!     let (inputs, targets) = inputs_and_targets(&row);
//!     assert_eq!((inputs.len(), targets.len()), (4096, 4096));
//! }
//! let saved = sampler.state(); // serialize with serde into the checkpoint
//! sampler.restore(saved)?;
//! # Ok::<(), hlat_train::data::DataError>(())
//! ```

pub mod builtin;
pub mod documents;
pub mod error;
pub mod filter;
pub mod ingest;
pub mod inputs;
pub mod megatron;
pub mod mixing;
pub mod packing;
pub mod parquet_input;
pub mod piece_cache;
pub mod piece_encoding;
pub mod rng;
pub mod rows;
pub mod sample;
pub mod sampler;
pub mod shard;
pub mod sink;
pub mod split;
pub mod text_field;
pub mod tokenizer;
pub mod tokens;

pub use builtin::{
    BuiltinDataConfig, BuiltinDataset, builtin_dataset, builtin_document, default_tokenizer,
};
pub use error::DataError;
pub use filter::Dedup;
pub use ingest::{IngestConfig, IngestSummary, OutputFormat, TOKENIZER_FILE, ingest};
pub use mixing::Mixture;
pub use packing::PackedRows;
pub use rows::{RowSource, inputs_and_targets};
pub use sampler::{Sampler, SamplerState};
pub use shard::{ShardSet, Split, TokenShard};
pub use text_field::TextField;
pub use tokenizer::{TOKENIZER_CONFIG_FILE, TextTokenizer};
pub use tokens::TokenStream;
