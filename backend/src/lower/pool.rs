//! Pooling over one or two spatial dimensions (`[batch, channels, spatial..]`): average and max
//! pooling as windowed reductions (`reduce-window`), max pooling's indices from the window's
//! patches, and the backward passes: average pooling's as the transpose of a windowed sum (the
//! gradient dilated by the stride with `pad`, then summed over every window), max pooling's as a
//! scatter-add at the indices. Burn's rules (those of `burn-ndarray`): padding counts towards
//! the average only with `count_include_pad`, and never the part of a `ceil_mode` window beyond
//! the padding; max pooling pads with −∞ and its index is `row · width + column` in the input.

use burn_ir::{
    AvgPool1dBackwardOpIr, AvgPool1dOpIr, AvgPool2dBackwardOpIr, AvgPool2dOpIr, MaxPool1dOpIr,
    MaxPool1dWithIndicesBackwardOpIr, MaxPool1dWithIndicesOpIr, MaxPool2dOpIr,
    MaxPool2dWithIndicesBackwardOpIr, MaxPool2dWithIndicesOpIr, TensorIr,
};

use super::OperatorRules;
use super::builder::{Combiner, Direction, Value, WindowAxis};
use super::context::{Lowered, Lowering, dims, element_type};
use super::index::scatter_along;
use super::reduce::{Reduction, arg_extremum, reduce};
use crate::hlo::PrimitiveType;

/// The window of a pooling, one entry per spatial dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pooling {
    pub kernel: Vec<i64>,
    pub stride: Vec<i64>,
    pub padding: Vec<i64>,
    pub dilation: Vec<i64>,
}

impl Pooling {
    fn new(kernel: &[usize], stride: &[usize], padding: &[usize], dilation: &[usize]) -> Self {
        let wide = |values: &[usize]| values.iter().map(|&value| value as i64).collect();
        Self {
            kernel: wide(kernel),
            stride: wide(stride),
            padding: wide(padding),
            dilation: wide(dilation),
        }
    }

    fn spatial(&self) -> usize {
        self.kernel.len()
    }

    fn extent(&self, d: usize) -> i64 {
        (self.kernel[d] - 1) * self.dilation[d] + 1
    }

    /// The padding after spatial dimension `d` that gives `outputs` windows over `length`
    /// elements (beyond the symmetric padding with `ceil_mode`; none when fewer suffice).
    fn padding_high(&self, d: usize, length: i64, outputs: i64) -> i64 {
        ((outputs - 1) * self.stride[d] + self.extent(d) - length - self.padding[d]).max(0)
    }
}

/// Widens bf16/f16 values to f32 (sums accumulate there, as the host's do).
fn widen(cx: &mut Lowering, value: &Value) -> Value {
    match value.element_type {
        PrimitiveType::Bf16 | PrimitiveType::F16 => cx.builder.convert(value, PrimitiveType::F32),
        _ => value.clone(),
    }
}

/// `x` reduced over every window of `pooling` with `combiner` (padding with `init`), cut to
/// `out_dims`.
fn windowed(
    cx: &mut Lowering,
    x: &Value,
    init: f64,
    pooling: &Pooling,
    out_dims: &[i64],
    combiner: Combiner,
) -> Value {
    let mut axes = vec![WindowAxis::new(1, 1); 2];
    axes.extend((0..pooling.spatial()).map(|d| WindowAxis {
        padding_low: pooling.padding[d],
        padding_high: pooling.padding_high(d, x.dims[2 + d], out_dims[2 + d]),
        window_dilation: pooling.dilation[d],
        ..WindowAxis::new(pooling.kernel[d], pooling.stride[d])
    }));
    let reduced = cx.builder.reduce_window(x, init, &axes, combiner);
    let zeros = vec![0; out_dims.len()];
    let ones = vec![1; out_dims.len()];
    cx.builder.slice(&reduced, &zeros, out_dims, &ones)
}

/// How many elements each average divides by, `[batch, channels, out..]` (in f32).
fn divisors(
    cx: &mut Lowering,
    pooling: &Pooling,
    in_dims: &[i64],
    out_dims: &[i64],
    count_include_pad: bool,
) -> Value {
    let per_axis: Vec<Vec<f32>> = (0..pooling.spatial())
        .map(|d| {
            let (length, padding, kernel) = (in_dims[2 + d], pooling.padding[d], pooling.kernel[d]);
            (0..out_dims[2 + d])
                .map(|output| {
                    let start = output * pooling.stride[d];
                    let end = start + kernel;
                    let count = if count_include_pad {
                        end.min(length + 2 * padding) - start
                    } else {
                        end.min(length + padding) - start.max(padding)
                    };
                    count as f32
                })
                .collect()
        })
        .collect();
    let counts: Vec<f32> = per_axis.iter().fold(vec![1.0], |products, axis| {
        products
            .iter()
            .flat_map(|&product| axis.iter().map(move |&count| product * count))
            .collect()
    });
    let counts = cx.builder.constant_f32(&counts, &out_dims[2..]);
    let mapping: Vec<i64> = (2..out_dims.len() as i64).collect();
    cx.builder.broadcast(&counts, out_dims, &mapping)
}

/// Average pooling.
fn average(
    cx: &mut Lowering,
    x: &TensorIr,
    pooling: &Pooling,
    count_include_pad: bool,
    out: &TensorIr,
) -> Lowered {
    let input = cx.get(x)?;
    let wide = widen(cx, &input);
    let out_dims = dims(out);
    let sums = windowed(cx, &wide, 0.0, pooling, &out_dims, Combiner::Add);
    let counts = divisors(cx, pooling, &input.dims, &out_dims, count_include_pad);
    let counts = cx.builder.convert(&counts, sums.element_type);
    let averages = cx.builder.binary("divide", &sums, &counts);
    let value = cx.builder.convert(&averages, input.element_type);
    cx.set(out, value)
}

/// The gradient of average pooling: each window's share of its gradient, summed over the
/// windows holding each input element.
fn average_backward(
    cx: &mut Lowering,
    x: &TensorIr,
    grad: &TensorIr,
    pooling: &Pooling,
    count_include_pad: bool,
    out: &TensorIr,
) -> Lowered {
    let gradient = cx.get(grad)?;
    let wide = widen(cx, &gradient);
    let in_dims = dims(x);
    let counts = divisors(cx, pooling, &in_dims, &gradient.dims, count_include_pad);
    let counts = cx.builder.convert(&counts, wide.element_type);
    let shares = cx.builder.binary("divide", &wide, &counts);
    let mut padding = vec![(0, 0, 0); 2];
    padding.extend((0..pooling.spatial()).map(|d| {
        let kernel = pooling.kernel[d];
        let stride = pooling.stride[d];
        let low = kernel - 1 - pooling.padding[d];
        let dilated = (gradient.dims[2 + d] - 1) * stride + 1;
        (low, in_dims[2 + d] + kernel - 1 - dilated - low, stride - 1)
    }));
    let spread = cx.builder.pad(&shares, 0.0, &padding);
    let mut axes = vec![WindowAxis::new(1, 1); 2];
    axes.extend(
        pooling
            .kernel
            .iter()
            .map(|&kernel| WindowAxis::new(kernel, 1)),
    );
    let summed = cx.builder.reduce_window(&spread, 0.0, &axes, Combiner::Add);
    let value = cx.builder.convert(&summed, gradient.element_type);
    cx.set(out, value)
}

/// The windows of `value` side by side: `[batch, channels, out.., taps]`, the taps in
/// row-major kernel order, padding with `fill`.
fn patches(cx: &mut Lowering, value: &Value, fill: f64, pooling: &Pooling, out: &[i64]) -> Value {
    let spatial = pooling.spatial();
    let mut padding = vec![(0, 0, 0); 2];
    padding.extend((0..spatial).map(|d| {
        let high = pooling.padding_high(d, value.dims[2 + d], out[2 + d]);
        (pooling.padding[d], high, 0)
    }));
    let padded = cx.builder.pad(value, fill, &padding);
    let taps: i64 = pooling.kernel.iter().product();
    let mut tap_dims = out.to_vec();
    tap_dims.push(1);
    let windows: Vec<Value> = (0..taps)
        .map(|tap| {
            let mut start = vec![0, 0];
            let mut limit = vec![out[0], out[1]];
            let mut stride = vec![1, 1];
            let mut rest = tap;
            let mut offsets = vec![0; spatial];
            for d in (0..spatial).rev() {
                offsets[d] = rest % pooling.kernel[d];
                rest /= pooling.kernel[d];
            }
            for d in 0..spatial {
                let first = offsets[d] * pooling.dilation[d];
                start.push(first);
                limit.push(first + (out[2 + d] - 1) * pooling.stride[d] + 1);
                stride.push(pooling.stride[d]);
            }
            let window = cx.builder.slice(&padded, &start, &limit, &stride);
            cx.builder.reshape(&window, &tap_dims)
        })
        .collect();
    cx.builder.concatenate(&windows, out.len())
}

/// Max pooling.
fn maximum(cx: &mut Lowering, x: &TensorIr, pooling: &Pooling, out: &TensorIr) -> Lowered {
    let input = cx.get(x)?;
    let out_dims = dims(out);
    let dilated = pooling.dilation.iter().any(|&dilation| dilation > 1);
    let value = if dilated && cx.options.rules == OperatorRules::Neuron {
        // neuronx-cc refuses dilated windows (EVRF017): the maximum of the patches instead.
        let taps = patches(cx, &input, f64::NEG_INFINITY, pooling, &out_dims);
        reduce(cx, Reduction::Max, &taps, &[out_dims.len()])
    } else {
        windowed(
            cx,
            &input,
            f64::NEG_INFINITY,
            pooling,
            &out_dims,
            Combiner::Maximum,
        )
    };
    cx.set(out, value)
}

/// Max pooling with the index of each maximum in its input plane (the first of equal maxima).
fn maximum_with_indices(
    cx: &mut Lowering,
    x: &TensorIr,
    pooling: &Pooling,
    out: &TensorIr,
    out_indices: &TensorIr,
) -> Lowered {
    let input = cx.get(x)?;
    let out_dims = dims(out);
    let index_type = element_type(out_indices.dtype)?;
    let taps = patches(cx, &input, f64::NEG_INFINITY, pooling, &out_dims);
    let tap_axis = out_dims.len();
    let (tap, maxima) = arg_extremum(cx, &taps, tap_axis, true, index_type)?;
    // Each input element's index in its plane, windowed like the values.
    let mut flat = cx.builder.filled(index_type, 0.0, &input.dims);
    let mut plane_stride = 1;
    for d in (2..input.rank()).rev() {
        let position = cx.builder.iota(index_type, &input.dims, d);
        let scale = cx
            .builder
            .filled(index_type, plane_stride as f64, &input.dims);
        let scaled = cx.builder.binary("multiply", &position, &scale);
        flat = cx.builder.binary("add", &flat, &scaled);
        plane_stride *= input.dims[d];
    }
    let flat_taps = patches(cx, &flat, 0.0, pooling, &out_dims);
    let tap_positions = cx.builder.iota(index_type, &flat_taps.dims, tap_axis);
    let mapping: Vec<i64> = (0..tap_axis as i64).collect();
    let chosen = cx.builder.broadcast(&tap, &flat_taps.dims, &mapping);
    let hit = cx.builder.compare(Direction::Eq, &tap_positions, &chosen);
    let zeros = cx.builder.filled(index_type, 0.0, &flat_taps.dims);
    let picked = cx.builder.select(&hit, &flat_taps, &zeros);
    let indices = reduce(cx, Reduction::Sum, &picked, &[tap_axis]);
    cx.set(out, maxima)?;
    cx.set(out_indices, indices)
}

/// The gradient of max pooling: each window's gradient added at its maximum's index.
fn maximum_backward(
    cx: &mut Lowering,
    x: &TensorIr,
    grad: &TensorIr,
    indices: &TensorIr,
    out: &TensorIr,
) -> Lowered {
    let gradient = cx.get(grad)?;
    let indices = cx.get(indices)?;
    let in_dims = dims(x);
    let plane: i64 = in_dims[2..].iter().product();
    let windows: i64 = gradient.dims[2..].iter().product();
    let lines = [in_dims[0], in_dims[1], windows];
    let zeros = cx
        .builder
        .filled(gradient.element_type, 0.0, &[in_dims[0], in_dims[1], plane]);
    let indices = cx.builder.reshape(&indices, &lines);
    let updates = cx.builder.reshape(&gradient, &lines);
    let summed = scatter_along(cx, &zeros, &indices, &updates, 2, Combiner::Add);
    let value = cx.builder.reshape(&summed, &in_dims);
    cx.set(out, value)
}

/// `avg_pool1d`.
pub(crate) fn avg_pool1d(cx: &mut Lowering, ir: &AvgPool1dOpIr) -> Lowered {
    let pooling = Pooling::new(&[ir.kernel_size], &[ir.stride], &[ir.padding], &[1]);
    average(cx, &ir.x, &pooling, ir.count_include_pad, &ir.out)
}

/// `avg_pool2d`.
pub(crate) fn avg_pool2d(cx: &mut Lowering, ir: &AvgPool2dOpIr) -> Lowered {
    let pooling = Pooling::new(&ir.kernel_size, &ir.stride, &ir.padding, &[1, 1]);
    average(cx, &ir.x, &pooling, ir.count_include_pad, &ir.out)
}

/// The gradient of `avg_pool1d`.
pub(crate) fn avg_pool1d_backward(cx: &mut Lowering, ir: &AvgPool1dBackwardOpIr) -> Lowered {
    let pooling = Pooling::new(&[ir.kernel_size], &[ir.stride], &[ir.padding], &[1]);
    average_backward(cx, &ir.x, &ir.grad, &pooling, ir.count_include_pad, &ir.out)
}

/// The gradient of `avg_pool2d`.
pub(crate) fn avg_pool2d_backward(cx: &mut Lowering, ir: &AvgPool2dBackwardOpIr) -> Lowered {
    let pooling = Pooling::new(&ir.kernel_size, &ir.stride, &ir.padding, &[1, 1]);
    average_backward(cx, &ir.x, &ir.grad, &pooling, ir.count_include_pad, &ir.out)
}

/// `max_pool1d`.
pub(crate) fn max_pool1d(cx: &mut Lowering, ir: &MaxPool1dOpIr) -> Lowered {
    let pooling = Pooling::new(
        &[ir.kernel_size],
        &[ir.stride],
        &[ir.padding],
        &[ir.dilation],
    );
    maximum(cx, &ir.x, &pooling, &ir.out)
}

/// `max_pool2d`.
pub(crate) fn max_pool2d(cx: &mut Lowering, ir: &MaxPool2dOpIr) -> Lowered {
    let pooling = Pooling::new(&ir.kernel_size, &ir.stride, &ir.padding, &ir.dilation);
    maximum(cx, &ir.x, &pooling, &ir.out)
}

/// `max_pool1d_with_indices`.
pub(crate) fn max_pool1d_with_indices(cx: &mut Lowering, ir: &MaxPool1dWithIndicesOpIr) -> Lowered {
    let pooling = Pooling::new(
        &[ir.kernel_size],
        &[ir.stride],
        &[ir.padding],
        &[ir.dilation],
    );
    maximum_with_indices(cx, &ir.x, &pooling, &ir.out, &ir.out_indices)
}

/// `max_pool2d_with_indices`.
pub(crate) fn max_pool2d_with_indices(cx: &mut Lowering, ir: &MaxPool2dWithIndicesOpIr) -> Lowered {
    let pooling = Pooling::new(&ir.kernel_size, &ir.stride, &ir.padding, &ir.dilation);
    maximum_with_indices(cx, &ir.x, &pooling, &ir.out, &ir.out_indices)
}

/// The gradient of `max_pool1d_with_indices`.
pub(crate) fn max_pool1d_backward(
    cx: &mut Lowering,
    ir: &MaxPool1dWithIndicesBackwardOpIr,
) -> Lowered {
    maximum_backward(cx, &ir.x, &ir.grad, &ir.indices, &ir.out)
}

/// The gradient of `max_pool2d_with_indices`.
pub(crate) fn max_pool2d_backward(
    cx: &mut Lowering,
    ir: &MaxPool2dWithIndicesBackwardOpIr,
) -> Lowered {
    maximum_backward(cx, &ir.x, &ir.grad, &ir.indices, &ir.out)
}
