//! The largest `k` elements along an axis and their positions (`topk`, `arg_topk`): a stable
//! descending `sort` of the elements with their positions, cut to the first `k`. Equal elements
//! keep their order (the lower position first).

use burn_ir::ReduceDimOpIr;

use super::context::{Lowered, Lowering, dims, element_type};
use super::index::position_type;

/// `topk` (`positions` false) or `arg_topk` (`positions` true) along `ir.axis`; `k` is the
/// output's size there.
pub(crate) fn top_k(cx: &mut Lowering, ir: &ReduceDimOpIr, positions: bool) -> Lowered {
    let input = cx.get(&ir.input)?;
    let index_type = if positions {
        element_type(ir.out.dtype)?
    } else {
        position_type(input.dims[ir.axis])
    };
    let order = cx.builder.iota(index_type, &input.dims, ir.axis);
    let (sorted, sorted_positions) = cx.builder.sort_descending(&input, &order, ir.axis);
    let chosen = if positions { sorted_positions } else { sorted };
    let out_dims = dims(&ir.out);
    let zeros = vec![0; out_dims.len()];
    let ones = vec![1; out_dims.len()];
    let value = cx.builder.slice(&chosen, &zeros, &out_dims, &ones);
    cx.set(&ir.out, value)
}
