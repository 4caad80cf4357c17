//! Tensors created from nothing: zeros, ones, empty, full.

use burn_ir::{CreationOpIr, FullOpIr};

use super::context::{Lowered, Lowering, dims, element_type};

/// A tensor filled with `value` (`empty` is filled with zeros).
pub(crate) fn filled(cx: &mut Lowering, ir: &CreationOpIr, value: f64) -> Lowered {
    let value = cx
        .builder
        .filled(element_type(ir.out.dtype)?, value, &dims(&ir.out));
    cx.set(&ir.out, value)
}

/// `full(shape, scalar)`, the scalar hoisted into a parameter.
pub(crate) fn full(cx: &mut Lowering, ir: &FullOpIr) -> Lowered {
    let value = cx.scalar_filled(ir.value, ir.out.dtype, &dims(&ir.out))?;
    cx.set(&ir.out, value)
}
