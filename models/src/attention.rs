//! Causal self-attention with rotary embeddings and grouped key/value heads.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, Device, Tensor, s};

use burn_trainium::attention::{
    FusedAttentionOptions, fused_attention, is_fused_on, repeat_kv_heads,
};

use crate::blocked_attention::{ATTENTION_BLOCK, attends_by_block, blocked_causal_attention};
use crate::cache::{CacheWrite, KvCache};
use crate::config::HlatConfig;
use crate::linear::{projection, row_parallel};
use crate::lora::{Lora, project};
use crate::norm::RmsNorm;
use crate::parallel::Exchange;
use crate::rotary::RotaryTables;

/// Multi-head causal self-attention; `num_heads / num_kv_heads` query heads share each key/value
/// head (grouped-query attention, as Hugging Face's `repeat_kv`). Optionally with biases on the
/// projections, an RMSNorm over each query and key head before the rotary embedding (Qwen3) and
/// a sliding window (Mistral).
///
/// It runs in three stages, [`Attention::project`], [`Attention::attend`] and
/// [`Attention::output`]: the decoder layer runs them in turn, activation checkpointing
/// recomputes them apart.
#[derive(Module, Debug)]
pub struct Attention {
    /// Query projection `hidden -> heads·head_dim`.
    pub q_proj: Linear,
    /// Key projection `hidden -> kv_heads·head_dim`.
    pub k_proj: Linear,
    /// Value projection `hidden -> kv_heads·head_dim`.
    pub v_proj: Linear,
    /// Output projection `heads·head_dim -> hidden`.
    pub o_proj: Linear,
    /// Norm of each query head `[head_dim]` (Qwen3's `q_norm`).
    pub q_norm: Option<RmsNorm>,
    /// Norm of each key head `[head_dim]` (Qwen3's `k_norm`).
    pub k_norm: Option<RmsNorm>,
    /// Number of query heads (this rank's, when split by [`crate::parallel`]).
    pub num_heads: usize,
    /// Number of key/value heads (this rank's, when split: 1 when the tensor-parallel degree
    /// exceeds the model's KV heads, each then held by several ranks; its query heads all belong
    /// to that head's group).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Positions a query sees, its own included, when the layer slides (`None`: all earlier).
    #[module(skip)]
    pub sliding_window: Option<usize>,
    /// LoRA adapter of the query projection ([`crate::lora`]).
    pub q_lora: Option<Lora>,
    /// LoRA adapter of the key projection.
    pub k_lora: Option<Lora>,
    /// LoRA adapter of the value projection.
    pub v_lora: Option<Lora>,
    /// LoRA adapter of the output projection.
    pub o_lora: Option<Lora>,
}

/// Where the keys and values of earlier positions come from.
pub enum Context<'a> {
    /// The whole sequence is in the input: attend causally within it.
    Full,
    /// Earlier positions are in the cache (for layer `layer`); the input continues them.
    Cached {
        /// The cache of the whole model.
        cache: &'a mut KvCache,
        /// The index of this layer in it.
        layer: usize,
        /// Where this pass writes and what its queries see.
        write: &'a CacheWrite,
    },
}

impl Attention {
    /// A freshly initialised attention layer for decoder layer `layer` of `config`.
    pub fn new(config: &HlatConfig, layer: usize, device: &Device) -> Self {
        let head_dim = config.head_dim();
        let hidden = config.hidden_size;
        let kv_width = config.num_kv_heads * head_dim;
        let q_width = config.num_heads * head_dim;
        let head_norm = || {
            config
                .qk_norm
                .then(|| RmsNorm::new(head_dim, config.rms_norm_eps, device))
        };
        Self {
            q_proj: projection(config, hidden, q_width, config.qkv_bias, device),
            k_proj: projection(config, hidden, kv_width, config.qkv_bias, device),
            v_proj: projection(config, hidden, kv_width, config.qkv_bias, device),
            o_proj: projection(config, q_width, hidden, config.o_proj_bias, device),
            q_norm: head_norm(),
            k_norm: head_norm(),
            num_heads: config.num_heads,
            num_kv_heads: config.num_kv_heads,
            head_dim,
            sliding_window: config.window_of_layer(layer),
            q_lora: None,
            k_lora: None,
            v_lora: None,
            o_lora: None,
        }
    }

    /// The output projection (row-parallel under `exchange`) of the attention core's output.
    pub fn output(&self, attended: Tensor<3>, exchange: &dyn Exchange) -> Tensor<3> {
        row_parallel(&self.o_proj, self.o_lora.as_ref(), attended, exchange)
    }

    /// Queries, keys and values `[batch, heads, seq, head_dim]` of `x`, the queries and keys
    /// normed per head (when the layer has those norms) and rotated.
    pub fn project(
        &self,
        x: Tensor<3>,
        rotary: &RotaryTables,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [batch, seq, _] = x.dims();
        let heads = |t: Tensor<3>, count: usize, norm: Option<&RmsNorm>| {
            let t = t.reshape([batch, seq, count, self.head_dim]);
            let t = match norm {
                Some(norm) => norm.forward(t),
                None => t,
            };
            t.swap_dims(1, 2)
        };
        let queries = project(&self.q_proj, self.q_lora.as_ref(), x.clone());
        let queries = rotary.apply(heads(queries, self.num_heads, self.q_norm.as_ref()));
        let keys = project(&self.k_proj, self.k_lora.as_ref(), x.clone());
        let keys = rotary.apply(heads(keys, self.num_kv_heads, self.k_norm.as_ref()));
        let values = project(&self.v_proj, self.v_lora.as_ref(), x);
        let values = heads(values, self.num_kv_heads, None);
        (queries, keys, values)
    }

    /// Whether the sliding window hides some earlier position from a sequence of `seq`.
    fn window_hides(&self, seq: usize) -> bool {
        self.sliding_window.is_some_and(|window| window < seq)
    }

    /// The attention core: causal softmax attention of `queries` over `keys` and `values` (and
    /// the cached positions before them), the heads joined: `[batch, seq, heads·head_dim]`.
    /// Training without a cache on a Trainium device, it is one fused operation forward and one
    /// backward ([`fused_attention`]: the key/value heads are not repeated, and no `[seq × seq]`
    /// scores are kept between the passes). Otherwise,
    /// sequences longer than [`ATTENTION_BLOCK`] attend by blocks when training
    /// (memory linear in the sequence, see [`blocked_causal_attention`]), and through Burn's
    /// attention module in inference (no autodiff), which each backend computes its own way:
    /// burn-flex by tiles, Trainium's `xla` by query blocks, `neuron` as the Neuron SDK's
    /// flash-attention kernel. (Burn's autodiff decomposes the module into full scores, so
    /// training keeps the blocks.)
    pub fn attend(
        &self,
        queries: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        context: Context<'_>,
    ) -> Tensor<3> {
        let seq = queries.dims()[2];
        let training = queries.device().is_autodiff();
        match context {
            Context::Full if training && is_fused_on(&queries.device()) => {
                let options = FusedAttentionOptions {
                    sliding_window: self.sliding_window,
                    ..FusedAttentionOptions::causal()
                };
                self.join_heads(fused_attention(queries, keys, values, None, &options))
            }
            // The window in the mask, a block of queries at a time over a long sequence (scores
            // `[block × seq]`, as the backward pass recomputes them).
            Context::Full if self.window_hides(seq) => {
                let blocks = (0..seq)
                    .step_by(ATTENTION_BLOCK)
                    .map(|first| {
                        let end = (first + ATTENTION_BLOCK).min(seq);
                        self.attend_rows(
                            queries.clone().slice(s![.., .., first..end, ..]),
                            keys.clone().slice(s![.., .., 0..end, ..]),
                            values.clone().slice(s![.., .., 0..end, ..]),
                            first,
                        )
                    })
                    .collect();
                Tensor::cat(blocks, 1)
            }
            Context::Full if attends_by_block(seq) && !training => {
                self.attend_through_module(queries, keys, values)
            }
            Context::Full if attends_by_block(seq) => self.join_heads(blocked_causal_attention(
                queries,
                self.repeat_kv(keys),
                self.repeat_kv(values),
                ATTENTION_BLOCK,
            )),
            Context::Full => self.attend_rows(queries, keys, values, 0),
            Context::Cached {
                cache,
                layer,
                write,
            } => {
                let (keys, values, hidden) =
                    cache.write(layer, keys, values, write, self.sliding_window.is_some());
                self.attend_masked(queries, keys, values, hidden)
            }
        }
    }

    /// The attention core for the queries of positions `first..first + rows` over the keys and
    /// values of positions `0..` (at least up to the last query): each query sees the keys up to
    /// its own position (and, with a sliding window, none before the window).
    /// `[batch, rows, heads·head_dim]`; the rows of [`Attention::attend`] over the whole
    /// sequence.
    pub fn attend_rows(
        &self,
        queries: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        first: usize,
    ) -> Tensor<3> {
        let rows = queries.dims()[2];
        let total = keys.dims()[2];
        let device = queries.device();
        let mut hidden = Tensor::<2, Bool>::tril_mask([rows, total], first as i64, &device);
        if let Some(window) = self.sliding_window {
            // Key k is before query q's window when k <= q - window.
            let offset = first as i64 - window as i64 + 1;
            let before = Tensor::<2, Bool>::triu_mask([rows, total], offset, &device);
            hidden = hidden.bool_or(before);
        }
        self.attend_masked(queries, keys, values, hidden)
    }

    /// Causal attention through Burn's attention module, in f32 as the blocks compute their
    /// softmax (Burn's reference attention, NdArray's, would sum a bf16 softmax over thousands of
    /// keys in bf16); the heads joined.
    fn attend_through_module(
        &self,
        queries: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
    ) -> Tensor<3> {
        let dtype = queries.dtype();
        let widen = |tensor: Tensor<4>| match dtype {
            DType::BF16 | DType::F16 => tensor.cast(DType::F32),
            _ => tensor,
        };
        let causal = AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: true,
        };
        let attended = attention(
            widen(queries),
            widen(self.repeat_kv(keys)),
            widen(self.repeat_kv(values)),
            None,
            None,
            causal,
        );
        self.join_heads(attended.cast(dtype))
    }

    /// Softmax attention with the scores of `future` (`[queries, keys]`, true where a query must
    /// not look) left out, in one piece; the heads joined.
    fn attend_masked(
        &self,
        queries: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        future: Tensor<2, Bool>,
    ) -> Tensor<3> {
        let [batch, _, seq, _] = queries.dims();
        let dtype = queries.dtype();
        let total = keys.dims()[2];
        let keys = self.repeat_kv(keys);
        let values = self.repeat_kv(values);

        let scale = (self.head_dim as f64).powf(-0.5);
        let scores = queries.matmul(keys.swap_dims(2, 3)) * scale;
        let future = future
            .unsqueeze::<4>()
            .expand([batch, self.num_heads, seq, total]);
        let scores = scores.mask_fill(future, f32::NEG_INFINITY);
        let weights = softmax(scores.cast(DType::F32), 3).cast(dtype);
        self.join_heads(weights.matmul(values))
    }

    /// `[batch, heads, seq, head_dim]` as `[batch, seq, heads·head_dim]`.
    fn join_heads(&self, x: Tensor<4>) -> Tensor<3> {
        let [batch, _, seq, _] = x.dims();
        x.swap_dims(1, 2)
            .reshape([batch, seq, self.num_heads * self.head_dim])
    }

    /// Repeats each key/value head for the query heads of its group: `[b, kv, t, d] -> [b, h, t, d]`.
    fn repeat_kv(&self, x: Tensor<4>) -> Tensor<4> {
        repeat_kv_heads(x, self.num_heads / self.num_kv_heads)
    }
}
