//! The subset of `xla/service/hlo.proto` and `xla/xla_data.proto` this crate writes, declared with
//! the field numbers of those files (proto3; unknown fields are simply absent).

#![allow(missing_docs)]

/// `xla.PrimitiveType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PrimitiveType {
    Invalid = 0,
    Pred = 1,
    S8 = 2,
    S16 = 3,
    S32 = 4,
    S64 = 5,
    U8 = 6,
    U16 = 7,
    U32 = 8,
    U64 = 9,
    F16 = 10,
    F32 = 11,
    F64 = 12,
    Tuple = 13,
    /// Complex numbers of two f32 (the spectra of `fft`).
    C64 = 15,
    Bf16 = 16,
}

/// `xla.LayoutProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LayoutProto {
    #[prost(int64, repeated, tag = "1")]
    pub minor_to_major: Vec<i64>,
}

/// `xla.ShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ShapeProto {
    #[prost(enumeration = "PrimitiveType", tag = "2")]
    pub element_type: i32,
    #[prost(int64, repeated, tag = "3")]
    pub dimensions: Vec<i64>,
    #[prost(message, repeated, tag = "4")]
    pub tuple_shapes: Vec<ShapeProto>,
    #[prost(message, optional, tag = "5")]
    pub layout: Option<LayoutProto>,
}

/// `xla.ProgramShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProgramShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub parameters: Vec<ShapeProto>,
    #[prost(message, optional, tag = "2")]
    pub result: Option<ShapeProto>,
    #[prost(string, repeated, tag = "3")]
    pub parameter_names: Vec<String>,
}

/// `xla.LiteralProto` (scalar constants of the types the lowering emits).
#[derive(Clone, PartialEq, prost::Message)]
pub struct LiteralProto {
    #[prost(message, optional, tag = "1")]
    pub shape: Option<ShapeProto>,
    #[prost(bool, repeated, tag = "2")]
    pub preds: Vec<bool>,
    #[prost(bytes = "vec", tag = "3")]
    pub u8s: Vec<u8>,
    #[prost(int32, repeated, tag = "4")]
    pub s32s: Vec<i32>,
    #[prost(int64, repeated, tag = "5")]
    pub s64s: Vec<i64>,
    #[prost(uint32, repeated, tag = "6")]
    pub u32s: Vec<u32>,
    #[prost(uint64, repeated, tag = "7")]
    pub u64s: Vec<u64>,
    #[prost(float, repeated, tag = "8")]
    pub f32s: Vec<f32>,
    #[prost(double, repeated, tag = "9")]
    pub f64s: Vec<f64>,
    #[prost(bytes = "vec", tag = "11")]
    pub f16s: Vec<u8>,
    #[prost(bytes = "vec", tag = "13")]
    pub bf16s: Vec<u8>,
    #[prost(bytes = "vec", tag = "15")]
    pub s8s: Vec<u8>,
    #[prost(bytes = "vec", tag = "16")]
    pub u16s: Vec<u8>,
    #[prost(bytes = "vec", tag = "17")]
    pub s16s: Vec<u8>,
}

/// `xla.OpMetadata` (only the names).
#[derive(Clone, PartialEq, prost::Message)]
pub struct OpMetadata {
    #[prost(string, tag = "1")]
    pub op_type: String,
    #[prost(string, tag = "2")]
    pub op_name: String,
}

/// `xla.HloInstructionProto.SliceDimensions`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SliceDimensions {
    #[prost(int64, tag = "1")]
    pub start: i64,
    #[prost(int64, tag = "2")]
    pub limit: i64,
    #[prost(int64, tag = "3")]
    pub stride: i64,
}

/// `xla.PaddingConfig.PaddingConfigDimension`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PaddingConfigDimension {
    #[prost(int64, tag = "1")]
    pub edge_padding_low: i64,
    #[prost(int64, tag = "2")]
    pub edge_padding_high: i64,
    #[prost(int64, tag = "3")]
    pub interior_padding: i64,
}

/// `xla.PaddingConfig`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PaddingConfig {
    #[prost(message, repeated, tag = "1")]
    pub dimensions: Vec<PaddingConfigDimension>,
}

/// `xla.WindowDimension`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WindowDimension {
    #[prost(int64, tag = "1")]
    pub size: i64,
    #[prost(int64, tag = "2")]
    pub stride: i64,
    #[prost(int64, tag = "3")]
    pub padding_low: i64,
    #[prost(int64, tag = "4")]
    pub padding_high: i64,
    #[prost(int64, tag = "5")]
    pub window_dilation: i64,
    #[prost(int64, tag = "6")]
    pub base_dilation: i64,
}

/// `xla.Window`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Window {
    #[prost(message, repeated, tag = "1")]
    pub dimensions: Vec<WindowDimension>,
}

/// `xla.DotDimensionNumbers`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DotDimensionNumbers {
    #[prost(int64, repeated, tag = "1")]
    pub lhs_contracting_dimensions: Vec<i64>,
    #[prost(int64, repeated, tag = "2")]
    pub rhs_contracting_dimensions: Vec<i64>,
    #[prost(int64, repeated, tag = "3")]
    pub lhs_batch_dimensions: Vec<i64>,
    #[prost(int64, repeated, tag = "4")]
    pub rhs_batch_dimensions: Vec<i64>,
}

/// `xla.GatherDimensionNumbers`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GatherDimensionNumbers {
    #[prost(int64, repeated, tag = "1")]
    pub offset_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "2")]
    pub collapsed_slice_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "3")]
    pub start_index_map: Vec<i64>,
    #[prost(int64, tag = "4")]
    pub index_vector_dim: i64,
    #[prost(int64, repeated, tag = "5")]
    pub operand_batching_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "6")]
    pub start_indices_batching_dims: Vec<i64>,
}

/// `xla.ScatterDimensionNumbers`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScatterDimensionNumbers {
    #[prost(int64, repeated, tag = "1")]
    pub update_window_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "2")]
    pub inserted_window_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "3")]
    pub scatter_dims_to_operand_dims: Vec<i64>,
    #[prost(int64, tag = "4")]
    pub index_vector_dim: i64,
    #[prost(int64, repeated, tag = "5")]
    pub input_batching_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "6")]
    pub scatter_indices_batching_dims: Vec<i64>,
}

/// `xla.ConvolutionDimensionNumbers`: which dimension of the input, kernel and output is the
/// batch, the feature and each spatial dimension.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConvolutionDimensionNumbers {
    #[prost(int64, tag = "7")]
    pub input_batch_dimension: i64,
    #[prost(int64, tag = "8")]
    pub input_feature_dimension: i64,
    #[prost(int64, repeated, tag = "11")]
    pub input_spatial_dimensions: Vec<i64>,
    #[prost(int64, tag = "3")]
    pub kernel_input_feature_dimension: i64,
    #[prost(int64, tag = "4")]
    pub kernel_output_feature_dimension: i64,
    #[prost(int64, repeated, tag = "6")]
    pub kernel_spatial_dimensions: Vec<i64>,
    #[prost(int64, tag = "9")]
    pub output_batch_dimension: i64,
    #[prost(int64, tag = "10")]
    pub output_feature_dimension: i64,
    #[prost(int64, repeated, tag = "12")]
    pub output_spatial_dimensions: Vec<i64>,
}

/// `xla.HloInstructionProto` (the fields the lowering sets).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HloInstructionProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub opcode: String,
    #[prost(message, optional, tag = "3")]
    pub shape: Option<ShapeProto>,
    #[prost(message, optional, tag = "7")]
    pub metadata: Option<OpMetadata>,
    #[prost(message, optional, tag = "8")]
    pub literal: Option<LiteralProto>,
    #[prost(int64, tag = "9")]
    pub parameter_number: i64,
    #[prost(int64, tag = "13")]
    pub tuple_index: i64,
    #[prost(int64, repeated, tag = "14")]
    pub dimensions: Vec<i64>,
    #[prost(message, optional, tag = "15")]
    pub window: Option<Window>,
    #[prost(message, optional, tag = "16")]
    pub convolution_dimension_numbers: Option<ConvolutionDimensionNumbers>,
    #[prost(message, repeated, tag = "17")]
    pub slice_dimensions: Vec<SliceDimensions>,
    #[prost(int64, repeated, tag = "20")]
    pub dynamic_slice_sizes: Vec<i64>,
    #[prost(message, optional, tag = "21")]
    pub padding_config: Option<PaddingConfig>,
    #[prost(message, optional, tag = "30")]
    pub dot_dimension_numbers: Option<DotDimensionNumbers>,
    /// `xla.FftType`: 0 FFT, 1 IFFT, 2 RFFT, 3 IRFFT.
    #[prost(int32, tag = "31")]
    pub fft_type: i32,
    #[prost(int64, repeated, tag = "32")]
    pub fft_length: Vec<i64>,
    #[prost(message, optional, tag = "33")]
    pub gather_dimension_numbers: Option<GatherDimensionNumbers>,
    #[prost(int64, repeated, tag = "34")]
    pub gather_slice_sizes: Vec<i64>,
    #[prost(int64, tag = "26")]
    pub channel_id: i64,
    #[prost(string, tag = "28")]
    pub custom_call_target: String,
    #[prost(int64, tag = "35")]
    pub id: i64,
    #[prost(int64, repeated, tag = "36")]
    pub operand_ids: Vec<i64>,
    #[prost(int64, repeated, tag = "38")]
    pub called_computation_ids: Vec<i64>,
    #[prost(bytes = "vec", tag = "43")]
    pub backend_config: Vec<u8>,
    #[prost(message, optional, tag = "48")]
    pub scatter_dimension_numbers: Option<ScatterDimensionNumbers>,
    #[prost(message, repeated, tag = "49")]
    pub replica_groups: Vec<ReplicaGroup>,
    #[prost(int64, tag = "50")]
    pub feature_group_count: i64,
    #[prost(message, repeated, tag = "52")]
    pub source_target_pairs: Vec<SourceTarget>,
    /// A custom call whose operands and result keep the layouts given
    /// (`operand_shapes_with_layout` and the result's shape).
    #[prost(bool, tag = "56")]
    pub constrain_layout: bool,
    #[prost(message, repeated, tag = "57")]
    pub operand_shapes_with_layout: Vec<ShapeProto>,
    #[prost(int64, tag = "58")]
    pub batch_group_count: i64,
    #[prost(bool, tag = "60")]
    pub is_stable: bool,
    #[prost(string, tag = "63")]
    pub comparison_direction: String,
    #[prost(bool, tag = "67")]
    pub indices_are_sorted: bool,
    #[prost(message, optional, tag = "68")]
    pub frontend_attributes: Option<FrontendAttributes>,
    #[prost(bool, tag = "69")]
    pub unique_indices: bool,
    #[prost(int32, tag = "70")]
    pub rng_algorithm: i32,
    #[prost(bool, tag = "71")]
    pub use_global_device_ids: bool,
    #[prost(string, tag = "72")]
    pub comparison_type: String,
    /// A custom call's calling convention ([`CUSTOM_CALL_STATUS_RETURNING`]).
    #[prost(int32, tag = "77")]
    pub custom_call_api_version: i32,
}

/// `xla.ReplicaGroup`: the replicas that take part in one collective together.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReplicaGroup {
    #[prost(int64, repeated, tag = "1")]
    pub replica_ids: Vec<i64>,
}

/// `xla.SourceTarget`: in a `collective-permute`, `source`'s operand becomes `target`'s result.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SourceTarget {
    #[prost(int64, tag = "1")]
    pub source: i64,
    #[prost(int64, tag = "2")]
    pub target: i64,
}

/// `xla.FrontendAttributes`: string attributes a compiler reads (e.g. the NEFF tensor names
/// `neuronx-cc` gives the program's inputs and outputs).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FrontendAttributes {
    #[prost(btree_map = "string, string", tag = "1")]
    pub map: std::collections::BTreeMap<String, String>,
}

/// `xla.RandomAlgorithm::RNG_THREE_FRY`: a `u64[2]` state.
pub const RNG_THREE_FRY: i32 = 1;

/// `xla.CustomCallApiVersion.API_VERSION_STATUS_RETURNING`: the convention of XLA GPU's library
/// calls (cuDNN's attention among them).
pub const CUSTOM_CALL_STATUS_RETURNING: i32 = 2;

/// `xla.HloComputationProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HloComputationProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub instructions: Vec<HloInstructionProto>,
    #[prost(message, optional, tag = "4")]
    pub program_shape: Option<ProgramShapeProto>,
    #[prost(int64, tag = "5")]
    pub id: i64,
    #[prost(int64, tag = "6")]
    pub root_id: i64,
}

/// `xla.HloBufferDonorProto.BufferDonorEntryProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BufferDonorEntryProto {
    #[prost(int64, tag = "1")]
    pub parameter_number: i64,
    #[prost(int64, repeated, tag = "2")]
    pub parameter_shape_index: Vec<i64>,
}

/// `xla.HloBufferDonorProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HloBufferDonorProto {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<BufferDonorEntryProto>,
}

/// `xla.Kind` of an input/output alias: the buffers may share memory.
pub const MAY_ALIAS: i32 = 1;

/// `xla.HloInputOutputAliasProto.AliasEntryProto`: an output that shares the buffer of a
/// parameter.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AliasEntryProto {
    #[prost(int64, repeated, tag = "1")]
    pub output_shape_index: Vec<i64>,
    #[prost(int64, tag = "2")]
    pub parameter_number: i64,
    #[prost(int64, repeated, tag = "3")]
    pub parameter_shape_index: Vec<i64>,
    #[prost(int32, tag = "4")]
    pub kind: i32,
}

/// `xla.HloInputOutputAliasProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HloInputOutputAliasProto {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<AliasEntryProto>,
}

/// `xla.HloModuleProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HloModuleProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub entry_computation_name: String,
    #[prost(message, repeated, tag = "3")]
    pub computations: Vec<HloComputationProto>,
    #[prost(message, optional, tag = "4")]
    pub host_program_shape: Option<ProgramShapeProto>,
    #[prost(int64, tag = "5")]
    pub id: i64,
    #[prost(int64, tag = "6")]
    pub entry_computation_id: i64,
    #[prost(message, optional, tag = "8")]
    pub input_output_alias: Option<HloInputOutputAliasProto>,
    #[prost(message, optional, tag = "18")]
    pub buffer_donor: Option<HloBufferDonorProto>,
}
