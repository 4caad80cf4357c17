//! The fused attention lowered for XLA's CUDA plugin (`FusedAttentionLowering::Cudnn`): cuDNN's
//! flash-attention calls exactly as JAX emits them (`fixtures/cudnn-attention`, made by
//! `jax.export` with `platforms=["cuda"]`: target, operands, layouts, API version, backend
//! configuration), no `[batch, heads, queries, keys]` buffer in the module, and the blocked form
//! wherever cuDNN does not compute what the operation asks.

use std::path::{Path, PathBuf};

use burn::tensor::DType;
use burn_trainium::attention::FusedAttentionOptions;
use burn_trainium::hlo::{HloInstructionProto, HloModuleProto, ShapeProto};
use burn_trainium::lower::{
    CUDNN_BACKWARD_TARGET, CUDNN_FORWARD_TARGET, FusedAttentionLowering, LowerOptions,
    LoweredProgram, boundary_of, lower_segment_with,
};
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

/// `case`'s forward and backward passes lowered for the CUDA plugin.
fn lowered(case: &Case, batch: usize, dtype: DType) -> LoweredProgram {
    let operations = attention_operations(case, batch, dtype);
    let options = LowerOptions {
        fused_attention: FusedAttentionLowering::Cudnn,
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
        let ours = lowered(&case, fixture.batch, dtype).module;
        for target in [CUDNN_FORWARD_TARGET, CUDNN_BACKWARD_TARGET] {
            assert_same_call(call(&ours, target), call(&jax, target), &fixture.name);
        }
        let scores = (fixture.batch * fixture.heads * fixture.queries * fixture.keys) as i64;
        let largest = largest_instruction(&ours);
        assert!(largest < scores / 2, "{}: {largest} elements", fixture.name);
    }
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
    let refused = [
        Case {
            sinks: true,
            ..base()
        },
        Case {
            options: FusedAttentionOptions {
                softcap: Some(30.0),
                ..FusedAttentionOptions::causal()
            },
            ..base()
        },
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
        let module = lowered(&case, 1, dtype).module;
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
