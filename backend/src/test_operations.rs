//! Captured operations for unit tests: tensors by id and status, and elementwise operations on
//! them, all `f32` of one shape.

use burn_backend::{DType, Shape};
use burn_ir::{
    BinaryOpIr, FloatOperationIr, NumericOperationIr, OperationIr, ScalarIr, ScalarOpIr, TensorId,
    TensorIr, TensorStatus, UnaryOpIr,
};

/// Tensor `id` with `status`.
pub(crate) fn tensor(id: u64, status: TensorStatus) -> TensorIr {
    TensorIr {
        id: TensorId::new(id),
        shape: Shape::new([2, 2]),
        status,
        dtype: DType::F32,
    }
}

/// `out = lhs + rhs`.
pub(crate) fn add(lhs: TensorIr, rhs: TensorIr, out: u64) -> OperationIr {
    OperationIr::NumericFloat(
        DType::F32,
        NumericOperationIr::Add(BinaryOpIr {
            lhs,
            rhs,
            out: tensor(out, TensorStatus::NotInit),
        }),
    )
}

/// `out = input * 0.5`.
pub(crate) fn halve(input: TensorIr, out: u64) -> OperationIr {
    OperationIr::NumericFloat(
        DType::F32,
        NumericOperationIr::MulScalar(ScalarOpIr {
            lhs: input,
            rhs: ScalarIr::Float(0.5),
            out: tensor(out, TensorStatus::NotInit),
        }),
    )
}

/// `out = exp(input)`.
pub(crate) fn exp(input: TensorIr, out: u64) -> OperationIr {
    OperationIr::Float(
        DType::F32,
        FloatOperationIr::Exp(UnaryOpIr {
            input,
            out: tensor(out, TensorStatus::NotInit),
        }),
    )
}
