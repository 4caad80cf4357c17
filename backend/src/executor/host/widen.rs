//! Scatter sums and products (and embedding gradients) of bf16 or f16 values in f32 on the
//! host, as the `xla` lowering and every reduction do: `burn-flex` accumulates them in the narrow type, where an accumulator
//! stops growing once an update falls below its rounding step (300 ones add up to 256 in bf16).

use burn_backend::DType;
use burn_backend::tensor::IndexingUpdateOp;
use burn_ir::{
    BaseOperationIr, CastOpIr, EmbeddingBackwardOpIr, ModuleOperationIr, OperationIr, TensorIr,
    TensorStatus,
};

use crate::capture::next_tensor_id;

/// The operations that replace `operation` when it is a scatter or select-assign that sums or
/// multiplies bf16/f16 values: both float inputs cast to f32, the operation in f32, the result
/// cast back into the original output. `None` for every other operation.
pub(super) fn widened(operation: &OperationIr) -> Option<Vec<OperationIr>> {
    if let OperationIr::Module(ModuleOperationIr::EmbeddingBackward(op)) = operation {
        return widened_embedding_backward(op);
    }
    let OperationIr::BaseFloat(base) = operation else {
        return None;
    };
    let accumulates =
        |update: &IndexingUpdateOp| matches!(update, IndexingUpdateOp::Add | IndexingUpdateOp::Mul);
    let mut wide = base.clone();
    let (tensor, value, out) = match &mut wide {
        BaseOperationIr::Scatter(op) if accumulates(&op.update) => {
            (&mut op.tensor, &mut op.value, &mut op.out)
        }
        BaseOperationIr::SelectAssign(op) if accumulates(&op.update) => {
            (&mut op.tensor, &mut op.value, &mut op.out)
        }
        _ => return None,
    };
    if !matches!(out.dtype, DType::BF16 | DType::F16) {
        return None;
    }
    let (wide_tensor, cast_tensor) = to_f32(tensor);
    let (wide_value, cast_value) = to_f32(value);
    let narrow_out = out.clone();
    *tensor = wide_tensor;
    *value = wide_value;
    out.id = next_tensor_id();
    out.dtype = DType::F32;
    let narrow = CastOpIr {
        input: TensorIr {
            status: TensorStatus::ReadWrite,
            ..out.clone()
        },
        out: narrow_out,
    };
    Some(vec![
        cast_tensor,
        cast_value,
        OperationIr::BaseFloat(wide),
        OperationIr::BaseFloat(BaseOperationIr::Cast(narrow)),
    ])
}

/// The gradient of an embedding (recorded whole since Burn 0.22, a scatter-add of the output's
/// gradient into the table's rows) in f32 when its table is bf16 or f16.
fn widened_embedding_backward(op: &EmbeddingBackwardOpIr) -> Option<Vec<OperationIr>> {
    if !matches!(op.out.dtype, DType::BF16 | DType::F16) {
        return None;
    }
    let mut wide = op.clone();
    let (wide_weights, cast_weights) = to_f32(&op.weights);
    let (wide_grad, cast_grad) = to_f32(&op.out_grad);
    wide.weights = wide_weights;
    wide.out_grad = wide_grad;
    wide.out.id = next_tensor_id();
    wide.out.dtype = DType::F32;
    let narrow = CastOpIr {
        input: TensorIr {
            status: TensorStatus::ReadWrite,
            ..wide.out.clone()
        },
        out: op.out.clone(),
    };
    Some(vec![
        cast_weights,
        cast_grad,
        OperationIr::Module(ModuleOperationIr::EmbeddingBackward(wide)),
        OperationIr::BaseFloat(BaseOperationIr::Cast(narrow)),
    ])
}

/// An f32 copy of `input` under a new id (consumed by its one use), and the cast that makes it.
fn to_f32(input: &TensorIr) -> (TensorIr, OperationIr) {
    let wide = TensorIr {
        id: next_tensor_id(),
        status: TensorStatus::NotInit,
        dtype: DType::F32,
        ..input.clone()
    };
    let cast = OperationIr::BaseFloat(BaseOperationIr::Cast(CastOpIr {
        input: input.clone(),
        out: wide.clone(),
    }));
    (
        TensorIr {
            status: TensorStatus::ReadWrite,
            ..wide
        },
        cast,
    )
}
