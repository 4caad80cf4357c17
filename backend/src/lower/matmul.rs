//! Matrix products: `matmul` with batch broadcasting, and the linear module with its backward
//! passes.

use burn_ir::{
    LinearBiasBackwardOpIr, LinearOpIr, LinearWeightBackwardOpIr, LinearXBackwardOpIr, MatmulOpIr,
};

use super::builder::Value;
use super::context::{Lowered, Lowering, dims, unsupported};
use super::reduce::{Reduction, reduce};
use crate::hlo::DotDimensionNumbers;

fn range(start: usize, end: usize) -> Vec<i64> {
    (start as i64..end as i64).collect()
}

/// `lhs [.., m, k] x rhs [.., k, n]`, batch dimensions broadcast.
pub(crate) fn matmul(cx: &mut Lowering, ir: &MatmulOpIr) -> Lowered {
    let lhs = cx.get(&ir.lhs)?;
    let rhs = cx.get(&ir.rhs)?;
    let out_dims = dims(&ir.out);
    let rank = out_dims.len();
    if rank < 2 || lhs.rank() < 2 || rhs.rank() < 2 {
        return unsupported(format!("matmul of ranks {} and {}", lhs.rank(), rhs.rank()));
    }
    let batch = &out_dims[..rank - 2];
    let lhs_dims: Vec<i64> = batch
        .iter()
        .chain(&lhs.dims[lhs.rank() - 2..])
        .copied()
        .collect();
    let rhs_dims: Vec<i64> = batch
        .iter()
        .chain(&rhs.dims[rhs.rank() - 2..])
        .copied()
        .collect();
    let lhs = cx.builder.broadcast_to(&lhs, &lhs_dims);
    let rhs = cx.builder.broadcast_to(&rhs, &rhs_dims);
    let rhs = cx.builder.convert(&rhs, lhs.element_type);
    let numbers = DotDimensionNumbers {
        lhs_contracting_dimensions: vec![rank as i64 - 1],
        rhs_contracting_dimensions: vec![rank as i64 - 2],
        lhs_batch_dimensions: range(0, rank - 2),
        rhs_batch_dimensions: range(0, rank - 2),
    };
    let value = cx.builder.dot(&lhs, &rhs, numbers, &out_dims);
    cx.set(&ir.out, value)
}

/// Contracts `lhs` dimensions with `rhs` dimensions (no batch dimensions).
fn contract(
    cx: &mut Lowering,
    lhs: &Value,
    rhs: &Value,
    lhs_dims: Vec<i64>,
    rhs_dims: Vec<i64>,
    out: &[i64],
) -> Value {
    let numbers = DotDimensionNumbers {
        lhs_contracting_dimensions: lhs_dims,
        rhs_contracting_dimensions: rhs_dims,
        lhs_batch_dimensions: Vec::new(),
        rhs_batch_dimensions: Vec::new(),
    };
    cx.builder.dot(lhs, rhs, numbers, out)
}

/// `linear(x [.., in], weight [in, out], bias [out]) = x weight + bias`.
pub(crate) fn linear(cx: &mut Lowering, ir: &LinearOpIr) -> Lowered {
    let x = cx.get(&ir.x)?;
    let weight = cx.get(&ir.weight)?;
    let out_dims = dims(&ir.out);
    let product = contract(
        cx,
        &x,
        &weight,
        vec![x.rank() as i64 - 1],
        vec![0],
        &out_dims,
    );
    let value = match &ir.bias {
        Some(bias) => {
            let bias = cx.get(bias)?;
            let bias = cx.builder.broadcast_to(&bias, &out_dims);
            cx.builder.binary("add", &product, &bias)
        }
        None => product,
    };
    cx.set(&ir.out, value)
}

/// The gradient of `linear` for `x`: `output_grad weightᵀ`.
pub(crate) fn linear_x_backward(cx: &mut Lowering, ir: &LinearXBackwardOpIr) -> Lowered {
    let weight = cx.get(&ir.weight)?;
    let gradient = cx.get(&ir.output_grad)?;
    let value = contract(
        cx,
        &gradient,
        &weight,
        vec![gradient.rank() as i64 - 1],
        vec![1],
        &dims(&ir.out),
    );
    cx.set(&ir.out, value)
}

/// The gradient of `linear` for the weight: `xᵀ output_grad`, summed over leading dimensions.
pub(crate) fn linear_weight_backward(cx: &mut Lowering, ir: &LinearWeightBackwardOpIr) -> Lowered {
    let x = cx.get(&ir.x)?;
    let gradient = cx.get(&ir.output_grad)?;
    let leading = range(0, x.rank() - 1);
    let value = contract(cx, &x, &gradient, leading.clone(), leading, &dims(&ir.out));
    cx.set(&ir.out, value)
}

/// The gradient of `linear` for the bias: `output_grad` summed over leading dimensions.
pub(crate) fn linear_bias_backward(cx: &mut Lowering, ir: &LinearBiasBackwardOpIr) -> Lowered {
    let gradient = cx.get(&ir.output_grad)?;
    let leading: Vec<usize> = (0..gradient.rank() - 1).collect();
    let value = reduce(cx, Reduction::Sum, &gradient, &leading);
    cx.set(&ir.out, value)
}
