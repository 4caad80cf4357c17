//! Which operations of Burn's IR have a lowering (the table behind `docs/xla-coverage.md`).

/// Whether an operation kind has a lowering.
///
/// `Lowered` can still fall back for some arguments, named in the error: `select` with indices
/// of rank other than 1, data types other than floats, integers and booleans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Lowered to HLO.
    Lowered,
    /// No lowering: the `xla` executor runs it on the host (counted in `host_fallbacks`).
    HostFallback(&'static str),
    /// Never recorded by Burn 0.22's router, so no executor receives it (the reason says what
    /// Burn does instead).
    NotRecorded(&'static str),
    /// Recorded, but refused by every executor with an error naming it (the reason says what to
    /// use instead).
    Refused(&'static str),
}

/// Every operation kind of `burn-ir` 0.22.1 and its coverage, named `Enum::Variant`.
pub const COVERAGE: &[(&str, Coverage)] = &[
    (
        "OperationIr::Init",
        Coverage::NotRecorded("its data is registered directly"),
    ),
    // The collectives of `crate::collective`; other custom operations have no lowering.
    ("OperationIr::Custom", Coverage::Lowered),
    ("OperationIr::Drop", Coverage::Lowered),
    ("BaseOperationIr::Reshape", Coverage::Lowered),
    ("BaseOperationIr::SwapDims", Coverage::Lowered),
    ("BaseOperationIr::Permute", Coverage::Lowered),
    ("BaseOperationIr::Flip", Coverage::Lowered),
    ("BaseOperationIr::Expand", Coverage::Lowered),
    ("BaseOperationIr::Unfold", Coverage::Lowered),
    ("BaseOperationIr::Slice", Coverage::Lowered),
    ("BaseOperationIr::SliceAssign", Coverage::Lowered),
    ("BaseOperationIr::Select", Coverage::Lowered),
    ("BaseOperationIr::SelectAssign", Coverage::Lowered),
    ("BaseOperationIr::MaskWhere", Coverage::Lowered),
    ("BaseOperationIr::MaskFill", Coverage::Lowered),
    ("BaseOperationIr::Gather", Coverage::Lowered),
    ("BaseOperationIr::Scatter", Coverage::Lowered),
    ("BaseOperationIr::ScatterNd", Coverage::Lowered),
    ("BaseOperationIr::GatherNd", Coverage::Lowered),
    ("BaseOperationIr::Equal", Coverage::Lowered),
    ("BaseOperationIr::EqualElem", Coverage::Lowered),
    ("BaseOperationIr::RepeatDim", Coverage::Lowered),
    ("BaseOperationIr::Cat", Coverage::Lowered),
    ("BaseOperationIr::Cast", Coverage::Lowered),
    ("BaseOperationIr::Empty", Coverage::Lowered),
    ("BaseOperationIr::Ones", Coverage::Lowered),
    ("BaseOperationIr::Zeros", Coverage::Lowered),
    ("NumericOperationIr::Add", Coverage::Lowered),
    ("NumericOperationIr::AddScalar", Coverage::Lowered),
    ("NumericOperationIr::Sub", Coverage::Lowered),
    ("NumericOperationIr::SubScalar", Coverage::Lowered),
    ("NumericOperationIr::Div", Coverage::Lowered),
    ("NumericOperationIr::DivScalar", Coverage::Lowered),
    ("NumericOperationIr::Rem", Coverage::Lowered),
    ("NumericOperationIr::RemScalar", Coverage::Lowered),
    ("NumericOperationIr::Mul", Coverage::Lowered),
    ("NumericOperationIr::MulScalar", Coverage::Lowered),
    ("NumericOperationIr::Abs", Coverage::Lowered),
    ("NumericOperationIr::Full", Coverage::Lowered),
    ("NumericOperationIr::MeanDim", Coverage::Lowered),
    ("NumericOperationIr::Mean", Coverage::Lowered),
    ("NumericOperationIr::Sum", Coverage::Lowered),
    ("NumericOperationIr::SumDim", Coverage::Lowered),
    ("NumericOperationIr::Prod", Coverage::Lowered),
    ("NumericOperationIr::ProdDim", Coverage::Lowered),
    ("NumericOperationIr::Greater", Coverage::Lowered),
    ("NumericOperationIr::GreaterElem", Coverage::Lowered),
    ("NumericOperationIr::GreaterEqual", Coverage::Lowered),
    ("NumericOperationIr::GreaterEqualElem", Coverage::Lowered),
    ("NumericOperationIr::Lower", Coverage::Lowered),
    ("NumericOperationIr::LowerElem", Coverage::Lowered),
    ("NumericOperationIr::LowerEqual", Coverage::Lowered),
    ("NumericOperationIr::LowerEqualElem", Coverage::Lowered),
    ("NumericOperationIr::ArgMax", Coverage::Lowered),
    ("NumericOperationIr::ArgTopK", Coverage::Lowered),
    ("NumericOperationIr::TopK", Coverage::Lowered),
    ("NumericOperationIr::ArgMin", Coverage::Lowered),
    ("NumericOperationIr::Max", Coverage::Lowered),
    ("NumericOperationIr::MaxDimWithIndices", Coverage::Lowered),
    ("NumericOperationIr::MinDimWithIndices", Coverage::Lowered),
    ("NumericOperationIr::Min", Coverage::Lowered),
    ("NumericOperationIr::MaxDim", Coverage::Lowered),
    ("NumericOperationIr::MinDim", Coverage::Lowered),
    ("NumericOperationIr::MaxAbs", Coverage::Lowered),
    ("NumericOperationIr::MaxAbsDim", Coverage::Lowered),
    ("NumericOperationIr::Clamp", Coverage::Lowered),
    ("NumericOperationIr::IntRandom", Coverage::Lowered),
    ("NumericOperationIr::Powi", Coverage::Lowered),
    ("NumericOperationIr::PowiScalar", Coverage::Lowered),
    ("NumericOperationIr::CumSum", Coverage::Lowered),
    ("NumericOperationIr::CumProd", Coverage::Lowered),
    ("NumericOperationIr::CumMin", Coverage::Lowered),
    ("NumericOperationIr::CumMax", Coverage::Lowered),
    ("FloatOperationIr::Exp", Coverage::Lowered),
    ("FloatOperationIr::Log", Coverage::Lowered),
    ("FloatOperationIr::Log1p", Coverage::Lowered),
    ("FloatOperationIr::Erf", Coverage::Lowered),
    ("FloatOperationIr::PowfScalar", Coverage::Lowered),
    ("FloatOperationIr::Sqrt", Coverage::Lowered),
    ("FloatOperationIr::Cos", Coverage::Lowered),
    ("FloatOperationIr::Cosh", Coverage::Lowered),
    ("FloatOperationIr::Sin", Coverage::Lowered),
    ("FloatOperationIr::Sinh", Coverage::Lowered),
    ("FloatOperationIr::Tan", Coverage::Lowered),
    ("FloatOperationIr::Tanh", Coverage::Lowered),
    ("FloatOperationIr::ArcCos", Coverage::Lowered),
    ("FloatOperationIr::ArcCosh", Coverage::Lowered),
    ("FloatOperationIr::ArcSin", Coverage::Lowered),
    ("FloatOperationIr::ArcSinh", Coverage::Lowered),
    ("FloatOperationIr::ArcTan", Coverage::Lowered),
    ("FloatOperationIr::ArcTanh", Coverage::Lowered),
    ("FloatOperationIr::ArcTan2", Coverage::Lowered),
    ("FloatOperationIr::Round", Coverage::Lowered),
    ("FloatOperationIr::Floor", Coverage::Lowered),
    ("FloatOperationIr::Ceil", Coverage::Lowered),
    ("FloatOperationIr::Trunc", Coverage::Lowered),
    ("FloatOperationIr::IntoInt", Coverage::Lowered),
    ("FloatOperationIr::Matmul", Coverage::Lowered),
    ("FloatOperationIr::Cross", Coverage::Lowered),
    ("FloatOperationIr::Random", Coverage::Lowered),
    ("FloatOperationIr::Recip", Coverage::Lowered),
    ("FloatOperationIr::IsNan", Coverage::Lowered),
    ("FloatOperationIr::IsInf", Coverage::Lowered),
    (
        "FloatOperationIr::Quantize",
        Coverage::NotRecorded(
            "burn-router 0.22 has no quantized tensors (its quantization operations are left unimplemented)",
        ),
    ),
    (
        "FloatOperationIr::Dequantize",
        Coverage::NotRecorded(
            "burn-router 0.22 has no quantized tensors (its quantization operations are left unimplemented)",
        ),
    ),
    ("FloatOperationIr::GridSample2d", Coverage::Lowered),
    ("FloatOperationIr::Powf", Coverage::Lowered),
    ("IntOperationIr::IntoFloat", Coverage::Lowered),
    ("IntOperationIr::BitwiseAnd", Coverage::Lowered),
    ("IntOperationIr::BitwiseAndScalar", Coverage::Lowered),
    ("IntOperationIr::BitwiseOr", Coverage::Lowered),
    ("IntOperationIr::BitwiseOrScalar", Coverage::Lowered),
    ("IntOperationIr::BitwiseXor", Coverage::Lowered),
    ("IntOperationIr::BitwiseXorScalar", Coverage::Lowered),
    ("IntOperationIr::BitwiseNot", Coverage::Lowered),
    ("IntOperationIr::BitwiseLeftShift", Coverage::Lowered),
    ("IntOperationIr::BitwiseLeftShiftScalar", Coverage::Lowered),
    ("IntOperationIr::BitwiseRightShift", Coverage::Lowered),
    ("IntOperationIr::BitwiseRightShiftScalar", Coverage::Lowered),
    ("IntOperationIr::Matmul", Coverage::Lowered),
    ("BoolOperationIr::IntoFloat", Coverage::Lowered),
    ("BoolOperationIr::IntoInt", Coverage::Lowered),
    ("BoolOperationIr::Not", Coverage::Lowered),
    ("BoolOperationIr::And", Coverage::Lowered),
    ("BoolOperationIr::Or", Coverage::Lowered),
    ("ModuleOperationIr::Embedding", Coverage::Lowered),
    ("ModuleOperationIr::EmbeddingBackward", Coverage::Lowered),
    ("ModuleOperationIr::Linear", Coverage::Lowered),
    ("ModuleOperationIr::LinearXBackward", Coverage::Lowered),
    ("ModuleOperationIr::LinearWeightBackward", Coverage::Lowered),
    ("ModuleOperationIr::LinearBiasBackward", Coverage::Lowered),
    ("ModuleOperationIr::Conv1d", Coverage::Lowered),
    ("ModuleOperationIr::Conv1dXBackward", Coverage::Lowered),
    ("ModuleOperationIr::Conv1dWeightBackward", Coverage::Lowered),
    ("ModuleOperationIr::Conv1dBiasBackward", Coverage::Lowered),
    ("ModuleOperationIr::Conv2d", Coverage::Lowered),
    ("ModuleOperationIr::Conv2dXBackward", Coverage::Lowered),
    ("ModuleOperationIr::Conv2dWeightBackward", Coverage::Lowered),
    ("ModuleOperationIr::Conv2dBiasBackward", Coverage::Lowered),
    ("ModuleOperationIr::Conv3d", Coverage::Lowered),
    ("ModuleOperationIr::Conv3dXBackward", Coverage::Lowered),
    ("ModuleOperationIr::Conv3dWeightBackward", Coverage::Lowered),
    ("ModuleOperationIr::Conv3dBiasBackward", Coverage::Lowered),
    ("ModuleOperationIr::DeformableConv2d", Coverage::Lowered),
    (
        "ModuleOperationIr::DeformableConv2dBackward",
        Coverage::Lowered,
    ),
    ("ModuleOperationIr::ConvTranspose1d", Coverage::Lowered),
    ("ModuleOperationIr::ConvTranspose2d", Coverage::Lowered),
    ("ModuleOperationIr::ConvTranspose3d", Coverage::Lowered),
    ("ModuleOperationIr::AvgPool1d", Coverage::Lowered),
    ("ModuleOperationIr::AvgPool2d", Coverage::Lowered),
    ("ModuleOperationIr::AvgPool1dBackward", Coverage::Lowered),
    ("ModuleOperationIr::AvgPool2dBackward", Coverage::Lowered),
    ("ModuleOperationIr::AdaptiveAvgPool1d", Coverage::Lowered),
    ("ModuleOperationIr::AdaptiveAvgPool2d", Coverage::Lowered),
    (
        "ModuleOperationIr::AdaptiveAvgPool1dBackward",
        Coverage::Lowered,
    ),
    (
        "ModuleOperationIr::AdaptiveAvgPool2dBackward",
        Coverage::Lowered,
    ),
    ("ModuleOperationIr::MaxPool1d", Coverage::Lowered),
    ("ModuleOperationIr::MaxPool1dWithIndices", Coverage::Lowered),
    (
        "ModuleOperationIr::MaxPool1dWithIndicesBackward",
        Coverage::Lowered,
    ),
    ("ModuleOperationIr::MaxPool2d", Coverage::Lowered),
    ("ModuleOperationIr::MaxPool2dWithIndices", Coverage::Lowered),
    (
        "ModuleOperationIr::MaxPool2dWithIndicesBackward",
        Coverage::Lowered,
    ),
    ("ModuleOperationIr::Interpolate", Coverage::Lowered),
    ("ModuleOperationIr::InterpolateBackward", Coverage::Lowered),
    ("ModuleOperationIr::Attention", Coverage::Lowered),
    (
        "ModuleOperationIr::CtcLoss",
        Coverage::NotRecorded(
            "Burn computes the CTC loss from other operations (a scan over time), which are lowered",
        ),
    ),
    (
        "ModuleOperationIr::CtcLossBackward",
        Coverage::NotRecorded(
            "Burn differentiates the CTC loss through the operations it is computed from",
        ),
    ),
    // New in Burn 0.22.
    ("ActivationOperationIr::Relu", Coverage::Lowered),
    ("ActivationOperationIr::ReluBackward", Coverage::Lowered),
    ("ActivationOperationIr::LeakyRelu", Coverage::Lowered),
    ("ActivationOperationIr::PRelu", Coverage::Lowered),
    ("ActivationOperationIr::Gelu", Coverage::Lowered),
    ("ActivationOperationIr::GeluBackward", Coverage::Lowered),
    ("ActivationOperationIr::Sigmoid", Coverage::Lowered),
    ("ActivationOperationIr::SigmoidBackward", Coverage::Lowered),
    ("ActivationOperationIr::HardSigmoid", Coverage::Lowered),
    ("ActivationOperationIr::LogSigmoid", Coverage::Lowered),
    (
        "ActivationOperationIr::LogSigmoidBackward",
        Coverage::Lowered,
    ),
    ("ActivationOperationIr::Softmax", Coverage::Lowered),
    ("ActivationOperationIr::LogSoftmax", Coverage::Lowered),
    ("ActivationOperationIr::Softmin", Coverage::Lowered),
    ("BaseOperationIr::NotEqual", Coverage::Lowered),
    ("BaseOperationIr::NotEqualElem", Coverage::Lowered),
    ("BaseOperationIr::All", Coverage::Lowered),
    ("BaseOperationIr::AllDim", Coverage::Lowered),
    ("BaseOperationIr::Any", Coverage::Lowered),
    ("BaseOperationIr::AnyDim", Coverage::Lowered),
    ("BoolOperationIr::Xor", Coverage::Lowered),
    ("FloatOperationIr::Hypot", Coverage::Lowered),
    ("NumericOperationIr::ArgSort", Coverage::Lowered),
    ("NumericOperationIr::ClampMax", Coverage::Lowered),
    ("NumericOperationIr::ClampMin", Coverage::Lowered),
    ("NumericOperationIr::Neg", Coverage::Lowered),
    ("NumericOperationIr::Pad", Coverage::Lowered),
    ("NumericOperationIr::Sign", Coverage::Lowered),
    ("NumericOperationIr::Sort", Coverage::Lowered),
    ("NumericOperationIr::SortWithIndices", Coverage::Lowered),
    ("NumericOperationIr::SumDims", Coverage::Lowered),
    ("NumericOperationIr::TopKWithIndices", Coverage::Lowered),
    ("ModuleOperationIr::AdaptiveAvgPool3d", Coverage::Lowered),
    (
        "ModuleOperationIr::AdaptiveAvgPool3dBackward",
        Coverage::Lowered,
    ),
    ("ModuleOperationIr::BatchNorm", Coverage::Lowered),
    (
        "ModuleOperationIr::ConvTranspose1dBiasBackward",
        Coverage::Lowered,
    ),
    (
        "ModuleOperationIr::ConvTranspose1dWeightBackward",
        Coverage::Lowered,
    ),
    (
        "ModuleOperationIr::ConvTranspose2dBiasBackward",
        Coverage::Lowered,
    ),
    (
        "ModuleOperationIr::ConvTranspose2dWeightBackward",
        Coverage::Lowered,
    ),
    (
        "ModuleOperationIr::ConvTranspose3dBiasBackward",
        Coverage::Lowered,
    ),
    (
        "ModuleOperationIr::ConvTranspose3dWeightBackward",
        Coverage::Lowered,
    ),
    ("ModuleOperationIr::LayerNorm", Coverage::Lowered),
    ("ModuleOperationIr::Unfold4d", Coverage::Lowered),
    (
        "DistributedOperationIr::AllReduce",
        Coverage::Refused(
            "Burn's all-reduce across devices (`burn::tensor::distributed`); the replicas of one Trainium device (`xla:0-3`) combine with `burn_trainium::collective`, compiled into the program",
        ),
    ),
    (
        "DistributedOperationIr::SyncCollective",
        Coverage::Refused(
            "Burn's all-reduce across devices (`burn::tensor::distributed`); the replicas of one Trainium device (`xla:0-3`) combine with `burn_trainium::collective`, compiled into the program",
        ),
    ),
];

/// The coverage table as Markdown.
pub fn coverage_markdown() -> String {
    let count = |kind: fn(&Coverage) -> bool| COVERAGE.iter().filter(|(_, c)| kind(c)).count();
    let lowered = count(|coverage| *coverage == Coverage::Lowered);
    let not_recorded = count(|coverage| matches!(coverage, Coverage::NotRecorded(_)));
    let fallbacks = count(|coverage| matches!(coverage, Coverage::HostFallback(_)));
    let refused = count(|coverage| matches!(coverage, Coverage::Refused(_)));
    let mut text = format!(
        "# XLA lowering coverage\n\nGenerated from `backend/src/lower/coverage.rs` by the test \
         `coverage` (`cargo test -p burn-trainium --test backend coverage`); do not edit by hand.\n\n\
         {lowered} of {} operation kinds of `burn-ir` 0.22.1 are lowered to HLO; {not_recorded} \
         are never recorded by Burn 0.22's router, so no executor receives them (the table says \
         what Burn does instead); {fallbacks} run on the host executor, one operation at a time, \
         when they appear in a segment of the `xla` executor (counted in \
         `Stats::host_fallbacks`, refused with `TRAINIUM_HOST_FALLBACK=error`); {refused} are \
         refused with an error naming them. A lowered kind still falls back for the arguments it \
         does not cover: `select` with indices of rank other than 1, data types other than floats, \
         integers and booleans. Random tensors are lowered only for executors that pass random \
         states (`LowerOptions::random_on_device`: the `xla` executor).\n\n\
         | Operation | Lowering |\n| --- | --- |\n",
        COVERAGE.len()
    );
    for (name, coverage) in COVERAGE {
        let status = match coverage {
            Coverage::Lowered => "lowered".to_string(),
            Coverage::HostFallback(reason) => format!("host fallback: {reason}"),
            Coverage::NotRecorded(reason) => format!("not recorded by Burn: {reason}"),
            Coverage::Refused(reason) => format!("refused: {reason}"),
        };
        text.push_str(&format!("| `{name}` | {status} |\n"));
    }
    text
}
