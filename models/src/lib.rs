//! # hlat
//!
//! The HLAT model (arXiv 2404.10630): a LLaMA-style decoder for Burn, generic over the backend.
//!
//! - [`HlatConfig`]: architecture, presets (`hlat-7b`, `hlat-70b`, `hlat-tiny`, `hlat-test`,
//!   `bench-tiny`), parameter count and training FLOPs.
//! - [`Hlat`]: logits and next-token cross-entropy; [`KvCache`] for incremental decoding.
//! - [`blocked_attention`]: causal attention by blocks (online softmax) for long sequences.
//! - [`generate`]: greedy or sampled generation with a KV cache.
//! - [`checkpoint`]: native checkpoints (`config.json` + `model.bpk`) and [`checkpoint::load_any`].
//! - [`sharded_checkpoint`]: tensor-parallel checkpoints, one file per rank.
//! - [`run_folder`]: the layout of a training run's checkpoints (written by the trainer, read by
//!   `load_any`).
//! - [`hf`]: Hugging Face `LlamaForCausalLM` import/export and `tokenizer.json`.
//! - [`merge`]: mergekit-style merges (linear, SLERP, task arithmetic, TIES, DARE) of Hugging
//!   Face checkpoints.
//! - [`parallel`]: tensor and sequence parallelism (split weights, the exchanges between ranks).

mod attention;
mod block;
pub mod blocked_attention;
mod cache;
pub mod checkpoint;
mod config;
pub mod generate;
pub mod hf;
mod linear;
pub mod merge;
mod mlp;
mod model;
mod norm;
pub mod parallel;
pub mod recompute;
mod rotary;
pub mod run_folder;
pub mod sharded_checkpoint;
mod staging;

pub use attention::Attention;
pub use block::DecoderLayer;
pub use cache::{CacheWrite, KvCache};
pub use config::{ConfigError, HlatConfig};
pub use mlp::Mlp;
pub use model::Hlat;
pub use norm::RmsNorm;
pub use tokenizers::Tokenizer;
