//! Operations that move elements without computing: reshape, transposes, flips, expansion,
//! slices (read and assign), concatenation, repetition and sliding windows (`unfold`).

use burn_backend::Slice;
use burn_ir::{
    CatOpIr, FlipOpIr, PermuteOpIr, RepeatDimOpIr, ShapeOpIr, SliceAssignOpIr, SliceOpIr,
    SwapDimsOpIr, UnfoldOpIr,
};

use super::builder::Combiner;
use super::context::{Lowered, Lowering, dims, unsupported};
use super::index::{scatter_elements, stack_coordinates};
use crate::hlo::{GatherDimensionNumbers, PrimitiveType};

/// `reshape`: same elements, new dimensions.
pub(crate) fn reshape(cx: &mut Lowering, ir: &ShapeOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let value = cx.builder.reshape(&input, &dims(&ir.out));
    cx.set(&ir.out, value)
}

/// `expand`: NumPy broadcasting to the output shape.
pub(crate) fn expand(cx: &mut Lowering, ir: &ShapeOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let value = cx.builder.broadcast_to(&input, &dims(&ir.out));
    cx.set(&ir.out, value)
}

/// `swap_dims`.
pub(crate) fn swap_dims(cx: &mut Lowering, ir: &SwapDimsOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let mut permutation: Vec<i64> = (0..input.rank() as i64).collect();
    permutation.swap(ir.dim1, ir.dim2);
    let value = cx.builder.transpose(&input, &permutation);
    cx.set(&ir.out, value)
}

/// `permute`.
pub(crate) fn permute(cx: &mut Lowering, ir: &PermuteOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let permutation: Vec<i64> = ir.axes.iter().map(|&axis| axis as i64).collect();
    let value = cx.builder.transpose(&input, &permutation);
    cx.set(&ir.out, value)
}

/// `flip`.
pub(crate) fn flip(cx: &mut Lowering, ir: &FlipOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let axes: Vec<i64> = ir.axes.iter().map(|&axis| axis as i64).collect();
    let value = cx.builder.reverse(&input, &axes);
    cx.set(&ir.out, value)
}

/// A slice as static `(start, limit, stride)` with a positive stride, or why not.
fn bounds(slice: &Slice, size: i64) -> Lowered<(i64, i64, i64)> {
    let normalize = |index: isize| {
        let index = index as i64;
        if index < 0 {
            (index + size).max(0)
        } else {
            index.min(size)
        }
    };
    let start = normalize(slice.start);
    let end = slice.end.map_or(size, normalize);
    if slice.step == 0 {
        return unsupported("slice step 0");
    }
    Ok((start, end.max(start), slice.step as i64))
}

/// Per-dimension bounds of `ranges` over `dims` (missing ranges take the whole dimension).
fn all_bounds(ranges: &[Slice], dims: &[i64]) -> Lowered<(Vec<i64>, Vec<i64>, Vec<i64>)> {
    let (mut starts, mut limits, mut strides) = (Vec::new(), Vec::new(), Vec::new());
    for (d, &size) in dims.iter().enumerate() {
        let (start, limit, stride) = match ranges.get(d) {
            Some(slice) => bounds(slice, size)?,
            None => (0, size, 1),
        };
        starts.push(start);
        limits.push(limit);
        strides.push(stride);
    }
    Ok((starts, limits, strides))
}

/// `slice` with positive steps.
pub(crate) fn slice(cx: &mut Lowering, ir: &SliceOpIr) -> Lowered {
    let input = cx.get(&ir.tensor)?;
    let (starts, limits, strides) = all_bounds(&ir.ranges, &input.dims)?;
    let backward: Vec<i64> = (0..strides.len() as i64)
        .filter(|&d| strides[d as usize] < 0)
        .collect();
    if backward.is_empty() {
        let value = cx.builder.slice(&input, &starts, &limits, &strides);
        return cx.set(&ir.out, value);
    }
    // A negative step walks its range from the end: the range, reversed, then every |step|-th
    // element from its start.
    let forward_strides: Vec<i64> = strides.iter().map(|&s| if s < 0 { 1 } else { s }).collect();
    let ranges = cx.builder.slice(&input, &starts, &limits, &forward_strides);
    let reversed = cx.builder.reverse(&ranges, &backward);
    let zeros = vec![0; strides.len()];
    let magnitudes: Vec<i64> = strides
        .iter()
        .map(|&s| if s < 0 { -s } else { 1 })
        .collect();
    let value = cx
        .builder
        .slice(&reversed, &zeros, &reversed.dims.clone(), &magnitudes);
    cx.set(&ir.out, value)
}

/// `slice_assign` with unit steps: the value is written over the slice.
pub(crate) fn slice_assign(cx: &mut Lowering, ir: &SliceAssignOpIr) -> Lowered {
    let tensor = cx.get(&ir.tensor)?;
    let value = cx.get(&ir.value)?;
    let (starts, limits, strides) = all_bounds(&ir.ranges, &tensor.dims)?;
    let value = cx.builder.convert(&value, tensor.element_type);
    if strides.iter().all(|&stride| stride == 1) {
        let result = cx.builder.update_slice(&tensor, &value, &starts);
        return cx.set(&ir.out, result);
    }
    // Steps other than 1: every element of `value` written at its own coordinates, the range's
    // start plus its index times the step (from the range's end backwards for a negative step).
    let rank = tensor.rank();
    let index_type = PrimitiveType::S32;
    let columns: Vec<_> = (0..rank)
        .map(|d| {
            let first = if strides[d] < 0 {
                limits[d] - 1
            } else {
                starts[d]
            };
            let index = cx.builder.iota(index_type, &value.dims, d);
            let step = cx
                .builder
                .filled(index_type, strides[d] as f64, &value.dims);
            let offset = cx.builder.filled(index_type, first as f64, &value.dims);
            let scaled = cx.builder.binary("multiply", &index, &step);
            cx.builder.binary("add", &scaled, &offset)
        })
        .collect();
    let coordinates = stack_coordinates(cx, &columns);
    let result = scatter_elements(cx, &tensor, &coordinates, &value, Combiner::Replace);
    cx.set(&ir.out, result)
}

/// `cat` along one dimension.
pub(crate) fn cat(cx: &mut Lowering, ir: &CatOpIr) -> Lowered {
    let values = ir
        .tensors
        .iter()
        .map(|tensor| cx.get(tensor))
        .collect::<Lowered<Vec<_>>>()?;
    let value = cx.builder.concatenate(&values, ir.dim);
    cx.set(&ir.out, value)
}

/// `repeat_dim`: the tensor repeated `times` along `dim`.
pub(crate) fn repeat_dim(cx: &mut Lowering, ir: &RepeatDimOpIr) -> Lowered {
    let input = cx.get(&ir.tensor)?;
    // [.., d, ..] -> broadcast to [.., times, d, ..] -> reshape to [.., times * d, ..].
    let mut stretched = input.dims.clone();
    stretched.insert(ir.dim, ir.times as i64);
    let mapping: Vec<i64> = (0..input.rank())
        .map(|d| if d < ir.dim { d as i64 } else { d as i64 + 1 })
        .collect();
    let repeated = cx.builder.broadcast(&input, &stretched, &mapping);
    let value = cx.builder.reshape(&repeated, &dims(&ir.out));
    cx.set(&ir.out, value)
}

/// `unfold(dim, size, step)`: every complete window of `size` elements along `dim`, advanced by
/// `step`; the windows replace `dim` and their elements form a new last dimension (a gather at
/// the constant positions `window · step + offset`).
pub(crate) fn unfold(cx: &mut Lowering, ir: &UnfoldOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    let out_dims = dims(&ir.out);
    let rank = input.rank() as i64;
    let windows = out_dims[ir.dim];
    let size = ir.size as i64;
    let positions: Vec<i32> = (0..windows)
        .flat_map(|window| (0..size).map(move |offset| (window * ir.step as i64 + offset) as i32))
        .collect();
    let positions = cx.builder.constant_s32(&positions);
    let positions = cx.builder.reshape(&positions, &[windows, size, 1]);
    let numbers = GatherDimensionNumbers {
        offset_dims: (0..=rank)
            .filter(|&d| d != ir.dim as i64 && d != rank)
            .collect(),
        collapsed_slice_dims: vec![ir.dim as i64],
        start_index_map: vec![ir.dim as i64],
        index_vector_dim: 2,
        ..Default::default()
    };
    let mut slice_sizes = input.dims.clone();
    slice_sizes[ir.dim] = 1;
    let value = cx
        .builder
        .gather(&input, &positions, numbers, &slice_sizes, &out_dims);
    cx.set(&ir.out, value)
}

/// The permutation that moves the last dimension of a rank-`rank` value to `dim`.
pub(crate) fn last_to(rank: usize, dim: usize) -> Vec<i64> {
    let last = rank as i64 - 1;
    (0..rank as i64)
        .map(|d| match d.cmp(&(dim as i64)) {
            std::cmp::Ordering::Less => d,
            std::cmp::Ordering::Equal => last,
            std::cmp::Ordering::Greater => d - 1,
        })
        .collect()
}
