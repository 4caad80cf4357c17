//! Captured operations for unit tests: `f32` tensors of one shape by id and status, elementwise
//! operations on them, and a scatter-add into one of them.

use burn_backend::tensor::IndexingUpdateOp;
use burn_backend::{DType, Shape};
use burn_ir::{
    BaseOperationIr, BinaryOpIr, FloatOperationIr, NumericOperationIr, OperationIr, ScalarIr,
    ScalarOpIr, ScatterOpIr, TensorId, TensorIr, TensorStatus, UnaryOpIr,
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

/// `out = target` with `value[i]` added at `indices[i]` along dimension 1, where `indices` and
/// `value` are `[2, columns]` and `target` is `[2, 2]`.
pub(crate) fn scatter_add_along_rows(
    target: TensorIr,
    indices: u64,
    value: u64,
    columns: usize,
    out: u64,
) -> OperationIr {
    let of_shape = |id: u64, dtype: DType| TensorIr {
        id: TensorId::new(id),
        shape: Shape::new([2, columns]),
        status: TensorStatus::ReadOnly,
        dtype,
    };
    OperationIr::BaseFloat(BaseOperationIr::Scatter(ScatterOpIr {
        tensor: target,
        dim: 1,
        indices: of_shape(indices, DType::I64),
        value: of_shape(value, DType::F32),
        update: IndexingUpdateOp::Add,
        out: tensor(out, TensorStatus::NotInit),
    }))
}
