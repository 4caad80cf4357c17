//! The deformable 2-d convolution and its backward pass, as Burn defines them (`burn-ndarray`'s
//! reference, torchvision's layout): each kernel tap samples the input bilinearly at its place
//! moved by a learnt offset (`[batch, 2 · offset_groups · taps, out_h, out_w]`, `y` then `x` per
//! tap), scaled by an optional mask (`[batch, offset_groups · taps, out_h, out_w]`); the sampled
//! columns are multiplied by the weight per weight group.
//!
//! The samples are four gathers (the corners) from the flattened input, each weighted by its
//! bilinear weight and zero outside the input; a sample whose point lies outside `(−1, size)` is
//! zero. The backward pass scatters the columns' gradient to the four corners (input), weights
//! the corners' differences (offsets), multiplies by the samples (mask) and transposes the
//! grouped product (weight, and the columns' gradient). Computed in f32.

use burn_ir::{DeformConv2dBackwardOpIr, DeformConv2dOpIr, DeformableConv2dOptionsIr, TensorIr};

use super::builder::{Combiner, Direction, Value};
use super::context::{Lowered, Lowering};
use super::index::{gather_along, scatter_along};
use super::reduce::{Reduction, reduce};
use crate::hlo::{DotDimensionNumbers, PrimitiveType};

const F32: PrimitiveType = PrimitiveType::F32;

/// The sizes of one deformable convolution.
struct Shape {
    batch: i64,
    channels: i64,
    height: i64,
    width: i64,
    out_channels: i64,
    kernel: [i64; 2],
    out: [i64; 2],
    weight_groups: i64,
    offset_groups: i64,
}

impl Shape {
    fn of(
        x: &TensorIr,
        weight: &TensorIr,
        offset: &TensorIr,
        options: &DeformableConv2dOptionsIr,
    ) -> Self {
        let size = |tensor: &TensorIr, d: usize| tensor.shape[d] as i64;
        Self {
            batch: size(x, 0),
            channels: size(x, 1),
            height: size(x, 2),
            width: size(x, 3),
            out_channels: size(weight, 0),
            kernel: [size(weight, 2), size(weight, 3)],
            out: [size(offset, 2), size(offset, 3)],
            weight_groups: options.weight_groups as i64,
            offset_groups: options.offset_groups as i64,
        }
    }

    fn taps(&self) -> i64 {
        self.kernel[0] * self.kernel[1]
    }

    fn positions(&self) -> i64 {
        self.out[0] * self.out[1]
    }

    /// `[batch, channels, taps, out_h, out_w]`: one sample per channel, tap and position.
    fn per_channel(&self) -> Vec<i64> {
        vec![
            self.batch,
            self.channels,
            self.taps(),
            self.out[0],
            self.out[1],
        ]
    }

    /// `[batch, offset_groups, channels / offset_groups, taps, out_h, out_w]`: the channels of
    /// each offset group apart.
    fn channels_by_group(&self) -> [i64; 6] {
        [
            self.batch,
            self.offset_groups,
            self.channels / self.offset_groups,
            self.taps(),
            self.out[0],
            self.out[1],
        ]
    }

    /// `[batch, offset_groups, taps, out_h, out_w]`: one value per offset group, tap, position.
    fn per_group(&self) -> Vec<i64> {
        vec![
            self.batch,
            self.offset_groups,
            self.taps(),
            self.out[0],
            self.out[1],
        ]
    }
}

/// The bilinear samples of every channel at every tap and position, and what the backward pass
/// needs of them.
struct Sampling {
    /// Each corner's flat index into an input plane (clamped inside), `[b, c, taps·positions]`.
    corner_indices: [Value; 4],
    /// Each corner's bilinear weight, zero where the corner lies outside, per channel.
    corner_weights: [Value; 4],
    /// Each corner's input value, zero where it lies outside, per channel.
    corner_values: [Value; 4],
    /// The fractional parts of the sampling point, `y − ⌊y⌋` and `x − ⌊x⌋`, per channel.
    fractions: [Value; 2],
    /// The bilinear samples (zero for points outside `(−1, size)`), per channel.
    samples: Value,
    /// The mask per channel (ones without one).
    mask: Value,
}

/// `value` of one entry per offset group (`[b, groups, taps, oh, ow]`) repeated for each channel
/// of its group (`[b, c, taps, oh, ow]`).
fn to_channels(cx: &mut Lowering, value: &Value, shape: &Shape) -> Value {
    let spread = cx
        .builder
        .broadcast(value, &shape.channels_by_group(), &[0, 1, 3, 4, 5]);
    cx.builder.reshape(&spread, &shape.per_channel())
}

/// Sums `value` (per channel) over the channels of each offset group.
fn to_groups(cx: &mut Lowering, value: &Value, shape: &Shape) -> Value {
    let split = cx.builder.reshape(value, &shape.channels_by_group());
    reduce(cx, Reduction::Sum, &split, &[2])
}

fn sample(
    cx: &mut Lowering,
    input: &Value,
    offset: &Value,
    mask: Option<&Value>,
    shape: &Shape,
    options: &DeformableConv2dOptionsIr,
) -> Sampling {
    let group_dims = shape.per_group();
    let channel_dims = shape.per_channel();
    // The offsets as [b, groups, taps, 2, oh, ow]; y is 0, x is 1.
    let split = [
        shape.batch,
        shape.offset_groups,
        shape.taps(),
        2,
        shape.out[0],
        shape.out[1],
    ];
    let offsets = cx.builder.reshape(offset, &split);
    let point = |cx: &mut Lowering, axis: usize| {
        let mut start = vec![0; 6];
        let mut limit = split.to_vec();
        start[3] = axis as i64;
        limit[3] = axis as i64 + 1;
        let moved = cx.builder.slice(&offsets, &start, &limit, &[1; 6]);
        let moved = cx.builder.reshape(&moved, &group_dims);
        // The tap's place: out · stride − padding + tap · dilation.
        let out_position = cx.builder.iota(F32, &group_dims, 3 + axis);
        let tap = cx.builder.iota(PrimitiveType::S32, &group_dims, 2);
        let kernel_width =
            cx.builder
                .filled(PrimitiveType::S32, shape.kernel[1] as f64, &group_dims);
        let tap_index = if axis == 0 {
            cx.builder.binary("divide", &tap, &kernel_width)
        } else {
            cx.builder.binary("remainder", &tap, &kernel_width)
        };
        let tap_index = cx.builder.convert(&tap_index, F32);
        let stride = cx
            .builder
            .filled(F32, options.stride[axis] as f64, &group_dims);
        let dilation = cx
            .builder
            .filled(F32, options.dilation[axis] as f64, &group_dims);
        let padding = cx
            .builder
            .filled(F32, options.padding[axis] as f64, &group_dims);
        let strided = cx.builder.binary("multiply", &out_position, &stride);
        let dilated = cx.builder.binary("multiply", &tap_index, &dilation);
        let base = cx.builder.binary("add", &strided, &dilated);
        let base = cx.builder.binary("subtract", &base, &padding);
        let place = cx.builder.binary("add", &base, &moved);
        to_channels(cx, &place, shape)
    };
    let y = point(cx, 0);
    let x = point(cx, 1);
    let flat_dims = [
        shape.batch,
        shape.channels,
        shape.taps() * shape.positions(),
    ];
    let planes = cx.builder.reshape(
        input,
        &[shape.batch, shape.channels, shape.height * shape.width],
    );
    let low = [cx.builder.unary("floor", &y), cx.builder.unary("floor", &x)];
    let fractions = [
        cx.builder.binary("subtract", &y, &low[0]),
        cx.builder.binary("subtract", &x, &low[1]),
    ];
    let one = cx.builder.filled(F32, 1.0, &channel_dims);
    let complements = [
        cx.builder.binary("subtract", &one, &fractions[0]),
        cx.builder.binary("subtract", &one, &fractions[1]),
    ];
    let zero = cx.builder.filled(F32, 0.0, &channel_dims);
    let sizes = [shape.height, shape.width];
    let mut corner_indices = Vec::new();
    let mut corner_weights = Vec::new();
    let mut corner_values = Vec::new();
    for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let mut valid = None;
        let mut clamped = Vec::new();
        for (axis, step) in [(0, dy), (1, dx)] {
            let shift = cx.builder.filled(F32, step as f64, &channel_dims);
            let coordinate = cx.builder.binary("add", &low[axis], &shift);
            let limit = cx.builder.filled(F32, sizes[axis] as f64, &channel_dims);
            let above = cx.builder.compare(Direction::Ge, &coordinate, &zero);
            let below = cx.builder.compare(Direction::Lt, &coordinate, &limit);
            let inside = cx.builder.binary("and", &above, &below);
            valid = Some(match valid {
                None => inside,
                Some(previous) => cx.builder.binary("and", &previous, &inside),
            });
            let last = cx
                .builder
                .filled(F32, (sizes[axis] - 1) as f64, &channel_dims);
            let bounded = cx.builder.binary("maximum", &coordinate, &zero);
            let bounded = cx.builder.binary("minimum", &bounded, &last);
            clamped.push(cx.builder.convert(&bounded, PrimitiveType::S32));
        }
        let valid = valid.expect("two axes");
        let width = cx
            .builder
            .filled(PrimitiveType::S32, shape.width as f64, &channel_dims);
        let row = cx.builder.binary("multiply", &clamped[0], &width);
        let index = cx.builder.binary("add", &row, &clamped[1]);
        let index = cx.builder.reshape(&index, &flat_dims);
        let value = gather_along(cx, &planes, &index, 2);
        let value = cx.builder.reshape(&value, &channel_dims);
        let value = cx.builder.select(&valid, &value, &zero);
        let weight_y = if dy == 0 {
            &complements[0]
        } else {
            &fractions[0]
        };
        let weight_x = if dx == 0 {
            &complements[1]
        } else {
            &fractions[1]
        };
        let weight = cx.builder.binary("multiply", weight_y, weight_x);
        let weight = cx.builder.select(&valid, &weight, &zero);
        corner_indices.push(index);
        corner_weights.push(weight);
        corner_values.push(value);
    }
    let mut samples = zero.clone();
    for (weight, value) in corner_weights.iter().zip(&corner_values) {
        let weighted = cx.builder.binary("multiply", weight, value);
        samples = cx.builder.binary("add", &samples, &weighted);
    }
    // Points outside (−1, size) sample nothing.
    let mut in_range = None;
    for (axis, point) in [(0, &y), (1, &x)] {
        let minus_one = cx.builder.filled(F32, -1.0, &channel_dims);
        let limit = cx.builder.filled(F32, sizes[axis] as f64, &channel_dims);
        let above = cx.builder.compare(Direction::Gt, point, &minus_one);
        let below = cx.builder.compare(Direction::Lt, point, &limit);
        let inside = cx.builder.binary("and", &above, &below);
        in_range = Some(match in_range {
            None => inside,
            Some(previous) => cx.builder.binary("and", &previous, &inside),
        });
    }
    let samples = cx
        .builder
        .select(&in_range.expect("two axes"), &samples, &zero);
    let mask = match mask {
        Some(mask) => {
            let mask = cx.builder.reshape(mask, &group_dims);
            to_channels(cx, &mask, shape)
        }
        None => one,
    };
    let four = |values: Vec<Value>| -> [Value; 4] { values.try_into().expect("four corners") };
    Sampling {
        corner_indices: four(corner_indices),
        corner_weights: four(corner_weights),
        corner_values: four(corner_values),
        fractions,
        samples,
        mask,
    }
}

/// The grouped product `[groups, a, k] · [groups, k, b]` → `[groups, a, b]`.
fn grouped_product(
    cx: &mut Lowering,
    lhs: &Value,
    rhs: &Value,
    lhs_contract: i64,
    rhs_contract: i64,
) -> Value {
    let numbers = DotDimensionNumbers {
        lhs_contracting_dimensions: vec![lhs_contract],
        rhs_contracting_dimensions: vec![rhs_contract],
        lhs_batch_dimensions: vec![0],
        rhs_batch_dimensions: vec![0],
    };
    let free = |value: &Value, contract: i64| value.dims[if contract == 1 { 2 } else { 1 }];
    let dims = [
        lhs.dims[0],
        free(lhs, lhs_contract),
        free(rhs, rhs_contract),
    ];
    cx.builder.dot(lhs, rhs, numbers, &dims)
}

/// The columns `[b, c, taps, p]` as `[weight_groups, (c / groups) · taps, b · p]`.
fn grouped_columns(cx: &mut Lowering, columns: &Value, shape: &Shape) -> Value {
    let per_group = shape.channels / shape.weight_groups;
    let split = [
        shape.batch,
        shape.weight_groups,
        per_group * shape.taps(),
        shape.positions(),
    ];
    let split = cx.builder.reshape(columns, &split);
    let moved = cx.builder.transpose(&split, &[1, 2, 0, 3]);
    cx.builder.reshape(
        &moved,
        &[
            shape.weight_groups,
            per_group * shape.taps(),
            shape.batch * shape.positions(),
        ],
    )
}

/// The weight `[o, c / groups, kh, kw]` as `[groups, o / groups, (c / groups) · taps]`.
fn grouped_weight(cx: &mut Lowering, weight: &Value, shape: &Shape) -> Value {
    let per_group = shape.channels / shape.weight_groups;
    cx.builder.reshape(
        weight,
        &[
            shape.weight_groups,
            shape.out_channels / shape.weight_groups,
            per_group * shape.taps(),
        ],
    )
}

/// `[groups, o / groups, b · p]` as `[b, o, oh, ow]`, and back.
fn ungroup_output(cx: &mut Lowering, value: &Value, shape: &Shape) -> Value {
    let split = [shape.out_channels, shape.batch, shape.out[0], shape.out[1]];
    let split = cx.builder.reshape(value, &split);
    cx.builder.transpose(&split, &[1, 0, 2, 3])
}

fn group_output(cx: &mut Lowering, gradient: &Value, shape: &Shape) -> Value {
    let moved = cx.builder.transpose(gradient, &[1, 0, 2, 3]);
    cx.builder.reshape(
        &moved,
        &[
            shape.weight_groups,
            shape.out_channels / shape.weight_groups,
            shape.batch * shape.positions(),
        ],
    )
}

fn wide(cx: &mut Lowering, tensor: &TensorIr) -> Lowered<Value> {
    let value = cx.get(tensor)?;
    Ok(cx.builder.convert(&value, F32))
}

fn wide_optional(cx: &mut Lowering, tensor: Option<&TensorIr>) -> Lowered<Option<Value>> {
    tensor.map(|tensor| wide(cx, tensor)).transpose()
}

/// Sets `out` to `value` converted to its dtype.
fn set_narrowed(cx: &mut Lowering, out: &TensorIr, value: &Value) -> Lowered {
    let element_type = super::context::element_type(out.dtype)?;
    let value = cx.builder.convert(value, element_type);
    let value = cx.builder.reshape(&value, &super::context::dims(out));
    cx.set(out, value)
}

/// The columns (masked samples) of every channel, tap and position, `[b, c, taps, p]`.
fn columns(cx: &mut Lowering, sampling: &Sampling, shape: &Shape) -> Value {
    let masked = cx
        .builder
        .binary("multiply", &sampling.samples, &sampling.mask);
    cx.builder.reshape(
        &masked,
        &[shape.batch, shape.channels, shape.taps(), shape.positions()],
    )
}

/// `deform_conv2d`: the samples masked, times the weight per group, plus the bias.
pub(crate) fn deform_conv2d(cx: &mut Lowering, ir: &DeformConv2dOpIr) -> Lowered {
    let shape = Shape::of(&ir.x, &ir.weight, &ir.offset, &ir.options);
    let input = wide(cx, &ir.x)?;
    let offset = wide(cx, &ir.offset)?;
    let weight = wide(cx, &ir.weight)?;
    let mask = wide_optional(cx, ir.mask.as_ref())?;
    let sampling = sample(cx, &input, &offset, mask.as_ref(), &shape, &ir.options);
    let columns = columns(cx, &sampling, &shape);
    let columns = grouped_columns(cx, &columns, &shape);
    let weight = grouped_weight(cx, &weight, &shape);
    let product = grouped_product(cx, &weight, &columns, 2, 1);
    let mut out = ungroup_output(cx, &product, &shape);
    if let Some(bias) = wide_optional(cx, ir.bias.as_ref())? {
        let bias = cx.builder.broadcast(&bias, &out.dims.clone(), &[1]);
        out = cx.builder.binary("add", &out, &bias);
    }
    set_narrowed(cx, &ir.out, &out)
}

/// The gradients of `deform_conv2d` for its input, offsets, weight, mask and bias.
pub(crate) fn deform_conv2d_backward(cx: &mut Lowering, ir: &DeformConv2dBackwardOpIr) -> Lowered {
    let shape = Shape::of(&ir.x, &ir.weight, &ir.offset, &ir.options);
    let input = wide(cx, &ir.x)?;
    let offset = wide(cx, &ir.offset)?;
    let weight = wide(cx, &ir.weight)?;
    let mask = wide_optional(cx, ir.mask.as_ref())?;
    let gradient = wide(cx, &ir.out_grad)?;
    let sampling = sample(cx, &input, &offset, mask.as_ref(), &shape, &ir.options);
    let grouped_gradient = group_output(cx, &gradient, &shape);

    // The weight's gradient: the output's gradient times the columns, per group.
    let columns = columns(cx, &sampling, &shape);
    let grouped = grouped_columns(cx, &columns, &shape);
    let weight_gradient = grouped_product(cx, &grouped_gradient, &grouped, 2, 2);
    set_narrowed(cx, &ir.weight_grad, &weight_gradient)?;

    // The columns' gradient: the weight transposed times the output's gradient, per group.
    let grouped_weight = grouped_weight(cx, &weight, &shape);
    let column_gradient = grouped_product(cx, &grouped_weight, &grouped_gradient, 1, 1);
    let per_group = shape.channels / shape.weight_groups;
    let split = [
        shape.weight_groups,
        per_group * shape.taps(),
        shape.batch,
        shape.positions(),
    ];
    let column_gradient = cx.builder.reshape(&column_gradient, &split);
    let column_gradient = cx.builder.transpose(&column_gradient, &[2, 0, 1, 3]);
    let channel_dims = shape.per_channel();
    let column_gradient = cx.builder.reshape(&column_gradient, &channel_dims);
    let masked_gradient = cx
        .builder
        .binary("multiply", &column_gradient, &sampling.mask);

    // The input's gradient: each corner's share, scattered to its place.
    let flat = [shape.batch, shape.channels, shape.height * shape.width];
    let mut input_gradient = cx.builder.filled(F32, 0.0, &flat);
    let spread = [
        shape.batch,
        shape.channels,
        shape.taps() * shape.positions(),
    ];
    for (index, weight) in sampling.corner_indices.iter().zip(&sampling.corner_weights) {
        let share = cx.builder.binary("multiply", &masked_gradient, weight);
        let share = cx.builder.reshape(&share, &spread);
        input_gradient = scatter_along(cx, &input_gradient, index, &share, 2, Combiner::Add);
    }
    set_narrowed(cx, &ir.input_grad, &input_gradient)?;

    // The offsets' gradient: the corners' differences weighted by the other axis' fraction.
    let [v1, v2, v3, v4] = &sampling.corner_values;
    let one = cx.builder.filled(F32, 1.0, &channel_dims);
    let slope = |cx: &mut Lowering, fraction: &Value, far: [&Value; 2], near: [&Value; 2]| {
        let complement = cx.builder.binary("subtract", &one, fraction);
        let far_difference = cx.builder.binary("subtract", far[0], far[1]);
        let near_difference = cx.builder.binary("subtract", near[0], near[1]);
        let far_part = cx.builder.binary("multiply", fraction, &far_difference);
        let near_part = cx.builder.binary("multiply", &complement, &near_difference);
        cx.builder.binary("add", &far_part, &near_part)
    };
    let slope_y = slope(cx, &sampling.fractions[1], [v4, v2], [v3, v1]);
    let slope_x = slope(cx, &sampling.fractions[0], [v4, v3], [v2, v1]);
    let offset_parts: Vec<Value> = [slope_y, slope_x]
        .iter()
        .map(|slope| {
            let product = cx.builder.binary("multiply", &masked_gradient, slope);
            let summed = to_groups(cx, &product, &shape);
            let mut with_axis = shape.per_group();
            with_axis.insert(3, 1);
            cx.builder.reshape(&summed, &with_axis)
        })
        .collect();
    let offset_gradient = cx.builder.concatenate(&offset_parts, 3);
    set_narrowed(cx, &ir.offset_grad, &offset_gradient)?;

    if let Some(mask_grad) = &ir.mask_grad {
        let product = cx
            .builder
            .binary("multiply", &column_gradient, &sampling.samples);
        let summed = to_groups(cx, &product, &shape);
        set_narrowed(cx, mask_grad, &summed)?;
    }
    if let Some(bias_grad) = &ir.bias_grad {
        let summed = reduce(cx, Reduction::Sum, &gradient, &[0, 2, 3]);
        set_narrowed(cx, bias_grad, &summed)?;
    }
    Ok(())
}
