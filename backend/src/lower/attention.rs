//! The attention module: `softmax(q kᵀ · scale, masked) v`, as Burn's reference fallback
//! computes it (soft capping, boolean mask, causal mask, additive bias, clamped softmax).

use burn_backend::DType;
use burn_ir::AttentionOpIr;

use super::AttentionLowering;
use super::builder::{Builder, Combiner, Direction, Value};
use super::context::{Failure, Lowered, Lowering, dims, element_type, unsupported};
use super::kernel_call::{KernelRequest, KernelTensor};
use crate::hlo::{DotDimensionNumbers, PrimitiveType};

/// The key tiles the Neuron SDK's flash kernel can work in (`FlashConfig.seq_tile_size`; the
/// sequence must be a multiple of the tile), largest first: 2048 is the kernel's default.
const FLASH_TILES: [i64; 3] = [2048, 1024, 512];
/// The widest head the flash kernel takes (one tile of the tensor engine).
pub(super) const FLASH_WIDEST_HEAD: i64 = 128;

/// The smallest finite value and the smallest positive normal value of a float dtype.
fn limits(dtype: DType) -> Lowered<(f64, f64)> {
    Ok(match dtype {
        DType::F64 => (f64::MIN, f64::MIN_POSITIVE),
        DType::F32 | DType::Flex32 => (f32::MIN as f64, f32::MIN_POSITIVE as f64),
        DType::F16 => (half::f16::MIN.to_f64(), half::f16::MIN_POSITIVE.to_f64()),
        DType::BF16 => (half::bf16::MIN.to_f64(), half::bf16::MIN_POSITIVE.to_f64()),
        other => return unsupported(format!("attention in {other:?}")),
    })
}

fn batched_dot(
    builder: &mut Builder,
    lhs: &Value,
    rhs: &Value,
    rhs_contracting: i64,
    dims: &[i64],
) -> Value {
    let numbers = DotDimensionNumbers {
        lhs_contracting_dimensions: vec![3],
        rhs_contracting_dimensions: vec![rhs_contracting],
        lhs_batch_dimensions: vec![0, 1],
        rhs_batch_dimensions: vec![0, 1],
    };
    builder.dot(lhs, rhs, numbers, dims)
}

/// Causal attention of more positions than this, without mask or bias, is computed by blocks of
/// this many queries (each over the keys up to its last query), so that no `[positions ×
/// positions]` scores exist at once: the memory of inference over long sequences stays linear
/// in their length, as with HLAT's own blocked attention.
const QUERY_BLOCK: i64 = 512;

/// The lowered operands of a softmax attention, in the type it is computed in.
struct Operands {
    query: Value,
    key: Value,
    value: Value,
    mask: Option<Value>,
    bias: Option<Value>,
}

/// What turns products into weights: the scale and soft cap (hoisted scalars), the causal mask,
/// the floors of the softmax's maximum and sum.
struct Softmax {
    scale: Value,
    softcap: Option<Value>,
    causal: bool,
    lowest: f64,
    smallest_positive: f64,
}

/// `softmax(q kᵀ · scale, capped, masked, biased) v` in one piece.
fn softmax_attention(builder: &mut Builder, operands: &Operands, softmax: &Softmax) -> Value {
    let Operands {
        query,
        key,
        value,
        mask,
        bias,
    } = operands;
    let [batch, heads, queries] = [query.dims[0], query.dims[1], query.dims[2]];
    let keys = key.dims[2];
    let score_dims = [batch, heads, queries, keys];
    let compute = query.element_type;

    let products = batched_dot(builder, query, key, 3, &score_dims);
    let scale = builder.broadcast(&softmax.scale, &score_dims, &[]);
    let mut scores = builder.binary("multiply", &products, &scale);
    if let Some(cap) = &softmax.softcap {
        let cap = builder.broadcast(cap, &score_dims, &[]);
        let scaled = builder.binary("divide", &scores, &cap);
        let squashed = builder.unary("tanh", &scaled);
        scores = builder.binary("multiply", &squashed, &cap);
    }
    let negative_infinity = builder.filled(compute, f64::NEG_INFINITY, &score_dims);
    if let Some(mask) = mask {
        let mask = builder.broadcast_to(mask, &score_dims);
        scores = builder.select(&mask, &negative_infinity, &scores);
    }
    if softmax.causal {
        // Key j is hidden from query i when j > i + (keys - queries).
        let grid = [queries, keys];
        let positions = super::index::position_type(queries.max(keys) * 2);
        let rows = builder.iota(positions, &grid, 0);
        let offset = builder.filled(positions, (keys - queries) as f64, &grid);
        let shifted = builder.binary("add", &rows, &offset);
        let columns = builder.iota(positions, &grid, 1);
        let future = builder.compare(Direction::Lt, &shifted, &columns);
        let future = builder.broadcast(&future, &score_dims, &[2, 3]);
        scores = builder.select(&future, &negative_infinity, &scores);
    }
    if let Some(bias) = bias {
        let bias = builder.broadcast_to(bias, &score_dims);
        scores = builder.binary("add", &scores, &bias);
    }

    let row_dims = [batch, heads, queries];
    let maximum = builder.reduce(&scores, f64::NEG_INFINITY, &[3], Combiner::Maximum);
    let floor = builder.filled(compute, softmax.lowest, &row_dims);
    let maximum = builder.binary("maximum", &maximum, &floor);
    let maximum = builder.broadcast(&maximum, &score_dims, &[0, 1, 2]);
    let shifted = builder.binary("subtract", &scores, &maximum);
    let numerator = builder.unary("exponential", &shifted);
    let sum = builder.reduce(&numerator, 0.0, &[3], Combiner::Add);
    let tiny = builder.filled(compute, softmax.smallest_positive, &row_dims);
    let sum = builder.binary("maximum", &sum, &tiny);
    let sum = builder.broadcast(&sum, &score_dims, &[0, 1, 2]);
    let weights = builder.binary("divide", &numerator, &sum);
    let out_dims = [batch, heads, queries, value.dims[3]];
    batched_dot(builder, &weights, value, 2, &out_dims)
}

/// Causal attention over the same positions, by blocks of [`QUERY_BLOCK`] queries, each over
/// the keys and values up to its last query; the blocks' outputs joined.
fn attention_by_query_blocks(
    builder: &mut Builder,
    operands: &Operands,
    softmax: &Softmax,
) -> Value {
    let positions = operands.query.dims[2];
    let prefix = |builder: &mut Builder, tensor: &Value, from: i64, to: i64| {
        let mut start = vec![0; 4];
        let mut limit = tensor.dims.clone();
        start[2] = from;
        limit[2] = to;
        builder.slice(tensor, &start, &limit, &[1; 4])
    };
    let mut blocks = Vec::new();
    for first in (0..positions).step_by(QUERY_BLOCK as usize) {
        let end = (first + QUERY_BLOCK).min(positions);
        let block = Operands {
            query: prefix(builder, &operands.query, first, end),
            key: prefix(builder, &operands.key, 0, end),
            value: prefix(builder, &operands.value, 0, end),
            mask: None,
            bias: None,
        };
        blocks.push(softmax_attention(builder, &block, softmax));
    }
    builder.concatenate(&blocks, 2)
}

/// `attention(query [b, h, q, d], key [b, h, k, d], value [b, h, k, v], mask, bias, options)`.
///
/// Attention of bf16 or f16 tensors is computed in f32 (both products, the softmax and its sum)
/// and rounded once into the output, as the host executor does (`executor/host/widen.rs`).
/// Causal self-attention over more than [`QUERY_BLOCK`] positions is computed by query blocks.
pub(crate) fn attention(cx: &mut Lowering, ir: &AttentionOpIr) -> Lowered {
    if cx.options.attention == AttentionLowering::NeuronFlash {
        match flash_tile(ir) {
            Ok(tile) => return neuron_flash_attention(cx, ir, tile),
            Err(reason) => log::debug!("attention lowered with HLO operations: {reason}"),
        }
    }
    let dtype = match ir.query.dtype {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    };
    let (lowest, smallest_positive) = limits(dtype)?;
    let compute = element_type(dtype)?;
    let convert = |cx: &mut Lowering, tensor| -> Lowered<Value> {
        let value = cx.get(tensor)?;
        Ok(cx.builder.convert(&value, compute))
    };
    let operands = Operands {
        query: convert(cx, &ir.query)?,
        key: convert(cx, &ir.key)?,
        value: convert(cx, &ir.value)?,
        mask: ir.mask.as_ref().map(|mask| cx.get(mask)).transpose()?,
        bias: ir
            .attn_bias
            .as_ref()
            .map(|bias| convert(cx, bias))
            .transpose()?,
    };
    // A given scale is a hoisted scalar; the default depends on the shape alone.
    let depth = operands.query.dims[3];
    let scale = match ir.options.scale {
        Some(scale) => cx.scalar(scale, dtype)?,
        None => cx.builder.constant(compute, 1.0 / (depth as f64).sqrt()),
    };
    let softmax = Softmax {
        scale,
        softcap: ir
            .options
            .softcap
            .map(|softcap| cx.scalar(softcap, dtype))
            .transpose()?,
        causal: ir.options.is_causal,
        lowest,
        smallest_positive,
    };
    let [queries, keys] = [operands.query.dims[2], operands.key.dims[2]];
    let out = if softmax.causal
        && operands.mask.is_none()
        && operands.bias.is_none()
        && queries == keys
        && queries > QUERY_BLOCK
    {
        attention_by_query_blocks(&mut cx.builder, &operands, &softmax)
    } else {
        softmax_attention(&mut cx.builder, &operands, &softmax)
    };
    cx.set(&ir.out, out)
}

/// The key tile the Neuron SDK's flash kernel computes `ir` in, or why the kernel does not
/// compute what `ir` asks for.
fn flash_tile(ir: &AttentionOpIr) -> Result<i64, String> {
    let options = &ir.options;
    if !options.is_causal || ir.mask.is_some() || ir.attn_bias.is_some() {
        return Err("the flash kernel takes causal attention without mask or bias".to_string());
    }
    if options.softcap.is_some() {
        return Err("the flash kernel has no soft cap".to_string());
    }
    let dtype = ir.query.dtype;
    if !matches!(dtype, DType::F32 | DType::BF16)
        || ir.key.dtype != dtype
        || ir.value.dtype != dtype
    {
        return Err(format!(
            "the flash kernel takes f32 or bf16 tensors of one type, not {dtype:?}, {:?}, {:?}",
            ir.key.dtype, ir.value.dtype
        ));
    }
    let [query, key, value] = [dims(&ir.query), dims(&ir.key), dims(&ir.value)];
    if key[..2] != query[..2] || value[..2] != query[..2] {
        return Err("the flash kernel takes as many key and value heads as query heads".into());
    }
    let positions = query[2];
    if key[2] != positions || value[2] != positions {
        return Err(format!(
            "the flash kernel takes as many keys as queries, not {} and {positions}",
            key[2]
        ));
    }
    let width = query[3];
    if key[3] != width || value[3] != width || width > FLASH_WIDEST_HEAD {
        return Err(format!(
            "the flash kernel takes heads of one width up to {FLASH_WIDEST_HEAD}, not {width}, {}, {}",
            key[3], value[3]
        ));
    }
    flash_key_tile(positions)
}

/// The largest key tile the SDK's flash kernels can work in over `positions` keys, or why there
/// is none.
pub(super) fn flash_key_tile(positions: i64) -> Result<i64, String> {
    FLASH_TILES
        .into_iter()
        .find(|tile| positions % tile == 0)
        .ok_or_else(|| {
            format!("the flash kernels take a multiple of 512 positions, not {positions}")
        })
}

/// `ir` as a request for the Neuron SDK's flash-attention forward kernel: queries and keys
/// transposed to `[batch, heads, width, positions]`, values as they are, no dropout seed
/// (inference takes none); one launch per batch row and head; the output `[batch, heads,
/// positions, width]`. bf16 runs the kernel's mixed precision (products in bf16, softmax in
/// f32), f32 runs it in f32.
///
/// The kernel's scale is part of the program, always `1/√width` (the shape decides it); a scale
/// the operation gives is a hoisted scalar, as everywhere (its value is not in the program's
/// key), so the queries are multiplied by its ratio to the kernel's before the call.
fn neuron_flash_attention(cx: &mut Lowering, ir: &AttentionOpIr, tile: i64) -> Lowered {
    let query = cx.get(&ir.query)?;
    let key = cx.get(&ir.key)?;
    let value = cx.get(&ir.value)?;
    let [batch, heads, _, width] = [query.dims[0], query.dims[1], query.dims[2], query.dims[3]];
    let kernel_scale = 1.0 / (width as f64).sqrt();
    let query = match &ir.options.scale {
        None => query,
        Some(scale) => {
            let given = cx.scalar_filled(*scale, DType::F32, &query.dims)?;
            let builder = &mut cx.builder;
            let root = builder.filled(PrimitiveType::F32, (width as f64).sqrt(), &query.dims);
            let ratio = builder.binary("multiply", &given, &root);
            let widened = builder.convert(&query, PrimitiveType::F32);
            let scaled = builder.binary("multiply", &widened, &ratio);
            builder.convert(&scaled, query.element_type)
        }
    };
    let builder = &mut cx.builder;
    let query = builder.transpose(&query, &[0, 1, 3, 2]);
    let key = builder.transpose(&key, &[0, 1, 3, 2]);
    let operands = [&query, &key, &value];
    let inputs = operands
        .iter()
        .map(|operand| KernelTensor::of(operand))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Failure::Invalid("a flash kernel operand of another type".into()))?;
    let outputs = vec![KernelTensor {
        shape: dims(&ir.out),
        ..inputs[2].clone()
    }];
    let arguments = serde_json::json!({
        "softmax_scale": kernel_scale,
        "use_causal_mask": true,
        "mixed_precision": ir.query.dtype == DType::BF16,
        "seq_tile_size": tile,
        "training": false,
    });
    let request = KernelRequest::new("flash_fwd", vec![batch, heads], inputs, outputs, arguments);
    let out = builder.kernel_request(&request, &operands).remove(0);
    cx.set(&ir.out, out)
}
