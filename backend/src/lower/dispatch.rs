//! Which lowering each operation of Burn's IR takes.

use burn_ir::{
    BaseOperationIr, BoolOperationIr, FloatOperationIr, IntOperationIr, ModuleOperationIr,
    NumericOperationIr, OperationIr,
};

use super::builder::Direction;
use super::context::{Lowered, Lowering, unsupported};
use super::conv;
use super::elementwise::{self, Arithmetic, Function};
use super::reduce::{self, Reduction};
use super::{
    activation, attention, collective, creation, deform_conv, fft, fused_attention, grid_sample,
    index, matmul, norm, pad, pool, random, resample, shape, sort,
};

impl Lowering {
    /// Lowers one operation, or says why it has no lowering.
    pub fn lower(&mut self, operation: &OperationIr) -> Lowered {
        match operation {
            OperationIr::BaseFloat(op) | OperationIr::BaseInt(op) | OperationIr::BaseBool(op) => {
                self.base(op)
            }
            OperationIr::NumericFloat(dtype, op) | OperationIr::NumericInt(dtype, op) => {
                self.numeric(*dtype, op)
            }
            OperationIr::Bool(op) => self.boolean(op),
            OperationIr::Int(op) => self.int(op),
            OperationIr::Float(dtype, op) => self.float(*dtype, op),
            OperationIr::Module(op) => self.module(op),
            OperationIr::Drop(_) => Ok(()),
            OperationIr::Init(_) => {
                unsupported("`Init` carries host data; it is registered, not lowered")
            }
            OperationIr::Custom(custom) if fft::is_fft(custom) => fft::fft(self, custom),
            OperationIr::Custom(custom) if crate::attention::is_fused_attention(custom) => {
                fused_attention::fused_attention(self, custom)
            }
            OperationIr::Custom(custom) => collective::custom(self, custom),
            OperationIr::Activation(op) => activation::activation(self, op),
            OperationIr::Distributed(_) => unsupported(
                "Burn's own all-reduce across devices (`burn::tensor::distributed`); the \
                 replicas of one Trainium device combine with `burn_trainium::collective`",
            ),
        }
    }

    fn base(&mut self, op: &BaseOperationIr) -> Lowered {
        use BaseOperationIr as Op;
        match op {
            Op::Reshape(ir) => shape::reshape(self, ir),
            Op::SwapDims(ir) => shape::swap_dims(self, ir),
            Op::Permute(ir) => shape::permute(self, ir),
            Op::Flip(ir) => shape::flip(self, ir),
            Op::Expand(ir) => shape::expand(self, ir),
            Op::Slice(ir) => shape::slice(self, ir),
            Op::SliceAssign(ir) => shape::slice_assign(self, ir),
            Op::Select(ir) => index::select(self, ir),
            Op::SelectAssign(ir) => index::select_assign(self, ir),
            Op::MaskWhere(ir) => index::mask_where(self, ir),
            Op::MaskFill(ir) => index::mask_fill(self, ir),
            Op::Gather(ir) => index::gather(self, ir),
            Op::Scatter(ir) => index::scatter(self, ir),
            Op::Equal(ir) => elementwise::compare(self, Direction::Eq, ir),
            Op::EqualElem(ir) => elementwise::compare_scalar(self, Direction::Eq, ir),
            Op::RepeatDim(ir) => shape::repeat_dim(self, ir),
            Op::Cat(ir) => shape::cat(self, ir),
            Op::Cast(ir) => elementwise::cast(self, &ir.input, &ir.out),
            Op::Empty(ir) | Op::Zeros(ir) => creation::filled(self, ir, 0.0),
            Op::Ones(ir) => creation::filled(self, ir, 1.0),
            Op::Unfold(ir) => shape::unfold(self, ir),
            Op::ScatterNd(ir) => index::scatter_nd(self, ir),
            Op::GatherNd(ir) => index::gather_nd(self, ir),
            Op::NotEqual(ir) => elementwise::compare(self, Direction::Ne, ir),
            Op::NotEqualElem(ir) => elementwise::compare_scalar(self, Direction::Ne, ir),
            Op::All(ir) => reduce::truth_all(self, true, ir),
            Op::Any(ir) => reduce::truth_all(self, false, ir),
            Op::AllDim(ir) => reduce::truth_dim(self, true, ir),
            Op::AnyDim(ir) => reduce::truth_dim(self, false, ir),
        }
    }

    fn numeric(&mut self, dtype: burn_backend::DType, op: &NumericOperationIr) -> Lowered {
        use NumericOperationIr as Op;
        match op {
            Op::Add(ir) => elementwise::binary(self, Arithmetic::Add, ir),
            Op::AddScalar(ir) => elementwise::scalar(self, Arithmetic::Add, ir),
            Op::Sub(ir) => elementwise::binary(self, Arithmetic::Sub, ir),
            Op::SubScalar(ir) => elementwise::scalar(self, Arithmetic::Sub, ir),
            Op::Div(ir) => elementwise::binary(self, Arithmetic::Div, ir),
            Op::DivScalar(ir) => elementwise::scalar(self, Arithmetic::Div, ir),
            Op::Rem(ir) => elementwise::binary(self, Arithmetic::Rem, ir),
            Op::RemScalar(ir) => elementwise::scalar(self, Arithmetic::Rem, ir),
            Op::Mul(ir) => elementwise::binary(self, Arithmetic::Mul, ir),
            Op::MulScalar(ir) => elementwise::scalar(self, Arithmetic::Mul, ir),
            Op::Abs(ir) => elementwise::unary(self, Function::Abs, ir),
            Op::Full(ir) => creation::full(self, ir),
            Op::MeanDim(ir) => reduce::dim(self, Reduction::Mean, ir),
            Op::Mean(ir) => reduce::all(self, Reduction::Mean, ir),
            Op::Sum(ir) => reduce::all(self, Reduction::Sum, ir),
            Op::SumDim(ir) => reduce::dim(self, Reduction::Sum, ir),
            Op::Prod(ir) => reduce::all(self, Reduction::Prod, ir),
            Op::ProdDim(ir) => reduce::dim(self, Reduction::Prod, ir),
            Op::Max(ir) => reduce::all(self, Reduction::Max, ir),
            Op::Min(ir) => reduce::all(self, Reduction::Min, ir),
            Op::MaxDim(ir) => reduce::dim(self, Reduction::Max, ir),
            Op::MinDim(ir) => reduce::dim(self, Reduction::Min, ir),
            Op::MaxAbs(ir) => reduce::all(self, Reduction::MaxAbs, ir),
            Op::MaxAbsDim(ir) => reduce::dim(self, Reduction::MaxAbs, ir),
            Op::ArgMax(ir) => reduce::arg(self, true, ir),
            Op::ArgMin(ir) => reduce::arg(self, false, ir),
            Op::MaxDimWithIndices(ir) => reduce::with_indices(self, true, ir),
            Op::MinDimWithIndices(ir) => reduce::with_indices(self, false, ir),
            Op::Greater(ir) => elementwise::compare(self, Direction::Gt, ir),
            Op::GreaterElem(ir) => elementwise::compare_scalar(self, Direction::Gt, ir),
            Op::GreaterEqual(ir) => elementwise::compare(self, Direction::Ge, ir),
            Op::GreaterEqualElem(ir) => elementwise::compare_scalar(self, Direction::Ge, ir),
            Op::Lower(ir) => elementwise::compare(self, Direction::Lt, ir),
            Op::LowerElem(ir) => elementwise::compare_scalar(self, Direction::Lt, ir),
            Op::LowerEqual(ir) => elementwise::compare(self, Direction::Le, ir),
            Op::LowerEqualElem(ir) => elementwise::compare_scalar(self, Direction::Le, ir),
            Op::Clamp(ir) => elementwise::clamp(self, ir),
            Op::Powi(ir) => elementwise::power_int(self, ir),
            Op::PowiScalar(ir) => elementwise::power_scalar(self, ir, dtype),
            Op::IntRandom(ir) => random::random(self, ir, true),
            Op::CumSum(ir) => reduce::cumulative(self, Reduction::Sum, ir),
            Op::CumProd(ir) => reduce::cumulative(self, Reduction::Prod, ir),
            Op::CumMin(ir) => reduce::cumulative(self, Reduction::Min, ir),
            Op::CumMax(ir) => reduce::cumulative(self, Reduction::Max, ir),
            Op::ArgTopK(ir) => sort::top_k(self, ir, true),
            Op::TopK(ir) => sort::top_k(self, ir, false),
            Op::TopKWithIndices(ir) => sort::top_k_with_indices(self, ir),
            Op::Sort(ir) => sort::sort(self, ir, false),
            Op::ArgSort(ir) => sort::sort(self, ir, true),
            Op::SortWithIndices(ir) => sort::sort_with_indices(self, ir),
            Op::SumDims(ir) => reduce::dims_kept(self, Reduction::Sum, ir),
            Op::Neg(ir) => elementwise::unary(self, Function::Neg, ir),
            Op::Sign(ir) => elementwise::unary(self, Function::Sign, ir),
            Op::ClampMin(ir) => elementwise::clamp_bound(self, ir, true),
            Op::ClampMax(ir) => elementwise::clamp_bound(self, ir, false),
            Op::Pad(ir) => pad::pad(self, ir),
        }
    }

    fn boolean(&mut self, op: &BoolOperationIr) -> Lowered {
        match op {
            BoolOperationIr::IntoFloat(ir) | BoolOperationIr::IntoInt(ir) => {
                elementwise::cast(self, &ir.input, &ir.out)
            }
            BoolOperationIr::Not(ir) => elementwise::unary(self, Function::Not, ir),
            BoolOperationIr::And(ir) => elementwise::binary(self, Arithmetic::And, ir),
            BoolOperationIr::Or(ir) => elementwise::binary(self, Arithmetic::Or, ir),
            BoolOperationIr::Xor(ir) => elementwise::binary(self, Arithmetic::BitXor, ir),
        }
    }

    fn int(&mut self, op: &IntOperationIr) -> Lowered {
        use IntOperationIr as Op;
        match op {
            Op::IntoFloat(ir) => elementwise::cast(self, &ir.input, &ir.out),
            Op::BitwiseAnd(ir) => elementwise::binary(self, Arithmetic::BitAnd, ir),
            Op::BitwiseAndScalar(ir) => elementwise::scalar(self, Arithmetic::BitAnd, ir),
            Op::BitwiseOr(ir) => elementwise::binary(self, Arithmetic::BitOr, ir),
            Op::BitwiseOrScalar(ir) => elementwise::scalar(self, Arithmetic::BitOr, ir),
            Op::BitwiseXor(ir) => elementwise::binary(self, Arithmetic::BitXor, ir),
            Op::BitwiseXorScalar(ir) => elementwise::scalar(self, Arithmetic::BitXor, ir),
            Op::BitwiseNot(ir) => elementwise::unary(self, Function::BitNot, ir),
            Op::BitwiseLeftShift(ir) => elementwise::binary(self, Arithmetic::ShiftLeft, ir),
            Op::BitwiseLeftShiftScalar(ir) => elementwise::scalar(self, Arithmetic::ShiftLeft, ir),
            Op::BitwiseRightShift(ir) => elementwise::binary(self, Arithmetic::ShiftRight, ir),
            Op::BitwiseRightShiftScalar(ir) => {
                elementwise::scalar(self, Arithmetic::ShiftRight, ir)
            }
            Op::Matmul(ir) => matmul::matmul(self, ir),
        }
    }

    fn float(&mut self, dtype: burn_backend::DType, op: &FloatOperationIr) -> Lowered {
        use FloatOperationIr as Op;
        match op {
            Op::Exp(ir) => elementwise::unary(self, Function::Exp, ir),
            Op::Log(ir) => elementwise::unary(self, Function::Log, ir),
            Op::Log1p(ir) => elementwise::unary(self, Function::Log1p, ir),
            Op::Erf(ir) => elementwise::unary(self, Function::Erf, ir),
            Op::PowfScalar(ir) => elementwise::power_scalar(self, ir, dtype),
            Op::Sqrt(ir) => elementwise::unary(self, Function::Sqrt, ir),
            Op::Cos(ir) => elementwise::unary(self, Function::Cos, ir),
            Op::Cosh(ir) => elementwise::unary(self, Function::Cosh, ir),
            Op::Sin(ir) => elementwise::unary(self, Function::Sin, ir),
            Op::Sinh(ir) => elementwise::unary(self, Function::Sinh, ir),
            Op::Tan(ir) => elementwise::unary(self, Function::Tan, ir),
            Op::Tanh(ir) => elementwise::unary(self, Function::Tanh, ir),
            Op::ArcTan2(ir) => elementwise::binary(self, Arithmetic::Atan2, ir),
            Op::Round(ir) => elementwise::unary(self, Function::Round, ir),
            Op::Floor(ir) => elementwise::unary(self, Function::Floor, ir),
            Op::Ceil(ir) => elementwise::unary(self, Function::Ceil, ir),
            Op::Trunc(ir) => elementwise::unary(self, Function::Trunc, ir),
            Op::IntoInt(ir) => elementwise::cast(self, &ir.input, &ir.out),
            Op::Matmul(ir) => matmul::matmul(self, ir),
            Op::Recip(ir) => elementwise::unary(self, Function::Recip, ir),
            Op::IsNan(ir) => elementwise::unary(self, Function::IsNan, ir),
            Op::IsInf(ir) => elementwise::unary(self, Function::IsInf, ir),
            Op::Powf(ir) => elementwise::binary(self, Arithmetic::Pow, ir),
            Op::Random(ir) => random::random(self, ir, false),
            Op::ArcCos(ir) => elementwise::unary(self, Function::ArcCos, ir),
            Op::ArcCosh(ir) => elementwise::unary(self, Function::ArcCosh, ir),
            Op::ArcSin(ir) => elementwise::unary(self, Function::ArcSin, ir),
            Op::ArcSinh(ir) => elementwise::unary(self, Function::ArcSinh, ir),
            Op::ArcTan(ir) => elementwise::unary(self, Function::ArcTan, ir),
            Op::ArcTanh(ir) => elementwise::unary(self, Function::ArcTanh, ir),
            Op::Cross(ir) => elementwise::cross(self, ir),
            Op::Hypot(ir) => elementwise::hypot(self, ir),
            Op::Quantize(_) | Op::Dequantize(_) => {
                unsupported("burn-router 0.22 never records it (it has no quantized tensors)")
            }
            Op::GridSample2d(ir) => grid_sample::grid_sample_2d(self, ir),
        }
    }

    fn module(&mut self, op: &ModuleOperationIr) -> Lowered {
        use ModuleOperationIr as Op;
        match op {
            Op::Embedding(ir) => index::embedding(self, ir),
            Op::EmbeddingBackward(ir) => index::embedding_backward(self, ir),
            Op::Linear(ir) => matmul::linear(self, ir),
            Op::LinearXBackward(ir) => matmul::linear_x_backward(self, ir),
            Op::LinearWeightBackward(ir) => matmul::linear_weight_backward(self, ir),
            Op::LinearBiasBackward(ir) => matmul::linear_bias_backward(self, ir),
            Op::Attention(ir) => attention::attention(self, ir),
            Op::Conv1d(ir) => conv::forward(self, ir),
            Op::Conv2d(ir) => conv::forward(self, ir),
            Op::Conv3d(ir) => conv::forward(self, ir),
            Op::Conv1dXBackward(ir) => conv::x_backward(self, ir),
            Op::Conv2dXBackward(ir) => conv::x_backward(self, ir),
            Op::Conv3dXBackward(ir) => conv::x_backward(self, ir),
            Op::Conv1dWeightBackward(ir) => conv::weight_backward(self, ir),
            Op::Conv2dWeightBackward(ir) => conv::weight_backward(self, ir),
            Op::Conv3dWeightBackward(ir) => conv::weight_backward(self, ir),
            Op::Conv1dBiasBackward(ir) => conv::bias_backward(self, &ir.output_grad, &ir.out),
            Op::Conv2dBiasBackward(ir) => conv::bias_backward(self, &ir.output_grad, &ir.out),
            Op::Conv3dBiasBackward(ir) => conv::bias_backward(self, &ir.output_grad, &ir.out),
            Op::ConvTranspose1d(ir) => conv::transposed(self, ir),
            Op::ConvTranspose2d(ir) => conv::transposed(self, ir),
            Op::ConvTranspose3d(ir) => conv::transposed(self, ir),
            Op::AvgPool1d(ir) => pool::avg_pool1d(self, ir),
            Op::AvgPool2d(ir) => pool::avg_pool2d(self, ir),
            Op::AvgPool1dBackward(ir) => pool::avg_pool1d_backward(self, ir),
            Op::AvgPool2dBackward(ir) => pool::avg_pool2d_backward(self, ir),
            Op::MaxPool1d(ir) => pool::max_pool1d(self, ir),
            Op::MaxPool2d(ir) => pool::max_pool2d(self, ir),
            Op::MaxPool1dWithIndices(ir) => pool::max_pool1d_with_indices(self, ir),
            Op::MaxPool2dWithIndices(ir) => pool::max_pool2d_with_indices(self, ir),
            Op::MaxPool1dWithIndicesBackward(ir) => pool::max_pool1d_backward(self, ir),
            Op::MaxPool2dWithIndicesBackward(ir) => pool::max_pool2d_backward(self, ir),
            Op::AdaptiveAvgPool1d(ir) => resample::adaptive_avg_pool1d(self, ir),
            Op::AdaptiveAvgPool2d(ir) => resample::adaptive_avg_pool2d(self, ir),
            Op::AdaptiveAvgPool1dBackward(ir) => resample::adaptive_avg_pool1d_backward(self, ir),
            Op::AdaptiveAvgPool2dBackward(ir) => resample::adaptive_avg_pool2d_backward(self, ir),
            Op::Interpolate(ir) => resample::interpolate(self, ir),
            Op::InterpolateBackward(ir) => resample::interpolate_backward(self, ir),
            Op::DeformableConv2d(ir) => deform_conv::deform_conv2d(self, ir),
            Op::DeformableConv2dBackward(ir) => deform_conv::deform_conv2d_backward(self, ir),
            Op::LayerNorm(ir) => norm::layer_norm(self, ir),
            Op::BatchNorm(ir) => norm::batch_norm(self, ir),
            Op::ConvTranspose1dBiasBackward(ir) => {
                conv::bias_backward(self, &ir.output_grad, &ir.out)
            }
            Op::ConvTranspose2dBiasBackward(ir) => {
                conv::bias_backward(self, &ir.output_grad, &ir.out)
            }
            Op::ConvTranspose3dBiasBackward(ir) => {
                conv::bias_backward(self, &ir.output_grad, &ir.out)
            }
            Op::ConvTranspose1dWeightBackward(ir) => conv::weight_backward(self, ir),
            Op::ConvTranspose2dWeightBackward(ir) => conv::weight_backward(self, ir),
            Op::ConvTranspose3dWeightBackward(ir) => conv::weight_backward(self, ir),
            Op::Unfold4d(ir) => conv::unfold4d(self, ir),
            Op::AdaptiveAvgPool3d(ir) => resample::adaptive_avg_pool3d(self, ir),
            Op::AdaptiveAvgPool3dBackward(ir) => resample::adaptive_avg_pool3d_backward(self, ir),
            Op::CtcLoss(_) | Op::CtcLossBackward(_) => unsupported(
                "burn-router 0.21 never records it (Burn computes the CTC loss from other operations)",
            ),
        }
    }
}
