//! Normalisation modules recorded whole since Burn 0.22: layer norm over the last dimension and
//! batch norm with given statistics (inference), as burn-backend's reference computes them
//! (biased variance, `sqrt(variance + epsilon)`), half-precision floats in f32.

use burn_ir::{BatchNormOpIr, LayerNormOpIr, TensorIr};

use super::builder::Value;
use super::context::{Lowered, Lowering, compute_type};
use super::reduce::{self, Reduction};
use crate::hlo::PrimitiveType;

/// A per-feature vector `tensor` (of `along`'s size) in `compute`, broadcast to `dims` along
/// dimension `along`.
fn per_feature(
    cx: &mut Lowering,
    tensor: &TensorIr,
    compute: PrimitiveType,
    dims: &[i64],
    along: usize,
) -> Lowered<Value> {
    let value = cx.get(tensor)?;
    let value = cx.builder.convert(&value, compute);
    let value = cx.builder.reshape(&value, &[dims[along]]);
    Ok(cx.builder.broadcast(&value, dims, &[along as i64]))
}

/// `(x - mean) / sqrt(var + eps) · gamma (+ beta)` over the last dimension.
pub(crate) fn layer_norm(cx: &mut Lowering, ir: &LayerNormOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let stored = input.element_type;
    let compute = compute_type(stored);
    let x = cx.builder.convert(&input, compute);
    let dims = x.dims.clone();
    let last = x.rank() - 1;
    let kept: Vec<i64> = (0..last as i64).collect();
    let mean = reduce::reduce(cx, Reduction::Mean, &x, &[last]);
    let mean = cx.builder.broadcast(&mean, &dims, &kept);
    let centered = cx.builder.binary("subtract", &x, &mean);
    let square = cx.builder.binary("multiply", &centered, &centered);
    let variance = reduce::reduce(cx, Reduction::Mean, &square, &[last]);
    let variance = cx.builder.broadcast(&variance, &dims, &kept);
    let epsilon = cx.builder.filled(compute, ir.epsilon.elem::<f64>(), &dims);
    let shifted = cx.builder.binary("add", &variance, &epsilon);
    let deviation = cx.builder.unary("sqrt", &shifted);
    let normalized = cx.builder.binary("divide", &centered, &deviation);
    let gamma = per_feature(cx, &ir.gamma, compute, &dims, last)?;
    let mut value = cx.builder.binary("multiply", &normalized, &gamma);
    if let Some(beta) = &ir.beta {
        let beta = per_feature(cx, beta, compute, &dims, last)?;
        value = cx.builder.binary("add", &value, &beta);
    }
    let value = cx.builder.convert(&value, stored);
    cx.set(&ir.out, value)
}

/// `(x - mean) / sqrt(variance + eps) · gamma + beta` per channel (dimension 1).
pub(crate) fn batch_norm(cx: &mut Lowering, ir: &BatchNormOpIr) -> Lowered {
    let input = cx.get(&ir.x)?;
    let stored = input.element_type;
    let compute = compute_type(stored);
    let x = cx.builder.convert(&input, compute);
    let dims = x.dims.clone();
    let mean = per_feature(cx, &ir.mean, compute, &dims, 1)?;
    let variance = per_feature(cx, &ir.variance, compute, &dims, 1)?;
    let gamma = per_feature(cx, &ir.gamma, compute, &dims, 1)?;
    let beta = per_feature(cx, &ir.beta, compute, &dims, 1)?;
    let epsilon = cx.builder.filled(compute, ir.epsilon.elem::<f64>(), &dims);
    let shifted = cx.builder.binary("add", &variance, &epsilon);
    let deviation = cx.builder.unary("sqrt", &shifted);
    let centered = cx.builder.binary("subtract", &x, &mean);
    let normalized = cx.builder.binary("divide", &centered, &deviation);
    let scaled = cx.builder.binary("multiply", &normalized, &gamma);
    let value = cx.builder.binary("add", &scaled, &beta);
    let value = cx.builder.convert(&value, stored);
    cx.set(&ir.out, value)
}
