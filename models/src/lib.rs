//! # hlat
//!
//! The HLAT model (arXiv 2404.10630) as one preset of a configurable LLaMA-family decoder for
//! Burn, on any Burn device (Flex, a GPU, Trainium), that also imports Llama 3.x, Mistral,
//! Qwen2/2.5, Qwen3 and the mixtures of experts Mixtral, Qwen2-MoE and Qwen3-MoE ([`moe`]).
//!
//! - [`HlatConfig`]: architecture, presets (`hlat-7b`, `hlat-70b`, `hlat-tiny`, `hlat-test`,
//!   `bench-tiny`, `bench-tiny-moe`, and `llama-3.1-8b`, `llama-3.2-1b`, `mistral-7b`,
//!   `qwen2.5-0.5b`, `mixtral-8x7b`, `qwen3-30b-a3b`), parameter count and training FLOPs;
//!   [`ModelFamily`], [`RopeScaling`], [`SlidingWindow`], [`MoeConfig`] for the families'
//!   variations.
//! - [`Hlat`]: logits and next-token cross-entropy; [`KvCache`] for incremental decoding.
//! - [`blocked_attention`]: causal attention by blocks (online softmax) for long sequences.
//! - [`generate`]: greedy or sampled generation with a KV cache.
//! - [`checkpoint`]: native checkpoints (`config.json` + `model.bpk`), sharded ones (one file per
//!   tensor-parallel rank and pipeline stage, [`checkpoint::sharded`]), the layout of a training
//!   run's checkpoints ([`checkpoint::run_folder`], written by the trainer) and
//!   [`checkpoint::load_any`], which opens any of them.
//! - [`hf`]: Hugging Face import/export (`LlamaForCausalLM`, `MistralForCausalLM`,
//!   `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MixtralForCausalLM`, `Qwen2MoeForCausalLM`,
//!   `Qwen3MoeForCausalLM`) and `tokenizer.json`.
//! - [`merge`]: mergekit-style merges (linear, SLERP, task arithmetic, TIES, DARE) of Hugging
//!   Face checkpoints.
//! - [`lora`]: LoRA adapters (PEFT's formulation), frozen base weights, merging.
//! - [`fully_sharded`]: fully sharded data parallelism (parameters kept as [`flat_shards`],
//!   gathered whole layer by layer).
//! - [`parallel`]: tensor and sequence parallelism (split weights, the exchanges between ranks).
//! - [`pipeline`]: pipeline parallelism (stages, 1F1B and interleaved schedules in one SPMD
//!   program).
//! - [`rng`]: the project's one seeded generator (SplitMix64), whose sequence never changes.
//! - [`vision`]: a small CNN in Burn's MNIST style with generated images, the check and
//!   benchmark of Burn's vision operations on a compiled device.

mod attention;
mod block;
pub mod blocked_attention;
mod cache;
pub mod checkpoint;
mod config;
pub mod expert_parallel;
mod family;
mod file_error;
pub mod flat_shards;
pub mod fully_sharded;
pub mod generate;
pub mod hf;
mod linear;
pub mod lora;
pub mod merge;
mod mlp;
mod model;
pub mod moe;
mod norm;
pub mod parallel;
pub mod pipeline;
pub mod recompute;
pub mod rng;
mod rotary;
mod staging;
pub mod vision;

pub use attention::Attention;
pub use block::DecoderLayer;
pub use block::MixtureLayer;
pub use cache::{CacheWrite, KvCache};
pub use config::{ConfigError, HlatConfig, SlidingWindow, element_count};
pub use family::ModelFamily;
pub use file_error::FileError;
pub use mlp::Mlp;
pub use model::{Hlat, token_log_probs};
pub use moe::{MoeConfig, SparseMoe};
pub use norm::RmsNorm;
pub use rotary::{Llama3Scaling, RopeScaling, YarnScaling};
pub use tokenizers::Tokenizer;
