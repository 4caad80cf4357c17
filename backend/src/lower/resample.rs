//! Resampling of the spatial dimensions (`[batch, channels, spatial..]`) by a linear map per
//! dimension: adaptive average pooling and bilinear, bicubic and Lanczos-3 interpolation are each
//! separable, so each is one product per spatial dimension with a weight matrix computed here
//! from the shapes alone, and its backward pass the product with the transposed matrices.
//! Nearest interpolation reads its source elements with a gather, exactly.
//!
//! The weights follow Burn's definitions (those of `burn-ndarray`): adaptive windows
//! `[⌊i·in/out⌋, ⌈(i+1)·in/out⌉)`; interpolation coordinates with and without `align_corners`,
//! bicubic's `a = −0.75` with clamped taps, Lanczos-3's taps inside the input normalised to sum
//! to one.

use burn_ir::{
    AdaptiveAvgPool1dBackwardOpIr, AdaptiveAvgPool1dOpIr, AdaptiveAvgPool2dBackwardOpIr,
    AdaptiveAvgPool2dOpIr, AdaptiveAvgPool3dBackwardOpIr, AdaptiveAvgPool3dOpIr,
    InterpolateBackwardOpIr, InterpolateModeIr, InterpolateOpIr, InterpolateOptionsIr, TensorIr,
};

use super::builder::Value;
use super::context::{Lowered, Lowering};
use super::index::select_slices;
use super::shape::last_to;
use crate::hlo::{DotDimensionNumbers, PrimitiveType};

/// A weight matrix `[rows, columns]`, row-major: output `i` of an axis is
/// `Σⱼ weights[i][j] · input[j]`.
struct Weights {
    rows: usize,
    columns: usize,
    values: Vec<f64>,
}

impl Weights {
    fn zeros(rows: usize, columns: usize) -> Self {
        Self {
            rows,
            columns,
            values: vec![0.0; rows * columns],
        }
    }

    fn add(&mut self, row: usize, column: usize, weight: f64) {
        self.values[row * self.columns + column] += weight;
    }

    fn transposed(&self) -> Self {
        let mut transposed = Weights::zeros(self.columns, self.rows);
        for row in 0..self.rows {
            for column in 0..self.columns {
                transposed.add(column, row, self.values[row * self.columns + column]);
            }
        }
        transposed
    }
}

/// `value` mapped along `axis` by `weights` (`[new length, old length]`), computed in f32.
fn map_axis(cx: &mut Lowering, value: &Value, axis: usize, weights: &Weights) -> Value {
    let wide = cx.builder.convert(value, PrimitiveType::F32);
    let entries: Vec<f32> = weights.values.iter().map(|&weight| weight as f32).collect();
    let matrix = cx
        .builder
        .constant_f32(&entries, &[weights.rows as i64, weights.columns as i64]);
    let mut product_dims: Vec<i64> = (0..value.rank())
        .filter(|&d| d != axis)
        .map(|d| value.dims[d])
        .collect();
    product_dims.push(weights.rows as i64);
    let numbers = DotDimensionNumbers {
        lhs_contracting_dimensions: vec![axis as i64],
        rhs_contracting_dimensions: vec![1],
        lhs_batch_dimensions: Vec::new(),
        rhs_batch_dimensions: Vec::new(),
    };
    let product = cx.builder.dot(&wide, &matrix, numbers, &product_dims);
    let moved = cx.builder.transpose(&product, &last_to(value.rank(), axis));
    cx.builder.convert(&moved, value.element_type)
}

/// `value` mapped along every spatial dimension by its weights.
fn map_spatial(cx: &mut Lowering, value: &Value, weights: &[Weights]) -> Value {
    weights
        .iter()
        .enumerate()
        .fold(value.clone(), |mapped, (d, weights)| {
            map_axis(cx, &mapped, 2 + d, weights)
        })
}

/// Adaptive average pooling's weights from `length` inputs to `outputs` (f32 window bounds, as
/// Burn computes them).
fn adaptive_weights(length: usize, outputs: usize) -> Weights {
    let mut weights = Weights::zeros(outputs, length);
    for output in 0..outputs {
        let start = ((output as f32 * length as f32) / outputs as f32).floor() as usize;
        let end = (((output + 1) as f32 * length as f32) / outputs as f32).ceil() as usize;
        let end = end.min(length);
        for input in start..end {
            weights.add(output, input, 1.0 / (end - start) as f64);
        }
    }
    weights
}

/// The adaptive pooling weights of every spatial dimension of `x` into `out`.
fn adaptive(x: &TensorIr, out: &TensorIr) -> Vec<Weights> {
    (2..x.shape.len())
        .map(|d| adaptive_weights(x.shape[d], out.shape[d]))
        .collect()
}

fn adaptive_forward(cx: &mut Lowering, x: &TensorIr, out: &TensorIr) -> Lowered {
    let input = cx.get(x)?;
    let value = map_spatial(cx, &input, &adaptive(x, out));
    cx.set(out, value)
}

fn adaptive_backward(cx: &mut Lowering, x: &TensorIr, grad: &TensorIr, out: &TensorIr) -> Lowered {
    let gradient = cx.get(grad)?;
    let weights: Vec<Weights> = adaptive(x, grad).iter().map(Weights::transposed).collect();
    let value = map_spatial(cx, &gradient, &weights);
    cx.set(out, value)
}

/// `adaptive_avg_pool1d`.
pub(crate) fn adaptive_avg_pool1d(cx: &mut Lowering, ir: &AdaptiveAvgPool1dOpIr) -> Lowered {
    adaptive_forward(cx, &ir.x, &ir.out)
}

/// `adaptive_avg_pool2d`.
pub(crate) fn adaptive_avg_pool2d(cx: &mut Lowering, ir: &AdaptiveAvgPool2dOpIr) -> Lowered {
    adaptive_forward(cx, &ir.x, &ir.out)
}

/// `adaptive_avg_pool3d`.
pub(crate) fn adaptive_avg_pool3d(cx: &mut Lowering, ir: &AdaptiveAvgPool3dOpIr) -> Lowered {
    adaptive_forward(cx, &ir.x, &ir.out)
}

/// The gradient of `adaptive_avg_pool3d`.
pub(crate) fn adaptive_avg_pool3d_backward(
    cx: &mut Lowering,
    ir: &AdaptiveAvgPool3dBackwardOpIr,
) -> Lowered {
    adaptive_backward(cx, &ir.x, &ir.grad, &ir.out)
}

/// The gradient of `adaptive_avg_pool1d`.
pub(crate) fn adaptive_avg_pool1d_backward(
    cx: &mut Lowering,
    ir: &AdaptiveAvgPool1dBackwardOpIr,
) -> Lowered {
    adaptive_backward(cx, &ir.x, &ir.grad, &ir.out)
}

/// The gradient of `adaptive_avg_pool2d`.
pub(crate) fn adaptive_avg_pool2d_backward(
    cx: &mut Lowering,
    ir: &AdaptiveAvgPool2dBackwardOpIr,
) -> Lowered {
    adaptive_backward(cx, &ir.x, &ir.grad, &ir.out)
}

/// The source coordinate of output `index` along an axis of `length` inputs and `outputs`
/// outputs (unclamped).
fn source_coordinate(index: usize, length: usize, outputs: usize, align_corners: bool) -> f64 {
    if align_corners {
        (length - 1) as f64 / (outputs.saturating_sub(1)).max(1) as f64 * index as f64
    } else {
        (index as f64 + 0.5) * (length as f64 / outputs as f64) - 0.5
    }
}

/// The nearest source of output `index` along an axis (f64 coordinates, as Burn's forward
/// pass).
fn nearest_source(index: usize, length: usize, outputs: usize) -> usize {
    (length as f64 / outputs as f64 * index as f64).floor() as usize
}

/// The source of output `index` under nearest-exact interpolation (PyTorch's `nearest-exact`):
/// the input element whose centre is nearest the output element's centre.
fn nearest_exact_source(index: usize, length: usize, outputs: usize) -> usize {
    let source = ((index as f64 + 0.5) * length as f64 / outputs as f64).floor() as usize;
    source.min(length.saturating_sub(1))
}

/// The nearest interpolation's gradient weights: Burn's backward pass finds the source with
/// f32 arithmetic.
fn nearest_backward_weights(length: usize, outputs: usize) -> Weights {
    let mut weights = Weights::zeros(outputs, length);
    for output in 0..outputs {
        let source = ((output as f32 * length as f32) / outputs as f32).floor() as usize;
        weights.add(output, source, 1.0);
    }
    weights
}

fn cubic_weights(t: f64) -> [f64; 4] {
    const A: f64 = -0.75;
    let near = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

fn lanczos3(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    if x.abs() >= 3.0 {
        return 0.0;
    }
    let pi_x = std::f64::consts::PI * x;
    (pi_x.sin() * (pi_x / 3.0).sin()) / (pi_x * (pi_x / 3.0))
}

/// The interpolation weights of one axis for the filtering modes.
fn interpolation_weights(
    mode: &InterpolateModeIr,
    align_corners: bool,
    length: usize,
    outputs: usize,
) -> Weights {
    let mut weights = Weights::zeros(outputs, length);
    let last = length as isize - 1;
    for output in 0..outputs {
        let coordinate = source_coordinate(output, length, outputs, align_corners);
        match mode {
            InterpolateModeIr::Nearest => {
                weights.add(output, nearest_source(output, length, outputs), 1.0);
            }
            InterpolateModeIr::NearestExact => {
                weights.add(output, nearest_exact_source(output, length, outputs), 1.0);
            }
            InterpolateModeIr::Bilinear => {
                let coordinate = if align_corners {
                    coordinate
                } else {
                    coordinate.clamp(0.0, last as f64)
                };
                let low = coordinate.floor();
                let high = coordinate.ceil().min(last as f64);
                let t = coordinate - low;
                weights.add(output, low as usize, 1.0 - t);
                weights.add(output, high as usize, t);
            }
            InterpolateModeIr::Bicubic => {
                let low = coordinate.floor();
                let taps = cubic_weights(coordinate - low);
                for (offset, weight) in (-1..=2).zip(taps) {
                    let source = (low as isize + offset).clamp(0, last);
                    weights.add(output, source as usize, weight);
                }
            }
            InterpolateModeIr::Lanczos3 => {
                let low = coordinate.floor();
                let taps: Vec<(usize, f64)> = (-2..=3)
                    .map(|offset| (low as isize + offset, offset))
                    .filter(|&(source, _)| (0..=last).contains(&source))
                    .map(|(source, offset)| {
                        (
                            source as usize,
                            lanczos3(coordinate - (low + offset as f64)),
                        )
                    })
                    .collect();
                let total: f64 = taps.iter().map(|&(_, weight)| weight).sum();
                let scale = if total != 0.0 { 1.0 / total } else { 1.0 };
                for (source, weight) in taps {
                    weights.add(output, source, weight * scale);
                }
            }
        }
    }
    weights
}

/// `value` at `sources` along `axis` (a gather of whole slices).
fn take(cx: &mut Lowering, value: &Value, axis: usize, sources: &[usize]) -> Value {
    let indices: Vec<i32> = sources.iter().map(|&source| source as i32).collect();
    let indices = cx.builder.constant_s32(&indices);
    select_slices(cx, value, &indices, axis)
}

/// The per-axis weights of an interpolation from `x`'s spatial size to `output_size`.
fn interpolation(
    options: &InterpolateOptionsIr,
    x: &TensorIr,
    output_size: [usize; 2],
) -> Vec<Weights> {
    (0..2)
        .map(|d| {
            interpolation_weights(
                &options.mode,
                options.align_corners,
                x.shape[2 + d],
                output_size[d],
            )
        })
        .collect()
}

/// `interpolate` (2-d, every mode).
pub(crate) fn interpolate(cx: &mut Lowering, ir: &InterpolateOpIr) -> Lowered {
    let input = cx.get(&ir.x)?;
    let nearest = match ir.options.mode {
        InterpolateModeIr::Nearest => Some(nearest_source as fn(usize, usize, usize) -> usize),
        InterpolateModeIr::NearestExact => Some(nearest_exact_source as _),
        _ => None,
    };
    let value = if let Some(source) = nearest {
        (0..2).fold(input, |value, d| {
            let (length, outputs) = (ir.x.shape[2 + d], ir.output_size[d]);
            let sources: Vec<usize> = (0..outputs)
                .map(|output| source(output, length, outputs))
                .collect();
            take(cx, &value, 2 + d, &sources)
        })
    } else {
        map_spatial(
            cx,
            &input,
            &interpolation(&ir.options, &ir.x, ir.output_size),
        )
    };
    cx.set(&ir.out, value)
}

/// The gradient of `interpolate`.
pub(crate) fn interpolate_backward(cx: &mut Lowering, ir: &InterpolateBackwardOpIr) -> Lowered {
    let gradient = cx.get(&ir.grad)?;
    let weights: Vec<Weights> = if ir.options.mode == InterpolateModeIr::Nearest {
        (0..2)
            .map(|d| nearest_backward_weights(ir.x.shape[2 + d], ir.output_size[d]))
            .collect()
    } else {
        interpolation(&ir.options, &ir.x, ir.output_size)
    };
    let transposed: Vec<Weights> = weights.iter().map(Weights::transposed).collect();
    let value = map_spatial(cx, &gradient, &transposed);
    cx.set(&ir.out, value)
}
