//! The fused attention's operations ([`crate::attention`]) as blocked HLO: the queries taken
//! [`QUERY_BLOCK`] rows at a time, each block over the keys its rows see, so the live scores are
//! one block's `[group·rows × keys]` per key/value head and never `[queries × keys]` for long
//! sequences. Grouped query heads are a dimension of their key/value head's products
//! (`[b, kv, group, rows, keys]`), so keys and values are never repeated. Computed in f32, as the
//! host computes it (`executor/host/attention.rs`), with the same forward statistics and the
//! same recomputing backward pass.

use burn_ir::CustomOpIr;

use super::builder::{Builder, Combiner, Direction, Value};
use super::context::{Failure, Lowered, Lowering, dims};
use super::{FusedAttentionLowering, cudnn_attention, neuron_attention};
use crate::attention::{
    AttentionShape, BACKWARD, FusedAttentionCall, FusedAttentionOptions, QUERY_BLOCK, QueryBlock,
};
use crate::hlo::{DotDimensionNumbers, PrimitiveType};

const F32: PrimitiveType = PrimitiveType::F32;

/// What every block of one attention shares.
struct Problem {
    shape: AttentionShape,
    options: FusedAttentionOptions,
    /// `[b, kv, group, q, d]` in f32.
    query: Value,
    /// `[b, kv, k, d]` in f32.
    key: Value,
    /// `[b, kv, k, dv]` in f32.
    value: Value,
    /// `[kv, group]` in f32.
    sinks: Option<Value>,
}

/// The scores of one block and what its backward pass needs of them.
struct Scores {
    /// Scaled, capped, hidden keys at -∞: `[b, kv, group, rows, keys]`.
    masked: Value,
    /// The scaled products before the cap, when there is one.
    uncapped: Option<Value>,
}

/// `burn_trainium.attention` or `burn_trainium.attention_backward`.
pub(crate) fn fused_attention(cx: &mut Lowering, custom: &CustomOpIr) -> Lowered {
    let call =
        FusedAttentionCall::of(custom).map_err(|error| Failure::Invalid(error.to_string()))?;
    match cx.options.fused_attention {
        FusedAttentionLowering::Blocked => {}
        FusedAttentionLowering::Cudnn => match cudnn_attention::unsupported(&call, custom) {
            None => return cudnn_attention::cudnn_attention(cx, custom, &call),
            Some(reason) => log::debug!("fused attention lowered as blocked HLO: {reason}"),
        },
        FusedAttentionLowering::NeuronFlash => match neuron_attention::flash_tile(&call, custom) {
            Ok(tile) => return neuron_attention::neuron_flash_attention(cx, custom, &call, tile),
            Err(reason) => log::debug!("fused attention lowered as blocked HLO: {reason}"),
        },
    }
    let FusedAttentionCall {
        options,
        shape,
        sinks: with_sinks,
    } = call;

    let widened = |cx: &mut Lowering, index: usize| -> Lowered<Value> {
        let value = cx.get(&custom.inputs[index])?;
        Ok(cx.builder.convert(&value, F32))
    };
    let grouped = |builder: &mut Builder, value: &Value| {
        let [b, kv, g] = [shape.batch, shape.kv_heads, shape.group()].map(|d| d as i64);
        builder.reshape(value, &[b, kv, g, value.dims[2], value.dims[3]])
    };
    let query = widened(cx, 0)?;
    let problem = Problem {
        query: grouped(&mut cx.builder, &query),
        key: widened(cx, 1)?,
        value: widened(cx, 2)?,
        sinks: match with_sinks {
            true => {
                let sinks = widened(cx, 3)?;
                let heads = [shape.kv_heads, shape.group()].map(|d| d as i64);
                Some(cx.builder.reshape(&sinks, &heads))
            }
            false => None,
        },
        shape,
        options,
    };
    if custom.id == BACKWARD {
        let rest = if with_sinks { 4 } else { 3 };
        let output = widened(cx, rest)?;
        let statistics = widened(cx, rest + 1)?;
        let output_grad = widened(cx, rest + 2)?;
        let output = grouped(&mut cx.builder, &output);
        let output_grad = grouped(&mut cx.builder, &output_grad);
        let statistics = cx
            .builder
            .reshape(&statistics, &problem.rows_shape(shape.queries));
        let grads = backward(
            &mut cx.builder,
            &problem,
            &output,
            &statistics,
            &output_grad,
        );
        for (out, grad) in custom.outputs.iter().zip(grads) {
            let grad = cx.builder.reshape(&grad, &dims(out));
            let grad = cx
                .builder
                .convert(&grad, super::context::element_type(out.dtype)?);
            cx.set(out, grad)?;
        }
        return Ok(());
    }
    let (output, statistics) = forward(&mut cx.builder, &problem);
    let [out, stats] = [&custom.outputs[0], &custom.outputs[1]];
    let output = cx.builder.reshape(&output, &dims(out));
    let output = cx
        .builder
        .convert(&output, super::context::element_type(out.dtype)?);
    cx.set(out, output)?;
    let statistics = cx.builder.reshape(&statistics, &dims(stats));
    cx.set(stats, statistics)
}

/// A batched product over the batch dimensions `[b, kv]` of both operands.
fn product(
    builder: &mut Builder,
    lhs: &Value,
    rhs: &Value,
    lhs_contracting: &[i64],
    rhs_contracting: &[i64],
) -> Value {
    let free = |value: &Value, contracting: &[i64]| {
        (2..value.rank() as i64)
            .filter(|d| !contracting.contains(d))
            .map(|d| value.dims[d as usize])
            .collect::<Vec<_>>()
    };
    let mut out = vec![lhs.dims[0], lhs.dims[1]];
    out.extend(free(lhs, lhs_contracting));
    out.extend(free(rhs, rhs_contracting));
    let numbers = DotDimensionNumbers {
        lhs_contracting_dimensions: lhs_contracting.to_vec(),
        rhs_contracting_dimensions: rhs_contracting.to_vec(),
        lhs_batch_dimensions: vec![0, 1],
        rhs_batch_dimensions: vec![0, 1],
    };
    builder.dot(lhs, rhs, numbers, &out)
}

/// `value` cut to `range` along dimension `dim`.
fn cut(builder: &mut Builder, value: &Value, dim: usize, range: &std::ops::Range<usize>) -> Value {
    let mut start = vec![0; value.rank()];
    let mut limit = value.dims.clone();
    start[dim] = range.start as i64;
    limit[dim] = range.end as i64;
    builder.slice(value, &start, &limit, &vec![1; value.rank()])
}

/// `scalar · value` for a constant `scalar`.
fn scaled(builder: &mut Builder, value: &Value, scalar: f64) -> Value {
    let factor = builder.filled(F32, scalar, &value.dims);
    builder.binary("multiply", value, &factor)
}

/// `[b, kv, group, rows]` rows statistics broadcast along a last dimension of `width`.
fn along_rows(builder: &mut Builder, rows: &Value, width: i64) -> Value {
    let mut out = rows.dims.clone();
    out.push(width);
    builder.broadcast(rows, &out, &[0, 1, 2, 3])
}

impl Problem {
    /// `[b, kv, group, rows]`.
    fn rows_shape(&self, rows: usize) -> [i64; 4] {
        [
            self.shape.batch,
            self.shape.kv_heads,
            self.shape.group(),
            rows,
        ]
        .map(|d| d as i64)
    }

    /// The sinks as `[b, kv, group, rows]`.
    fn sink_rows(&self, builder: &mut Builder, sinks: &Value, rows: usize) -> Value {
        builder.broadcast(sinks, &self.rows_shape(rows), &[1, 2])
    }

    /// The scores of `block`: `[b, kv, group, rows, keys]`, with the block's query rows and keys.
    fn scores(&self, builder: &mut Builder, block: &QueryBlock) -> (Scores, Value, Value) {
        let query = cut(builder, &self.query, 3, &block.rows);
        let key = cut(builder, &self.key, 2, &block.keys);
        let products = product(builder, &query, &key, &[4], &[3]);
        let scaled_products = scaled(builder, &products, self.options.scale_for(self.shape.depth));
        let (capped, uncapped) = match self.options.softcap {
            Some(cap) => {
                let divided = scaled(builder, &scaled_products, 1.0 / cap);
                let squashed = builder.unary("tanh", &divided);
                (scaled(builder, &squashed, cap), Some(scaled_products))
            }
            None => (scaled_products, None),
        };
        let masked = match self.hidden(builder, block, &capped.dims) {
            Some(hidden) => {
                let lowest = builder.filled(F32, f64::NEG_INFINITY, &capped.dims);
                builder.select(&hidden, &lowest, &capped)
            }
            None => capped,
        };
        (Scores { masked, uncapped }, query, key)
    }

    /// Where a row of `block` does not see a key of it, broadcast to `score_dims` (`None` when
    /// every row sees every key of the block).
    fn hidden(
        &self,
        builder: &mut Builder,
        block: &QueryBlock,
        score_dims: &[i64],
    ) -> Option<Value> {
        if !self.options.hides_keys_in(block, &self.shape) {
            return None;
        }
        let grid = [block.rows.len() as i64, block.keys.len() as i64];
        let positions_type = super::index::position_type(2 * self.shape.keys.max(1) as i64);
        let offset = block.rows.start + self.shape.keys - self.shape.queries;
        let rows = builder.iota(positions_type, &grid, 0);
        let first_row = builder.filled(positions_type, offset as f64, &grid);
        let positions = builder.binary("add", &rows, &first_row);
        let columns = builder.iota(positions_type, &grid, 1);
        let first_key = builder.filled(positions_type, block.keys.start as f64, &grid);
        let keys = builder.binary("add", &columns, &first_key);
        let mut hidden = builder.compare(Direction::Gt, &keys, &positions);
        if let Some(window) = self.options.sliding_window {
            // Key k is before position p's window when k + window <= p.
            let width = builder.filled(positions_type, window as f64, &grid);
            let reach = builder.binary("add", &keys, &width);
            let before = builder.compare(Direction::Le, &reach, &positions);
            // Either (a select, which Neuron's operator table has; `or` it has not).
            hidden = builder.select(&hidden, &hidden, &before);
        }
        Some(builder.broadcast(&hidden, score_dims, &[3, 4]))
    }
}

/// The output `[b, kv, group, q, dv]` and statistics `[b, kv, group, q]`.
fn forward(builder: &mut Builder, problem: &Problem) -> (Value, Value) {
    let mut outputs = Vec::new();
    let mut statistics = Vec::new();
    for block in problem.options.query_blocks(&problem.shape, QUERY_BLOCK) {
        let rows = block.rows.len();
        let (scores, _, _) = problem.scores(builder, &block);
        let width = scores.masked.dims[4];
        let mut maximum =
            builder.reduce(&scores.masked, f64::NEG_INFINITY, &[4], Combiner::Maximum);
        let sink = problem
            .sinks
            .as_ref()
            .map(|sinks| problem.sink_rows(builder, sinks, rows));
        if let Some(sink) = &sink {
            maximum = builder.binary("maximum", &maximum, sink);
        }
        let spread = along_rows(builder, &maximum, width);
        let shifted = builder.binary("subtract", &scores.masked, &spread);
        let probabilities = builder.unary("exponential", &shifted);
        let mut sum = builder.reduce(&probabilities, 0.0, &[4], Combiner::Add);
        if let Some(sink) = &sink {
            let shifted_sink = builder.binary("subtract", sink, &maximum);
            let sink_share = builder.unary("exponential", &shifted_sink);
            sum = builder.binary("add", &sum, &sink_share);
        }
        let value = cut(builder, &problem.value, 2, &block.keys);
        let weighted = product(builder, &probabilities, &value, &[4], &[2]);
        let divisor = along_rows(builder, &sum, problem.shape.value_depth as i64);
        outputs.push(builder.binary("divide", &weighted, &divisor));
        let log_sum = builder.unary("log", &sum);
        statistics.push(builder.binary("add", &maximum, &log_sum));
    }
    (
        builder.concatenate(&outputs, 3),
        builder.concatenate(&statistics, 3),
    )
}

/// The gradients `[dq, dk, dv, (dsinks)]` (`[b, kv, group, q, d]`, `[b, kv, k, d]`,
/// `[b, kv, k, dv]`, `[kv, group]`).
fn backward(
    builder: &mut Builder,
    problem: &Problem,
    output: &Value,
    statistics: &Value,
    output_grad: &Value,
) -> Vec<Value> {
    let scale = problem.options.scale_for(problem.shape.depth);
    // D = rowsum(dO ∘ O): [b, kv, group, q].
    let product_of_outputs = builder.binary("multiply", output_grad, output);
    let delta = builder.reduce(&product_of_outputs, 0.0, &[4], Combiner::Add);
    let mut key_grad = builder.filled(F32, 0.0, &problem.key.dims);
    let mut value_grad = builder.filled(F32, 0.0, &problem.value.dims);
    let mut sink_grad = problem
        .sinks
        .as_ref()
        .map(|sinks| builder.filled(F32, 0.0, &sinks.dims));
    let mut query_grads = Vec::new();
    for block in problem.options.query_blocks(&problem.shape, QUERY_BLOCK) {
        let rows = block.rows.len();
        let (scores, query, key) = problem.scores(builder, &block);
        let width = scores.masked.dims[4];
        let block_statistics = cut(builder, statistics, 3, &block.rows);
        let block_delta = cut(builder, &delta, 3, &block.rows);
        let block_output_grad = cut(builder, output_grad, 3, &block.rows);
        let value = cut(builder, &problem.value, 2, &block.keys);

        let spread = along_rows(builder, &block_statistics, width);
        let shifted = builder.binary("subtract", &scores.masked, &spread);
        let probabilities = builder.unary("exponential", &shifted);
        let block_value_grad = product(
            builder,
            &probabilities,
            &block_output_grad,
            &[2, 3],
            &[2, 3],
        );
        let weight_grad = product(builder, &block_output_grad, &value, &[4], &[3]);
        let spread_delta = along_rows(builder, &block_delta, width);
        let centred = builder.binary("subtract", &weight_grad, &spread_delta);
        let mut score_grad = builder.binary("multiply", &probabilities, &centred);
        if let (Some(cap), Some(uncapped)) = (problem.options.softcap, &scores.uncapped) {
            let divided = scaled(builder, uncapped, 1.0 / cap);
            let squashed = builder.unary("tanh", &divided);
            let square = builder.binary("multiply", &squashed, &squashed);
            let one = builder.filled(F32, 1.0, &square.dims);
            let slope = builder.binary("subtract", &one, &square);
            score_grad = builder.binary("multiply", &score_grad, &slope);
        }
        let score_grad = scaled(builder, &score_grad, scale);
        query_grads.push(product(builder, &score_grad, &key, &[4], &[2]));
        let block_key_grad = product(builder, &score_grad, &query, &[2, 3], &[2, 3]);
        key_grad = add_rows(builder, &key_grad, &block_key_grad, &block.keys);
        value_grad = add_rows(builder, &value_grad, &block_value_grad, &block.keys);
        if let (Some(total), Some(sinks)) = (&sink_grad, &problem.sinks) {
            // -Σ exp(sink - L) · D over the batch and the rows, per head.
            let sink = problem.sink_rows(builder, sinks, rows);
            let shifted_sink = builder.binary("subtract", &sink, &block_statistics);
            let share = builder.unary("exponential", &shifted_sink);
            let part = builder.binary("multiply", &share, &block_delta);
            let summed = builder.reduce(&part, 0.0, &[0, 3], Combiner::Add);
            sink_grad = Some(builder.binary("subtract", total, &summed));
        }
    }
    let mut grads = vec![builder.concatenate(&query_grads, 3), key_grad, value_grad];
    grads.extend(sink_grad);
    grads
}

/// `total` with `part` added to its key positions `keys` (dimension 2).
fn add_rows(
    builder: &mut Builder,
    total: &Value,
    part: &Value,
    keys: &std::ops::Range<usize>,
) -> Value {
    let length = total.dims[2] as usize;
    if keys.start == 0 && keys.end == length {
        return builder.binary("add", total, part);
    }
    let mut padding = vec![(0, 0, 0); total.rank()];
    padding[2] = (keys.start as i64, (length - keys.end) as i64, 0);
    let padded = builder.pad(part, 0.0, &padding);
    builder.binary("add", total, &padded)
}
