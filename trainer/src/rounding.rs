//! Stochastic rounding of f32 values to bf16.

use burn::tensor::{DType, Distribution, Tensor};

/// Smallest normal bf16 (and f32) magnitude; below it bf16 values are spaced like at it.
const MIN_NORMAL: f32 = f32::MIN_POSITIVE;
/// bf16 keeps 7 explicit mantissa bits: neighbours in `[2^e, 2^(e+1))` are `2^(e-7)` apart.
const MANTISSA_BITS: i32 = 7;

/// Rounds every element of an f32 tensor to one of its two neighbouring bf16 values, the upper
/// one with probability equal to the distance from the lower one in units of their spacing, so
/// that the rounding is unbiased: `E[round(x)] = x`. Randomness comes from the device's seeded
/// generator (`Device::seed`). Returns a bf16 tensor.
pub fn stochastic_round_bf16<const D: usize>(values: Tensor<D>) -> Tensor<D> {
    let values = values.cast(DType::F32);
    // Below 2^-119 the spacing of bf16 values (2^-126 · 2^-7 at most) is an f32 subnormal,
    // which devices that flush subnormals (XLA's CPU client, Neuron) make 0: those values are
    // rounded to nearest.
    let tiny = values
        .clone()
        .abs()
        .lower_elem(MIN_NORMAL * 2f32.powi(MANTISSA_BITS));
    let magnitude = values.clone().abs().clamp_min(MIN_NORMAL);
    // Binade exponent: floor(log2 |x|), corrected where `ln` rounding puts it one off; within
    // the exponents of normal f32 values.
    let exponent = magnitude
        .clone()
        .log()
        .div_scalar(std::f32::consts::LN_2)
        .floor()
        .clamp(-126.0, 127.0);
    // 2^exponent as exp(exponent · ln 2), made exact by rounding to bf16: within a few f32 ulps
    // of a power of two, the nearest bf16 is that power (no `power` of a run-time exponent,
    // which the Neuron compiler refuses); clamped to the normal range, where `exp` fell just
    // below 2^-126 (a subnormal, flushed to 0 on some devices).
    let mut binade = exponent
        .mul_scalar(std::f32::consts::LN_2)
        .exp()
        .cast(DType::BF16)
        .cast(DType::F32)
        .clamp(MIN_NORMAL, 2f32.powi(127));
    let too_high = binade.clone().greater(magnitude.clone());
    binade = binade.clone().mask_where(too_high, binade.div_scalar(2.0));
    let too_low = binade.clone().mul_scalar(2.0).lower_equal(magnitude);
    binade = binade.clone().mask_where(too_low, binade.mul_scalar(2.0));
    let spacing = binade.mul_scalar(2f32.powi(-MANTISSA_BITS));

    let lower = values
        .clone()
        .div(spacing.clone())
        .floor()
        .mul(spacing.clone());
    let fraction = values.clone().sub(lower.clone()).div(spacing.clone());
    let draw = fraction.random_like(Distribution::Uniform(0.0, 1.0));
    let round_up = draw.lower(fraction);
    lower
        .clone()
        .mask_where(round_up, lower.add(spacing))
        .mask_where(tiny, values)
        .cast(DType::BF16)
}
