//! Random tensors drawn on the device: Threefry bits from a per-draw `u64[2]` state that the
//! executor passes at every run (so the same program draws new numbers each step), turned into
//! uniform, normal or Bernoulli values. The distribution's parameters are hoisted scalars.

use burn_backend::{DType, Distribution};
use burn_ir::{RandomOpIr, ScalarIr};

use super::builder::{Direction, Value};
use super::context::{Lowered, Lowering, dims, element_type, unsupported};
use crate::hlo::PrimitiveType;

/// Uniform `f32` values in `[0, 1)` of shape `dims`: 23 random mantissa bits under exponent 0.
fn unit_uniform(cx: &mut Lowering, dims: &[i64]) -> Value {
    let state = cx.random_state();
    let builder = &mut cx.builder;
    let bits = builder.random_bits(&state, dims);
    let nine = builder.filled(PrimitiveType::U32, 9.0, dims);
    let mantissa = builder.binary("shift-right-logical", &bits, &nine);
    let exponent = builder.filled(PrimitiveType::U32, f64::from(0x3f80_0000u32), dims);
    let one_to_two = builder.binary("or", &mantissa, &exponent);
    let one_to_two = builder.bitcast(&one_to_two, PrimitiveType::F32);
    let one = builder.filled(PrimitiveType::F32, 1.0, dims);
    builder.binary("subtract", &one_to_two, &one)
}

/// Integers of `element_type` uniform over the whole type, of shape `dims` (Burn's default
/// distribution for integers, `rand`'s standard uniform): 32 random bits per element, 64 from
/// two draws, fewer by truncation, reinterpreted as signed where the type is.
fn integer_bits(cx: &mut Lowering, dims: &[i64], element_type: PrimitiveType) -> Value {
    let state = cx.random_state();
    let builder = &mut cx.builder;
    let (unsigned, signed) = match element_type {
        PrimitiveType::S64 | PrimitiveType::U64 => (PrimitiveType::U64, PrimitiveType::S64),
        PrimitiveType::S16 | PrimitiveType::U16 => (PrimitiveType::U16, PrimitiveType::S16),
        PrimitiveType::S8 | PrimitiveType::U8 => (PrimitiveType::U8, PrimitiveType::S8),
        _ => (PrimitiveType::U32, PrimitiveType::S32),
    };
    let bits = if unsigned == PrimitiveType::U64 {
        let mut pair_dims = vec![2];
        pair_dims.extend(dims);
        let pair = builder.random_bits(&state, &pair_dims);
        let pair = builder.convert(&pair, PrimitiveType::U64);
        let rank = dims.len() + 1;
        let half = |builder: &mut super::builder::Builder, index: i64| {
            let mut start = vec![0; rank];
            let mut limit = pair_dims.clone();
            start[0] = index;
            limit[0] = index + 1;
            let part = builder.slice(&pair, &start, &limit, &vec![1; rank]);
            builder.reshape(&part, dims)
        };
        let high = half(builder, 0);
        let low = half(builder, 1);
        let thirty_two = builder.filled(PrimitiveType::U64, 32.0, dims);
        let high = builder.binary("shift-left", &high, &thirty_two);
        builder.binary("or", &high, &low)
    } else {
        let bits = builder.random_bits(&state, dims);
        builder.convert(&bits, unsigned)
    };
    if element_type == signed {
        builder.bitcast(&bits, signed)
    } else {
        bits
    }
}

fn parameter(cx: &mut Lowering, value: f64, dims: &[i64]) -> Lowered<Value> {
    cx.scalar_filled(ScalarIr::Float(value), DType::F32, dims)
}

/// `Float::Random` and `Numeric::IntRandom`.
pub(crate) fn random(cx: &mut Lowering, ir: &RandomOpIr, integer: bool) -> Lowered {
    if !cx.options.random_on_device {
        return unsupported("random numbers are drawn on the host for this executor");
    }
    let out_dims = dims(&ir.out);
    let value = match ir.distribution {
        Distribution::Default if integer => {
            integer_bits(cx, &out_dims, element_type(ir.out.dtype)?)
        }
        Distribution::Default => unit_uniform(cx, &out_dims),
        Distribution::Uniform(low, high) => {
            let unit = unit_uniform(cx, &out_dims);
            let low = parameter(cx, low, &out_dims)?;
            let high = parameter(cx, high, &out_dims)?;
            let builder = &mut cx.builder;
            let width = builder.binary("subtract", &high, &low);
            let scaled = builder.binary("multiply", &unit, &width);
            let shifted = builder.binary("add", &scaled, &low);
            if integer {
                builder.unary("floor", &shifted)
            } else {
                shifted
            }
        }
        Distribution::Bernoulli(probability) => {
            let unit = unit_uniform(cx, &out_dims);
            let probability = parameter(cx, probability, &out_dims)?;
            let hit = cx.builder.compare(Direction::Lt, &unit, &probability);
            cx.builder.convert(&hit, PrimitiveType::F32)
        }
        // Normal integers are normal floats truncated toward zero (the conversion below), as
        // `rand`'s normal samples cast to an integer type.
        Distribution::Normal(mean, std) => {
            // Box-Muller: sqrt(-2 ln u1) cos(2 pi u2), with u1 in (0, 1].
            let mut pair_dims = vec![2];
            pair_dims.extend(&out_dims);
            let pair = unit_uniform(cx, &pair_dims);
            let mean = parameter(cx, mean, &out_dims)?;
            let std = parameter(cx, std, &out_dims)?;
            let builder = &mut cx.builder;
            let rank = out_dims.len();
            let mut start = vec![0; rank + 1];
            let mut limit = pair_dims.clone();
            let stride = vec![1; rank + 1];
            limit[0] = 1;
            let first = builder.slice(&pair, &start, &limit, &stride);
            start[0] = 1;
            limit[0] = 2;
            let second = builder.slice(&pair, &start, &limit, &stride);
            let first = builder.reshape(&first, &out_dims);
            let second = builder.reshape(&second, &out_dims);
            let one = builder.filled(PrimitiveType::F32, 1.0, &out_dims);
            let positive = builder.binary("subtract", &one, &first);
            let log = builder.unary("log", &positive);
            let minus_two = builder.filled(PrimitiveType::F32, -2.0, &out_dims);
            let radius = builder.binary("multiply", &log, &minus_two);
            let radius = builder.unary("sqrt", &radius);
            let two_pi = builder.filled(PrimitiveType::F32, std::f64::consts::TAU, &out_dims);
            let angle = builder.binary("multiply", &second, &two_pi);
            let cosine = builder.unary("cosine", &angle);
            let standard = builder.binary("multiply", &radius, &cosine);
            let scaled = builder.binary("multiply", &standard, &std);
            builder.binary("add", &scaled, &mean)
        }
    };
    let value = cx.builder.convert(&value, element_type(ir.out.dtype)?);
    cx.set(&ir.out, value)
}
