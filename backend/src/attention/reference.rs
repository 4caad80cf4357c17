//! The materialised attention: every `[queries × keys]` score at once, in Burn's own tensor
//! operations. It is what [`super::fused_attention`] computes on devices that are not Trainium's
//! (Flex, a GPU backend: their autodiff differentiates it) and what the fused operation is
//! checked against.

use burn::tensor::activation::softmax;
use burn::tensor::{Bool, DType, Tensor, s};

use super::options::{AttentionShape, FusedAttentionOptions};

/// `softmax(cap(q kᵀ · scale), masked, sinks) v` with the scores materialised, computed in f32
/// and rounded once into the query's dtype.
///
/// # Panics
/// When the tensors or the options do not fit together (see [`AttentionShape::of`]).
pub fn materialized_attention(
    query: Tensor<4>,
    key: Tensor<4>,
    value: Tensor<4>,
    sinks: Option<Tensor<1>>,
    options: &FusedAttentionOptions,
) -> Tensor<4> {
    let shape = checked_shape(&query, &key, &value, sinks.as_ref(), options);
    let AttentionShape {
        batch,
        heads,
        queries,
        keys,
        depth,
        ..
    } = shape;
    let dtype = query.dtype();
    let device = query.device();
    let widen = |tensor: Tensor<4>| tensor.cast(DType::F32);
    let key = repeat_kv_heads(widen(key), shape.group());
    let value = repeat_kv_heads(widen(value), shape.group());

    let mut scores = widen(query).matmul(key.swap_dims(2, 3)) * options.scale_for(depth);
    if let Some(cap) = options.softcap {
        scores = (scores / cap).tanh() * cap;
    }
    if options.causal {
        let offset = keys as i64 - queries as i64;
        let mut hidden = Tensor::<2, Bool>::tril_mask([queries, keys], offset, &device);
        if let Some(window) = options.sliding_window {
            let before =
                Tensor::<2, Bool>::triu_mask([queries, keys], offset - window as i64 + 1, &device);
            hidden = hidden.bool_or(before);
        }
        let hidden = hidden
            .unsqueeze::<4>()
            .expand([batch, heads, queries, keys]);
        scores = scores.mask_fill(hidden, f32::NEG_INFINITY);
    }
    let weights = match sinks {
        None => softmax(scores, 3),
        Some(sinks) => {
            let sinks = sinks
                .cast(DType::F32)
                .reshape([1, heads, 1, 1])
                .expand([batch, heads, queries, 1]);
            softmax(Tensor::cat(vec![scores, sinks], 3), 3).slice(s![.., .., .., 0..keys])
        }
    };
    weights.matmul(value).cast(dtype)
}

/// The shape of an attention's tensors, the options checked.
///
/// # Panics
/// When they do not fit together.
pub(super) fn checked_shape(
    query: &Tensor<4>,
    key: &Tensor<4>,
    value: &Tensor<4>,
    sinks: Option<&Tensor<1>>,
    options: &FusedAttentionOptions,
) -> AttentionShape {
    let sinks = sinks.map(|sinks| sinks.dims());
    AttentionShape::of(
        &query.dims(),
        &key.dims(),
        &value.dims(),
        sinks.as_ref().map(|dims| dims.as_slice()),
        options,
    )
    .unwrap_or_else(|error| panic!("{error}"))
}

/// Each key/value head repeated for the `group` query heads that share it (Hugging Face's
/// `repeat_kv`): `[b, kv, t, d] -> [b, kv·group, t, d]`.
pub fn repeat_kv_heads(x: Tensor<4>, group: usize) -> Tensor<4> {
    if group == 1 {
        return x;
    }
    let [batch, kv_heads, positions, depth] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .expand([batch, kv_heads, group, positions, depth])
        .reshape([batch, kv_heads * group, positions, depth])
}
