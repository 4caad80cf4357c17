//! Sorting along an axis: `sort`, `argsort` and both together, and the largest `k` elements with
//! or without their positions (`topk`, `arg_topk`): a stable `sort` of the elements with their
//! positions, cut to the first `k` for the top-k forms. Equal elements keep their order (the
//! lower position first), as the host's stable sort does.

use burn_ir::{ReduceDimOpIr, SortOpIr, SortWithIndicesOpIr, TensorIr, TopKWithIndicesOpIr};

use super::builder::Value;
use super::context::{Lowered, Lowering, dims, element_type};
use super::index::position_type;

/// `input` sorted along `axis` with its positions carried along (`index_type`): both sorted.
fn sorted_with_positions(
    cx: &mut Lowering,
    input: &TensorIr,
    axis: usize,
    descending: bool,
    index_type: crate::hlo::PrimitiveType,
) -> Lowered<(Value, Value)> {
    let input = cx.get(input)?;
    let order = cx.builder.iota(index_type, &input.dims, axis);
    Ok(cx.builder.sort(&input, &order, axis, descending))
}

/// The first `out`'s-shape elements of `value` (the top `k` along the sorted axis).
fn leading(cx: &mut Lowering, value: &Value, out: &TensorIr) -> Value {
    let out_dims = dims(out);
    let zeros = vec![0; out_dims.len()];
    let ones = vec![1; out_dims.len()];
    cx.builder.slice(value, &zeros, &out_dims, &ones)
}

/// `topk` (`positions` false) or `arg_topk` (`positions` true) along `ir.axis`; `k` is the
/// output's size there.
pub(crate) fn top_k(cx: &mut Lowering, ir: &ReduceDimOpIr, positions: bool) -> Lowered {
    let index_type = if positions {
        element_type(ir.out.dtype)?
    } else {
        position_type(ir.input.shape[ir.axis] as i64)
    };
    let (sorted, sorted_positions) =
        sorted_with_positions(cx, &ir.input, ir.axis, true, index_type)?;
    let chosen = if positions { sorted_positions } else { sorted };
    let value = leading(cx, &chosen, &ir.out);
    cx.set(&ir.out, value)
}

/// The largest `k` elements along `ir.dim` and their positions.
pub(crate) fn top_k_with_indices(cx: &mut Lowering, ir: &TopKWithIndicesOpIr) -> Lowered {
    let index_type = element_type(ir.out_indices.dtype)?;
    let (sorted, positions) = sorted_with_positions(cx, &ir.tensor, ir.dim, true, index_type)?;
    let values = leading(cx, &sorted, &ir.out);
    let positions = leading(cx, &positions, &ir.out_indices);
    cx.set(&ir.out, values)?;
    cx.set(&ir.out_indices, positions)
}

/// `sort` (`positions` false) or `argsort` (`positions` true) along `ir.dim`.
pub(crate) fn sort(cx: &mut Lowering, ir: &SortOpIr, positions: bool) -> Lowered {
    let index_type = if positions {
        element_type(ir.out.dtype)?
    } else {
        position_type(ir.input.shape[ir.dim] as i64)
    };
    let (sorted, sorted_positions) =
        sorted_with_positions(cx, &ir.input, ir.dim, ir.descending, index_type)?;
    cx.set(&ir.out, if positions { sorted_positions } else { sorted })
}

/// The sorted elements along `ir.dim` and their positions.
pub(crate) fn sort_with_indices(cx: &mut Lowering, ir: &SortWithIndicesOpIr) -> Lowered {
    let index_type = element_type(ir.out_indices.dtype)?;
    let (sorted, positions) =
        sorted_with_positions(cx, &ir.input, ir.dim, ir.descending, index_type)?;
    cx.set(&ir.out, sorted)?;
    cx.set(&ir.out_indices, positions)
}
