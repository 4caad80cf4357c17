//! The fused attention's operations ([`crate::attention`]) as the Neuron SDK's flash-attention
//! kernels, for the `neuron` executor ([`super::FusedAttentionLowering::NeuronFlash`]): the
//! forward pass as `flash_fwd` in training (output and log-sum-exp statistics), the backward pass
//! as `flash_attn_bwd` (query, key and value gradients recomputed from those statistics), both
//! as kernel requests the executor has the SDK's tracer turn into calls
//! (`super::kernel_call`).
//!
//! The kernels' layouts: queries, keys (and, backward, values, outputs and their gradients) as
//! `[batch, heads, width, positions]`; forward values as `[batch, kv heads, positions, width]`;
//! the statistics as `[batch, heads, 128, positions / 128]` (row `128·t + p` at `[p, t]`, the
//! tensor engine's partitions). One launch per batch row and key/value head: the kernels take
//! grouped query heads as they are. The statistics are the natural log-sum-exp of each row's
//! scaled scores, as the operation's.

use burn_backend::DType;
use burn_ir::CustomOpIr;
use serde_json::json;

use super::attention::{FLASH_WIDEST_HEAD, flash_key_tile};
use super::builder::{Builder, Value};
use super::context::{Failure, Lowered, Lowering, dims};
use super::kernel_call::{KernelRequest, KernelTensor};
use crate::attention::{BACKWARD, FusedAttentionCall};

/// The partitions of the tensor engine: the statistics' second-to-last dimension.
const PARTITIONS: i64 = 128;
/// `[b, h, positions, width]` to `[b, h, width, positions]` and back.
const SWAP_LAST: [i64; 4] = [0, 1, 3, 2];

/// The key tile the SDK's kernels compute `call` in, or why they do not compute what it asks.
pub(crate) fn flash_tile(call: &FusedAttentionCall, custom: &CustomOpIr) -> Result<i64, String> {
    let FusedAttentionCall {
        options,
        shape,
        sinks,
    } = call;
    if *sinks {
        return Err("the flash kernels have no sinks".into());
    }
    if options.softcap.is_some() {
        return Err("the flash kernels have no soft cap".into());
    }
    let dtype = custom.inputs[0].dtype;
    if !matches!(dtype, DType::F32 | DType::BF16)
        || custom.inputs[1..3].iter().any(|input| input.dtype != dtype)
    {
        return Err(format!(
            "the flash kernels take f32 or bf16 queries, keys and values of one type, not \
             {dtype:?}, {:?}, {:?}",
            custom.inputs[1].dtype, custom.inputs[2].dtype
        ));
    }
    let width = shape.depth as i64;
    if shape.value_depth != shape.depth || width > FLASH_WIDEST_HEAD {
        return Err(format!(
            "the flash kernels take heads of one width up to {FLASH_WIDEST_HEAD}, not {} and {}",
            shape.depth, shape.value_depth
        ));
    }
    if shape.queries != shape.keys {
        return Err(format!(
            "the flash kernels take as many keys as queries, not {} and {}",
            shape.keys, shape.queries
        ));
    }
    flash_key_tile(shape.keys as i64)
}

/// `burn_trainium.attention` or `burn_trainium.attention_backward` as a request for the SDK's
/// kernel, in key tiles of `tile` ([`flash_tile`]'s).
pub(crate) fn neuron_flash_attention(
    cx: &mut Lowering,
    custom: &CustomOpIr,
    call: &FusedAttentionCall,
    tile: i64,
) -> Lowered {
    let options = &call.options;
    let shape = &call.shape;
    let mut arguments = json!({
        "softmax_scale": options.scale_for(shape.depth),
        "use_causal_mask": options.causal,
        "sliding_window": options.sliding_window.map_or(-1, |window| window as i64),
        "mixed_precision": custom.inputs[0].dtype == DType::BF16,
    });
    let mut operands = Vec::new();
    let backward = custom.id == BACKWARD;
    // Forward: q, k, v. Backward: q, k, v, output, output gradient, statistics.
    let order: &[usize] = if backward {
        &[0, 1, 2, 3, 5, 4]
    } else {
        &[0, 1, 2]
    };
    for &index in order {
        let value = cx.get(&custom.inputs[index])?;
        let builder = &mut cx.builder;
        operands.push(match value.rank() {
            3 => statistics_to_partitions(builder, &value),
            // Forward values stay [b, kv, positions, width].
            _ if index == 2 && !backward => value,
            _ => builder.transpose(&value, &SWAP_LAST),
        });
    }
    let tensor = |value: &Value| {
        KernelTensor::of(value)
            .ok_or_else(|| Failure::Invalid("a flash kernel operand of another type".into()))
    };
    let inputs = operands.iter().map(tensor).collect::<Lowered<Vec<_>>>()?;
    let (kernel, outputs) = if backward {
        // dq [b, h, width, positions], dk and dv [b, kv, width, positions].
        let grads = inputs[..3].to_vec();
        ("flash_attn_bwd", grads)
    } else {
        arguments["seq_tile_size"] = json!(tile);
        arguments["training"] = json!(true);
        let output = KernelTensor {
            shape: dims(&custom.outputs[0]),
            ..inputs[0].clone()
        };
        let [b, h, q] = [shape.batch, shape.heads, shape.queries].map(|d| d as i64);
        let statistics = KernelTensor {
            dtype: "float32".into(),
            shape: vec![b, h, PARTITIONS, q / PARTITIONS],
        };
        ("flash_fwd", vec![output, statistics])
    };
    let grid = vec![shape.batch as i64, shape.kv_heads as i64];
    let request = KernelRequest::new(kernel, grid, inputs, outputs, arguments);
    let operands: Vec<&Value> = operands.iter().collect();
    let results = cx.builder.kernel_request(&request, &operands);
    for (index, (out, result)) in custom.outputs.iter().zip(results).enumerate() {
        let builder = &mut cx.builder;
        let result = match (backward, index) {
            (true, _) => builder.transpose(&result, &SWAP_LAST),
            (false, 0) => result,
            (false, _) => partitions_to_statistics(builder, &result),
        };
        cx.set(out, result)?;
    }
    Ok(())
}

/// Statistics `[b, h, positions]` as the kernels keep them: `[b, h, 128, positions / 128]`.
fn statistics_to_partitions(builder: &mut Builder, statistics: &Value) -> Value {
    let [b, h, q] = [statistics.dims[0], statistics.dims[1], statistics.dims[2]];
    let tiles = builder.reshape(statistics, &[b, h, q / PARTITIONS, PARTITIONS]);
    builder.transpose(&tiles, &SWAP_LAST)
}

/// The kernels' statistics `[b, h, 128, positions / 128]` as `[b, h, positions]`.
fn partitions_to_statistics(builder: &mut Builder, partitions: &Value) -> Value {
    let [b, h, p, t] = [
        partitions.dims[0],
        partitions.dims[1],
        partitions.dims[2],
        partitions.dims[3],
    ];
    let rows = builder.transpose(partitions, &SWAP_LAST);
    builder.reshape(&rows, &[b, h, p * t])
}
