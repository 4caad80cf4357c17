//! Reductions: sum, mean, product, max, min (of values or magnitudes), over all dimensions or
//! one, and the indices of maxima and minima.

use burn_ir::{
    DimOpIr, ReduceDimOpIr, ReduceDimWithIndicesOpIr, ReduceDimsOpIr, ReduceOpIr, TensorIr,
};

use super::builder::{Combiner, Direction, Value};
use super::context::{Failure, Lowered, Lowering, dims, element_type};
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

impl Reduction {
    /// Whether the reduction picks an element (a maximum or a minimum): it has no value over no
    /// elements, and a NaN among the elements is the result.
    fn is_extremum(self) -> bool {
        matches!(self, Reduction::Max | Reduction::Min | Reduction::MaxAbs)
    }
}

/// Whether `element_type` is a floating-point type (one that holds NaN).
fn is_float(element_type: PrimitiveType) -> bool {
    matches!(
        element_type,
        PrimitiveType::F16 | PrimitiveType::Bf16 | PrimitiveType::F32 | PrimitiveType::F64
    )
}

/// An error for an extremum over an axis of `input` that holds no elements (Burn's reference
/// panics there; a program reports it instead).
fn refuse_empty_axes(reduction: Reduction, input: &Value, axes: &[usize]) -> Lowered {
    let shape: Vec<usize> = input.dims.iter().map(|&size| size as usize).collect();
    match empty_extremum_axis(reduction, &shape, axes) {
        Some(reason) => Err(Failure::Invalid(reason)),
        None => Ok(()),
    }
}

/// Why an extremum (`what`) over `axes` of a tensor of `shape` is refused, if one of the axes is
/// empty; the `host` executor refuses it with the same words before burn-flex's kernels panic.
pub(crate) fn empty_extremum_axis(
    what: impl std::fmt::Debug,
    shape: &[usize],
    axes: &[usize],
) -> Option<String> {
    let axis = axes.iter().find(|&&axis| shape[axis] == 0)?;
    Some(format!(
        "{what:?} over axis {axis} of a tensor of shape {shape:?}: the axis is empty, and an \
         extremum of no elements is undefined"
    ))
}

/// Whether any element of `input` along `axes` is NaN (the reduced shape), or `None` for types
/// without NaN. Computed as the maximum of 0/1 flags: Neuron reduces only by minimum, maximum,
/// sum and product.
fn holds_nan(cx: &mut Lowering, input: &Value, axes: &[usize]) -> Option<Value> {
    if !is_float(input.element_type) {
        return None;
    }
    let builder = &mut cx.builder;
    let nan = builder.compare(Direction::Ne, input, input);
    let flags = builder.convert(&nan, PrimitiveType::S32);
    let any = builder.reduce(&flags, 0.0, axes, Combiner::Maximum);
    let zero = builder.filled(PrimitiveType::S32, 0.0, &any.dims.clone());
    Some(builder.compare(Direction::Ne, &any, &zero))
}

/// `value` with NaN wherever `nan` holds (`value` unchanged without a predicate).
fn nan_where(cx: &mut Lowering, nan: Option<&Value>, value: Value) -> Value {
    match nan {
        Some(nan) => {
            let not_a_number = cx.builder.filled(value.element_type, f64::NAN, &value.dims);
            cx.builder.select(nan, &not_a_number, &value)
        }
        None => value,
    }
}

/// Reduces `axes` of `input` as Burn's reduction operations do: an extremum of an empty axis
/// is an error and one of elements holding NaN is NaN (XLA's CPU compiler drops NaN from
/// `maximum` and `minimum` by default, so it is propagated explicitly). [`reduce`] is the bare
/// reduction for callers whose arithmetic propagates NaN anyway (the softmax).
fn reduce_op(
    cx: &mut Lowering,
    reduction: Reduction,
    input: &Value,
    axes: &[usize],
) -> Lowered<Value> {
    if !reduction.is_extremum() {
        return Ok(reduce(cx, reduction, input, axes));
    }
    refuse_empty_axes(reduction, input, axes)?;
    let extremum = reduce(cx, reduction, input, axes);
    let nan = holds_nan(cx, input, axes);
    Ok(nan_where(cx, nan.as_ref(), extremum))
}

/// A reduction over every dimension (the result has shape `[1]`).
pub(crate) fn all(cx: &mut Lowering, reduction: Reduction, ir: &ReduceOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let axes: Vec<usize> = (0..input.rank()).collect();
    let reduced = reduce_op(cx, reduction, &input, &axes)?;
    set_reshaped(cx, &ir.out, &reduced)
}

/// A reduction over one dimension, kept with size 1.
pub(crate) fn dim(cx: &mut Lowering, reduction: Reduction, ir: &ReduceDimOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let reduced = reduce_op(cx, reduction, &input, &[ir.axis])?;
    set_reshaped(cx, &ir.out, &reduced)
}

/// A reduction over several dimensions, each kept with size 1.
pub(crate) fn dims_kept(cx: &mut Lowering, reduction: Reduction, ir: &ReduceDimsOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let reduced = reduce_op(cx, reduction, &input, &ir.axes)?;
    set_reshaped(cx, &ir.out, &reduced)
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
    // `all` is the minimum of 0/1 flags starting from 1 (true), `any` the maximum starting from
    // 0 (false): what each is over no elements.
    let reduced = if every {
        cx.builder.reduce(&counted, 1.0, &axes, Combiner::Minimum)
    } else {
        cx.builder.reduce(&counted, 0.0, &axes, Combiner::Maximum)
    };
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

/// The index of the first maximum (or minimum) along `axis`, and the extremum itself: in a row
/// holding NaN, the first NaN and NaN. An empty axis is an error.
pub(crate) fn arg_extremum(
    cx: &mut Lowering,
    input: &Value,
    axis: usize,
    maximum: bool,
    index_type: PrimitiveType,
) -> Lowered<(Value, Value)> {
    let reduction = if maximum {
        Reduction::Max
    } else {
        Reduction::Min
    };
    refuse_empty_axes(reduction, input, &[axis])?;
    let extremum = reduce(cx, reduction, input, &[axis]);
    let row_has_nan = holds_nan(cx, input, &[axis]);
    let mapping: Vec<i64> = (0..input.rank())
        .filter(|&d| d != axis)
        .map(|d| d as i64)
        .collect();
    let stretched = cx.builder.broadcast(&extremum, &input.dims, &mapping);
    let equal = cx.builder.compare(Direction::Eq, input, &stretched);
    let hit = match &row_has_nan {
        // A row holding NaN has its first NaN as extremum (NumPy's and PyTorch's rule, and the
        // host executor's): NaN equals nothing, so `equal` alone finds no position there.
        Some(row_has_nan) => {
            let nan = cx.builder.compare(Direction::Ne, input, input);
            let row_has_nan = cx.builder.broadcast(row_has_nan, &input.dims, &mapping);
            cx.builder.select(&row_has_nan, &nan, &equal)
        }
        None => equal,
    };
    let extremum = nan_where(cx, row_has_nan.as_ref(), extremum);
    let builder = &mut cx.builder;
    let positions = builder.iota(index_type, &input.dims, axis);
    let beyond = builder.filled(index_type, input.dims[axis] as f64, &input.dims);
    let candidates = builder.select(&hit, &positions, &beyond);
    let index = builder.reduce(&candidates, highest(index_type), &[axis], Combiner::Minimum);
    Ok((index, extremum))
}

/// `argmax` / `argmin` along an axis, kept with size 1: the first extremum, the first NaN in a
/// row that holds one.
pub(crate) fn arg(cx: &mut Lowering, maximum: bool, ir: &ReduceDimOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let (index, _) = arg_extremum(cx, &input, ir.axis, maximum, element_type(ir.out.dtype)?)?;
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
    )?;
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
    let value = if reduction.is_extremum() && is_float(element_type) {
        // From the first NaN on, the running extremum is NaN (Burn's reference).
        let nan = cx.builder.compare(Direction::Ne, &wide, &wide);
        let flags = cx.builder.convert(&nan, PrimitiveType::S32);
        let seen = cx
            .builder
            .cumulative(&flags, 0.0, ir.axis, Combiner::Maximum);
        let zero = cx.builder.filled(PrimitiveType::S32, 0.0, &seen.dims);
        let seen = cx.builder.compare(Direction::Ne, &seen, &zero);
        nan_where(cx, Some(&seen), value)
    } else {
        value
    };
    cx.set(&ir.out, value)
}
