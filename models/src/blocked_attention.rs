//! Blocked causal attention: the queries and keys taken a block of positions at a time with an
//! online softmax (a running maximum and sum per query, rescaled as each key block arrives, as
//! FlashAttention computes it), so no `[seq × seq]` score matrix exists: the live scores are one
//! `[block × block]` tile per head, and memory grows linearly with the sequence.
//!
//! The backward pass of training keeps nothing of this: [`crate::recompute`] runs the attention
//! again one block of queries at a time ([`crate::Attention::attend_rows`], scores
//! `[block × seq]`), so training memory is linear in the sequence too.

use burn::tensor::{Bool, DType, Tensor, s};

/// Sequences longer than this many positions attend by blocks of this many positions; shorter
/// ones in one piece (their scores are small, and one piece is fewer operations).
pub const ATTENTION_BLOCK: usize = 512;

/// Whether a sequence of `seq` positions attends by blocks of [`ATTENTION_BLOCK`].
pub fn attends_by_block(seq: usize) -> bool {
    seq > ATTENTION_BLOCK
}

/// Causal softmax attention of `queries` over `keys` and `values` (all `[batch, heads, seq,
/// head_dim]`, the key/value heads already repeated for their query heads) in blocks of `block`
/// positions: the same result as the full `softmax(q·kᵀ/√d + causal mask)·v`, with scores and
/// softmax statistics in f32 and the output in the queries' dtype. Key blocks wholly after a
/// query block are skipped.
///
/// # Panics
/// If `block` is 0.
pub fn blocked_causal_attention(
    queries: Tensor<4>,
    keys: Tensor<4>,
    values: Tensor<4>,
    block: usize,
) -> Tensor<4> {
    assert!(block > 0, "attention blocks need at least one position");
    let [batch, heads, seq, head_dim] = queries.dims();
    let dtype = queries.dtype();
    let device = queries.device();
    let scale = (head_dim as f64).powf(-0.5);

    let mut outputs = Vec::with_capacity(seq.div_ceil(block));
    for query_start in (0..seq).step_by(block) {
        let query_end = (query_start + block).min(seq);
        let rows = query_end - query_start;
        let query_block = queries
            .clone()
            .slice(s![.., .., query_start..query_end, ..]);
        let mut maximum =
            Tensor::<4>::full([batch, heads, rows, 1], f32::NEG_INFINITY, &device).cast(DType::F32);
        let mut sum = Tensor::<4>::zeros([batch, heads, rows, 1], &device).cast(DType::F32);
        let mut weighted =
            Tensor::<4>::zeros([batch, heads, rows, head_dim], &device).cast(DType::F32);
        // Every key block from the first to the one holding the block's last query.
        for key_start in (0..query_end).step_by(block) {
            let key_end = (key_start + block).min(query_end);
            let key_block = keys.clone().slice(s![.., .., key_start..key_end, ..]);
            let value_block = values.clone().slice(s![.., .., key_start..key_end, ..]);
            let mut scores =
                (query_block.clone().matmul(key_block.swap_dims(2, 3)) * scale).cast(DType::F32);
            if key_end > query_start + 1 {
                // The tile reaches past its first query: each query sees the keys up to its own
                // position. Every query sees the block's first key, so no row is all masked.
                let future = Tensor::<2, Bool>::tril_mask(
                    [rows, key_end - key_start],
                    (query_start - key_start) as i64,
                    &device,
                )
                .unsqueeze::<4>()
                .expand([batch, heads, rows, key_end - key_start]);
                scores = scores.mask_fill(future, f32::NEG_INFINITY);
            }
            let new_maximum = maximum.clone().max_pair(scores.clone().max_dim(3));
            let rescale = (maximum - new_maximum.clone()).exp();
            let probabilities = (scores - new_maximum.clone()).exp();
            sum = sum * rescale.clone() + probabilities.clone().sum_dim(3);
            weighted = weighted * rescale
                + probabilities
                    .cast(dtype)
                    .matmul(value_block)
                    .cast(DType::F32);
            maximum = new_maximum;
        }
        outputs.push((weighted / sum).cast(dtype));
    }
    Tensor::cat(outputs, 2)
}
