//! Elementwise operations: arithmetic with broadcasting, scalar operands, comparisons,
//! transcendental functions, bitwise and boolean logic, casts, and the cross product of
//! 3-vectors.

use burn_backend::DType;
use burn_ir::{BinaryOpIr, ClampOpIr, CrossOpIr, ScalarOpIr, TensorIr, UnaryOpIr};

use super::OperatorRules;
use super::builder::{Direction, Value};
use super::context::{Lowered, Lowering, compute_type, dims, element_type};
use crate::hlo::PrimitiveType;

/// Arithmetic on two tensors, as Burn defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arithmetic {
    Add,
    Sub,
    Mul,
    Div,
    /// Python-style remainder: the sign of the divisor.
    Rem,
    Pow,
    /// `atan2(lhs, rhs)`.
    Atan2,
    BitAnd,
    BitOr,
    BitXor,
    ShiftLeft,
    ShiftRight,
    And,
    Or,
}

impl Arithmetic {
    fn opcode(self) -> &'static str {
        match self {
            Arithmetic::Add => "add",
            Arithmetic::Sub => "subtract",
            Arithmetic::Mul => "multiply",
            Arithmetic::Div => "divide",
            Arithmetic::Rem => "remainder",
            Arithmetic::Pow => "power",
            Arithmetic::Atan2 => "atan2",
            Arithmetic::BitAnd | Arithmetic::And => "and",
            Arithmetic::BitOr | Arithmetic::Or => "or",
            Arithmetic::BitXor => "xor",
            Arithmetic::ShiftLeft => "shift-left",
            // Signed types; unsigned ones shift logically (see `apply`).
            Arithmetic::ShiftRight => "shift-right-arithmetic",
        }
    }
}

/// `op(lhs, rhs)` on values already of one shape and type.
fn apply(cx: &mut Lowering, op: Arithmetic, lhs: &Value, rhs: &Value) -> Value {
    let builder = &mut cx.builder;
    match op {
        Arithmetic::Rem => {
            // ((a % b) + b) % b, as burn-flex computes it.
            let remainder = builder.binary("remainder", lhs, rhs);
            let shifted = builder.binary("add", &remainder, rhs);
            builder.binary("remainder", &shifted, rhs)
        }
        Arithmetic::Or => {
            // `a or b` as `not (not a and not b)`: Neuron's operator list has LogicalAnd and
            // LogicalNot but no LogicalOr.
            let neither_lhs = builder.unary("not", lhs);
            let neither_rhs = builder.unary("not", rhs);
            let neither = builder.binary("and", &neither_lhs, &neither_rhs);
            builder.unary("not", &neither)
        }
        Arithmetic::ShiftRight
            if matches!(
                lhs.element_type,
                PrimitiveType::U8 | PrimitiveType::U16 | PrimitiveType::U32 | PrimitiveType::U64
            ) =>
        {
            // Unsigned values shift in zeros, as Rust's `>>` on them.
            builder.binary("shift-right-logical", lhs, rhs)
        }
        _ => builder.binary(op.opcode(), lhs, rhs),
    }
}

/// Converts both operands to `element_type` and broadcasts them to `out_dims`.
fn operands(
    cx: &mut Lowering,
    lhs: &Value,
    rhs: &Value,
    element_type: PrimitiveType,
    out_dims: &[i64],
) -> (Value, Value) {
    let lhs = cx.builder.convert(lhs, element_type);
    let rhs = cx.builder.convert(rhs, element_type);
    let lhs = cx.builder.broadcast_to(&lhs, out_dims);
    let rhs = cx.builder.broadcast_to(&rhs, out_dims);
    (lhs, rhs)
}

/// `lhs op rhs` with broadcasting, computed in the type of `lhs`.
pub(crate) fn binary(cx: &mut Lowering, op: Arithmetic, ir: &BinaryOpIr) -> Lowered {
    let lhs = cx.get(&ir.lhs)?;
    let rhs = cx.get(&ir.rhs)?;
    let (lhs, rhs) = operands(cx, &lhs, &rhs, lhs.element_type, &dims(&ir.out));
    let value = apply(cx, op, &lhs, &rhs);
    cx.set(&ir.out, value)
}

/// `lhs op scalar`, the scalar converted to the dtype of `lhs`.
pub(crate) fn scalar(cx: &mut Lowering, op: Arithmetic, ir: &ScalarOpIr) -> Lowered {
    let lhs = cx.get(&ir.lhs)?;
    let rhs = cx.scalar_filled(ir.rhs, ir.lhs.dtype, &lhs.dims)?;
    let value = apply(cx, op, &lhs, &rhs);
    cx.set(&ir.out, value)
}

/// A comparison of two tensors with broadcasting.
pub(crate) fn compare(cx: &mut Lowering, direction: Direction, ir: &BinaryOpIr) -> Lowered {
    let lhs = cx.get(&ir.lhs)?;
    let rhs = cx.get(&ir.rhs)?;
    let (lhs, rhs) = operands(cx, &lhs, &rhs, lhs.element_type, &dims(&ir.out));
    let value = cx.builder.compare(direction, &lhs, &rhs);
    cx.set(&ir.out, value)
}

/// A comparison with a scalar.
pub(crate) fn compare_scalar(cx: &mut Lowering, direction: Direction, ir: &ScalarOpIr) -> Lowered {
    let lhs = cx.get(&ir.lhs)?;
    let rhs = cx.scalar_filled(ir.rhs, ir.lhs.dtype, &lhs.dims)?;
    let value = cx.builder.compare(direction, &lhs, &rhs);
    cx.set(&ir.out, value)
}

/// Elementwise functions of one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Function {
    Abs,
    Exp,
    Log,
    Log1p,
    Erf,
    Sqrt,
    Cos,
    Sin,
    Tan,
    Tanh,
    Cosh,
    Sinh,
    Round,
    Floor,
    Ceil,
    Trunc,
    Recip,
    IsNan,
    IsInf,
    ArcCos,
    ArcSin,
    ArcTan,
    ArcCosh,
    ArcSinh,
    ArcTanh,
    Not,
    BitNot,
    Neg,
    Sign,
}

/// `function(input)`.
pub(crate) fn unary(cx: &mut Lowering, function: Function, ir: &UnaryOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let builder = &mut cx.builder;
    let one = |builder: &mut super::builder::Builder| {
        builder.filled(input.element_type, 1.0, &input.dims)
    };
    let value = match function {
        Function::Abs => builder.unary("abs", &input),
        Function::Exp => builder.unary("exponential", &input),
        Function::Log => builder.unary("log", &input),
        Function::Log1p => builder.unary("log-plus-one", &input),
        Function::Erf => builder.unary("erf", &input),
        Function::Sqrt => builder.unary("sqrt", &input),
        Function::Cos => builder.unary("cosine", &input),
        Function::Sin => builder.unary("sine", &input),
        Function::Tan => builder.unary("tan", &input),
        Function::Tanh => builder.unary("tanh", &input),
        Function::Cosh | Function::Sinh => {
            // (e^x ± e^-x) / 2
            let positive = builder.unary("exponential", &input);
            let negated = builder.unary("negate", &input);
            let negative = builder.unary("exponential", &negated);
            let opcode = if function == Function::Cosh {
                "add"
            } else {
                "subtract"
            };
            let sum = builder.binary(opcode, &positive, &negative);
            let half = builder.filled(input.element_type, 0.5, &input.dims);
            builder.binary("multiply", &sum, &half)
        }
        Function::Round => builder.unary("round-nearest-even", &input),
        Function::Floor => builder.unary("floor", &input),
        Function::Ceil => builder.unary("ceil", &input),
        Function::Trunc => {
            let zero = builder.filled(input.element_type, 0.0, &input.dims);
            let negative = builder.compare(Direction::Lt, &input, &zero);
            let up = builder.unary("ceil", &input);
            let down = builder.unary("floor", &input);
            builder.select(&negative, &up, &down)
        }
        Function::Recip => {
            let one = one(builder);
            builder.binary("divide", &one, &input)
        }
        Function::IsNan => builder.compare(Direction::Ne, &input, &input),
        Function::IsInf => {
            let magnitude = builder.unary("abs", &input);
            let infinity = builder.filled(input.element_type, f64::INFINITY, &input.dims);
            builder.compare(Direction::Eq, &magnitude, &infinity)
        }
        Function::ArcCos | Function::ArcSin => {
            // acos x = atan2(sqrt(1 - x²), x), asin x = atan2(x, sqrt(1 - x²))
            let one = one(builder);
            let square = builder.binary("multiply", &input, &input);
            let rest = builder.binary("subtract", &one, &square);
            let root = builder.unary("sqrt", &rest);
            if function == Function::ArcCos {
                builder.binary("atan2", &root, &input)
            } else {
                builder.binary("atan2", &input, &root)
            }
        }
        Function::ArcTan => {
            let one = one(builder);
            builder.binary("atan2", &input, &one)
        }
        Function::ArcCosh | Function::ArcSinh => {
            // acosh x = ln(x + sqrt(x² - 1)), asinh x = ln(x + sqrt(x² + 1))
            let one = one(builder);
            let square = builder.binary("multiply", &input, &input);
            let opcode = if function == Function::ArcCosh {
                "subtract"
            } else {
                "add"
            };
            let shifted = builder.binary(opcode, &square, &one);
            let root = builder.unary("sqrt", &shifted);
            let sum = builder.binary("add", &input, &root);
            builder.unary("log", &sum)
        }
        Function::ArcTanh => {
            // atanh x = ln((1 + x) / (1 - x)) / 2
            let one = one(builder);
            let numerator = builder.binary("add", &one, &input);
            let denominator = builder.binary("subtract", &one, &input);
            let ratio = builder.binary("divide", &numerator, &denominator);
            let log = builder.unary("log", &ratio);
            let half = builder.filled(input.element_type, 0.5, &input.dims);
            builder.binary("multiply", &log, &half)
        }
        Function::Not | Function::BitNot => builder.unary("not", &input),
        Function::Neg => builder.unary("negate", &input),
        Function::Sign => {
            // HLO's `sign` keeps the sign of a zero (-0 gives -0); Burn's sign of any zero is +0.
            // Integers have one zero, and `sign` alone is theirs.
            let sign = builder.unary("sign", &input);
            if ir.input.dtype.is_float() {
                let zero = builder.filled(input.element_type, 0.0, &input.dims);
                let is_zero = builder.compare(Direction::Eq, &input, &zero);
                builder.select(&is_zero, &zero, &sign)
            } else {
                sign
            }
        }
    };
    cx.set(&ir.out, value)
}

/// `clamp(tensor, min, max)` with scalar bounds.
pub(crate) fn clamp(cx: &mut Lowering, ir: &ClampOpIr) -> Lowered {
    let tensor = cx.get(&ir.tensor)?;
    let min = cx.scalar_filled(ir.min, ir.tensor.dtype, &tensor.dims)?;
    let max = cx.scalar_filled(ir.max, ir.tensor.dtype, &tensor.dims)?;
    let upper = cx.builder.binary("minimum", &tensor, &max);
    let value = cx.builder.binary("maximum", &upper, &min);
    cx.set(&ir.out, value)
}

/// `max(tensor, bound)` (`lower` true: `clamp_min`) or `min(tensor, bound)` (`clamp_max`).
pub(crate) fn clamp_bound(cx: &mut Lowering, ir: &ScalarOpIr, lower: bool) -> Lowered {
    let tensor = cx.get(&ir.lhs)?;
    let bound = cx.scalar_filled(ir.rhs, ir.lhs.dtype, &tensor.dims)?;
    let opcode = if lower { "maximum" } else { "minimum" };
    let value = cx.builder.binary(opcode, &tensor, &bound);
    cx.set(&ir.out, value)
}

/// `sqrt(lhs² + rhs²)` without overflow or underflow in between, as `f32::hypot`: the larger
/// magnitude `m` times `sqrt(1 + (s / m)²)`, `s` the smaller (0 when both are 0); half-precision
/// floats in f32.
pub(crate) fn hypot(cx: &mut Lowering, ir: &BinaryOpIr) -> Lowered {
    let out_dims = dims(&ir.out);
    let lhs = cx.get(&ir.lhs)?;
    let rhs = cx.get(&ir.rhs)?;
    let stored = lhs.element_type;
    let wide = compute_type(stored);
    let (lhs, rhs) = operands(cx, &lhs, &rhs, wide, &out_dims);
    let builder = &mut cx.builder;
    let lhs = builder.unary("abs", &lhs);
    let rhs = builder.unary("abs", &rhs);
    let larger = builder.binary("maximum", &lhs, &rhs);
    let smaller = builder.binary("minimum", &lhs, &rhs);
    let zero = builder.filled(wide, 0.0, &out_dims);
    let one = builder.filled(wide, 1.0, &out_dims);
    let both_zero = builder.compare(Direction::Eq, &larger, &zero);
    let divisor = builder.select(&both_zero, &one, &larger);
    let ratio = builder.binary("divide", &smaller, &divisor);
    let square = builder.binary("multiply", &ratio, &ratio);
    let sum = builder.binary("add", &one, &square);
    let root = builder.unary("sqrt", &sum);
    let value = builder.binary("multiply", &larger, &root);
    // Infinity wins over NaN, as in `f32::hypot`.
    let infinity = builder.filled(wide, f64::INFINITY, &out_dims);
    let infinite = builder.compare(Direction::Eq, &larger, &infinity);
    let value = builder.select(&infinite, &infinity, &value);
    let value = cx.builder.convert(&value, stored);
    cx.set(&ir.out, value)
}

/// A change of dtype (float precision, float to int, int to float, bool to number).
pub(crate) fn cast(cx: &mut Lowering, input: &TensorIr, out: &TensorIr) -> Lowered {
    let value = cx.get(input)?;
    let target = element_type(out.dtype)?;
    let converted = if target == PrimitiveType::Pred {
        // Numbers become booleans by comparison with zero, not by truncation.
        let zero = cx.builder.filled(value.element_type, 0.0, &value.dims);
        cx.builder.compare(Direction::Ne, &value, &zero)
    } else {
        cx.builder.convert(&value, target)
    };
    cx.set(out, converted)
}

/// `lhs ^ rhs` for an integer exponent tensor (converted to the type of `lhs`).
pub(crate) fn power_int(cx: &mut Lowering, ir: &BinaryOpIr) -> Lowered {
    binary(cx, Arithmetic::Pow, ir)
}

/// `lhs ^ exponent` with the exponent known when lowering, not a hoisted parameter (exponents,
/// RMSNorm's square or a square root's gradient, do not change from step to step). `power` with
/// a constant exponent, except under Neuron's rules (Pow wants a compile-time integer exponent)
/// for a fractional exponent of a float tensor: `sqrt` for ½, `rsqrt` for −½, else
/// `exp(e · log x)` computed in f32 and rounded once.
pub(crate) fn power_scalar(cx: &mut Lowering, ir: &ScalarOpIr, _dtype: DType) -> Lowered {
    let lhs = cx.get(&ir.lhs)?;
    let exponent = ir.rhs.elem::<f64>();
    let float = matches!(
        lhs.element_type,
        PrimitiveType::F16 | PrimitiveType::Bf16 | PrimitiveType::F32 | PrimitiveType::F64
    );
    let rewrite = cx.options.rules == OperatorRules::Neuron
        && float
        && exponent.is_finite()
        && exponent.fract() != 0.0;
    let builder = &mut cx.builder;
    let value = match exponent {
        0.5 if rewrite => builder.unary("sqrt", &lhs),
        -0.5 if rewrite => builder.unary("rsqrt", &lhs),
        e if rewrite => {
            let wide = match lhs.element_type {
                PrimitiveType::F64 => PrimitiveType::F64,
                _ => PrimitiveType::F32,
            };
            let x = builder.convert(&lhs, wide);
            let log = builder.unary("log", &x);
            let factor = builder.filled(wide, e, &lhs.dims);
            let scaled = builder.binary("multiply", &log, &factor);
            let power = builder.unary("exponential", &scaled);
            builder.convert(&power, lhs.element_type)
        }
        e => {
            let exponent = builder.filled(lhs.element_type, e, &lhs.dims);
            builder.binary("power", &lhs, &exponent)
        }
    };
    cx.set(&ir.out, value)
}

/// `cross(lhs, rhs, dim)`: the cross product of the 3-vectors along `dim` (broadcast).
pub(crate) fn cross(cx: &mut Lowering, ir: &CrossOpIr) -> Lowered {
    let out_dims = dims(&ir.out);
    let lhs = cx.get(&ir.lhs)?;
    let rhs = cx.get(&ir.rhs)?;
    let lhs = cx.builder.broadcast_to(&lhs, &out_dims);
    let rhs = cx.builder.broadcast_to(&rhs, &out_dims);
    let rhs = cx.builder.convert(&rhs, lhs.element_type);
    let mut component = |value: &Value, index: i64| {
        let mut start = vec![0; out_dims.len()];
        let mut limit = out_dims.clone();
        start[ir.dim] = index;
        limit[ir.dim] = index + 1;
        cx.builder
            .slice(value, &start, &limit, &vec![1; out_dims.len()])
    };
    let a = [0, 1, 2].map(|index| component(&lhs, index));
    let b = [0, 1, 2].map(|index| component(&rhs, index));
    let parts: Vec<Value> = [(1, 2), (2, 0), (0, 1)]
        .iter()
        .map(|&(i, j)| {
            let forward = cx.builder.binary("multiply", &a[i], &b[j]);
            let backward = cx.builder.binary("multiply", &a[j], &b[i]);
            cx.builder.binary("subtract", &forward, &backward)
        })
        .collect();
    let value = cx.builder.concatenate(&parts, ir.dim);
    cx.set(&ir.out, value)
}
