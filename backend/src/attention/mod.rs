//! Attention as one differentiable operation: [`fused_attention`].
//!
//! A model that calls it (HLAT's decoder does) hands a Trainium device one forward and one
//! backward operation per layer instead of the dozens of a materialised softmax: the forward pass
//! keeps the log-sum-exp statistics of each query row, and the backward pass recomputes the
//! probabilities from them, so no `[queries × keys]` probabilities are stored between the passes.
//! It takes what today's decoders need: causal attention, a sliding window, grouped-query heads
//! (the key/value heads are never repeated), a scale, soft capping and attention sinks (a learned
//! logit per head in the softmax's denominator, as GPT-OSS has).
//!
//! How each executor computes the two operations:
//! - `host`: by blocks of queries on Flex, in f32 (`executor/host/attention.rs`);
//! - `xla`: blocked HLO whose live scores are one block of queries over its keys
//!   (`lower/fused_attention.rs`);
//! - any other Burn device (Flex, a GPU backend): [`materialized_attention`], which Burn's own
//!   autodiff differentiates.
//!
//! ```no_run
//! use burn::tensor::{Distribution, Tensor};
//! use burn_trainium::attention::{FusedAttentionOptions, fused_attention};
//!
//! let device = burn_trainium::device("xla:0")?.autodiff();
//! let random = |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Default, &device);
//! // 8 query heads over 2 key/value heads, 128 positions, a window of 64.
//! let (query, key, value) = (random([1, 8, 128, 64]), random([1, 2, 128, 64]), random([1, 2, 128, 64]));
//! let options = FusedAttentionOptions { sliding_window: Some(64), ..FusedAttentionOptions::causal() };
//! let output = fused_attention(query.clone(), key, value, None, &options);
//! let grads = output.sum().backward();
//! # Ok::<(), burn_trainium::BackendError>(())
//! ```

mod extension;
mod options;
mod reference;
mod tensor;

pub use extension::{
    AttentionBackward, AttentionExtension, BACKWARD, FORWARD, FusedAttentionCall, Gradients4,
    fused_attention_arity, is_fused_attention,
};
pub use options::{
    AttentionShape, FusedAttentionError, FusedAttentionOptions, QUERY_BLOCK, QueryBlock,
};
pub use reference::{materialized_attention, repeat_kv_heads};
pub(crate) use tensor::{FusedAttentionSetting, fused_attention_from_env};
pub use tensor::{fused_attention, fused_attention_with_statistics, is_fused_on};
