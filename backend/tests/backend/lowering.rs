//! The lowering on its own (no plugin): structural keys, hoisted scalars, segment boundaries,
//! the split around operations without a lowering, and module dumps.

use burn::tensor::DType;
use burn_ir::{
    AttentionOpIr, AttentionOptionsIr, BinaryOpIr, CustomOpIr, ModuleOperationIr,
    NumericOperationIr, OperationIr, ScalarIr, ScalarOpIr, TensorId, TensorIr, TensorStatus,
};
use burn_trainium::hlo::{HloModuleProto, PrimitiveType};
use burn_trainium::lower::{
    self, LowerError, LowerOptions, Step, boundary_of, lower_segment, plan_segment,
};
use prost::Message;

fn tensor(id: u64, shape: &[usize], status: TensorStatus) -> TensorIr {
    TensorIr {
        id: TensorId::new(id),
        shape: shape.to_vec().into(),
        status,
        dtype: DType::F32,
    }
}

/// `out = (x * scale + x) ` with ids from `first` on: `x` is an input, used up by the add.
fn scaled_sum(first: u64, shape: &[usize], scale: f64) -> Vec<OperationIr> {
    let x = |status| tensor(first, shape, status);
    let scaled = |status| tensor(first + 1, shape, status);
    let out = tensor(first + 2, shape, TensorStatus::NotInit);
    vec![
        OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::MulScalar(ScalarOpIr {
                lhs: x(TensorStatus::ReadOnly),
                rhs: ScalarIr::Float(scale),
                out: scaled(TensorStatus::NotInit),
            }),
        ),
        OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::Add(BinaryOpIr {
                lhs: scaled(TensorStatus::ReadWrite),
                rhs: x(TensorStatus::ReadWrite),
                out,
            }),
        ),
    ]
}

fn lower(operations: &[OperationIr]) -> lower::LoweredProgram {
    lower_segment(operations, &boundary_of(operations)).expect("lowers")
}

fn entry_computation(program: &lower::LoweredProgram) -> &burn_trainium::hlo::HloComputationProto {
    program
        .module
        .computations
        .iter()
        .find(|computation| computation.id == program.module.entry_computation_id)
        .expect("the module has its entry computation")
}

#[test]
fn the_key_ignores_tensor_ids_and_scalar_values_but_not_shapes() {
    let first = lower(&scaled_sum(10, &[2, 3], 0.1));
    let renumbered = lower(&scaled_sum(500, &[2, 3], 0.7));
    let reshaped = lower(&scaled_sum(10, &[3, 2], 0.1));
    assert_eq!(first.key, renumbered.key);
    assert_eq!(first.bytes, renumbered.bytes);
    assert_ne!(first.key, reshaped.key);
}

#[test]
fn scalars_are_parameters_after_the_inputs() {
    let program = lower(&scaled_sum(10, &[2, 3], 0.25));
    assert_eq!(
        program.inputs.iter().map(|t| t.id).collect::<Vec<_>>(),
        [TensorId::new(10)]
    );
    assert_eq!(
        program.outputs.iter().map(|t| t.id).collect::<Vec<_>>(),
        [TensorId::new(12)]
    );
    assert_eq!(program.released, [TensorId::new(10)]);
    assert_eq!(program.scalars.len(), 1);
    assert_eq!(program.scalars[0].to_vec::<f32>().unwrap(), [0.25]);
    let entry = entry_computation(&program);
    let parameters = entry.program_shape.as_ref().unwrap().parameters.len();
    assert_eq!(parameters, 2, "one input, one scalar pack");
    let donors = program
        .module
        .buffer_donor
        .as_ref()
        .expect("the used-up input is a donor");
    assert_eq!(donors.entries[0].parameter_number, 0);
}

#[test]
fn segments_split_around_operations_without_a_lowering() {
    let mut operations = scaled_sum(10, &[4], 2.0);
    operations.push(OperationIr::Custom(CustomOpIr::new(
        "no_lowering",
        &[tensor(12, &[4], TensorStatus::ReadOnly)],
        &[tensor(20, &[4], TensorStatus::NotInit)],
    )));
    operations.push(OperationIr::NumericFloat(
        DType::F32,
        NumericOperationIr::Add(BinaryOpIr {
            lhs: tensor(12, &[4], TensorStatus::ReadWrite),
            rhs: tensor(20, &[4], TensorStatus::ReadWrite),
            out: tensor(21, &[4], TensorStatus::NotInit),
        }),
    ));
    let error = lower_segment(&operations, &boundary_of(&operations)).unwrap_err();
    assert!(
        matches!(&error, LowerError::Unsupported { index: 2, operation, .. } if operation == "Custom"),
        "{error}"
    );
    let steps = plan_segment(&operations, &LowerOptions::default()).unwrap();
    assert_eq!(steps.len(), 3);
    match (&steps[0], &steps[1], &steps[2]) {
        (Step::Program(first), Step::Fallback(fallback), Step::Program(last)) => {
            assert!(matches!(fallback.as_ref(), OperationIr::Custom(_)));
            assert_eq!(
                first.outputs.iter().map(|t| t.id).collect::<Vec<_>>(),
                [TensorId::new(12)]
            );
            let inputs: Vec<TensorId> = last.inputs.iter().map(|t| t.id).collect();
            assert_eq!(inputs, [TensorId::new(12), TensorId::new(20)]);
        }
        other => panic!("unexpected plan {other:?}"),
    }
}

#[test]
fn dumps_hold_the_module_as_binary_and_text() {
    let folder = tempfile::tempdir().unwrap();
    let program = lower(&scaled_sum(1, &[2], 3.0));
    let binary = lower::dump_module_to(folder.path(), &program).unwrap();
    let decoded = HloModuleProto::decode(std::fs::read(&binary).unwrap().as_slice()).unwrap();
    assert_eq!(decoded, *program.module);
    let text = std::fs::read_to_string(binary.with_extension("txt")).unwrap();
    assert!(
        text.contains("HloModule segment_") && text.contains("multiply("),
        "{text}"
    );
}

/// The attention module on bf16 tensors works in f32: both products, the softmax's maximum and
/// sum, and its exponentials, so its sum over many keys does not stop growing at bf16's rounding
/// step on devices that compute bf16 natively; only the result is rounded to bf16.
#[test]
fn bf16_attention_is_computed_in_f32_and_rounded_once() {
    let bf16 = |id: u64, shape: &[usize], status| TensorIr {
        dtype: DType::BF16,
        ..tensor(id, shape, status)
    };
    let operation = OperationIr::Module(ModuleOperationIr::Attention(AttentionOpIr {
        query: bf16(1, &[1, 2, 3, 4], TensorStatus::ReadOnly),
        key: bf16(2, &[1, 2, 5, 4], TensorStatus::ReadOnly),
        value: bf16(3, &[1, 2, 5, 6], TensorStatus::ReadOnly),
        mask: None,
        attn_bias: Some(bf16(4, &[1, 2, 3, 5], TensorStatus::ReadOnly)),
        options: AttentionOptionsIr {
            scale: None,
            softcap: Some(ScalarIr::Float(2.0)),
            is_causal: true,
        },
        out: bf16(5, &[1, 2, 3, 6], TensorStatus::NotInit),
    }));
    let program = lower(&[operation]);
    let entry = entry_computation(&program);
    let type_of = |instruction: &burn_trainium::hlo::HloInstructionProto| {
        PrimitiveType::try_from(instruction.shape.as_ref().unwrap().element_type).unwrap()
    };
    let mut seen = std::collections::HashMap::new();
    for instruction in &entry.instructions {
        if ["dot", "reduce", "exponential", "divide", "tanh"].contains(&instruction.opcode.as_str())
        {
            *seen.entry(instruction.opcode.as_str()).or_insert(0) += 1;
            assert_eq!(
                type_of(instruction),
                PrimitiveType::F32,
                "{} {}",
                instruction.opcode,
                instruction.name
            );
        }
    }
    assert_eq!(seen.get("dot"), Some(&2), "{seen:?}");
    assert_eq!(seen.get("reduce"), Some(&2), "{seen:?}");
    let root = entry
        .instructions
        .iter()
        .find(|instruction| instruction.id == entry.root_id)
        .unwrap();
    let result = entry
        .instructions
        .iter()
        .find(|instruction| instruction.id == root.operand_ids[0])
        .unwrap();
    assert_eq!(type_of(result), PrimitiveType::Bf16);
}
