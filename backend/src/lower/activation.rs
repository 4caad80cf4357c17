//! Burn's activation group (`OperationIr::Activation`, new in Burn 0.22), computed as the host's
//! burn-flex computes it: half-precision floats in f32 and rounded once, NaN kept by `relu`, the
//! exact (erf) derivative of GELU, sigmoids that never take the exponential of a large positive
//! number.

use burn_ir::{ActivationOperationIr, BinaryOpIr, DimOpIr, HardSigmoidOpIr, TensorIr};

use super::builder::{Builder, Direction, Value};
use super::context::{Lowered, Lowering, compute_type, dims};
use super::reduce::{self, Reduction};

/// Lowers one operation of the activation group.
pub(crate) fn activation(cx: &mut Lowering, op: &ActivationOperationIr) -> Lowered {
    use ActivationOperationIr as Op;
    match op {
        Op::Relu(ir) => unary(cx, &ir.input, &ir.out, relu),
        Op::ReluBackward(ir) => binary(cx, ir, relu_backward),
        Op::LeakyRelu(ir) => {
            let slope = ir.rhs.elem::<f64>();
            unary(cx, &ir.lhs, &ir.out, |builder, x| {
                negative_scaled(builder, x, |builder, x| scale(builder, x, slope))
            })
        }
        Op::PRelu(ir) => binary(cx, ir, |builder, x, alpha| {
            negative_scaled(builder, x, |builder, x| {
                builder.binary("multiply", alpha, x)
            })
        }),
        Op::Gelu(ir) => unary(cx, &ir.input, &ir.out, gelu),
        Op::GeluBackward(ir) => binary(cx, ir, gelu_backward),
        Op::Sigmoid(ir) => unary(cx, &ir.input, &ir.out, sigmoid),
        Op::SigmoidBackward(ir) => binary(cx, ir, sigmoid_backward),
        Op::HardSigmoid(ir) => hard_sigmoid(cx, ir),
        Op::LogSigmoid(ir) => unary(cx, &ir.input, &ir.out, log_sigmoid),
        Op::LogSigmoidBackward(ir) => binary(cx, ir, |builder, x, grad| {
            let negated = builder.unary("negate", x);
            let derivative = sigmoid(builder, &negated);
            builder.binary("multiply", grad, &derivative)
        }),
        Op::Softmax(ir) => softmax(cx, ir, Softmax::Plain),
        Op::LogSoftmax(ir) => softmax(cx, ir, Softmax::Log),
        Op::Softmin(ir) => softmax(cx, ir, Softmax::Min),
    }
}

/// `out = function(input)`, computed in [`compute_type`] and rounded once.
fn unary(
    cx: &mut Lowering,
    input: &TensorIr,
    out: &TensorIr,
    function: impl FnOnce(&mut Builder, &Value) -> Value,
) -> Lowered {
    let input = cx.get(input)?;
    let stored = input.element_type;
    let wide = cx.builder.convert(&input, compute_type(stored));
    let result = function(&mut cx.builder, &wide);
    let result = cx.builder.convert(&result, stored);
    cx.set(out, result)
}

/// `out = function(lhs, rhs)` with both broadcast to the output's shape, computed in
/// [`compute_type`] and rounded once.
fn binary(
    cx: &mut Lowering,
    ir: &BinaryOpIr,
    function: impl FnOnce(&mut Builder, &Value, &Value) -> Value,
) -> Lowered {
    let out_dims = dims(&ir.out);
    let lhs = cx.get(&ir.lhs)?;
    let rhs = cx.get(&ir.rhs)?;
    let stored = lhs.element_type;
    let wide = compute_type(stored);
    let builder = &mut cx.builder;
    let lhs = builder.convert(&lhs, wide);
    let rhs = builder.convert(&rhs, wide);
    let lhs = builder.broadcast_to(&lhs, &out_dims);
    let rhs = builder.broadcast_to(&rhs, &out_dims);
    let result = function(builder, &lhs, &rhs);
    let result = cx.builder.convert(&result, stored);
    cx.set(&ir.out, result)
}

fn filled_like(builder: &mut Builder, like: &Value, value: f64) -> Value {
    builder.filled(like.element_type, value, &like.dims)
}

fn scale(builder: &mut Builder, x: &Value, factor: f64) -> Value {
    let factor = filled_like(builder, x, factor);
    builder.binary("multiply", x, &factor)
}

fn add_constant(builder: &mut Builder, x: &Value, constant: f64) -> Value {
    let constant = filled_like(builder, x, constant);
    builder.binary("add", x, &constant)
}

/// `x` where `x > 0` or `x` is NaN, else 0.
fn relu(builder: &mut Builder, x: &Value) -> Value {
    let zero = filled_like(builder, x, 0.0);
    // `x <= 0` is false for NaN, which therefore passes through.
    let clipped = builder.compare(Direction::Le, x, &zero);
    builder.select(&clipped, &zero, x)
}

/// The gradient where the output is positive (or NaN), else 0.
fn relu_backward(builder: &mut Builder, output: &Value, grad: &Value) -> Value {
    let zero = filled_like(builder, output, 0.0);
    let clipped = builder.compare(Direction::Le, output, &zero);
    builder.select(&clipped, &zero, grad)
}

/// `x` where `x >= 0`, else `negative(x)`.
fn negative_scaled(
    builder: &mut Builder,
    x: &Value,
    negative: impl FnOnce(&mut Builder, &Value) -> Value,
) -> Value {
    let zero = filled_like(builder, x, 0.0);
    let non_negative = builder.compare(Direction::Ge, x, &zero);
    let scaled = negative(builder, x);
    builder.select(&non_negative, x, &scaled)
}

/// The normal distribution's cumulative distribution function, `(1 + erf(x / √2)) / 2`.
fn normal_cdf(builder: &mut Builder, x: &Value) -> Value {
    let scaled = scale(builder, x, std::f64::consts::FRAC_1_SQRT_2);
    let erf = builder.unary("erf", &scaled);
    let shifted = add_constant(builder, &erf, 1.0);
    scale(builder, &shifted, 0.5)
}

/// `x · Φ(x)`.
fn gelu(builder: &mut Builder, x: &Value) -> Value {
    let cdf = normal_cdf(builder, x);
    builder.binary("multiply", x, &cdf)
}

/// `grad · (Φ(x) + x · φ(x))`, φ the normal density `exp(-x²/2) / √(2π)`.
fn gelu_backward(builder: &mut Builder, x: &Value, grad: &Value) -> Value {
    let cdf = normal_cdf(builder, x);
    let square = builder.binary("multiply", x, x);
    let exponent = scale(builder, &square, -0.5);
    let exponential = builder.unary("exponential", &exponent);
    let density = scale(
        builder,
        &exponential,
        1.0 / (2.0 * std::f64::consts::PI).sqrt(),
    );
    let weighted = builder.binary("multiply", x, &density);
    let derivative = builder.binary("add", &cdf, &weighted);
    builder.binary("multiply", grad, &derivative)
}

/// `1 / (1 + e^-x)` for `x >= 0`, `e^x / (1 + e^x)` otherwise.
fn sigmoid(builder: &mut Builder, x: &Value) -> Value {
    let magnitude = builder.unary("abs", x);
    let negated = builder.unary("negate", &magnitude);
    let small = builder.unary("exponential", &negated);
    let denominator = add_constant(builder, &small, 1.0);
    let one = filled_like(builder, x, 1.0);
    let positive = builder.binary("divide", &one, &denominator);
    let negative = builder.binary("divide", &small, &denominator);
    let zero = filled_like(builder, x, 0.0);
    let non_negative = builder.compare(Direction::Ge, x, &zero);
    builder.select(&non_negative, &positive, &negative)
}

/// `grad · s · (1 - s)` from the sigmoid's output `s`.
fn sigmoid_backward(builder: &mut Builder, output: &Value, grad: &Value) -> Value {
    let one = filled_like(builder, output, 1.0);
    let complement = builder.binary("subtract", &one, output);
    let product = builder.binary("multiply", output, &complement);
    builder.binary("multiply", grad, &product)
}

/// `min(x, 0) - log(1 + e^-|x|)`: `-log(1 + e^-x)` for `x >= 0`, `x - log(1 + e^x)` otherwise.
fn log_sigmoid(builder: &mut Builder, x: &Value) -> Value {
    let zero = filled_like(builder, x, 0.0);
    let lower = builder.binary("minimum", x, &zero);
    let magnitude = builder.unary("abs", x);
    let negated = builder.unary("negate", &magnitude);
    let small = builder.unary("exponential", &negated);
    let softplus = builder.unary("log-plus-one", &small);
    builder.binary("subtract", &lower, &softplus)
}

/// `clamp(alpha · x + beta, 0, 1)`.
fn hard_sigmoid(cx: &mut Lowering, ir: &HardSigmoidOpIr) -> Lowered {
    let (alpha, beta) = (ir.alpha.elem::<f64>(), ir.beta.elem::<f64>());
    unary(cx, &ir.tensor, &ir.out, |builder, x| {
        let scaled = scale(builder, x, alpha);
        let shifted = add_constant(builder, &scaled, beta);
        let zero = filled_like(builder, x, 0.0);
        let one = filled_like(builder, x, 1.0);
        let upper = builder.binary("minimum", &shifted, &one);
        builder.binary("maximum", &upper, &zero)
    })
}

/// Which member of the softmax family.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Softmax {
    /// `e^(x - max) / Σ e^(x - max)`.
    Plain,
    /// `(x - max) - log Σ e^(x - max)`.
    Log,
    /// The softmax of `-x`.
    Min,
}

/// A softmax along `ir.axis`, shifted by the maximum along it.
fn softmax(cx: &mut Lowering, ir: &DimOpIr, kind: Softmax) -> Lowered {
    let input = cx.get(&ir.input)?;
    let stored = input.element_type;
    let mut x = cx.builder.convert(&input, compute_type(stored));
    if kind == Softmax::Min {
        x = cx.builder.unary("negate", &x);
    }
    let kept: Vec<i64> = (0..x.rank())
        .filter(|&axis| axis != ir.axis)
        .map(|axis| axis as i64)
        .collect();
    let maximum = reduce::reduce(cx, Reduction::Max, &x, &[ir.axis]);
    let maximum = cx.builder.broadcast(&maximum, &x.dims, &kept);
    let shifted = cx.builder.binary("subtract", &x, &maximum);
    let exponential = cx.builder.unary("exponential", &shifted);
    let sum = reduce::reduce(cx, Reduction::Sum, &exponential, &[ir.axis]);
    let sum = cx.builder.broadcast(&sum, &x.dims, &kept);
    let result = match kind {
        Softmax::Plain | Softmax::Min => cx.builder.binary("divide", &exponential, &sum),
        Softmax::Log => {
            let log_sum = cx.builder.unary("log", &sum);
            cx.builder.binary("subtract", &shifted, &log_sum)
        }
    };
    let result = cx.builder.convert(&result, stored);
    cx.set(&ir.out, result)
}
