//! Reductions: sum, mean, product, max, min (of values or magnitudes), over all dimensions or
//! one, and the indices of maxima and minima.

use burn_ir::{
    DimOpIr, ReduceDimOpIr, ReduceDimWithIndicesOpIr, ReduceDimsOpIr, ReduceOpIr, TensorIr,
};

use super::builder::{Combiner, Direction, Value};
use super::context::{Lowered, Lowering, dims, element_type};
use crate::hlo::PrimitiveType;

/// What a reduction computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reduction {
    Sum,
    Mean,
    Prod,
    Max,
    Min,
    MaxAbs,
}

/// The smallest value of a type (the identity of `maximum`).
fn lowest(element_type: PrimitiveType) -> f64 {
    match element_type {
        PrimitiveType::S8 => i8::MIN as f64,
        PrimitiveType::S16 => i16::MIN as f64,
        PrimitiveType::S32 => i32::MIN as f64,
        PrimitiveType::S64 => i64::MIN as f64,
        PrimitiveType::U8
        | PrimitiveType::U16
        | PrimitiveType::U32
        | PrimitiveType::U64
        | PrimitiveType::Pred => 0.0,
        _ => f64::NEG_INFINITY,
    }
}

/// The largest value of a type (the identity of `minimum`).
fn highest(element_type: PrimitiveType) -> f64 {
    match element_type {
        PrimitiveType::S8 => i8::MAX as f64,
        PrimitiveType::S16 => i16::MAX as f64,
        PrimitiveType::S32 => i32::MAX as f64,
        PrimitiveType::S64 => i64::MAX as f64,
        PrimitiveType::U8 => u8::MAX as f64,
        PrimitiveType::U16 => u16::MAX as f64,
        PrimitiveType::U32 => u32::MAX as f64,
        PrimitiveType::U64 => u64::MAX as f64,
        PrimitiveType::Pred => 1.0,
        _ => f64::INFINITY,
    }
}

/// Reduces `axes` of `input` (the result drops them).
pub(crate) fn reduce(
    cx: &mut Lowering,
    reduction: Reduction,
    input: &Value,
    axes: &[usize],
) -> Value {
    let narrow = matches!(input.element_type, PrimitiveType::Bf16 | PrimitiveType::F16);
    if narrow
        && matches!(
            reduction,
            Reduction::Sum | Reduction::Mean | Reduction::Prod
        )
    {
        // Accumulate half-precision floats in f32, as the host does.
        let wide = cx.builder.convert(input, PrimitiveType::F32);
        let reduced = reduce(cx, reduction, &wide, axes);
        return cx.builder.convert(&reduced, input.element_type);
    }
    let element_type = input.element_type;
    let builder = &mut cx.builder;
    match reduction {
        Reduction::Sum => builder.reduce(input, 0.0, axes, Combiner::Add),
        Reduction::Prod => builder.reduce(input, 1.0, axes, Combiner::Multiply),
        Reduction::Max => builder.reduce(input, lowest(element_type), axes, Combiner::Maximum),
        Reduction::Min => builder.reduce(input, highest(element_type), axes, Combiner::Minimum),
        Reduction::MaxAbs => {
            let magnitude = builder.unary("abs", input);
            builder.reduce(&magnitude, lowest(element_type), axes, Combiner::Maximum)
        }
        Reduction::Mean => {
            let sum = builder.reduce(input, 0.0, axes, Combiner::Add);
            let count: i64 = axes.iter().map(|&axis| input.dims[axis]).product();
            let count = builder.filled(element_type, count as f64, &sum.dims);
            builder.binary("divide", &sum, &count)
        }
    }
}

/// A reduction over every dimension (the result has shape `[1]`).
pub(crate) fn all(cx: &mut Lowering, reduction: Reduction, ir: &ReduceOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let axes: Vec<usize> = (0..input.rank()).collect();
    let reduced = reduce(cx, reduction, &input, &axes);
    let value = cx.builder.reshape(&reduced, &dims(&ir.out));
    cx.set(&ir.out, value)
}

/// A reduction over one dimension, kept with size 1.
pub(crate) fn dim(cx: &mut Lowering, reduction: Reduction, ir: &ReduceDimOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let reduced = reduce(cx, reduction, &input, &[ir.axis]);
    let value = cx.builder.reshape(&reduced, &dims(&ir.out));
    cx.set(&ir.out, value)
}

/// A reduction over several dimensions, each kept with size 1.
pub(crate) fn dims_kept(cx: &mut Lowering, reduction: Reduction, ir: &ReduceDimsOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let reduced = reduce(cx, reduction, &input, &ir.axes);
    let value = cx.builder.reshape(&reduced, &dims(&ir.out));
    cx.set(&ir.out, value)
}

/// Whether every element (`every` true) or any element of `input` along `axes` is non-zero,
/// shaped as `out`.
fn truth(
    cx: &mut Lowering,
    every: bool,
    input: &TensorIr,
    axes: Option<usize>,
    out: &TensorIr,
) -> Lowered {
    let input = cx.get(input)?;
    let zero = cx.builder.filled(input.element_type, 0.0, &input.dims);
    let non_zero = cx.builder.compare(Direction::Ne, &input, &zero);
    let counted = cx.builder.convert(&non_zero, PrimitiveType::S32);
    let axes: Vec<usize> = match axes {
        Some(axis) => vec![axis],
        None => (0..counted.rank()).collect(),
    };
    let reduction = if every {
        Reduction::Min
    } else {
        Reduction::Max
    };
    let reduced = reduce(cx, reduction, &counted, &axes);
    let zero = cx.builder.filled(PrimitiveType::S32, 0.0, &reduced.dims);
    let truth = cx.builder.compare(Direction::Ne, &reduced, &zero);
    let truth = cx.builder.convert(&truth, element_type(out.dtype)?);
    let value = cx.builder.reshape(&truth, &dims(out));
    cx.set(out, value)
}

/// `all` (`every` true) or `any` over every element.
pub(crate) fn truth_all(cx: &mut Lowering, every: bool, ir: &ReduceOpIr) -> Lowered {
    truth(cx, every, &ir.input, None, &ir.out)
}

/// `all_dim` (`every` true) or `any_dim` along one dimension, kept with size 1.
pub(crate) fn truth_dim(cx: &mut Lowering, every: bool, ir: &ReduceDimOpIr) -> Lowered {
    truth(cx, every, &ir.input, Some(ir.axis), &ir.out)
}

/// The index of the first maximum (or minimum) along `axis`, and the extremum itself.
pub(crate) fn arg_extremum(
    cx: &mut Lowering,
    input: &Value,
    axis: usize,
    maximum: bool,
    index_type: PrimitiveType,
) -> (Value, Value) {
    let reduction = if maximum {
        Reduction::Max
    } else {
        Reduction::Min
    };
    let extremum = reduce(cx, reduction, input, &[axis]);
    let builder = &mut cx.builder;
    let mapping: Vec<i64> = (0..input.rank())
        .filter(|&d| d != axis)
        .map(|d| d as i64)
        .collect();
    let stretched = builder.broadcast(&extremum, &input.dims, &mapping);
    let equal = builder.compare(Direction::Eq, input, &stretched);
    let hit = if matches!(
        input.element_type,
        PrimitiveType::F16 | PrimitiveType::Bf16 | PrimitiveType::F32 | PrimitiveType::F64
    ) {
        // A row holding NaN has its first NaN as extremum (NumPy's and PyTorch's rule, and the
        // host executor's): NaN equals nothing, so `equal` alone finds no position there.
        let nan = builder.compare(Direction::Ne, input, input);
        // Whether any is NaN, as the maximum of 0/1 (Neuron reduces only by min, max, add,
        // multiply).
        let flags = builder.convert(&nan, PrimitiveType::S32);
        let any = builder.reduce(&flags, 0.0, &[axis], Combiner::Maximum);
        let zero = builder.filled(PrimitiveType::S32, 0.0, &any.dims.clone());
        let row_has_nan = builder.compare(Direction::Ne, &any, &zero);
        let row_has_nan = builder.broadcast(&row_has_nan, &input.dims, &mapping);
        builder.select(&row_has_nan, &nan, &equal)
    } else {
        equal
    };
    let positions = builder.iota(index_type, &input.dims, axis);
    let beyond = builder.filled(index_type, input.dims[axis] as f64, &input.dims);
    let candidates = builder.select(&hit, &positions, &beyond);
    let index = builder.reduce(&candidates, highest(index_type), &[axis], Combiner::Minimum);
    (index, extremum)
}

/// `argmax` / `argmin` along an axis, kept with size 1: the first extremum, the first NaN in a
/// row that holds one.
pub(crate) fn arg(cx: &mut Lowering, maximum: bool, ir: &ReduceDimOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let (index, _) = arg_extremum(cx, &input, ir.axis, maximum, element_type(ir.out.dtype)?);
    let value = cx.builder.reshape(&index, &dims(&ir.out));
    cx.set(&ir.out, value)
}

/// `max_dim_with_indices` / `min_dim_with_indices`.
pub(crate) fn with_indices(
    cx: &mut Lowering,
    maximum: bool,
    ir: &ReduceDimWithIndicesOpIr,
) -> Lowered {
    let input = cx.get(&ir.tensor)?;
    let (index, extremum) = arg_extremum(
        cx,
        &input,
        ir.dim,
        maximum,
        element_type(ir.out_indices.dtype)?,
    );
    set_reshaped(cx, &ir.out, &extremum)?;
    set_reshaped(cx, &ir.out_indices, &index)
}

fn set_reshaped(cx: &mut Lowering, out: &TensorIr, value: &Value) -> Lowered {
    let value = cx.builder.reshape(value, &dims(out));
    cx.set(out, value)
}

/// Running sums, products, minima and maxima along an axis.
pub(crate) fn cumulative(cx: &mut Lowering, reduction: Reduction, ir: &DimOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let narrow = matches!(input.element_type, PrimitiveType::Bf16 | PrimitiveType::F16);
    let wide = if narrow && matches!(reduction, Reduction::Sum | Reduction::Prod) {
        // Accumulate half-precision floats in f32, as the host does.
        cx.builder.convert(&input, PrimitiveType::F32)
    } else {
        input.clone()
    };
    let element_type = wide.element_type;
    let (init, combiner) = match reduction {
        Reduction::Sum => (0.0, Combiner::Add),
        Reduction::Prod => (1.0, Combiner::Multiply),
        Reduction::Max => (lowest(element_type), Combiner::Maximum),
        Reduction::Min => (highest(element_type), Combiner::Minimum),
        Reduction::Mean | Reduction::MaxAbs => {
            return super::context::unsupported(format!("cumulative {reduction:?}"));
        }
    };
    let value = cx.builder.cumulative(&wide, init, ir.axis, combiner);
    cx.set(&ir.out, value)
}
