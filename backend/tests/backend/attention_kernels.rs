//! The fused attention lowered to vendor kernels.
//!
//! - For XLA's CUDA plugin (`FusedAttentionLowering::Cudnn`): cuDNN's flash-attention calls
//!   exactly as JAX emits them (`fixtures/cudnn-attention`, made by `jax.export` with
//!   `platforms=["cuda"]`: target, operands, layouts, API version, backend configuration).
//! - For `neuron` (`FusedAttentionLowering::NeuronFlash`): requests for the Neuron SDK's
//!   `flash_fwd` in training and `flash_attn_bwd`, in the kernels' layouts, accepted by the
//!   Neuron lint.
//!
//! Neither module holds a `[batch, heads, queries, keys]` buffer, and what a kernel does not
//! compute is lowered as the blocked form.

use std::path::{Path, PathBuf};

use burn::tensor::DType;
use burn_trainium::attention::FusedAttentionOptions;
use burn_trainium::hlo::{HloInstructionProto, HloModuleProto, ShapeProto};
use burn_trainium::lower::{
    CUDNN_BACKWARD_TARGET, CUDNN_FORWARD_TARGET, FusedAttentionLowering, KernelRequest,
    KernelTensor, LowerOptions, LoweredProgram, OperatorRules, boundary_of, lower_segment_with,
};
use burn_trainium::neuron::lint_module;
use prost::Message;
use serde::Deserialize;

use super::fused_attention::{Case, attention_operations};

/// One case of `fixtures/cudnn-attention/cases.json`.
#[derive(Debug, Deserialize)]
struct FixtureCase {
    name: String,
    batch: usize,
    queries: usize,
    keys: usize,
    heads: usize,
    kv_heads: usize,
    depth: usize,
    dtype: String,
    causal: bool,
    window: Option<usize>,
    scale: Option<f64>,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/cudnn-attention")
}

/// `case`'s forward and backward passes lowered with `lowering` (and Neuron's operator rules
/// for Neuron's kernels).
fn lowered(
    case: &Case,
    batch: usize,
    dtype: DType,
    lowering: FusedAttentionLowering,
) -> LoweredProgram {
    let operations = attention_operations(case, batch, dtype);
    let rules = match lowering {
        FusedAttentionLowering::NeuronFlash => OperatorRules::Neuron,
        _ => OperatorRules::Xla,
    };
    let options = LowerOptions {
        fused_attention: lowering,
        rules,
        ..LowerOptions::default()
    };
    lower_segment_with(&operations, &boundary_of(&operations), &options)
        .expect("the attention lowers")
}

fn instructions(module: &HloModuleProto) -> impl Iterator<Item = &HloInstructionProto> {
    module.computations.iter().flat_map(|c| &c.instructions)
}

/// The custom call to `target` in `module` (exactly one).
fn call<'m>(module: &'m HloModuleProto, target: &str) -> &'m HloInstructionProto {
    let calls: Vec<_> = instructions(module)
        .filter(|instruction| instruction.custom_call_target == target)
        .collect();
    assert_eq!(calls.len(), 1, "calls to {target}");
    calls[0]
}

/// A shape as element type, dimensions and layout, elements of a tuple in order.
fn laid_out(shape: &ShapeProto) -> Vec<(i32, Vec<i64>, Vec<i64>)> {
    if shape.tuple_shapes.is_empty() {
        let layout = shape
            .layout
            .as_ref()
            .map(|layout| layout.minor_to_major.clone());
        return vec![(
            shape.element_type,
            shape.dimensions.clone(),
            layout.unwrap_or_default(),
        )];
    }
    shape.tuple_shapes.iter().flat_map(laid_out).collect()
}

/// What two calls must agree on: target, operand shapes and layouts, result shapes and layouts,
/// constrained layouts, API version, and the backend configuration as JSON.
fn assert_same_call(ours: &HloInstructionProto, jax: &HloInstructionProto, case: &str) {
    let target = &jax.custom_call_target;
    assert_eq!(ours.custom_call_target, *target, "{case}");
    let operands = |call: &HloInstructionProto| {
        let shapes: Vec<_> = call
            .operand_shapes_with_layout
            .iter()
            .flat_map(laid_out)
            .collect();
        assert_eq!(
            shapes.len(),
            call.operand_ids.len(),
            "{case}: {target}'s operand layouts"
        );
        shapes
    };
    assert_eq!(operands(ours), operands(jax), "{case}: {target}'s operands");
    let results = |call: &HloInstructionProto| laid_out(call.shape.as_ref().unwrap());
    assert_eq!(results(ours), results(jax), "{case}: {target}'s results");
    assert!(
        jax.constrain_layout && ours.constrain_layout,
        "{case}: {target}"
    );
    assert_eq!(
        ours.custom_call_api_version, jax.custom_call_api_version,
        "{case}: {target}"
    );
    let config = |call: &HloInstructionProto| {
        serde_json::from_slice::<serde_json::Value>(&call.backend_config).unwrap()
    };
    assert_eq!(
        config(ours),
        config(jax),
        "{case}: {target}'s backend configuration"
    );
}

/// The largest number of elements one instruction of `module` holds.
fn largest_instruction(module: &HloModuleProto) -> i64 {
    instructions(module)
        .filter_map(|instruction| instruction.shape.as_ref())
        .flat_map(laid_out)
        .map(|(_, dims, _)| dims.iter().product::<i64>())
        .max()
        .unwrap()
}

/// For every case JAX exported, the lowering's two cuDNN calls equal JAX's in every field, and
/// nothing in the module is as large as one head's scores.
#[test]
fn cudnn_calls_equal_what_jax_exports() {
    let text = std::fs::read_to_string(fixtures().join("cases.json")).unwrap();
    let cases: Vec<FixtureCase> = serde_json::from_str(&text).unwrap();
    assert_eq!(cases.len(), 3);
    for fixture in &cases {
        let bytes = std::fs::read(fixtures().join(format!("{}.hlo.pb", fixture.name))).unwrap();
        let jax = HloModuleProto::decode(bytes.as_slice()).unwrap();
        let dtype = match fixture.dtype.as_str() {
            "bfloat16" => DType::BF16,
            "float16" => DType::F16,
            other => panic!("{}: dtype {other}", fixture.name),
        };
        let case = Case {
            name: "fixture",
            heads: fixture.heads,
            kv_heads: fixture.kv_heads,
            queries: fixture.queries,
            keys: fixture.keys,
            depth: fixture.depth,
            sinks: false,
            options: FusedAttentionOptions {
                scale: fixture.scale,
                causal: fixture.causal,
                sliding_window: fixture.window,
                softcap: None,
            },
        };
        let ours = lowered(&case, fixture.batch, dtype, FusedAttentionLowering::Cudnn).module;
        for target in [CUDNN_FORWARD_TARGET, CUDNN_BACKWARD_TARGET] {
            assert_same_call(call(&ours, target), call(&jax, target), &fixture.name);
        }
        let scores = (fixture.batch * fixture.heads * fixture.queries * fixture.keys) as i64;
        let largest = largest_instruction(&ours);
        assert!(largest < scores / 2, "{}: {largest} elements", fixture.name);
    }
}

/// `base` with learned sinks, and `base` with a soft cap: what neither vendor kernel computes.
fn with_sinks_or_cap(base: impl Fn() -> Case) -> [Case; 2] {
    let capped = FusedAttentionOptions {
        softcap: Some(30.0),
        ..FusedAttentionOptions::causal()
    };
    [
        Case {
            sinks: true,
            ..base()
        },
        Case {
            options: capped,
            ..base()
        },
    ]
}

/// What cuDNN does not compute (f32, sinks, a soft cap, a causal mask over a cache, wide heads)
/// is lowered as the blocked form, without a cuDNN call.
#[test]
fn what_cudnn_does_not_compute_stays_blocked() {
    let base = || Case {
        depth: 64,
        ..Case::causal("base", 4, 2, 256)
    };
    let taken = [(base(), DType::BF16, true), (base(), DType::F32, false)];
    let [sinks, capped] = with_sinks_or_cap(base);
    let refused = [
        sinks,
        capped,
        Case {
            queries: 8,
            ..base()
        },
        Case {
            depth: 160,
            ..base()
        },
        Case {
            depth: 60,
            ..base()
        },
    ]
    .map(|case| (case, DType::BF16, false));
    for (index, (case, dtype, cudnn)) in taken.into_iter().chain(refused).enumerate() {
        let module = lowered(&case, 1, dtype, FusedAttentionLowering::Cudnn).module;
        let calls = instructions(&module)
            .filter(|instruction| instruction.custom_call_target.starts_with("__cudnn$"))
            .count();
        assert_eq!(
            calls,
            if cudnn { 2 } else { 0 },
            "case {index} in {dtype:?}"
        );
    }
}

/// The kernel requests of `module`, in order.
fn requests(module: &HloModuleProto) -> Vec<KernelRequest> {
    instructions(module)
        .filter_map(KernelRequest::of_instruction)
        .map(Result::unwrap)
        .collect()
}

/// Training a grouped-query attention (bf16, causal, and f32 with a window and a scale) on
/// `neuron`: one `flash_fwd` in training and one `flash_attn_bwd`, launched per batch row and
/// key/value head, their tensors in the kernels' layouts and their arguments the operation's;
/// the module passes the Neuron lint and holds no head's scores.
#[test]
fn neuron_trains_attention_with_the_sdks_flash_kernels() {
    let windowed = FusedAttentionOptions {
        sliding_window: Some(300),
        scale: Some(0.2),
        ..FusedAttentionOptions::causal()
    };
    let cases = [
        (Case::causal("causal", 4, 2, 512), DType::BF16),
        (
            Case {
                depth: 64,
                options: windowed,
                ..Case::causal("window", 2, 1, 1024)
            },
            DType::F32,
        ),
    ];
    for (case, dtype) in cases {
        let batch = 2;
        let program = lowered(&case, batch, dtype, FusedAttentionLowering::NeuronFlash);
        assert_eq!(lint_module(&program.module), [], "{}", case.name);
        let [b, h, kv, s, d] =
            [batch, case.heads, case.kv_heads, case.queries, case.depth].map(|size| size as i64);
        let largest = largest_instruction(&program.module);
        assert!(
            largest < b * h * s * s / 2,
            "{}: {largest} elements",
            case.name
        );

        let name = if dtype == DType::BF16 {
            "bfloat16"
        } else {
            "float32"
        };
        let tensor = |dtype: &str, shape: &[i64]| KernelTensor {
            dtype: dtype.to_string(),
            shape: shape.to_vec(),
        };
        let typed = |shape: &[i64]| tensor(name, shape);
        let statistics = tensor("float32", &[b, h, 128, s / 128]);
        let [forward, backward] = &requests(&program.module)[..] else {
            panic!("{}: two requests", case.name)
        };
        assert_eq!(forward.kernel, "flash_fwd");
        assert_eq!(backward.kernel, "flash_attn_bwd");
        for request in [forward, backward] {
            assert_eq!(request.grid, [b, kv], "{}", case.name);
            let argument = |name: &str| request.arguments[name].clone();
            let scale = case.options.scale_for(case.depth);
            assert_eq!(argument("softmax_scale"), serde_json::json!(scale));
            assert_eq!(argument("use_causal_mask"), serde_json::json!(true));
            let window = case.options.sliding_window.map_or(-1, |w| w as i64);
            assert_eq!(argument("sliding_window"), serde_json::json!(window));
            let mixed = dtype == DType::BF16;
            assert_eq!(argument("mixed_precision"), serde_json::json!(mixed));
        }
        assert_eq!(forward.arguments["training"], serde_json::json!(true));
        assert_eq!(
            forward.inputs,
            [
                typed(&[b, h, d, s]),
                typed(&[b, kv, d, s]),
                typed(&[b, kv, s, d])
            ]
        );
        assert_eq!(forward.outputs, [typed(&[b, h, s, d]), statistics.clone()]);
        let queries = typed(&[b, h, d, s]);
        let keys = typed(&[b, kv, d, s]);
        assert_eq!(
            backward.inputs,
            [
                queries.clone(),
                keys.clone(),
                keys.clone(),
                queries.clone(),
                queries.clone(),
                statistics
            ]
        );
        assert_eq!(backward.outputs, [queries, keys.clone(), keys]);
    }
}

/// What the SDK's flash kernels do not compute (sinks, a soft cap, a length not a multiple of
/// 512, wide heads, a causal mask over a cache) is lowered as the blocked form, without a
/// request.
#[test]
fn what_the_flash_kernels_do_not_compute_stays_blocked() {
    let base = || Case {
        depth: 64,
        ..Case::causal("base", 4, 2, 512)
    };
    let [sinks, capped] = with_sinks_or_cap(base);
    let refused = [
        sinks,
        capped,
        Case {
            queries: 500,
            keys: 500,
            ..base()
        },
        Case {
            depth: 160,
            ..base()
        },
        Case {
            queries: 128,
            ..base()
        },
    ];
    assert_eq!(
        requests(&lowered(&base(), 1, DType::F32, FusedAttentionLowering::NeuronFlash).module)
            .len(),
        2
    );
    for (index, case) in refused.into_iter().enumerate() {
        let module = lowered(&case, 1, DType::BF16, FusedAttentionLowering::NeuronFlash).module;
        assert_eq!(requests(&module), [], "case {index}");
        assert_eq!(lint_module(&module), [], "case {index}");
    }
}
