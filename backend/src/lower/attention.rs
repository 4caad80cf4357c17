//! The attention module: `softmax(q kᵀ · scale, masked) v`, as Burn's reference fallback
//! computes it (soft capping, boolean mask, causal mask, additive bias, clamped softmax).

use burn_backend::DType;
use burn_ir::{AttentionOpIr, ScalarIr};

use super::builder::{Combiner, Direction, Value};
use super::context::{Lowered, Lowering, dims, element_type, unsupported};
use crate::hlo::{DotDimensionNumbers, PrimitiveType};

/// The smallest finite value and the smallest positive normal value of a float dtype.
fn limits(dtype: DType) -> Lowered<(f64, f64)> {
    Ok(match dtype {
        DType::F64 => (f64::MIN, f64::MIN_POSITIVE),
        DType::F32 | DType::Flex32 => (f32::MIN as f64, f32::MIN_POSITIVE as f64),
        DType::F16 => (half::f16::MIN.to_f64(), half::f16::MIN_POSITIVE.to_f64()),
        DType::BF16 => (half::bf16::MIN.to_f64(), half::bf16::MIN_POSITIVE.to_f64()),
        other => return unsupported(format!("attention in {other:?}")),
    })
}

fn batched_dot(
    cx: &mut Lowering,
    lhs: &Value,
    rhs: &Value,
    rhs_contracting: i64,
    dims: &[i64],
) -> Value {
    let numbers = DotDimensionNumbers {
        lhs_contracting_dimensions: vec![3],
        rhs_contracting_dimensions: vec![rhs_contracting],
        lhs_batch_dimensions: vec![0, 1],
        rhs_batch_dimensions: vec![0, 1],
    };
    cx.builder.dot(lhs, rhs, numbers, dims)
}

/// `attention(query [b, h, q, d], key [b, h, k, d], value [b, h, k, v], mask, bias, options)`.
///
/// Attention of bf16 or f16 tensors is computed in f32 (both products, the softmax and its sum)
/// and rounded once into the output, as the host executor does (`executor/host/widen.rs`).
pub(crate) fn attention(cx: &mut Lowering, ir: &AttentionOpIr) -> Lowered {
    let dtype = match ir.query.dtype {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    };
    let (lowest, smallest_positive) = limits(dtype)?;
    let compute = element_type(dtype)?;
    let query = cx.get(&ir.query)?;
    let key = cx.get(&ir.key)?;
    let value = cx.get(&ir.value)?;
    let query = cx.builder.convert(&query, compute);
    let key = cx.builder.convert(&key, compute);
    let value = cx.builder.convert(&value, compute);
    let [batch, heads, queries, depth] =
        [query.dims[0], query.dims[1], query.dims[2], query.dims[3]];
    let keys = key.dims[2];
    let score_dims = [batch, heads, queries, keys];

    let products = batched_dot(cx, &query, &key, 3, &score_dims);
    let scale = ir
        .options
        .scale
        .unwrap_or(ScalarIr::Float(1.0 / (depth as f64).sqrt()));
    let scale = cx.scalar_filled(scale, dtype, &score_dims)?;
    let mut scores = cx.builder.binary("multiply", &products, &scale);
    if let Some(softcap) = ir.options.softcap {
        let cap = cx.scalar_filled(softcap, dtype, &score_dims)?;
        let scaled = cx.builder.binary("divide", &scores, &cap);
        let squashed = cx.builder.unary("tanh", &scaled);
        scores = cx.builder.binary("multiply", &squashed, &cap);
    }
    let negative_infinity = cx
        .builder
        .filled(query.element_type, f64::NEG_INFINITY, &score_dims);
    if let Some(mask) = &ir.mask {
        let mask = cx.get(mask)?;
        let mask = cx.builder.broadcast_to(&mask, &score_dims);
        scores = cx.builder.select(&mask, &negative_infinity, &scores);
    }
    if ir.options.is_causal {
        // Key j is hidden from query i when j > i + (keys - queries).
        let grid = [queries, keys];
        let rows = cx.builder.iota(PrimitiveType::S64, &grid, 0);
        let offset = cx
            .builder
            .filled(PrimitiveType::S64, (keys - queries) as f64, &grid);
        let shifted = cx.builder.binary("add", &rows, &offset);
        let columns = cx.builder.iota(PrimitiveType::S64, &grid, 1);
        let future = cx.builder.compare(Direction::Lt, &shifted, &columns);
        let future = cx.builder.broadcast(&future, &score_dims, &[2, 3]);
        scores = cx.builder.select(&future, &negative_infinity, &scores);
    }
    if let Some(bias) = &ir.attn_bias {
        let bias = cx.get(bias)?;
        let bias = cx.builder.convert(&bias, compute);
        let bias = cx.builder.broadcast_to(&bias, &score_dims);
        scores = cx.builder.binary("add", &scores, &bias);
    }

    let builder = &mut cx.builder;
    let row_dims = [batch, heads, queries];
    let maximum = builder.reduce(&scores, f64::NEG_INFINITY, &[3], Combiner::Maximum);
    let floor = builder.filled(query.element_type, lowest, &row_dims);
    let maximum = builder.binary("maximum", &maximum, &floor);
    let maximum = builder.broadcast(&maximum, &score_dims, &[0, 1, 2]);
    let shifted = builder.binary("subtract", &scores, &maximum);
    let numerator = builder.unary("exponential", &shifted);
    let sum = builder.reduce(&numerator, 0.0, &[3], Combiner::Add);
    let tiny = builder.filled(query.element_type, smallest_positive, &row_dims);
    let sum = builder.binary("maximum", &sum, &tiny);
    let sum = builder.broadcast(&sum, &score_dims, &[0, 1, 2]);
    let weights = builder.binary("divide", &numerator, &sum);

    let out = batched_dot(cx, &weights, &value, 2, &dims(&ir.out));
    cx.set(&ir.out, out)
}
