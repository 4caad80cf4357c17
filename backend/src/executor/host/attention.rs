//! The fused attention on the host executor ([`crate::attention`]): the custom operations
//! `burn_trainium.attention` and `burn_trainium.attention_backward` computed on Flex by blocks
//! of [`QUERY_BLOCK`] queries, each over the keys its rows see, in f32.
//!
//! The forward pass keeps the log-sum-exp `L` of each row; the backward pass recomputes a block's
//! probabilities `P = exp(S - L)` from it (FlashAttention-2's backward pass): with
//! `D = rowsum(dO ∘ O)`, `dV = Pᵀ dO`, `dS = P ∘ (dO Vᵀ - D)`, `dQ = dS K · scale`,
//! `dK = dSᵀ Q · scale` (times `1 - tanh²` under a soft cap), and a sink's gradient
//! `-Σ exp(sink - L) · D`. Grouped query heads are a dimension of their key/value head's
//! products, so keys and values are never repeated.

use burn_backend::ops::{BoolTensorOps, FloatTensorOps};
use burn_backend::tensor::FloatTensor;
use burn_backend::{DType, Shape, TensorData, TensorMetadata};
use burn_flex::{Flex, FlexDevice};
use burn_ir::{CustomOpIr, HandleContainer};
use burn_router::CustomOpRegistry;
use burn_std::Slice;

use crate::attention::{
    AttentionShape, BACKWARD, FORWARD, FusedAttentionCall, FusedAttentionOptions, QUERY_BLOCK,
    QueryBlock,
};

type Handles = HandleContainer<<Flex as burn_ir::BackendIr>::Handle>;
type Float = FloatTensor<Flex>;

/// Adds the fused attention's operations to a host runner's `registry`.
pub(super) fn register(registry: &mut CustomOpRegistry<Flex>) {
    registry.register(FORWARD, |handles, custom, _device| forward(handles, custom));
    registry.register(BACKWARD, |handles, custom, _device| {
        backward(handles, custom)
    });
}

/// What every block of one attention shares.
struct Problem {
    shape: AttentionShape,
    options: FusedAttentionOptions,
    scale: f64,
}

impl Problem {
    fn of(custom: &CustomOpIr) -> Self {
        let FusedAttentionCall { options, shape, .. } = FusedAttentionCall::of(custom)
            .unwrap_or_else(|error| panic!("`{}`: {error}", custom.id));
        Self {
            scale: options.scale_for(shape.depth),
            shape,
            options,
        }
    }

    fn blocks(&self) -> Vec<QueryBlock> {
        self.options.query_blocks(&self.shape, QUERY_BLOCK)
    }

    /// `[b, h, t, w]` rows `rows` as `[b, kv, group·rows, w]` in f32.
    fn grouped(&self, tensor: &Float, rows: &std::ops::Range<usize>) -> Float {
        let AttentionShape {
            batch, kv_heads, ..
        } = self.shape;
        let width = tensor.shape()[3];
        let rows_of = slice(tensor, 2, rows.clone());
        let count = self.shape.group() * rows.len();
        Flex::float_reshape(widen(rows_of), Shape::from([batch, kv_heads, count, width]))
    }

    /// `[b, kv, group·rows, w]` as `[b, h, rows, w]`.
    fn ungrouped(&self, tensor: Float, rows: usize) -> Float {
        let width = tensor.shape()[3];
        let AttentionShape { batch, heads, .. } = self.shape;
        Flex::float_reshape(tensor, Shape::from([batch, heads, rows, width]))
    }

    /// `[b, h, rows]` statistics as `[b, kv, group·rows, 1]`.
    fn row_column(&self, rows: Float) -> Float {
        let count = rows.shape().num_elements() / (self.shape.batch * self.shape.kv_heads);
        Flex::float_reshape(
            rows,
            Shape::from([self.shape.batch, self.shape.kv_heads, count, 1]),
        )
    }

    /// The sinks `[h]` as `[1, kv, group·rows, 1]`, each repeated over the rows of its head.
    fn sink_column(&self, sinks: &Float, rows: usize) -> Float {
        let AttentionShape {
            kv_heads, heads, ..
        } = self.shape;
        let group = self.shape.group();
        let column = Flex::float_reshape(widen(sinks.clone()), Shape::from([1, heads, 1]));
        let repeated = Flex::float_expand(column, Shape::from([1, heads, rows]));
        Flex::float_reshape(repeated, Shape::from([1, kv_heads, group * rows, 1]))
    }

    /// The scaled (and capped) products of a block's queries and keys, hidden keys at -∞,
    /// `[b, kv, group·rows, keys]`, and the scaled products before the cap (for its gradient).
    fn scores(&self, query: &Float, key: &Float, block: &QueryBlock) -> (Float, Option<Float>) {
        let products = Flex::float_matmul(query.clone(), Flex::float_swap_dims(key.clone(), 2, 3));
        let scaled = Flex::float_mul_scalar(products, self.scale.into());
        let (capped, uncapped) = match self.options.softcap {
            Some(cap) => {
                let squashed = Flex::float_tanh(Flex::float_div_scalar(scaled.clone(), cap.into()));
                (Flex::float_mul_scalar(squashed, cap.into()), Some(scaled))
            }
            None => (scaled, None),
        };
        let Some(hidden) = self.hidden(block) else {
            return (capped, uncapped);
        };
        let hidden = Flex::bool_expand(hidden, capped.shape());
        let masked = Flex::float_mask_fill(capped, hidden, f32::NEG_INFINITY.into());
        (masked, uncapped)
    }

    /// Which of a block's keys each of its rows does not see, `[1, 1, group·rows, keys]`
    /// (`None` when every row sees every key of the block).
    fn hidden(&self, block: &QueryBlock) -> Option<burn_backend::tensor::BoolTensor<Flex>> {
        if !self.options.hides_keys_in(block, &self.shape) {
            return None;
        }
        let AttentionShape { queries, keys, .. } = self.shape;
        let mut hidden = Vec::with_capacity(block.rows.len() * block.keys.len());
        for row in block.rows.clone() {
            let (start, end) = self.options.visible_keys(row, queries, keys);
            hidden.extend(block.keys.clone().map(|key| key < start || key >= end));
        }
        let rows = block.rows.len();
        let mask = Flex::bool_from_data(
            TensorData::new(hidden, [1, 1, rows, block.keys.len()]),
            &FlexDevice,
        );
        let group = self.shape.group();
        let repeated = Flex::bool_expand(mask, Shape::from([1, group, rows, block.keys.len()]));
        Some(Flex::bool_reshape(
            repeated,
            Shape::from([1, 1, group * rows, block.keys.len()]),
        ))
    }
}

/// `tensor` in f32.
fn widen(tensor: Float) -> Float {
    match tensor.dtype() {
        DType::F32 => tensor,
        _ => Flex::float_cast(tensor, burn_backend::FloatDType::F32),
    }
}

/// `tensor` in `dtype`.
fn narrow(tensor: Float, dtype: DType) -> Float {
    if tensor.dtype() == dtype {
        return tensor;
    }
    Flex::float_cast(tensor, dtype.into())
}

/// `tensor` with dimension `dim` cut to `range`.
fn slice(tensor: &Float, dim: usize, range: std::ops::Range<usize>) -> Float {
    let mut slices: Vec<Slice> = tensor.shape().iter().map(|&d| (0..d).into()).collect();
    slices[dim] = range.into();
    Flex::float_slice(tensor.clone(), &slices)
}

/// `total` with `part` added to its positions `range` along dimension `dim`.
fn add_into(total: Float, dim: usize, range: std::ops::Range<usize>, part: Float) -> Float {
    let mut slices: Vec<Slice> = total.shape().iter().map(|&d| (0..d).into()).collect();
    slices[dim] = range.clone().into();
    let sum = Flex::float_add(slice(&total, dim, range), part);
    Flex::float_slice_assign(total, &slices, sum)
}

/// The tensors `custom` takes, in order.
fn input_tensors(handles: &mut Handles, custom: &CustomOpIr) -> Vec<Float> {
    custom
        .inputs
        .iter()
        .map(|input| handles.get_float_tensor::<Flex>(input))
        .collect()
}

fn forward(handles: &mut Handles, custom: &CustomOpIr) {
    let inputs = input_tensors(handles, custom);
    let problem = Problem::of(custom);
    let sinks = inputs.get(3);
    let [query, key, value] = [&inputs[0], &inputs[1], &inputs[2]];
    let mut outputs = Vec::new();
    let mut statistics = Vec::new();
    for block in problem.blocks() {
        let rows = block.rows.len();
        let grouped_query = problem.grouped(query, &block.rows);
        let block_key = widen(slice(key, 2, block.keys.clone()));
        let block_value = widen(slice(value, 2, block.keys.clone()));
        let (scores, _) = problem.scores(&grouped_query, &block_key, &block);
        let mut maximum = Flex::float_max_dim(scores.clone(), 3);
        let sink = sinks.map(|sinks| {
            let [b, kv, count, _] = maximum.shape().dims::<4>();
            Flex::float_expand(
                problem.sink_column(sinks, rows),
                Shape::from([b, kv, count, 1]),
            )
        });
        if let Some(sink) = &sink {
            maximum = Flex::float_max_dim(Flex::float_cat(vec![maximum, sink.clone()], 3), 3);
        }
        let probabilities = Flex::float_exp(Flex::float_sub(scores, maximum.clone()));
        let mut sum = Flex::float_sum_dim(probabilities.clone(), 3);
        if let Some(sink) = sink {
            sum = Flex::float_add(sum, Flex::float_exp(Flex::float_sub(sink, maximum.clone())));
        }
        let weighted = Flex::float_matmul(probabilities, block_value);
        let output = Flex::float_div(weighted, sum.clone());
        outputs.push(narrow(problem.ungrouped(output, rows), query.dtype()));
        let log_sum = Flex::float_add(maximum, Flex::float_log(sum));
        let [batch, heads] = [problem.shape.batch, problem.shape.heads];
        statistics.push(Flex::float_reshape(
            log_sum,
            Shape::from([batch, heads, rows]),
        ));
    }
    let output = Flex::float_cat(outputs, 2);
    let statistics = Flex::float_cat(statistics, 2);
    handles.register_float_tensor::<Flex>(&custom.outputs[0].id, output);
    handles.register_float_tensor::<Flex>(&custom.outputs[1].id, statistics);
}

fn backward(handles: &mut Handles, custom: &CustomOpIr) {
    let inputs = input_tensors(handles, custom);
    let problem = Problem::of(custom);
    let with_sinks = inputs.len() == 7;
    let [query, key, value] = [&inputs[0], &inputs[1], &inputs[2]];
    let sinks = with_sinks.then(|| &inputs[3]);
    let rest = &inputs[if with_sinks { 4 } else { 3 }..];
    let [output, statistics, output_grad] = [&rest[0], &rest[1], &rest[2]];

    // D = rowsum(dO ∘ O), [b, h, q].
    let delta = Flex::float_sum_dim(
        Flex::float_mul(widen(output_grad.clone()), widen(output.clone())),
        3,
    );
    let zeros = |like: &Float| Flex::float_zeros(like.shape(), &FlexDevice, DType::F32.into());
    let mut key_grad = zeros(key);
    let mut value_grad = zeros(value);
    let mut sink_grad = sinks.map(zeros);
    let mut query_grads = Vec::new();
    for block in problem.blocks() {
        let rows = block.rows.len();
        let grouped_query = problem.grouped(query, &block.rows);
        let grouped_output_grad = problem.grouped(output_grad, &block.rows);
        let block_key = widen(slice(key, 2, block.keys.clone()));
        let block_value = widen(slice(value, 2, block.keys.clone()));
        let block_statistics = problem.row_column(slice(statistics, 2, block.rows.clone()));
        let block_delta = problem.row_column(slice(&delta, 2, block.rows.clone()));

        let (scores, uncapped) = problem.scores(&grouped_query, &block_key, &block);
        let probabilities = Flex::float_exp(Flex::float_sub(scores, block_statistics.clone()));
        let block_value_grad = Flex::float_matmul(
            Flex::float_swap_dims(probabilities.clone(), 2, 3),
            grouped_output_grad.clone(),
        );
        let weight_grad = Flex::float_matmul(
            grouped_output_grad,
            Flex::float_swap_dims(block_value, 2, 3),
        );
        let mut score_grad = Flex::float_mul(
            probabilities,
            Flex::float_sub(weight_grad, block_delta.clone()),
        );
        if let (Some(cap), Some(uncapped)) = (problem.options.softcap, uncapped) {
            let squashed = Flex::float_tanh(Flex::float_div_scalar(uncapped, cap.into()));
            let slope = Flex::float_add_scalar(
                Flex::float_neg(Flex::float_mul(squashed.clone(), squashed)),
                1.0.into(),
            );
            score_grad = Flex::float_mul(score_grad, slope);
        }
        let score_grad = Flex::float_mul_scalar(score_grad, problem.scale.into());
        let block_query_grad = Flex::float_matmul(score_grad.clone(), block_key);
        let block_key_grad =
            Flex::float_matmul(Flex::float_swap_dims(score_grad, 2, 3), grouped_query);
        query_grads.push(narrow(
            problem.ungrouped(block_query_grad, rows),
            query.dtype(),
        ));
        key_grad = add_into(key_grad, 2, block.keys.clone(), block_key_grad);
        value_grad = add_into(value_grad, 2, block.keys.clone(), block_value_grad);
        if let (Some(total), Some(sinks)) = (sink_grad.take(), sinks) {
            // -Σ exp(sink - L) · D over the batch and the rows, per head.
            let column = problem.sink_column(sinks, rows);
            let share = Flex::float_exp(Flex::float_sub(column, block_statistics));
            let part = Flex::float_mul(share, block_delta);
            let AttentionShape { batch, heads, .. } = problem.shape;
            let per_head = Flex::float_reshape(part, Shape::from([batch, heads, rows]));
            let summed = Flex::float_sum_dim(Flex::float_sum_dim(per_head, 2), 0);
            let summed = Flex::float_reshape(summed, Shape::from([heads]));
            sink_grad = Some(Flex::float_sub(total, summed));
        }
    }
    let grads = [
        Some(Flex::float_cat(query_grads, 2)),
        Some(narrow(key_grad, key.dtype())),
        Some(narrow(value_grad, value.dtype())),
        sink_grad
            .zip(sinks)
            .map(|(grad, sinks)| narrow(grad, sinks.dtype())),
    ];
    for (output, grad) in custom.outputs.iter().zip(grads.into_iter().flatten()) {
        handles.register_float_tensor::<Flex>(&output.id, grad);
    }
}
