//! Lowering: a segment of Burn's IR becomes one XLA `HloModuleProto`.
//!
//! Shared by every executor that runs HLO (`xla` through PJRT, `neuron` through `neuronx-cc`).
//! The module's parameters are, in order, the segment's inputs (tensors read but not produced),
//! one vector per element type holding the segment's scalar operands (hoisted, so that a learning
//! rate that changes every step does not change the program), and the states of the random
//! tensors it draws. The entry computation returns a tuple of the segment's outputs (tensors produced and still alive at its end).
//!
//! Files follow the kinds of operations: `elementwise`, `reduce`, `shape`, `index`, `matmul`
//! (matmul and the linear module), `attention`, `creation`.

mod activation;
mod attention;
pub(crate) mod builder;
mod collective;
mod context;
mod conv;
mod coverage;
mod creation;
mod cudnn_attention;
mod deform_conv;
mod dispatch;
mod dump;
mod elementwise;
pub mod fft;
mod fused_attention;
mod grid_sample;
mod in_place;
mod index;
mod kernel_call;
mod matmul;
mod neuron_attention;
mod norm;
mod pad;
mod pool;
mod random;
mod reduce;
mod resample;
mod shape;
mod sort;

use std::ops::Range;
use std::sync::Arc;

use burn_backend::TensorData;
use burn_ir::{OperationIr, ScalarIr, TensorId, TensorIr};
use prost::Message;

use crate::capture::{Segment, SegmentBoundary};
use crate::hlo::HloModuleProto;

pub(crate) use context::scalar_data;
pub use coverage::{COVERAGE, Coverage, coverage_markdown};
pub use cudnn_attention::{CUDNN_BACKWARD_TARGET, CUDNN_FORWARD_TARGET};
pub use dump::{DUMP_DIR_ENV, dump_module, dump_module_to};
pub use kernel_call::{KERNEL_REQUEST_TARGET, KernelRequest, KernelTensor};
pub(crate) use reduce::empty_extremum_axis;

use context::Lowering;

/// Why a segment could not be lowered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LowerError {
    /// Operation `index` of the segment has no lowering (yet); it can run elsewhere.
    #[error("operation {index} ({operation}) has no XLA lowering: {reason}")]
    Unsupported {
        /// Its position in the segment.
        index: usize,
        /// Its kind, e.g. `Float::Random`.
        operation: String,
        /// What is not supported.
        reason: String,
    },
    /// The segment is inconsistent (a tensor used before it exists, a shape that disagrees).
    #[error("cannot lower operation {index} ({operation}): {reason}")]
    Invalid {
        /// Its position in the segment.
        index: usize,
        /// Its kind.
        operation: String,
        /// What is wrong.
        reason: String,
    },
}

/// The structural key of a program: equal for segments that differ only in tensor ids and in
/// the values of their scalar operands. The first 8 bytes of the SHA-256 of the module (stable
/// across Rust releases, so the names of cached modules are too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StructuralKey(pub u64);

impl StructuralKey {
    /// The key of a serialized module.
    pub fn of(bytes: &[u8]) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(bytes);
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        StructuralKey(u64::from_be_bytes(first))
    }
}

impl std::fmt::Display for StructuralKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{:016x}", self.0)
    }
}

/// A hoisted scalar and the operation it was hoisted for (its index in the segment).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HoistedScalar {
    /// The operation being lowered when it was hoisted.
    pub operation: usize,
    /// Its value.
    pub value: ScalarIr,
}

/// One segment lowered to HLO, with what the executor must pass and collect.
#[derive(Debug, Clone)]
pub struct LoweredProgram {
    /// The module (shared by the runs of a segment that repeats).
    pub module: Arc<HloModuleProto>,
    /// Its serialized bytes (the `"hlo"` program format of PJRT).
    pub bytes: Arc<Vec<u8>>,
    /// Hash of `bytes`: the compile cache key.
    pub key: StructuralKey,
    /// The first parameters: the segment's inputs, in order.
    pub inputs: Vec<TensorIr>,
    /// The following parameters: the hoisted scalars, one rank-1 array per element type.
    pub scalars: Vec<TensorData>,
    /// Where each hoisted scalar came from, pack by pack as in `scalars`.
    pub hoisted: Vec<Vec<HoistedScalar>>,
    /// The operations of the segment the program computes (indices into the segment).
    pub operations: Range<usize>,
    /// The elements of the result tuple: the segment's outputs, in order.
    pub outputs: Vec<TensorIr>,
    /// Whether the parameter after the scalars is `s32[1]`, the running replica's global index
    /// (each replica its own), which the split of a collective reads under
    /// [`OperatorRules::Neuron`].
    pub replica_index: bool,
    /// The last parameter, when non-zero: `u64[2 * random_draws]`, one fresh Threefry state
    /// (`[key, counter]`) per random tensor the program draws, filled by the executor at each run.
    pub random_draws: usize,
    /// Inputs whose life ends in the segment: their buffers are released after the run (and
    /// offered to the program as buffer donors).
    pub released: Vec<TensorId>,
    /// Collectives in the program that exchange data between replicas.
    pub collectives: usize,
    /// Bytes each replica sends into those collectives per run.
    pub collective_bytes: u64,
}

impl LoweredProgram {
    /// Renumbers the program's operations as those of a segment in which they start at `start`.
    fn shift_operations(&mut self, start: usize) {
        self.operations = self.operations.start + start..self.operations.end + start;
        for hoisted in self.hoisted.iter_mut().flatten() {
            hoisted.operation += start;
        }
    }
}

/// One step of running a segment: a lowered program, or one operation without a lowering.
#[derive(Debug, Clone)]
pub enum Step {
    /// A run of consecutive operations, lowered to one program.
    Program(Box<LoweredProgram>),
    /// An operation with no lowering, to run elsewhere (the host executor).
    Fallback(Box<OperationIr>),
}

/// Choices of the lowering that depend on the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LowerOptions {
    /// Draw random tensors on the device (`rng-bit-generator`). The executor must then pass
    /// [`LoweredProgram::random_draws`] states as the last parameter. When off, random tensors
    /// have no lowering.
    pub random_on_device: bool,
    /// How many replicas run the program (collectives are checked against it).
    pub replicas: usize,
    /// How the program may reuse the buffers of inputs whose life ends in it.
    pub donation: Donation,
    /// How Burn's attention module (`ModuleOperationIr::Attention`) is lowered.
    pub attention: AttentionLowering,
    /// How the fused attention's operations (`crate::attention`) are lowered.
    pub fused_attention: FusedAttentionLowering,
    /// Which compiler's operator rules the module keeps to.
    pub rules: OperatorRules,
}

/// Which compiler's operator rules a module keeps to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OperatorRules {
    /// Any HLO XLA compiles: a collective's split reads `replica-id` and slices at a run-time
    /// offset (`dynamic-slice`); powers of any exponent are `power`.
    #[default]
    Xla,
    /// The operators and rules `neuronx-cc` documents (the executor's lint): the split reads the
    /// replica's index from a parameter and selects among constant-offset slices; a power of a
    /// fractional exponent is `exp(e · log x)`.
    Neuron,
}

impl Default for LowerOptions {
    fn default() -> Self {
        Self {
            random_on_device: false,
            replicas: 1,
            donation: Donation::Donors,
            attention: AttentionLowering::Portable,
            fused_attention: FusedAttentionLowering::Blocked,
            rules: OperatorRules::Xla,
        }
    }
}

/// How Burn's attention module is lowered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionLowering {
    /// With HLO's own operations, as Burn's reference computes it: every compiler runs it.
    Portable,
    /// As a request for the Neuron SDK's flash-attention kernel (`flash_fwd`) wherever the
    /// kernel computes the same thing (causal, no mask, bias or soft cap, f32 or bf16, a
    /// sequence a multiple of 512 and heads at most 128 wide); elsewhere portable. The `neuron`
    /// executor turns the requests into the SDK's calls (see [`KernelRequest`]).
    NeuronFlash,
}

/// How the fused attention's operations (`burn_trainium.attention` and its backward pass) are
/// lowered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FusedAttentionLowering {
    /// As blocked HLO every compiler runs: one block of queries' scores at a time.
    #[default]
    Blocked,
    /// As cuDNN's flash-attention calls (`__cudnn$fmhaSoftmax`, `__cudnn$fmhaSoftmaxBackward`),
    /// in the form JAX emits, wherever cuDNN computes what the operation asks: bf16 or f16, no
    /// sinks or soft cap, query and value heads of one width (a multiple of 8 up to 128), a
    /// causal mask only over as many queries as keys; blocked elsewhere. For XLA's CUDA plugin.
    Cudnn,
    /// As requests for the Neuron SDK's flash-attention kernels (`flash_fwd` in training,
    /// `flash_attn_bwd`) wherever they compute what the operation asks: f32 or bf16, no sinks or
    /// soft cap, heads of one width up to 128, as many queries as keys, a multiple of 512
    /// positions; blocked elsewhere. The `neuron` executor turns the requests into the SDK's
    /// calls, as for [`AttentionLowering::NeuronFlash`].
    NeuronFlash,
}

/// How a program may reuse the buffers of the inputs whose life ends in it (`released_inputs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Donation {
    /// They are offered as buffer donors and the compiler pairs them with outputs of the same
    /// size, in order.
    Donors,
    /// Each output that replaces an input in place (followed from the input along Burn's last-use
    /// marks through operations of the output's shape and type) aliases that input; no other
    /// input is offered.
    InPlace,
}

/// Splits `operations` into lowered programs and the operations between them that have no
/// lowering, in order: each program is as long as possible.
pub fn plan_segment(
    operations: &[OperationIr],
    options: &LowerOptions,
) -> Result<Vec<Step>, LowerError> {
    plan_segment_keeping_on_host(operations, options, &[])
}

/// [`plan_segment`], with the operations of the kinds `host_kinds` names (`Module::Conv2d`, as
/// [`operation_name`] writes them) kept on the host although they have a lowering.
pub fn plan_segment_keeping_on_host(
    operations: &[OperationIr],
    options: &LowerOptions,
    host_kinds: &[String],
) -> Result<Vec<Step>, LowerError> {
    let kept = |operation: &OperationIr| {
        !host_kinds.is_empty() && host_kinds.contains(&operation_name(operation))
    };
    let mut steps = Vec::new();
    let mut start = 0;
    while start < operations.len() {
        if kept(&operations[start]) {
            steps.push(Step::Fallback(Box::new(operations[start].clone())));
            start += 1;
            continue;
        }
        let mut end = (start..operations.len())
            .find(|&index| kept(&operations[index]))
            .unwrap_or(operations.len());
        loop {
            let piece = &operations[start..end];
            match lower_segment_with(piece, &boundary_of(piece), options) {
                Ok(mut program) => {
                    program.shift_operations(start);
                    steps.push(Step::Program(Box::new(program)));
                    start = end;
                    break;
                }
                Err(LowerError::Unsupported { index: 0, .. }) => {
                    steps.push(Step::Fallback(Box::new(operations[start].clone())));
                    start += 1;
                    break;
                }
                Err(LowerError::Unsupported { index, .. }) => end = start + index,
                Err(error) => return Err(error),
            }
        }
    }
    Ok(steps)
}

/// The boundary of a run of operations.
pub fn boundary_of(operations: &[OperationIr]) -> SegmentBoundary {
    let mut segment = Segment::default();
    operations
        .iter()
        .cloned()
        .for_each(|operation| segment.push(operation));
    segment.boundary()
}

/// A short name of an operation's kind, e.g. `NumericFloat::Add` or `Module::Embedding`.
pub fn operation_name(operation: &OperationIr) -> String {
    let debug = format!("{operation:?}");
    let outer_end = debug.find('(').unwrap_or(debug.len());
    let outer = &debug[..outer_end];
    let rest = debug.get(outer_end + 1..).unwrap_or("");
    // `NumericFloat(F32, Add(...))` and `Float(BF16, Exp(...))` carry a dtype first.
    let rest = match rest.split_once(", ") {
        Some((first, tail))
            if !first.contains('(')
                && !first.contains('{')
                && first.chars().all(char::is_alphanumeric) =>
        {
            tail
        }
        _ => rest,
    };
    let inner_end = rest.find(['(', ' ', '{']).unwrap_or(rest.len());
    let inner = &rest[..inner_end];
    match outer {
        "Drop" | "Custom" | "Init" => outer.to_string(),
        _ => format!("{outer}::{inner}"),
    }
}

/// Lowers `operations` (a whole segment or a run of it) whose boundary is `boundary`.
///
/// `Drop` operations only end lifetimes and lower to nothing. Inputs listed in
/// `boundary.released_inputs` are marked as buffer donors ([`Donation::Donors`]). Random tensors
/// are not lowered (see [`lower_segment_with`]).
pub fn lower_segment(
    operations: &[OperationIr],
    boundary: &SegmentBoundary,
) -> Result<LoweredProgram, LowerError> {
    lower_segment_with(operations, boundary, &LowerOptions::default())
}

/// [`lower_segment`] with explicit [`LowerOptions`].
pub fn lower_segment_with(
    operations: &[OperationIr],
    boundary: &SegmentBoundary,
    options: &LowerOptions,
) -> Result<LoweredProgram, LowerError> {
    // Inputs only dropped here are released but not passed: the program does not change with
    // the drops that happen to land in a segment.
    let used: std::collections::HashSet<TensorId> = operations
        .iter()
        .filter(|operation| !matches!(operation, OperationIr::Drop(_)))
        .flat_map(|operation| operation.inputs().map(|input| input.id))
        .collect();
    let inputs: Vec<TensorIr> = boundary
        .inputs
        .iter()
        .filter(|input| used.contains(&input.id))
        .cloned()
        .collect();
    let boundary = &SegmentBoundary {
        inputs,
        outputs: boundary.outputs.clone(),
        released_inputs: boundary.released_inputs.clone(),
    };
    let mut lowering =
        Lowering::new(&boundary.inputs, *options).map_err(|reason| LowerError::Invalid {
            index: 0,
            operation: "inputs".into(),
            reason,
        })?;
    // Operations are numbered in the module's metadata without the drops, which lower to
    // nothing: a segment that also releases tensors of earlier segments is the same module, so
    // the same compiled program (a new generation after an old one, say).
    let mut number = 0;
    for (index, operation) in operations.iter().enumerate() {
        lowering.operation = index;
        lowering.builder.op_name = format!("{number}:{}", operation_name(operation));
        if !matches!(operation, OperationIr::Drop(_)) {
            number += 1;
        }
        lowering
            .lower(operation)
            .map_err(|error| error.at(index, operation))?;
    }
    let outputs = boundary
        .outputs
        .iter()
        .map(|tensor| lowering.get(tensor))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| error.at_outputs())?;
    let aliases = (options.donation == Donation::InPlace).then(|| {
        in_place::in_place_outputs(
            operations,
            &boundary.inputs,
            &boundary.outputs,
            &boundary.released_inputs,
        )
    });
    let context::Finished {
        mut module,
        scalars,
        hoisted,
        replica_index,
        random_draws,
        collectives,
        collective_bytes,
    } = lowering.finish(&outputs, boundary, aliases.as_deref());
    let key = StructuralKey::of(&module.encode_to_vec());
    module.name = format!("segment_{key}");
    let bytes = module.encode_to_vec();
    Ok(LoweredProgram {
        module: Arc::new(module),
        bytes: Arc::new(bytes),
        key,
        inputs: boundary.inputs.clone(),
        scalars,
        hoisted,
        operations: 0..operations.len(),
        outputs: boundary.outputs.clone(),
        replica_index,
        random_draws,
        released: boundary.released_inputs.clone(),
        collectives,
        collective_bytes,
    })
}
