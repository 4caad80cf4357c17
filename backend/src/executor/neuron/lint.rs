//! The Neuron lint: every HLO module is checked against what the Neuron SDK documents about
//! `neuronx-cc`'s XLA frontend before the compiler sees it, so a program the compiler would
//! reject (after minutes of compiling) is refused at once, naming the operator, the rule and the
//! Burn operation it came from.
//!
//! [`OPERATORS`] is the operator table: the operators `neuronx-cc`'s documentation lists as
//! supported, and the few it omits that the SDK's own libraries or error codes show it accepts
//! (each with that evidence). [`Rule`] names the other documented constraints. No Neuron compiler
//! is reachable where this was written: on a machine with the SDK, `neuronx-cc list-operators
//! --framework XLA` prints the compiler's own list, against which the table can be checked.
//!
//! Sources (aws-neuron/aws-neuron-sdk, read at the Neuron 2.32 release, compiler 2.27):
//! - the "Supported Operators" section of `release-notes/components/compiler.rst` (XlaBuilder
//!   names, with their restrictions; last extended in 2023 with SelectAndScatter, 2.4.0.21, and
//!   BitcastConvertType, 2.6.0.19), the one list for neuronx-cc (the archived
//!   `neuron-cc-ops-xla.rst` is the Inf1 compiler's);
//! - the compiler's error codes (`compiler/error-codes/`): EVRF006 (RNG algorithms), EVRF015 and
//!   EHCA005 (custom-call targets), EVRF017–019 (reduce-window), EVRF022 (shifts), EVRF063
//!   (reduce-scatter), EMOD025 (dynamic shapes), EVRF001 (unsupported operators);
//! - data types (`about-neuron/arch/neuron-features/data-types.rst`): "On Trn1, 64-bit integers
//!   are always auto-converted to 32-bit integers."
//!
//! Where later evidence contradicts the list's notes (release 2.3.0.4 says `pow()` takes
//! floating-point exponents; NeuronX Distributed Inference's KV cache updates at run-time
//! indices), the lint keeps the documented restriction: the lowering meets it at no cost.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use crate::hlo::{HloComputationProto, HloInstructionProto, HloModuleProto, PrimitiveType};

/// The environment variable that sets what a violation does: `error` (default), `warn`, `off`.
pub const LINT_ENV: &str = crate::settings::NEURON_LINT.name;

/// Why an operator is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acceptance {
    /// On the published list, under this name.
    Listed(&'static str),
    /// Not on the list, which is known to be incomplete; accepted on this evidence.
    Evidence(&'static str),
}

/// One operator of the table: its HLO opcode, why it is accepted, and the restriction the
/// documentation states for it (checked by a [`Rule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operator {
    /// The HLO opcode (`HloInstructionProto.opcode`).
    pub opcode: &'static str,
    /// Why it is accepted.
    pub acceptance: Acceptance,
    /// The documented restriction, if any.
    pub restriction: Option<&'static str>,
}

const fn listed(opcode: &'static str, name: &'static str) -> Operator {
    Operator {
        opcode,
        acceptance: Acceptance::Listed(name),
        restriction: None,
    }
}

const fn restricted(opcode: &'static str, name: &'static str, rule: &'static str) -> Operator {
    Operator {
        opcode,
        acceptance: Acceptance::Listed(name),
        restriction: Some(rule),
    }
}

const fn evidenced(opcode: &'static str, evidence: &'static str) -> Operator {
    Operator {
        opcode,
        acceptance: Acceptance::Evidence(evidence),
        restriction: None,
    }
}

/// The operators `neuronx-cc` accepts, by HLO opcode (see the module's sources).
pub const OPERATORS: &[Operator] = &[
    listed("parameter", "(the arguments of every computation)"),
    listed("abs", "Abs"),
    listed("add", "Add"),
    listed("all-gather", "Allgather"),
    listed("all-reduce", "Allreduce"),
    listed("and", "LogicalAnd"),
    listed("atan2", "Atan2"),
    listed("batch-norm-grad", "Batchnormgrad"),
    listed("batch-norm-inference", "Batchnorminference"),
    listed("batch-norm-training", "Batchnorm"),
    listed("bitcast-convert", "BitcastConvertType"),
    listed("broadcast", "Broadcast, BroadcastInDim"),
    listed("ceil", "Ceil"),
    listed("clamp", "Clamp"),
    listed("compare", "Compare, Eq, Ne, Lt, Le, Gt, Ge"),
    listed("concatenate", "Concatenate"),
    listed("constant", "Constant, ConstantLiteral"),
    listed("convert", "ConvertElementType"),
    listed("cosine", "Cos"),
    restricted(
        "custom-call",
        "Customcall",
        "only the targets the compiler recognizes (EVRF015)",
    ),
    listed("divide", "Div"),
    listed("dot", "Dot, DotGeneral"),
    restricted(
        "dynamic-update-slice",
        "DynamicUpdateSlice",
        "Supports only for constant index",
    ),
    listed("exponential", "Exp"),
    listed("floor", "Floor"),
    restricted(
        "gather",
        "Gather",
        "Supports only disjoint start_index_map and remapped_offset_dims",
    ),
    listed("get-tuple-element", "GetTupleElement"),
    listed("iota", "Iota"),
    listed("log", "Log"),
    listed("maximum", "Max"),
    listed("minimum", "Min"),
    listed("multiply", "Mul"),
    listed("negate", "Neg"),
    listed("not", "LogicalNot"),
    listed("pad", "Pad"),
    restricted(
        "power",
        "Pow",
        "Exponent argument must be a compile-time integer constant",
    ),
    restricted(
        "reduce",
        "Reduce",
        "Min, Max, Add and Mul are the only supported computations",
    ),
    listed("reshape", "Reshape"),
    listed("reverse", "Rev"),
    restricted(
        "rng-bit-generator",
        "RngBitGenerator",
        "RNG_DEFAULT only (EVRF006)",
    ),
    listed("rng", "RngUniform"),
    listed("rsqrt", "Rsqrt"),
    listed("scatter", "Scatter"),
    listed("select", "Select"),
    listed("select-and-scatter", "SelectAndScatter"),
    listed("shift-right-logical", "ShiftRightLogical"),
    listed("sign", "Sign"),
    listed("sine", "Sin"),
    listed("slice", "Slice"),
    listed("sqrt", "Sqrt"),
    listed("subtract", "Sub"),
    listed("tanh", "Tanh"),
    listed("transpose", "Transpose"),
    listed("tuple", "Tuple"),
    evidenced(
        "reduce-scatter",
        "NeuronX Distributed's sequence-parallel layers and ZeRO-1 call xm.reduce_scatter \
         (parallel_layers/comm.py); EVRF063 names float reduce-scatter as supported; release \
         2.30 added coalesced ordered reduce-scatter",
    ),
    evidenced(
        "all-to-all",
        "NeuronX Distributed's expert parallelism calls xm.all_to_all \
         (parallel_layers/mappings.py)",
    ),
    evidenced(
        "dynamic-slice",
        "NeuronX Distributed's blockwise MoE slices with xla dynamic_slice at run-time starts \
         passed as parameters (modules/moe/blockwise.py); release 2.32 lists dynamic_slice",
    ),
    evidenced(
        "opt-barrier",
        "NeuronX Distributed's activation checkpointing (utils/activation_checkpoint.py) wraps \
         torch_xla.utils.checkpoint, which fences the recomputed inputs with \
         xm.optimization_barrier_",
    ),
    evidenced(
        "convolution",
        "the compiler's release notes (release-notes/components/compiler.rst) fix convolution \
         results (a kernel smaller than its dilation) and convolution tiling: the operator \
         itself is compiled",
    ),
    evidenced(
        "reduce-window",
        "EVRF017-019 state what the compiler refuses in reduce-window (dilation, several \
         operands): the operator itself is accepted",
    ),
    evidenced(
        "shift-right-arithmetic",
        "EVRF022 states what the compiler refuses in it (operands other than 32 bits)",
    ),
    evidenced(
        "collective-permute",
        "the Neuron JAX environment-variables page lists it among the collective-compute \
         instructions (NeuronX Distributed itself emulates send/recv with all-gather)",
    ),
    evidenced(
        "while",
        "the Neuron JAX known issues accept while loops of a static trip count",
    ),
];

/// A documented constraint a module can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// The opcode is not in [`OPERATORS`] (EVRF001).
    Operator,
    /// `reduce` (and `reduce-window`, `all-reduce`, `reduce-scatter`) combine only by min, max,
    /// add or multiply.
    ReduceCombiner,
    /// `power` needs a compile-time integer exponent.
    ConstantIntegerExponent,
    /// `dynamic-update-slice` takes constant start indices.
    ConstantIndices,
    /// `rng-bit-generator` uses `RNG_DEFAULT` (EVRF006).
    RngAlgorithm,
    /// `custom-call` only to the targets the compiler recognizes (EVRF015, EHCA005).
    CustomCallTarget,
    /// `reduce-window` without window or base dilation (EVRF017, EVRF018).
    WindowDilation,
    /// Shifts on 32-bit integers at most (EVRF022).
    ShiftWidth,
    /// Every dimension has a static size (EMOD025).
    StaticShape,
    /// No 64-bit integers: trn1 narrows them to 32 bits.
    NoWide64BitIntegers,
}

impl Rule {
    /// What the rule says.
    pub fn description(self) -> &'static str {
        match self {
            Rule::Operator => "not an operator neuronx-cc lists or is known to accept (EVRF001)",
            Rule::ReduceCombiner => {
                "reductions combine only by min, max, add or multiply (Supported operators: Reduce)"
            }
            Rule::ConstantIntegerExponent => {
                "the exponent of power must be a compile-time integer constant (Supported \
                 operators: Pow)"
            }
            Rule::ConstantIndices => {
                "dynamic-update-slice takes constant start indices (Supported operators: \
                 DynamicUpdateSlice)"
            }
            Rule::RngAlgorithm => "rng-bit-generator must use RNG_DEFAULT (EVRF006)",
            Rule::CustomCallTarget => "custom calls only to the Neuron SDK's own targets (EMOD025)",
            Rule::WindowDilation => "reduce-window without dilation (EVRF035)",
            Rule::ShiftWidth => "shifts on 32-bit integers at most",
            Rule::StaticShape => "every dimension must have a static size",
            Rule::NoWide64BitIntegers => {
                "no 64-bit integers: trn1 narrows them to 32 bits (data types)"
            }
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.description())
    }
}

/// The custom-call targets a module may hold: those EVRF015 lists as recognized by the compiler
/// (the NKI kernel calls the SDK's tracer writes among them), and the project's kernel requests,
/// which the tracer replaces by such calls before the compiler runs.
pub const CUSTOM_CALL_TARGETS: &[&str] = &[
    crate::lower::KERNEL_REQUEST_TARGET,
    super::kernels::NEURON_KERNEL_TARGET,
    "AwsNeuronErf",
    "AwsNeuronGelu",
    "AwsNeuronGeluApprxTanh",
    "AwsNeuronGeluBackward",
    "AwsNeuronSilu",
    "AwsNeuronSiluBackward",
    "AwsNeuronRmsNorm",
    "AwsNeuronSoftmax",
    "AwsNeuronSoftmaxBackward",
    "AwsNeuronCollectiveMatmul",
    "AwsNeuronIntMatmult",
    "AwsNeuronArgMax",
    "AwsNeuronArgMin",
    "AwsNeuronTopK",
    "AwsNeuronDropoutMaskV1",
    "AwsNeuronCustomOp",
    "AwsNeuronDevicePrint",
    "ResizeNearest",
    "ResizeBilinear",
    "ResizeNearestGrad",
    "AwsNeuronLNCShardingConstraint",
    "AwsNeuronTransferWithStaticRing",
    "AwsNeuronModuleMarkerStart-Forward",
    "AwsNeuronModuleMarkerStart-Backward",
    "AwsNeuronModuleMarkerEnd-Forward",
    "AwsNeuronModuleMarkerEnd-Backward",
    "NeuronBoundaryMarker-Start",
    "NeuronBoundaryMarker-End",
];

/// One place a module breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The module.
    pub module: String,
    /// The instruction's name.
    pub instruction: String,
    /// Its opcode.
    pub opcode: String,
    /// The rule it breaks.
    pub rule: Rule,
    /// The Burn operation it was lowered from (the instruction's metadata), if recorded.
    pub operation: Option<String>,
    /// What exactly is wrong.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{}: `{}` ({}) breaks the Neuron rule \"{}\": {}",
            self.module, self.opcode, self.instruction, self.rule, self.detail
        )?;
        if let Some(operation) = &self.operation {
            write!(formatter, " (lowered from Burn operation {operation})")?;
        }
        Ok(())
    }
}

/// What a violation does (`HLAT_NEURON_LINT`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LintMode {
    /// The compile is refused with the violations.
    #[default]
    Error,
    /// Each violation is logged as a warning and the module compiled.
    Warn,
    /// Modules are not checked.
    Off,
}

impl FromStr for LintMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "error" => Ok(LintMode::Error),
            "warn" => Ok(LintMode::Warn),
            "off" => Ok(LintMode::Off),
            _ => Err("expected error, warn or off".to_string()),
        }
    }
}

/// Checks `module` against the table and the rules; returns every violation, in instruction
/// order.
pub fn lint_module(module: &HloModuleProto) -> Vec<Violation> {
    let known: HashMap<&str, &Operator> = OPERATORS.iter().map(|o| (o.opcode, o)).collect();
    let computations: HashMap<i64, &HloComputationProto> =
        module.computations.iter().map(|c| (c.id, c)).collect();
    let mut violations = Vec::new();
    for computation in &module.computations {
        let by_id: HashMap<i64, &HloInstructionProto> =
            computation.instructions.iter().map(|i| (i.id, i)).collect();
        for instruction in &computation.instructions {
            let mut report = |rule: Rule, detail: String| {
                violations.push(Violation {
                    module: module.name.clone(),
                    instruction: instruction.name.clone(),
                    opcode: instruction.opcode.clone(),
                    rule,
                    operation: instruction
                        .metadata
                        .as_ref()
                        .map(|metadata| metadata.op_name.clone())
                        .filter(|name| !name.is_empty()),
                    detail,
                })
            };
            let opcode = instruction.opcode.as_str();
            if !known.contains_key(opcode) {
                report(Rule::Operator, format!("`{opcode}` is not in the table"));
            }
            check_shape(instruction, &mut report);
            match opcode {
                "reduce" | "reduce-window" | "all-reduce" | "reduce-scatter" => {
                    let dilated =
                        instruction
                            .window
                            .iter()
                            .flat_map(|w| &w.dimensions)
                            .any(|dimension| {
                                dimension.window_dilation > 1 || dimension.base_dilation > 1
                            });
                    if dilated {
                        report(Rule::WindowDilation, "a dilated window".into());
                    }
                    for called in &instruction.called_computation_ids {
                        let root = computations
                            .get(called)
                            .and_then(|c| c.instructions.iter().find(|i| i.id == c.root_id))
                            .map_or("?", |root| root.opcode.as_str());
                        if !matches!(root, "add" | "maximum" | "minimum" | "multiply") {
                            report(Rule::ReduceCombiner, format!("combines by `{root}`"));
                        }
                    }
                }
                "power" => {
                    let exponent = instruction.operand_ids.get(1).map(|&id| origin(&by_id, id));
                    match exponent {
                        Some(source) if source.opcode == "constant" => {
                            if !integer_literal(source) {
                                report(
                                    Rule::ConstantIntegerExponent,
                                    "the constant exponent is not an integer".into(),
                                );
                            }
                        }
                        _ => report(
                            Rule::ConstantIntegerExponent,
                            "the exponent is computed at run time".into(),
                        ),
                    }
                }
                // Only the update's indices: NeuronX Distributed slices at run-time starts.
                "dynamic-update-slice" => {
                    for &id in instruction.operand_ids.iter().skip(2) {
                        let source = origin(&by_id, id);
                        if source.opcode != "constant" {
                            report(
                                Rule::ConstantIndices,
                                format!("a start index comes from `{}`", source.opcode),
                            );
                        }
                    }
                }
                "rng-bit-generator" if instruction.rng_algorithm != RNG_DEFAULT => report(
                    Rule::RngAlgorithm,
                    format!("algorithm {}", instruction.rng_algorithm),
                ),
                "custom-call"
                    if !CUSTOM_CALL_TARGETS.contains(&instruction.custom_call_target.as_str()) =>
                {
                    report(
                        Rule::CustomCallTarget,
                        format!("target `{}`", instruction.custom_call_target),
                    )
                }
                "shift-left" | "shift-right-logical" | "shift-right-arithmetic" => {
                    let wide = instruction.shape.as_ref().is_some_and(|shape| {
                        matches!(
                            PrimitiveType::try_from(shape.element_type),
                            Ok(PrimitiveType::S64 | PrimitiveType::U64)
                        )
                    });
                    if wide {
                        report(Rule::ShiftWidth, "a 64-bit shift".into());
                    }
                }
                _ => {}
            }
        }
    }
    violations
}

/// `xla.RandomAlgorithm::RNG_DEFAULT`.
const RNG_DEFAULT: i32 = 0;

/// Reports dynamic dimensions and 64-bit integers in the instruction's shape.
fn check_shape(instruction: &HloInstructionProto, report: &mut impl FnMut(Rule, String)) {
    let mut pending: Vec<_> = instruction.shape.iter().collect();
    while let Some(shape) = pending.pop() {
        pending.extend(&shape.tuple_shapes);
        if shape.dimensions.iter().any(|&size| size < 0) {
            report(
                Rule::StaticShape,
                format!("dimensions {:?}", shape.dimensions),
            );
        }
        if let Ok(wide @ (PrimitiveType::S64 | PrimitiveType::U64)) =
            PrimitiveType::try_from(shape.element_type)
        {
            report(Rule::NoWide64BitIntegers, format!("an {wide:?} result"));
        }
    }
}

/// The instruction a value comes from, looking through operations that only move or convert
/// it (a broadcast constant is a constant).
fn origin<'a>(
    by_id: &HashMap<i64, &'a HloInstructionProto>,
    mut id: i64,
) -> &'a HloInstructionProto {
    loop {
        let instruction = by_id[&id];
        match instruction.opcode.as_str() {
            "broadcast" | "reshape" | "convert" | "slice" | "transpose" => {
                id = instruction.operand_ids[0]
            }
            _ => return instruction,
        }
    }
}

/// Whether a constant holds only integer values.
fn integer_literal(constant: &HloInstructionProto) -> bool {
    let Some(literal) = &constant.literal else {
        return false;
    };
    let pairs = |bytes: &[u8], decode: fn([u8; 2]) -> f64| -> Vec<f64> {
        bytes
            .chunks_exact(2)
            .map(|pair| decode([pair[0], pair[1]]))
            .collect()
    };
    let bf16s = pairs(&literal.bf16s, |bytes| {
        half::bf16::from_le_bytes(bytes).to_f64()
    });
    let f16s = pairs(&literal.f16s, |bytes| {
        half::f16::from_le_bytes(bytes).to_f64()
    });
    literal
        .f32s
        .iter()
        .map(|&value| value as f64)
        .chain(literal.f64s.iter().copied())
        .chain(bf16s)
        .chain(f16s)
        .all(|value| value.fract() == 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlo::{self, WindowDimension};
    use crate::lower::builder::{Builder, Combiner, Direction, Value};

    /// A module of one computation built by `build` from an `f32[4]` parameter, then edited by
    /// `edit` (for what the builder never writes).
    fn module(
        build: impl FnOnce(&mut Builder, &Value) -> Value,
        edit: impl FnOnce(&mut HloModuleProto),
    ) -> HloModuleProto {
        let mut builder = Builder::default();
        builder.op_name = "0:Float::Test".into();
        let x = builder.parameter(0, PrimitiveType::F32, &[4]);
        let out = build(&mut builder, &x);
        let mut module = builder.finish(
            "test",
            vec![hlo::array_shape(PrimitiveType::F32, &[4])],
            &[out],
        );
        edit(&mut module);
        module
    }

    /// The instruction of `opcode` in `module`.
    fn instruction<'a>(
        module: &'a mut HloModuleProto,
        opcode: &str,
    ) -> &'a mut HloInstructionProto {
        module
            .computations
            .iter_mut()
            .flat_map(|c| &mut c.instructions)
            .find(|i| i.opcode == opcode)
            .expect("the module has the instruction")
    }

    #[test]
    fn listed_operators_within_their_restrictions_pass() {
        let module = module(
            |b, x| {
                let root = b.unary("rsqrt", x);
                let two = b.filled(PrimitiveType::F32, 2.0, &[4]);
                let squared = b.binary("power", &root, &two);
                let sum = b.reduce(&squared, 0.0, &[0], Combiner::Add);
                let sum = b.broadcast(&sum, &[4], &[]);
                b.binary("add", &squared, &sum)
            },
            |_| {},
        );
        assert_eq!(lint_module(&module), []);
    }

    #[test]
    fn each_rule_is_named_where_it_is_broken() {
        type Build = Box<dyn FnOnce(&mut Builder, &Value) -> Value>;
        type Edit = Box<dyn FnOnce(&mut HloModuleProto)>;
        let keep: fn() -> Edit = || Box::new(|_| {});
        let negate: fn() -> Build = || Box::new(|b, x| b.unary("negate", x));
        let cases: Vec<(Rule, Build, Edit)> = vec![
            (
                Rule::Operator,
                Box::new(|b, x| {
                    let id = b.replica_id();
                    let id = b.convert(&id, PrimitiveType::F32);
                    let id = b.broadcast(&id, &[4], &[]);
                    b.binary("add", x, &id)
                }),
                keep(),
            ),
            (
                Rule::ReduceCombiner,
                Box::new(|b, x| {
                    let zero = b.filled(PrimitiveType::F32, 0.0, &[4]);
                    let positive = b.compare(Direction::Gt, x, &zero);
                    let any = b.reduce(&positive, 0.0, &[0], Combiner::Or);
                    let any = b.convert(&any, PrimitiveType::F32);
                    let any = b.broadcast(&any, &[4], &[]);
                    b.binary("add", x, &any)
                }),
                keep(),
            ),
            (
                Rule::ConstantIntegerExponent,
                Box::new(|b, x| {
                    let exponent = b.filled(PrimitiveType::F32, -0.5, &[4]);
                    b.binary("power", x, &exponent)
                }),
                keep(),
            ),
            (
                Rule::ConstantIntegerExponent,
                Box::new(|b, x| b.binary("power", x, x)),
                keep(),
            ),
            (
                Rule::ConstantIndices,
                Box::new(|b, x| {
                    let index = b.convert(x, PrimitiveType::S32);
                    let index = b.slice(&index, &[0], &[1], &[1]);
                    let index = b.reshape(&index, &[]);
                    let piece = b.dynamic_slice(x, &[index], &[4]);
                    b.binary("add", x, &piece)
                }),
                // The slice made an update at a run-time index.
                Box::new(|m| {
                    let slice = instruction(m, "dynamic-slice");
                    let (operand, index) = (slice.operand_ids[0], slice.operand_ids[1]);
                    slice.opcode = "dynamic-update-slice".into();
                    slice.operand_ids = vec![operand, operand, index];
                }),
            ),
            (
                Rule::RngAlgorithm,
                Box::new(|b, x| {
                    let state = b.filled(PrimitiveType::U32, 7.0, &[4]);
                    let bits = b.random_bits(&state, &[4]);
                    let bits = b.convert(&bits, PrimitiveType::F32);
                    b.binary("add", x, &bits)
                }),
                keep(),
            ),
            (
                Rule::CustomCallTarget,
                negate(),
                Box::new(|m| {
                    let call = instruction(m, "negate");
                    call.opcode = "custom-call".into();
                    call.custom_call_target = "MyKernel".into();
                }),
            ),
            (
                Rule::WindowDilation,
                Box::new(|b, x| {
                    let sum = b.reduce(x, 0.0, &[0], Combiner::Add);
                    b.broadcast(&sum, &[4], &[])
                }),
                Box::new(|m| {
                    let reduce = instruction(m, "reduce");
                    reduce.opcode = "reduce-window".into();
                    reduce.window = Some(hlo::Window {
                        dimensions: vec![WindowDimension {
                            size: 2,
                            stride: 1,
                            window_dilation: 2,
                            base_dilation: 1,
                            ..Default::default()
                        }],
                    });
                }),
            ),
            (
                Rule::ShiftWidth,
                negate(),
                Box::new(|m| {
                    let shift = instruction(m, "negate");
                    shift.opcode = "shift-right-logical".into();
                    shift.shape = Some(hlo::array_shape(PrimitiveType::U64, &[4]));
                }),
            ),
            (
                Rule::StaticShape,
                negate(),
                Box::new(|m| {
                    instruction(m, "negate").shape =
                        Some(hlo::array_shape(PrimitiveType::F32, &[-1]));
                }),
            ),
            (
                Rule::NoWide64BitIntegers,
                Box::new(|b, x| {
                    let wide = b.convert(x, PrimitiveType::S64);
                    b.convert(&wide, PrimitiveType::F32)
                }),
                keep(),
            ),
        ];
        for (rule, build, edit) in cases {
            let module = module(build, edit);
            let violations = lint_module(&module);
            let violation = violations
                .iter()
                .find(|v| v.rule == rule)
                .unwrap_or_else(|| panic!("{rule:?} not found in {violations:?}"));
            // The message names the operator, the rule and the Burn operation.
            let message = violation.to_string();
            assert!(
                message.contains(&format!("`{}`", violation.opcode)),
                "{message}"
            );
            assert!(message.contains(rule.description()), "{message}");
            assert!(message.contains("Float::Test"), "{message}");
        }
    }

    #[test]
    fn the_table_cites_evidence_for_every_unlisted_operator() {
        let mut seen = std::collections::HashSet::new();
        for operator in OPERATORS {
            assert!(seen.insert(operator.opcode), "{} twice", operator.opcode);
            if let Acceptance::Evidence(evidence) = operator.acceptance {
                assert!(evidence.len() > 40, "{}: {evidence}", operator.opcode);
            }
        }
        for undocumented in [
            "replica-id",
            "partition-id",
            "or",
            "xor",
            "remainder",
            "erf",
        ] {
            assert!(!seen.contains(undocumented), "{undocumented}");
        }
    }

    #[test]
    fn lint_modes_parse_and_bad_ones_are_named() {
        assert_eq!("warn".parse::<LintMode>(), Ok(LintMode::Warn));
        assert_eq!("off".parse::<LintMode>(), Ok(LintMode::Off));
        assert_eq!("error".parse::<LintMode>(), Ok(LintMode::Error));
        assert!("strict".parse::<LintMode>().is_err());
    }
}
