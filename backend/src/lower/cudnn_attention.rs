//! The fused attention's operations ([`crate::attention`]) as cuDNN's flash-attention calls, for
//! XLA's CUDA plugin ([`super::FusedAttentionLowering::Cudnn`]).
//!
//! XLA no longer rewrites attention written in HLO into cuDNN's kernel, so the producer names
//! it, as JAX does (`jax.nn.dot_product_attention(implementation="cudnn")`): a custom call to
//! `__cudnn$fmhaSoftmax` (output, f32 log-sum-exp statistics, workspace) and one to
//! `__cudnn$fmhaSoftmaxBackward` (query, key and value gradients, workspace), each with a
//! `cudnn_fmha_backend_config`. The calls here are JAX's in its default layout, field for field
//! (`fixtures/cudnn-attention`, made by `jax.export`): queries, keys and values enter as
//! `[batch, positions, heads, width]` and the output and gradients come back as `[batch, heads,
//! positions, width]` laid out in memory as `[batch, positions, heads, width]`. The operation's
//! tensors are `[batch, heads, positions, width]`, so each operand is a transpose; in a
//! decoder, whose projections produce `[batch, positions, heads, width]`, that transpose undoes
//! the one before the attention and XLA removes both, and the results' layout makes the
//! transpose after it free as well. Grouped-query heads are passed as they are: cuDNN takes
//! fewer key/value heads than query heads.

use burn_backend::DType;
use burn_ir::CustomOpIr;
use serde_json::json;

use super::builder::{LaidOut, Value};
use super::context::{Failure, Lowered, Lowering, element_type};
use crate::attention::{AttentionShape, BACKWARD, FusedAttentionCall, FusedAttentionOptions};
use crate::hlo::PrimitiveType;

/// cuDNN's flash-attention forward call.
pub const CUDNN_FORWARD_TARGET: &str = "__cudnn$fmhaSoftmax";
/// cuDNN's flash-attention backward call.
pub const CUDNN_BACKWARD_TARGET: &str = "__cudnn$fmhaSoftmaxBackward";
/// The widest head cuDNN's flash attention takes on every GPU it runs on (256 from Hopper on).
const WIDEST_HEAD: usize = 128;
/// `[batch, heads, positions, width]` to `[batch, positions, heads, width]` and back.
const SWAP_HEADS_AND_POSITIONS: [i64; 4] = [0, 2, 1, 3];
/// The results' layout: `[batch, heads, positions, width]` stored as `[batch, positions, heads,
/// width]`.
const HEADS_INSIDE_POSITIONS: [i64; 4] = [3, 1, 2, 0];

/// Why cuDNN's flash attention does not compute `call` on `custom`'s tensors, if it does not.
pub(crate) fn unsupported(call: &FusedAttentionCall, custom: &CustomOpIr) -> Option<String> {
    let FusedAttentionCall {
        options,
        shape,
        sinks,
    } = call;
    let dtype = custom.inputs[0].dtype;
    if *sinks {
        return Some("cuDNN's attention has no sinks".into());
    }
    if options.softcap.is_some() {
        return Some("cuDNN's attention has no soft cap".into());
    }
    if !matches!(dtype, DType::BF16 | DType::F16)
        || custom.inputs[1..3].iter().any(|input| input.dtype != dtype)
    {
        return Some(format!(
            "cuDNN's attention takes bf16 or f16 queries, keys and values of one type, not \
             {dtype:?}, {:?}, {:?}",
            custom.inputs[1].dtype, custom.inputs[2].dtype
        ));
    }
    if shape.depth != shape.value_depth || shape.depth > WIDEST_HEAD || shape.depth % 8 != 0 {
        return Some(format!(
            "cuDNN's attention takes heads of one width, a multiple of 8 up to {WIDEST_HEAD}, not \
             {} and {}",
            shape.depth, shape.value_depth
        ));
    }
    if options.causal && shape.queries != shape.keys {
        // cuDNN's causal mask starts at the first key; the operation's ends at the last.
        return Some(format!(
            "cuDNN's causal mask takes as many queries as keys, not {} and {}",
            shape.queries, shape.keys
        ));
    }
    None
}

/// `burn_trainium.attention` or `burn_trainium.attention_backward` as cuDNN's call (see the
/// module documentation); [`unsupported`] must have accepted it.
pub(crate) fn cudnn_attention(
    cx: &mut Lowering,
    custom: &CustomOpIr,
    call: &FusedAttentionCall,
) -> Lowered {
    let element = element_type(custom.inputs[0].dtype)?;
    let backward = custom.id == BACKWARD;
    let config = backend_config(&call.shape, &call.options, element, backward)?;
    // Operands in cuDNN's order: q, k, v, then (backward) statistics, output gradient, output.
    let order: &[usize] = if backward {
        &[0, 1, 2, 4, 5, 3]
    } else {
        &[0, 1, 2]
    };
    let mut operands: Vec<(Value, LaidOut)> = Vec::new();
    for &index in order {
        let value = cx.get(&custom.inputs[index])?;
        let value = match value.rank() {
            4 => cx.builder.transpose(&value, &SWAP_HEADS_AND_POSITIONS),
            _ => value,
        };
        let laid = LaidOut::row_major(value.element_type, &value.dims);
        operands.push((value, laid));
    }
    let heads_inside = |tensor: &burn_ir::TensorIr| -> Lowered<LaidOut> {
        Ok(LaidOut {
            element_type: element_type(tensor.dtype)?,
            dims: super::context::dims(tensor),
            minor_to_major: HEADS_INSIDE_POSITIONS.to_vec(),
        })
    };
    let mut results = Vec::new();
    if backward {
        for grad in &custom.outputs {
            results.push(heads_inside(grad)?);
        }
    } else {
        let [output, statistics] = [&custom.outputs[0], &custom.outputs[1]];
        results.push(heads_inside(output)?);
        results.push(LaidOut::row_major(
            element_type(statistics.dtype)?,
            &super::context::dims(statistics),
        ));
    }
    results.push(LaidOut::row_major(PrimitiveType::U8, &[0]));
    let target = if backward {
        CUDNN_BACKWARD_TARGET
    } else {
        CUDNN_FORWARD_TARGET
    };
    let values = cx.builder.library_call(target, &operands, &results, config);
    for (out, value) in custom.outputs.iter().zip(values) {
        cx.set(out, value)?;
    }
    Ok(())
}

/// The `cudnn_fmha_backend_config` of a call, as JAX writes it for its default layout (BTNH).
fn backend_config(
    shape: &AttentionShape,
    options: &FusedAttentionOptions,
    element: PrimitiveType,
    backward: bool,
) -> Lowered<Vec<u8>> {
    let element = match element {
        PrimitiveType::Bf16 => "BF16",
        PrimitiveType::F16 => "F16",
        other => {
            return Err(Failure::Invalid(format!(
                "cuDNN's attention of {other:?} tensors"
            )));
        }
    };
    let text = |values: &[i64]| values.iter().map(i64::to_string).collect::<Vec<_>>();
    // Contracting dimensions of the two operands, then their batch dimensions, for each product
    // of the layout: Q·Kᵀ → P and P·V → O forward; P·dO → dV, dO·Vᵀ → dP, dP·Q → dK and
    // dP·K → dQ backward (P and dP are [b, n, t, s]; the rest [b, positions, heads, width]).
    let numbers = |contracting: [i64; 2], lhs_batch: [i64; 2], rhs_batch: [i64; 2]| {
        json!({
            "lhs_contracting_dimensions": text(&contracting[..1]),
            "rhs_contracting_dimensions": text(&contracting[1..]),
            "lhs_batch_dimensions": text(&lhs_batch),
            "rhs_batch_dimensions": text(&rhs_batch),
        })
    };
    let products = if backward {
        json!({
            "bmm1_grad_gemm1_dot_dimension_numbers": numbers([2, 1], [0, 1], [0, 2]),
            "bmm1_grad_gemm2_dot_dimension_numbers": numbers([3, 1], [0, 1], [0, 2]),
            "bmm2_grad_gemm1_dot_dimension_numbers": numbers([2, 1], [0, 1], [0, 2]),
            "bmm2_grad_gemm2_dot_dimension_numbers": numbers([3, 3], [0, 2], [0, 2]),
        })
    } else {
        json!({
            "bmm1_dot_dimension_numbers": numbers([3, 3], [0, 2], [0, 2]),
            "bmm2_dot_dimension_numbers": numbers([3, 1], [0, 1], [0, 2]),
        })
    };
    let scores = [shape.batch, shape.heads, shape.queries, shape.keys].map(|d| d as i64);
    let mut config = json!({
        "algorithm": {
            "algo_id": "0",
            "math_type": "TENSOR_OP_MATH",
            "tuning_knobs": {"17": "1", "24": "0"},
            "is_cudnn_frontend": true,
            "workspace_size": "0",
        },
        "fmha_scale": options.scale_for(shape.depth),
        "intermediate_tensor_shape": {
            "element_type": element,
            "dimensions": text(&scores),
            "tuple_shapes": [],
            "layout": {
                "dim_level_types": [],
                "dim_unique": [],
                "dim_ordered": [],
                "minor_to_major": text(&[3, 2, 1, 0]),
                "tiles": [],
                "element_size_in_bits": "0",
                "memory_space": "0",
                "index_primitive_type": "PRIMITIVE_TYPE_INVALID",
                "pointer_primitive_type": "PRIMITIVE_TYPE_INVALID",
                "dynamic_shape_metadata_prefix_bytes": "0",
            },
            "is_dynamic_dimension": [false, false, false, false],
        },
        "is_flash_attention": true,
        "mask_type": if options.causal { "CAUSAL" } else { "NO_MASK" },
        "dropout_rate": 0.0,
        "seed": 42,
        "sliding_window_length": options.sliding_window.unwrap_or(0),
        "max_seg_per_batch": 1,
        "is_paged_attention": false,
    });
    if let (Some(config), Some(products)) = (config.as_object_mut(), products.as_object()) {
        config.extend(products.clone());
    }
    let whole = json!({
        "operation_queue_id": "0",
        "cudnn_fmha_backend_config": config,
    });
    Ok(serde_json::to_vec(&whole).expect("a backend configuration is plain JSON"))
}
