//! The sum of a whole f32 tensor of at least [`PARALLEL_SUM`] elements as sums along its axes,
//! last first, then of what is left: `burn-flex` sums so long a tensor with rayon, whose grouping
//! of the partial sums depends on work stealing, so that one program could give two results
//! differing in their last bits (a gradient's global norm, say, and so a whole run); a sum along
//! an axis is one pass in a fixed order per output. A tensor of one axis is summed as it is.

use burn_backend::DType;
use burn_ir::{NumericOperationIr, OperationIr, ReduceDimOpIr, ReduceOpIr, TensorIr, TensorStatus};

use crate::capture::next_tensor_id;

/// The length from which `burn-flex` 0.22.1 sums a contiguous f32 tensor in parallel.
pub(super) const PARALLEL_SUM: usize = 4 * 1024 * 1024;

/// The operations that replace `operation` when it sums a whole f32 tensor of at least
/// [`PARALLEL_SUM`] elements and more than one axis: a sum along each axis from the last until
/// fewer elements are left, then their sum into the original output. `None` otherwise.
pub(super) fn ordered(operation: &OperationIr) -> Option<Vec<OperationIr>> {
    let OperationIr::NumericFloat(dtype, NumericOperationIr::Sum(sum)) = operation else {
        return None;
    };
    let elements = |tensor: &TensorIr| tensor.shape.iter().product::<usize>();
    if sum.input.dtype != DType::F32 || elements(&sum.input) < PARALLEL_SUM {
        return None;
    }
    let mut operations = Vec::new();
    let mut current = sum.input.clone();
    for axis in (0..current.shape.len()).rev() {
        if elements(&current) < PARALLEL_SUM {
            break;
        }
        if current.shape[axis] == 1 {
            continue;
        }
        let mut dims = current.shape.to_vec();
        dims[axis] = 1;
        let out = TensorIr {
            id: next_tensor_id(),
            shape: dims.into(),
            status: TensorStatus::NotInit,
            dtype: DType::F32,
        };
        operations.push(OperationIr::NumericFloat(
            *dtype,
            NumericOperationIr::SumDim(ReduceDimOpIr {
                input: current,
                out: out.clone(),
                axis,
                accumulator_len: 1,
            }),
        ));
        current = TensorIr {
            status: TensorStatus::ReadWrite,
            ..out
        };
    }
    if operations.is_empty() {
        return None;
    }
    operations.push(OperationIr::NumericFloat(
        *dtype,
        NumericOperationIr::Sum(ReduceOpIr {
            input: current,
            out: sum.out.clone(),
        }),
    ));
    Some(operations)
}
