//! The lowering on its own (no plugin): structural keys, hoisted scalars, segment boundaries,
//! the split around operations without a lowering, and module dumps.

use burn::tensor::DType;
use burn_ir::{
    AttentionOpIr, AttentionOptionsIr, BinaryOpIr, CustomOpIr, ModuleOperationIr,
    NumericOperationIr, OperationIr, ScalarIr, ScalarOpIr, TensorId, TensorIr, TensorStatus,
};
use burn_trainium::collective::{Collective, ReplicaGroups, SourceTargetPairs};
use burn_trainium::hlo::{HloModuleProto, PrimitiveType};
use burn_trainium::lower::{
    self, LowerError, LowerOptions, OperatorRules, Step, boundary_of, lower_segment, plan_segment,
};
use burn_trainium::neuron::{Rule, lint_module};
use prost::Message;

use super::support::tensor;

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
    assert_eq!(program.scalars[0].try_to_vec::<f32>().unwrap(), [0.25]);
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

/// A bf16 tensor of `shape`.
fn bf16(id: u64, shape: &[usize], status: TensorStatus) -> TensorIr {
    TensorIr {
        dtype: DType::BF16,
        ..tensor(id, shape, status)
    }
}

/// The products and conversions of the entry computation when `operations` are lowered under
/// `rules`, with their element types.
fn product_types(operations: &[OperationIr], rules: OperatorRules) -> Vec<(String, PrimitiveType)> {
    let options = LowerOptions {
        rules,
        ..LowerOptions::default()
    };
    let program =
        lower::lower_segment_with(operations, &boundary_of(operations), &options).unwrap();
    entry_computation(&program)
        .instructions
        .iter()
        .filter(|instruction| ["dot", "convert"].contains(&instruction.opcode.as_str()))
        .map(|instruction| {
            let shape = instruction.shape.as_ref().unwrap();
            let element_type = PrimitiveType::try_from(shape.element_type).unwrap();
            (instruction.opcode.clone(), element_type)
        })
        .collect()
}

/// A bf16 matrix product is written for XLA as bf16 × bf16 → f32 and rounded once (the form
/// XLA CPU's matrix library runs with the CPU's bf16 instructions), and for `neuronx-cc` as the
/// bf16 product it was.
#[test]
fn bf16_matrix_products_sum_in_f32_for_xla_alone() {
    let operations = [OperationIr::Float(
        DType::BF16,
        burn_ir::FloatOperationIr::Matmul(burn_ir::MatmulOpIr {
            lhs: bf16(1, &[8, 16], TensorStatus::ReadOnly),
            rhs: bf16(2, &[16, 8], TensorStatus::ReadOnly),
            out: bf16(3, &[8, 8], TensorStatus::NotInit),
        }),
    )];
    for (rules, summed_in) in [
        (OperatorRules::Xla, PrimitiveType::F32),
        (OperatorRules::Neuron, PrimitiveType::Bf16),
    ] {
        let expected = match summed_in {
            PrimitiveType::F32 => vec![
                ("dot".to_string(), PrimitiveType::F32),
                ("convert".to_string(), PrimitiveType::Bf16),
            ],
            _ => vec![("dot".to_string(), PrimitiveType::Bf16)],
        };
        assert_eq!(product_types(&operations, rules), expected, "{rules:?}");
    }
}

/// A product the library refuses keeps its bf16 result: XLA CPU's own dot cannot run bf16 ×
/// bf16 → f32 (a bf16-mixed step of a small model stopped with "Unsupported element type for
/// DotThunk"). A linear layer's weight gradient `xᵀ g` contracts the first dimension of both
/// operands, a column-major left side.
#[test]
fn a_bf16_weight_gradient_keeps_its_bf16_product() {
    let operations = [OperationIr::Module(
        ModuleOperationIr::LinearWeightBackward(burn_ir::LinearWeightBackwardOpIr {
            x: bf16(1, &[64, 32], TensorStatus::ReadOnly),
            output_grad: bf16(2, &[64, 16], TensorStatus::ReadOnly),
            out: bf16(3, &[32, 16], TensorStatus::NotInit),
        }),
    )];
    assert_eq!(
        product_types(&operations, OperatorRules::Xla),
        [("dot".to_string(), PrimitiveType::Bf16)]
    );
}

/// Causal attention of `dtype` tensors, `queries` and `keys` positions, heads `width` wide.
fn causal_attention(dtype: DType, queries: usize, keys: usize, width: usize) -> AttentionOpIr {
    let typed = |id: u64, shape: &[usize], status| TensorIr {
        dtype,
        ..tensor(id, shape, status)
    };
    AttentionOpIr {
        query: typed(1, &[1, 2, queries, width], TensorStatus::ReadOnly),
        key: typed(2, &[1, 2, keys, width], TensorStatus::ReadOnly),
        value: typed(3, &[1, 2, keys, width], TensorStatus::ReadOnly),
        mask: None,
        attn_bias: None,
        options: AttentionOptionsIr {
            scale: Some(ScalarIr::Float(0.5)),
            softcap: None,
            is_causal: true,
        },
        out: typed(5, &[1, 2, queries, width], TensorStatus::NotInit),
    }
}

/// The entry computation's custom calls and products when `attention` is lowered with `lowering`.
fn lowered_attention(
    attention: AttentionOpIr,
    lowering: lower::AttentionLowering,
) -> (Vec<burn_trainium::hlo::HloInstructionProto>, usize) {
    let operations = [OperationIr::Module(ModuleOperationIr::Attention(attention))];
    let options = LowerOptions {
        attention: lowering,
        ..LowerOptions::default()
    };
    let program = lower::lower_segment_with(&operations, &boundary_of(&operations), &options)
        .expect("lowers");
    let entry = entry_computation(&program);
    let calls = entry
        .instructions
        .iter()
        .filter(|instruction| instruction.opcode == "custom-call")
        .cloned()
        .collect();
    let products = entry
        .instructions
        .iter()
        .filter(|instruction| instruction.opcode == "dot")
        .count();
    (calls, products)
}

/// With the Neuron flash lowering, attention the SDK's `flash_fwd` computes is one kernel request
/// on the kernel's layouts (queries and keys transposed to `[batch, heads, width, positions]`);
/// anything else, and every attention under the portable lowering, keeps HLO's products.
#[test]
fn neuron_flash_attention_is_a_kernel_request_where_the_kernel_computes_the_same() {
    use lower::AttentionLowering::{NeuronFlash, Portable};

    let operations = [OperationIr::Module(ModuleOperationIr::Attention(
        causal_attention(DType::F32, 512, 512, 32),
    ))];
    let options = LowerOptions {
        attention: NeuronFlash,
        ..LowerOptions::default()
    };
    let program =
        lower::lower_segment_with(&operations, &boundary_of(&operations), &options).unwrap();
    let entry = entry_computation(&program);
    let by_id = |id: i64| {
        entry
            .instructions
            .iter()
            .find(|instruction| instruction.id == id)
            .unwrap()
    };
    let calls: Vec<_> = entry
        .instructions
        .iter()
        .filter(|instruction| instruction.opcode == "custom-call")
        .collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].custom_call_target, lower::KERNEL_REQUEST_TARGET);
    assert!(entry.instructions.iter().all(|i| i.opcode != "dot"));
    let operands: Vec<_> = calls[0].operand_ids.iter().map(|&id| by_id(id)).collect();
    for operand in &operands[..2] {
        assert_eq!(operand.opcode, "transpose");
        assert_eq!(operand.dimensions, [0, 1, 3, 2]);
    }
    let key = by_id(operands[1].operand_ids[0]);
    assert_eq!(
        (key.opcode.as_str(), key.parameter_number),
        ("parameter", 1)
    );
    // The given scale (0.5, a hoisted scalar) reaches the kernel as a factor on the queries:
    // 0.5 · √32 times the queries, then the kernel's own 1/√32.
    let scaled = by_id(operands[0].operand_ids[0]);
    assert_eq!(scaled.opcode, "multiply");
    let [query, ratio] = [0, 1].map(|index| by_id(scaled.operand_ids[index]));
    assert_eq!(
        (query.opcode.as_str(), query.parameter_number),
        ("parameter", 0)
    );
    assert_eq!(ratio.opcode, "multiply");
    assert_eq!(
        (operands[2].opcode.as_str(), operands[2].parameter_number),
        ("parameter", 2)
    );
    assert_eq!(operands.len(), 3, "inference takes no dropout seed");
    let request = lower::KernelRequest::of_instruction(calls[0])
        .unwrap()
        .unwrap();
    assert_eq!(request.kernel, "flash_fwd");
    assert_eq!(request.grid, [1, 2]);
    assert_eq!(request.inputs[0].shape, [1, 2, 32, 512]);
    assert_eq!(request.inputs[2].shape, [1, 2, 512, 32]);
    assert_eq!(request.outputs[0].dtype, "float32");
    let kernel_scale = request.arguments["softmax_scale"].as_f64().unwrap();
    assert!(
        (kernel_scale - 1.0 / 32f64.sqrt()).abs() < 1e-15,
        "the kernel's scale depends on the shape alone: {kernel_scale}"
    );
    assert_eq!(request.arguments["mixed_precision"], false);
    assert_eq!(request.arguments["seq_tile_size"], 512);
    assert_eq!(request.arguments["training"], false);
    // 4096 positions run in the kernel's default tile.
    let (calls, _) = lowered_attention(causal_attention(DType::BF16, 4096, 4096, 8), NeuronFlash);
    let request = lower::KernelRequest::of_instruction(&calls[0])
        .unwrap()
        .unwrap();
    assert_eq!(request.arguments["seq_tile_size"], 2048);
    assert_eq!(request.arguments["mixed_precision"], true);

    // The portable lowering never asks for the kernel.
    let (calls, products) = lowered_attention(causal_attention(DType::F32, 512, 512, 32), Portable);
    assert_eq!((calls.len(), products), (0, 2));
    // What the kernel does not compute stays portable.
    let not_causal = AttentionOpIr {
        options: AttentionOptionsIr {
            is_causal: false,
            ..causal_attention(DType::F32, 512, 512, 32).options
        },
        ..causal_attention(DType::F32, 512, 512, 32)
    };
    let masked = AttentionOpIr {
        mask: Some(TensorIr {
            dtype: DType::Bool(burn::tensor::BoolStore::Native),
            ..tensor(4, &[1, 2, 512, 512], TensorStatus::ReadOnly)
        }),
        ..causal_attention(DType::F32, 512, 512, 32)
    };
    let soft_capped = AttentionOpIr {
        options: AttentionOptionsIr {
            softcap: Some(ScalarIr::Float(30.0)),
            ..causal_attention(DType::F32, 512, 512, 32).options
        },
        ..causal_attention(DType::F32, 512, 512, 32)
    };
    for (case, attention) in [
        ("not causal", not_causal),
        ("masked", masked),
        ("soft capped", soft_capped),
        ("500 positions", causal_attention(DType::F32, 500, 500, 32)),
        (
            "fewer queries than keys",
            causal_attention(DType::F32, 512, 1024, 32),
        ),
        (
            "heads 256 wide",
            causal_attention(DType::F32, 512, 512, 256),
        ),
        ("f16", causal_attention(DType::F16, 512, 512, 32)),
    ] {
        let (calls, products) = lowered_attention(attention, NeuronFlash);
        assert_eq!((calls.len(), products), (0, 2), "{case}");
    }
}

/// Causal self-attention over 1,100 positions is lowered by query blocks of 512: three blocks
/// (512, 512 and 76 queries over 512, 1,024 and 1,100 keys), no product of all queries with all
/// keys, the scale hoisted once; over 512 positions it stays one piece.
#[test]
fn long_causal_attention_is_lowered_by_query_blocks() {
    let operations = [OperationIr::Module(ModuleOperationIr::Attention(
        causal_attention(DType::F32, 1100, 1100, 8),
    ))];
    let program = lower(&operations);
    let entry = entry_computation(&program);
    let score_shapes: Vec<Vec<i64>> = entry
        .instructions
        .iter()
        .filter(|instruction| instruction.opcode == "dot")
        .map(|instruction| instruction.shape.as_ref().unwrap().dimensions.clone())
        .filter(|dims| dims[3] != 8)
        .collect();
    assert_eq!(
        score_shapes,
        [
            vec![1, 2, 512, 512],
            vec![1, 2, 512, 1024],
            vec![1, 2, 76, 1100]
        ]
    );
    assert_eq!(program.hoisted.iter().map(Vec::len).sum::<usize>(), 1);
    assert!(
        entry
            .instructions
            .iter()
            .any(|instruction| instruction.opcode == "concatenate")
    );
    let (_, products) = lowered_attention(
        causal_attention(DType::F32, 512, 512, 8),
        lower::AttentionLowering::Portable,
    );
    assert_eq!(products, 2);
}

/// The opcodes of every instruction of `program`.
fn opcodes(program: &lower::LoweredProgram) -> Vec<String> {
    program
        .module
        .computations
        .iter()
        .flat_map(|computation| &computation.instructions)
        .map(|instruction| instruction.opcode.clone())
        .collect()
}

/// `collective` of a `dtype[4, 8]` on 4 replicas, lowered under `rules`.
fn lowered_collective(
    collective: Collective,
    dtype: DType,
    rules: OperatorRules,
) -> lower::LoweredProgram {
    let typed = |id, shape: &[usize], status| TensorIr {
        dtype,
        ..tensor(id, shape, status)
    };
    let output = collective.output_shape(&[4, 8]).unwrap();
    let custom = collective.to_ir(
        vec![typed(1, &[4, 8], TensorStatus::ReadOnly)],
        vec![typed(2, &output, TensorStatus::NotInit)],
    );
    let operations = [OperationIr::Custom(custom)];
    let options = LowerOptions {
        replicas: 4,
        rules,
        ..LowerOptions::default()
    };
    lower::lower_segment_with(&operations, &boundary_of(&operations), &options).unwrap()
}

/// `split` of an `f32[4, 8]` along dimension 1 over tensor-parallel pairs of 4 replicas, lowered
/// under `rules`.
fn lowered_split(rules: OperatorRules) -> lower::LoweredProgram {
    let groups = ReplicaGroups::contiguous(4, 2).unwrap();
    lowered_collective(Collective::Split { dim: 1, groups }, DType::F32, rules)
}

/// A permute is one `collective-permute` of the operand's type (bf16 stays bf16: nothing is
/// reduced) carrying its source–target pairs, without a channel id (with one, XLA would read
/// the pairs as partition ids), under both rules; the lint accepts it; it is counted as a
/// collective of the input's bytes.
#[test]
fn the_permute_is_one_collective_permute_of_replica_pairs() {
    let stages = SourceTargetPairs::shift(&ReplicaGroups::all(4), 1, false);
    for rules in [OperatorRules::Xla, OperatorRules::Neuron] {
        for (dtype, element_type) in [
            (DType::F32, PrimitiveType::F32),
            (DType::BF16, PrimitiveType::Bf16),
        ] {
            let pairs = stages.clone();
            let program = lowered_collective(Collective::Permute { pairs }, dtype, rules);
            let permutes: Vec<_> = entry_computation(&program)
                .instructions
                .iter()
                .filter(|instruction| instruction.opcode == "collective-permute")
                .collect();
            assert_eq!(permutes.len(), 1, "{:?}", opcodes(&program));
            let permute = permutes[0];
            let pairs: Vec<(i64, i64)> = permute
                .source_target_pairs
                .iter()
                .map(|pair| (pair.source, pair.target))
                .collect();
            assert_eq!(pairs, [(0, 1), (1, 2), (2, 3)]);
            assert_eq!(permute.channel_id, 0);
            assert!(permute.replica_groups.is_empty() && !permute.use_global_device_ids);
            let shape = permute.shape.as_ref().unwrap();
            assert_eq!(
                (shape.element_type, shape.dimensions.as_slice()),
                (element_type as i32, &[4i64, 8][..])
            );
            assert!(!opcodes(&program).iter().any(|op| op == "convert"));
            assert_eq!(lint_module(&program.module), []);
            assert_eq!(program.collectives, 1);
            assert_eq!(program.collective_bytes, 32 * dtype.size() as u64);
        }
    }
}

/// Under Neuron's rules the split reads the replica's index from a parameter of its own and
/// selects among slices at constant offsets: no `replica-id`, no `dynamic-slice`, and the lint
/// finds nothing; XLA's lowering keeps `replica-id` (which the lint names).
#[test]
fn the_split_under_neuron_rules_needs_no_replica_id() {
    let neuron = lowered_split(OperatorRules::Neuron);
    assert!(neuron.replica_index);
    let found = opcodes(&neuron);
    assert!(
        !found
            .iter()
            .any(|op| op == "replica-id" || op == "dynamic-slice"),
        "{found:?}"
    );
    let parameters = entry_computation(&neuron).program_shape.as_ref().unwrap();
    let index = parameters.parameters.last().unwrap();
    assert_eq!(
        (index.element_type, index.dimensions.as_slice()),
        (PrimitiveType::S32 as i32, &[1i64][..])
    );
    assert_eq!(lint_module(&neuron.module), []);

    let xla = lowered_split(OperatorRules::Xla);
    assert!(!xla.replica_index);
    assert!(opcodes(&xla).iter().any(|op| op == "replica-id"));
    let rules: Vec<Rule> = lint_module(&xla.module).iter().map(|v| v.rule).collect();
    assert_eq!(rules, [Rule::Operator], "replica-id");
}

/// `x ^ e` for a scalar exponent, lowered under `rules`.
fn lowered_power(exponent: f64, rules: OperatorRules) -> lower::LoweredProgram {
    let operations = [OperationIr::Float(
        DType::F32,
        burn_ir::FloatOperationIr::PowfScalar(ScalarOpIr {
            lhs: tensor(1, &[4], TensorStatus::ReadOnly),
            rhs: ScalarIr::Float(exponent),
            out: tensor(2, &[4], TensorStatus::NotInit),
        }),
    )];
    let options = LowerOptions {
        rules,
        ..LowerOptions::default()
    };
    lower::lower_segment_with(&operations, &boundary_of(&operations), &options).unwrap()
}

/// Powers under Neuron's rules in the operators its compiler lists: ±½ as `sqrt` / `rsqrt`, a
/// fraction as `exp(e · log x)`, an integer as `power` of a constant integer (which the rule
/// allows); under XLA's, `power` whatever the exponent.
#[test]
fn powers_lower_to_listed_operators() {
    let count = |program: &lower::LoweredProgram, opcode: &str| {
        opcodes(program).iter().filter(|op| *op == opcode).count()
    };
    let neuron = |exponent| lowered_power(exponent, OperatorRules::Neuron);
    assert_eq!(count(&neuron(-0.5), "rsqrt"), 1);
    assert_eq!(count(&neuron(0.5), "sqrt"), 1);
    let fraction = neuron(0.3);
    assert_eq!(
        (count(&fraction, "log"), count(&fraction, "exponential")),
        (1, 1)
    );
    for exponent in [-0.5, 0.5, 0.3, 3.0, -2.0] {
        assert_eq!(lint_module(&neuron(exponent).module), [], "{exponent}");
    }
    assert_eq!(count(&neuron(3.0), "power"), 1);
    for exponent in [-0.5, 0.3, 3.0] {
        assert_eq!(
            count(&lowered_power(exponent, OperatorRules::Xla), "power"),
            1
        );
    }
    assert_eq!(
        lint_module(&lowered_power(0.3, OperatorRules::Xla).module)[0].rule,
        Rule::ConstantIntegerExponent
    );
}
