//! Convolutions of one, two and three spatial dimensions as HLO `convolution`: the forward pass,
//! the gradients of the input, the weight and the bias, and the transposed convolution (which is
//! the input's gradient of the convolution it transposes).
//!
//! Burn's layouts: input `[batch, channels_in, spatial..]`, weight
//! `[channels_out, channels_in / groups, kernel..]` (a transposed convolution's weight is
//! `[channels_in, channels_out / groups, kernel..]`), output `[batch, channels_out, spatial..]`.
//! The gradients follow the transpose rules of XLA's convolution (as JAX derives them): the
//! input's gradient convolves the output's gradient, dilated by the stride, with the flipped
//! kernel; the weight's gradient convolves the input with the output's gradient as the kernel,
//! the groups moved from the features to the batch.

use burn_ir::{
    Conv1dOpIr, Conv1dWeightBackwardOpIr, Conv1dXBackwardOpIr, Conv2dOpIr,
    Conv2dWeightBackwardOpIr, Conv2dXBackwardOpIr, Conv3dOpIr, Conv3dWeightBackwardOpIr,
    Conv3dXBackwardOpIr, ConvTranspose1dOpIr, ConvTranspose1dWeightBackwardOpIr,
    ConvTranspose2dOpIr, ConvTranspose2dWeightBackwardOpIr, ConvTranspose3dOpIr,
    ConvTranspose3dWeightBackwardOpIr, TensorIr, Unfold4dOpIr,
};

use super::builder::{Value, WindowAxis};
use super::context::{Lowered, Lowering, dims};
use super::reduce::{Reduction, reduce};
use crate::hlo::ConvolutionDimensionNumbers;

/// The stride, padding, dilation and groups of a convolution, one entry per spatial dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub stride: Vec<i64>,
    /// `(before, after)` per spatial dimension (Burn 0.22 pads convolutions asymmetrically).
    pub padding: Vec<(i64, i64)>,
    pub dilation: Vec<i64>,
    pub groups: i64,
}

fn to_i64(values: &[usize]) -> Vec<i64> {
    values.iter().map(|&value| value as i64).collect()
}

/// A convolution's padding as `(before, after)` pairs: Burn 0.22 records asymmetric pairs for
/// convolutions and one symmetric amount for the other windowed modules.
trait PaddingPairs {
    fn pairs(&self) -> Vec<(i64, i64)>;
}

impl<const N: usize> PaddingPairs for [usize; N] {
    fn pairs(&self) -> Vec<(i64, i64)> {
        self.iter()
            .map(|&side| (side as i64, side as i64))
            .collect()
    }
}

impl<const N: usize> PaddingPairs for [(usize, usize); N] {
    fn pairs(&self) -> Vec<(i64, i64)> {
        self.iter()
            .map(|&(before, after)| (before as i64, after as i64))
            .collect()
    }
}

/// A convolution's (or transposed convolution's) operation: input, weight, bias and geometry.
pub(crate) trait ConvolutionIr {
    fn parts(&self) -> (&TensorIr, &TensorIr, Option<&TensorIr>, Geometry, &TensorIr);
}

/// The gradient operations of a convolution for its input or weight: input, weight, output
/// gradient and geometry.
pub(crate) trait ConvolutionGradientIr {
    fn parts(&self) -> (&TensorIr, &TensorIr, &TensorIr, Geometry, &TensorIr);
}

/// The [`Geometry`] of a convolution's options (every options type has the same fields).
macro_rules! geometry_of {
    ($options:expr) => {
        Geometry {
            stride: to_i64(&$options.stride),
            padding: $options.padding.pairs(),
            dilation: to_i64(&$options.dilation),
            groups: $options.groups as i64,
        }
    };
}

macro_rules! convolution_ir {
    ($($forward:ty),* ; $($gradient:ty),*) => {
        $(impl ConvolutionIr for $forward {
            fn parts(&self) -> (&TensorIr, &TensorIr, Option<&TensorIr>, Geometry, &TensorIr) {
                let geometry = geometry_of!(self.options);
                (&self.x, &self.weight, self.bias.as_ref(), geometry, &self.out)
            }
        })*
        $(impl ConvolutionGradientIr for $gradient {
            fn parts(&self) -> (&TensorIr, &TensorIr, &TensorIr, Geometry, &TensorIr) {
                let geometry = geometry_of!(self.options);
                (&self.x, &self.weight, &self.output_grad, geometry, &self.out)
            }
        })*
    };
}

convolution_ir!(
    Conv1dOpIr, Conv2dOpIr, Conv3dOpIr, ConvTranspose1dOpIr, ConvTranspose2dOpIr,
    ConvTranspose3dOpIr;
    Conv1dXBackwardOpIr, Conv2dXBackwardOpIr, Conv3dXBackwardOpIr, Conv1dWeightBackwardOpIr,
    Conv2dWeightBackwardOpIr, Conv3dWeightBackwardOpIr
);

/// The weight gradient of a transposed convolution `y = x *ᵀ w` is the weight gradient of the
/// convolution that maps `y` back to `x` with the same weight (Burn's transposed weight has the
/// convolution's layout): its input is `y`'s gradient, its output's gradient is `x`.
macro_rules! transposed_weight_gradient_ir {
    ($($gradient:ty),*) => {
        $(impl ConvolutionGradientIr for $gradient {
            fn parts(&self) -> (&TensorIr, &TensorIr, &TensorIr, Geometry, &TensorIr) {
                let geometry = geometry_of!(self.options);
                (&self.output_grad, &self.weight, &self.x, geometry, &self.out)
            }
        })*
    };
}

transposed_weight_gradient_ir!(
    ConvTranspose1dWeightBackwardOpIr,
    ConvTranspose2dWeightBackwardOpIr,
    ConvTranspose3dWeightBackwardOpIr
);

/// `unfold4d` (im2col): every `kernel_size` window of `x` `[batch, channels, height, width]`
/// as a column, `[batch, channels · kh · kw, windows]`, channel-major then kernel row then
/// column. Lowered as a grouped convolution with one-hot kernels, one group per channel.
pub(crate) fn unfold4d(cx: &mut Lowering, ir: &Unfold4dOpIr) -> Lowered {
    let input = cx.get(&ir.x)?;
    let [kernel_height, kernel_width] = ir.kernel_size.map(|size| size as i64);
    let positions = kernel_height * kernel_width;
    let channels = input.dims[1];
    let mut ones = vec![0.0f32; (positions * positions) as usize];
    for position in 0..positions {
        ones[(position * positions + position) as usize] = 1.0;
    }
    let one_hot = cx
        .builder
        .constant_f32(&ones, &[positions, 1, kernel_height, kernel_width]);
    // The same one-hot kernels for every channel: [channels · positions, 1, kh, kw].
    let tiled = cx.builder.broadcast(
        &one_hot,
        &[channels, positions, 1, kernel_height, kernel_width],
        &[1, 2, 3, 4],
    );
    let kernel = cx.builder.reshape(
        &tiled,
        &[channels * positions, 1, kernel_height, kernel_width],
    );
    let kernel = cx.builder.convert(&kernel, input.element_type);
    let options = &ir.options;
    let axes: Vec<WindowAxis> = (0..2)
        .map(|d| WindowAxis {
            padding_low: options.padding[d] as i64,
            padding_high: options.padding[d] as i64,
            window_dilation: options.dilation[d] as i64,
            ..WindowAxis::new(kernel.dims[2 + d], options.stride[d] as i64)
        })
        .collect();
    let out_dims = dims(&ir.out);
    let windows: Vec<i64> = (0..2)
        .map(|d| axes[d].positions(input.dims[2 + d]))
        .collect();
    let convolved = cx.builder.convolution(
        &input,
        &kernel,
        &axes,
        channels_first(2),
        (channels, 1),
        &[input.dims[0], channels * positions, windows[0], windows[1]],
    );
    let value = cx.builder.reshape(&convolved, &out_dims);
    cx.set(&ir.out, value)
}

impl Geometry {
    /// The extent of the dilated kernel along spatial dimension `d`.
    fn kernel_extent(&self, d: usize, kernel: i64) -> i64 {
        (kernel - 1) * self.dilation[d] + 1
    }
}

/// Burn's layout on both sides: batch, then features, then the spatial dimensions; the
/// kernel's output features first, then its input features.
fn channels_first(spatial: usize) -> ConvolutionDimensionNumbers {
    let spatial_dims: Vec<i64> = (2..2 + spatial as i64).collect();
    ConvolutionDimensionNumbers {
        input_batch_dimension: 0,
        input_feature_dimension: 1,
        input_spatial_dimensions: spatial_dims.clone(),
        kernel_output_feature_dimension: 0,
        kernel_input_feature_dimension: 1,
        kernel_spatial_dimensions: spatial_dims.clone(),
        output_batch_dimension: 0,
        output_feature_dimension: 1,
        output_spatial_dimensions: spatial_dims,
    }
}

/// `value + bias`, the bias `[features]` broadcast along dimension 1.
fn add_channel_bias(cx: &mut Lowering, value: Value, bias: Option<&TensorIr>) -> Lowered<Value> {
    let Some(bias) = bias else {
        return Ok(value);
    };
    let bias = cx.get(bias)?;
    let bias = cx.builder.convert(&bias, value.element_type);
    let bias = cx.builder.broadcast(&bias, &value.dims, &[1]);
    Ok(cx.builder.binary("add", &value, &bias))
}

/// The convolution `x * weight + bias`.
pub(crate) fn forward(cx: &mut Lowering, ir: &impl ConvolutionIr) -> Lowered {
    let (x, weight, bias, geometry, out) = ir.parts();
    let geometry = &geometry;
    let input = cx.get(x)?;
    let kernel = cx.get(weight)?;
    let kernel = cx.builder.convert(&kernel, input.element_type);
    let spatial = input.rank() - 2;
    let axes: Vec<WindowAxis> = (0..spatial)
        .map(|d| WindowAxis {
            padding_low: geometry.padding[d].0,
            padding_high: geometry.padding[d].1,
            window_dilation: geometry.dilation[d],
            ..WindowAxis::new(kernel.dims[2 + d], geometry.stride[d])
        })
        .collect();
    let value = cx.builder.convolution(
        &input,
        &kernel,
        &axes,
        channels_first(spatial),
        (geometry.groups, 1),
        &dims(out),
    );
    let value = add_channel_bias(cx, value, bias)?;
    cx.set(out, value)
}

/// The gradient for the input of the convolution with `weight` and `geometry` whose output's
/// gradient is `gradient`, for an input of `out_dims`. This is also the transposed convolution
/// of `gradient` (Burn's transposed weight is the convolution's weight).
fn input_gradient(
    cx: &mut Lowering,
    gradient: &Value,
    weight: &Value,
    geometry: &Geometry,
    out_dims: &[i64],
) -> Value {
    let spatial = gradient.rank() - 2;
    let groups = geometry.groups;
    let weight = cx.builder.convert(weight, gradient.element_type);
    // [out, in / g, k..] → [out / g, in, k..]: the groups leave the output features for the
    // input features, in the same group-major order.
    let kernel = if groups == 1 {
        weight
    } else {
        let (outputs, inputs) = (weight.dims[0], weight.dims[1]);
        let kernel_dims = &weight.dims[2..];
        let split: Vec<i64> = [groups, outputs / groups, inputs]
            .iter()
            .chain(kernel_dims)
            .copied()
            .collect();
        let split = cx.builder.reshape(&weight, &split);
        let permutation: Vec<i64> = [1, 0, 2].into_iter().chain(3..3 + spatial as i64).collect();
        let moved = cx.builder.transpose(&split, &permutation);
        let merged: Vec<i64> = [outputs / groups, groups * inputs]
            .iter()
            .chain(kernel_dims)
            .copied()
            .collect();
        cx.builder.reshape(&moved, &merged)
    };
    let flipped_axes: Vec<i64> = (2..2 + spatial as i64).collect();
    let kernel = cx.builder.reverse(&kernel, &flipped_axes);
    let axes: Vec<WindowAxis> = (0..spatial)
        .map(|d| {
            let size = kernel.dims[2 + d];
            let extent = geometry.kernel_extent(d, size);
            let stride = geometry.stride[d];
            let dilated_gradient = (gradient.dims[2 + d] - 1) * stride + 1;
            let padding_low = extent - 1 - geometry.padding[d].0;
            WindowAxis {
                padding_low,
                padding_high: out_dims[2 + d] + extent - 1 - dilated_gradient - padding_low,
                window_dilation: geometry.dilation[d],
                base_dilation: stride,
                ..WindowAxis::new(size, 1)
            }
        })
        .collect();
    let mut numbers = channels_first(spatial);
    numbers.kernel_input_feature_dimension = 0;
    numbers.kernel_output_feature_dimension = 1;
    cx.builder
        .convolution(gradient, &kernel, &axes, numbers, (groups, 1), out_dims)
}

/// The gradient of a convolution for its input.
pub(crate) fn x_backward(cx: &mut Lowering, ir: &impl ConvolutionGradientIr) -> Lowered {
    let (_, weight, output_grad, geometry, out) = ir.parts();
    let geometry = &geometry;
    let weight = cx.get(weight)?;
    let gradient = cx.get(output_grad)?;
    let value = input_gradient(cx, &gradient, &weight, geometry, &dims(out));
    cx.set(out, value)
}

/// The transposed convolution `x *ᵀ weight + bias`.
pub(crate) fn transposed(cx: &mut Lowering, ir: &impl ConvolutionIr) -> Lowered {
    let (x, weight, bias, geometry, out) = ir.parts();
    let geometry = &geometry;
    let input = cx.get(x)?;
    let weight = cx.get(weight)?;
    let value = input_gradient(cx, &input, &weight, geometry, &dims(out));
    let value = add_channel_bias(cx, value, bias)?;
    cx.set(out, value)
}

/// The gradient of a convolution for its weight: the input convolved with the output's
/// gradient, batch and features exchanged, the groups carried by the batch.
pub(crate) fn weight_backward(cx: &mut Lowering, ir: &impl ConvolutionGradientIr) -> Lowered {
    let (x, _, output_grad, geometry, out) = ir.parts();
    let geometry = &geometry;
    let input = cx.get(x)?;
    let gradient = cx.get(output_grad)?;
    let gradient = cx.builder.convert(&gradient, input.element_type);
    let out_dims = dims(out);
    let spatial = input.rank() - 2;
    let axes: Vec<WindowAxis> = (0..spatial)
        .map(|d| {
            let extent = geometry.kernel_extent(d, out_dims[2 + d]);
            let dilated_gradient = (gradient.dims[2 + d] - 1) * geometry.stride[d] + 1;
            let padding = geometry.padding[d].0;
            WindowAxis {
                padding_low: padding,
                padding_high: dilated_gradient - input.dims[2 + d] + extent - padding - 1,
                window_dilation: geometry.stride[d],
                ..WindowAxis::new(gradient.dims[2 + d], geometry.dilation[d])
            }
        })
        .collect();
    let spatial_dims: Vec<i64> = (2..2 + spatial as i64).collect();
    let numbers = ConvolutionDimensionNumbers {
        input_batch_dimension: 1,
        input_feature_dimension: 0,
        input_spatial_dimensions: spatial_dims.clone(),
        kernel_input_feature_dimension: 0,
        kernel_output_feature_dimension: 1,
        kernel_spatial_dimensions: spatial_dims.clone(),
        output_batch_dimension: 1,
        output_feature_dimension: 0,
        output_spatial_dimensions: spatial_dims,
    };
    let value = cx.builder.convolution(
        &input,
        &gradient,
        &axes,
        numbers,
        (1, geometry.groups),
        &out_dims,
    );
    cx.set(out, value)
}

/// The gradient of a convolution for its bias: the output's gradient summed over every
/// dimension but the features.
pub(crate) fn bias_backward(cx: &mut Lowering, output_grad: &TensorIr, out: &TensorIr) -> Lowered {
    let gradient = cx.get(output_grad)?;
    let summed: Vec<usize> = (0..gradient.rank()).filter(|&d| d != 1).collect();
    let value = reduce(cx, Reduction::Sum, &gradient, &summed);
    cx.set(out, value)
}
