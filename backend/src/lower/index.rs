//! Indexed reads and writes: gather, scatter, their multi-dimensional forms (`gather_nd`,
//! `scatter_nd`), select, select-assign, masks, and the embedding module with its backward pass.

use burn_backend::tensor::IndexingUpdateOp;
use burn_ir::{
    EmbeddingBackwardOpIr, EmbeddingOpIr, GatherNdOpIr, GatherOpIr, MaskFillOpIr, MaskWhereOpIr,
    ScatterNdOpIr, ScatterOpIr, SelectAssignOpIr, SelectOpIr,
};

use super::builder::{Combiner, Direction, Value};
use super::context::{Lowered, Lowering, dims, unsupported};
use crate::hlo::{GatherDimensionNumbers, PrimitiveType, ScatterDimensionNumbers};

/// The combiner of an indexed update on values of `element_type`.
fn combiner(update: &IndexingUpdateOp, element_type: PrimitiveType) -> Combiner {
    let boolean = element_type == PrimitiveType::Pred;
    match update {
        IndexingUpdateOp::Assign => Combiner::Replace,
        IndexingUpdateOp::Add if boolean => Combiner::Or,
        IndexingUpdateOp::Add => Combiner::Add,
        IndexingUpdateOp::Mul if boolean => Combiner::And,
        IndexingUpdateOp::Mul => Combiner::Multiply,
        IndexingUpdateOp::Min => Combiner::Minimum,
        IndexingUpdateOp::Max => Combiner::Maximum,
    }
}

/// Full coordinates `[..shape, rank]` into a tensor of rank `rank`: `indices` along `dim`, the
/// position itself along every other dimension.
fn coordinates(cx: &mut Lowering, indices: &Value, dim: usize, rank: usize) -> Value {
    let columns: Vec<Value> = (0..rank)
        .map(|d| {
            if d == dim {
                indices.clone()
            } else {
                cx.builder.iota(indices.element_type, &indices.dims, d)
            }
        })
        .collect();
    stack_coordinates(cx, &columns)
}

/// `tensor[coordinates[i]] combiner= updates[i]` for every element `i` of `updates`, whose full
/// coordinates into `tensor` are the last dimension of `coordinates` (as
/// [`stack_coordinates`] makes them).
pub(crate) fn scatter_elements(
    cx: &mut Lowering,
    tensor: &Value,
    coordinates: &Value,
    updates: &Value,
    combiner: Combiner,
) -> Value {
    let rank = tensor.rank() as i64;
    let all: Vec<i64> = (0..rank).collect();
    let numbers = ScatterDimensionNumbers {
        update_window_dims: Vec::new(),
        inserted_window_dims: all.clone(),
        scatter_dims_to_operand_dims: all,
        index_vector_dim: coordinates.rank() as i64 - 1,
        ..Default::default()
    };
    cx.builder
        .scatter(tensor, coordinates, updates, numbers, combiner)
}

/// One coordinate per dimension (`columns`, each of one shape) stacked into the index vectors
/// `[..shape, columns]` of an elementwise scatter or gather.
pub(crate) fn stack_coordinates(cx: &mut Lowering, columns: &[Value]) -> Value {
    let mut column_dims = columns[0].dims.clone();
    column_dims.push(1);
    let stacked: Vec<Value> = columns
        .iter()
        .map(|column| cx.builder.reshape(column, &column_dims))
        .collect();
    cx.builder.concatenate(&stacked, column_dims.len() - 1)
}

/// `gather(dim, tensor, indices)`: `out[i] = tensor[i with i[dim] = indices[i]]`.
pub(crate) fn gather(cx: &mut Lowering, ir: &GatherOpIr) -> Lowered {
    let tensor = cx.get(&ir.tensor)?;
    let indices = cx.get(&ir.indices)?;
    let value = gather_along(cx, &tensor, &indices, ir.dim);
    cx.set(&ir.out, value)
}

/// `tensor[i with i[dim] = indices[i]]`, of the indices' shape.
pub(crate) fn gather_along(
    cx: &mut Lowering,
    tensor: &Value,
    indices: &Value,
    dim: usize,
) -> Value {
    let rank = tensor.rank();
    let coordinates = coordinates(cx, indices, dim, rank);
    let all: Vec<i64> = (0..rank as i64).collect();
    let numbers = GatherDimensionNumbers {
        offset_dims: Vec::new(),
        collapsed_slice_dims: all.clone(),
        start_index_map: all,
        index_vector_dim: rank as i64,
        ..Default::default()
    };
    cx.builder
        .gather(tensor, &coordinates, numbers, &vec![1; rank], &indices.dims)
}

/// `scatter(dim, tensor, indices, value)`: `tensor[i with i[dim] = indices[i]] op= value[i]`.
pub(crate) fn scatter(cx: &mut Lowering, ir: &ScatterOpIr) -> Lowered {
    let tensor = cx.get(&ir.tensor)?;
    let indices = cx.get(&ir.indices)?;
    let value = cx.get(&ir.value)?;
    let rank = tensor.rank();
    let zeros = vec![0; rank];
    let ones = vec![1; rank];
    let updates = cx.builder.slice(&value, &zeros, &indices.dims, &ones);
    let updates = cx.builder.convert(&updates, tensor.element_type);
    let combiner = combiner(&ir.update, tensor.element_type);
    let result = scatter_along(cx, &tensor, &indices, &updates, ir.dim, combiner);
    cx.set(&ir.out, result)
}

/// `tensor[i with i[dim] = indices[i]] combiner= updates[i]`, `updates` of the indices' shape.
pub(crate) fn scatter_along(
    cx: &mut Lowering,
    tensor: &Value,
    indices: &Value,
    updates: &Value,
    dim: usize,
    combiner: Combiner,
) -> Value {
    let rank = tensor.rank();
    let one_per_line =
        indices.dims[dim] == 1 && (0..rank).all(|d| d == dim || indices.dims[d] == tensor.dims[d]);
    if one_per_line {
        // One index per line updates each position at most once, so the scatter is elementwise:
        // where the position along `dim` equals the line's index, the combination of the tensor
        // and the line's update, elsewhere the tensor. As a compare and a select it fuses into
        // its consumers instead of writing a whole tensor: the gradient of a gather of one
        // target per row (the cross-entropy's backward pass) would otherwise scatter into a
        // fresh `[rows, vocabulary]` tensor, and scatters are slow on accelerators.
        let hit = line_index_hits(cx, tensor, indices, dim);
        let spread = cx.builder.broadcast_to(updates, &tensor.dims);
        let combined = match combiner.opcode() {
            Some(opcode) => cx.builder.binary(opcode, tensor, &spread),
            None => spread,
        };
        return cx.builder.select(&hit, &combined, tensor);
    }
    let coordinates = coordinates(cx, indices, dim, rank);
    scatter_elements(cx, tensor, &coordinates, updates, combiner)
}

/// The layout of a `gather_nd`/`scatter_nd`: the index vector is the last dimension of the
/// indices (`m` long) and indexes the data's first `m` dimensions; the rest form each slice.
struct NdLayout {
    /// The index vector's dimension (the indices' last).
    index_vector_dim: i64,
    /// The data's indexed dimensions, `0..m`.
    indexed: Vec<i64>,
    /// The result's (or updates') dimensions that hold a slice.
    slice_dims: Vec<i64>,
}

impl NdLayout {
    fn of(data: &Value, indices: &Value) -> Self {
        let batch = indices.rank() as i64 - 1;
        let depth = indices.dims[indices.rank() - 1];
        Self {
            index_vector_dim: batch,
            indexed: (0..depth).collect(),
            slice_dims: (batch..batch + data.rank() as i64 - depth).collect(),
        }
    }
}

/// `gather_nd(data, indices [.., m])`: the slices `data[indices[i, 0], .., indices[i, m-1], ..]`,
/// `indices.shape[..-1] + data.shape[m..]`.
pub(crate) fn gather_nd(cx: &mut Lowering, ir: &GatherNdOpIr) -> Lowered {
    let data = cx.get(&ir.data)?;
    let indices = cx.get(&ir.indices)?;
    let layout = NdLayout::of(&data, &indices);
    let slice_sizes: Vec<i64> = (0..data.rank())
        .map(|d| {
            if d < layout.indexed.len() {
                1
            } else {
                data.dims[d]
            }
        })
        .collect();
    let numbers = GatherDimensionNumbers {
        offset_dims: layout.slice_dims,
        collapsed_slice_dims: layout.indexed.clone(),
        start_index_map: layout.indexed,
        index_vector_dim: layout.index_vector_dim,
        ..Default::default()
    };
    let value = cx
        .builder
        .gather(&data, &indices, numbers, &slice_sizes, &dims(&ir.out));
    cx.set(&ir.out, value)
}

/// `scatter_nd(data, indices [.., m], values, reduction)`: each slice of `values` combined into
/// `data` at `indices[i, 0..m]`.
pub(crate) fn scatter_nd(cx: &mut Lowering, ir: &ScatterNdOpIr) -> Lowered {
    let data = cx.get(&ir.data)?;
    let indices = cx.get(&ir.indices)?;
    let values = cx.get(&ir.values)?;
    let values = cx.builder.convert(&values, data.element_type);
    let layout = NdLayout::of(&data, &indices);
    let numbers = ScatterDimensionNumbers {
        update_window_dims: layout.slice_dims,
        inserted_window_dims: layout.indexed.clone(),
        scatter_dims_to_operand_dims: layout.indexed,
        index_vector_dim: layout.index_vector_dim,
        ..Default::default()
    };
    let combiner = combiner(&ir.reduction, data.element_type);
    let result = cx
        .builder
        .scatter(&data, &indices, &values, numbers, combiner);
    cx.set(&ir.out, result)
}

/// Where the position along `dim` of each element of `tensor` equals its line's index in
/// `indices` (of size 1 along `dim` and the tensor's size elsewhere): a mask of the tensor's
/// shape. Indices out of range hit no position, as a scatter drops them.
fn line_index_hits(cx: &mut Lowering, tensor: &Value, indices: &Value, dim: usize) -> Value {
    // Positions in 32 bits where the dimension and the indices fit them (Neuron narrows 64-bit
    // integers), else in 64.
    let wide =
        indices.element_type == PrimitiveType::S64 || indices.element_type == PrimitiveType::U64;
    let index_type = if wide {
        PrimitiveType::S64
    } else {
        position_type(tensor.dims[dim])
    };
    let indices = cx.builder.convert(indices, index_type);
    let positions = cx.builder.iota(index_type, &tensor.dims, dim);
    let targets = cx.builder.broadcast_to(&indices, &tensor.dims);
    cx.builder.compare(Direction::Eq, &positions, &targets)
}

/// The integer type of positions below `size`: 32 bits where they fit (Neuron narrows 64-bit
/// integers), else 64.
pub(crate) fn position_type(size: i64) -> PrimitiveType {
    if size <= i64::from(i32::MAX) {
        PrimitiveType::S32
    } else {
        PrimitiveType::S64
    }
}

/// `select(tensor, dim, indices)`: the slices of `tensor` at `indices` along `dim`.
pub(crate) fn select(cx: &mut Lowering, ir: &SelectOpIr) -> Lowered {
    let tensor = cx.get(&ir.tensor)?;
    let indices = cx.get(&ir.indices)?;
    if indices.rank() != 1 {
        return unsupported(format!("select with indices of rank {}", indices.rank()));
    }
    let value = select_slices(cx, &tensor, &indices, ir.dim);
    cx.set(&ir.out, value)
}

/// The slices of `tensor` at the positions `indices` (rank 1) along `dim`, in their order.
pub(crate) fn select_slices(
    cx: &mut Lowering,
    tensor: &Value,
    indices: &Value,
    dim: usize,
) -> Value {
    let count = indices.dims[0];
    let starts = cx.builder.reshape(indices, &[count, 1]);
    let numbers = GatherDimensionNumbers {
        offset_dims: (0..tensor.rank() as i64)
            .filter(|&d| d != dim as i64)
            .collect(),
        collapsed_slice_dims: vec![dim as i64],
        start_index_map: vec![dim as i64],
        index_vector_dim: 1,
        ..Default::default()
    };
    let mut slice_sizes = tensor.dims.clone();
    slice_sizes[dim] = 1;
    let mut out_dims = tensor.dims.clone();
    out_dims[dim] = count;
    cx.builder
        .gather(tensor, &starts, numbers, &slice_sizes, &out_dims)
}

/// `select_add` and friends: `tensor[.., indices[i], ..] op= value[.., i, ..]` along `dim`.
pub(crate) fn select_assign(cx: &mut Lowering, ir: &SelectAssignOpIr) -> Lowered {
    let tensor = cx.get(&ir.tensor)?;
    let indices = cx.get(&ir.indices)?;
    let value = cx.get(&ir.value)?;
    if indices.rank() != 1 {
        return unsupported(format!(
            "select_assign with indices of rank {}",
            indices.rank()
        ));
    }
    let rank = tensor.rank();
    let starts = cx.builder.reshape(&indices, &[indices.dims[0], 1]);
    let updates = cx.builder.convert(&value, tensor.element_type);
    let numbers = ScatterDimensionNumbers {
        update_window_dims: (0..rank as i64).filter(|&d| d != ir.dim as i64).collect(),
        inserted_window_dims: vec![ir.dim as i64],
        scatter_dims_to_operand_dims: vec![ir.dim as i64],
        index_vector_dim: 1,
        ..Default::default()
    };
    let combiner = combiner(&ir.update, tensor.element_type);
    let result = cx
        .builder
        .scatter(&tensor, &starts, &updates, numbers, combiner);
    cx.set(&ir.out, result)
}

/// `mask_where(tensor, mask, value)`: `value` where the mask is true, with broadcasting.
pub(crate) fn mask_where(cx: &mut Lowering, ir: &MaskWhereOpIr) -> Lowered {
    let out_dims = dims(&ir.out);
    let tensor = cx.get(&ir.tensor)?;
    let mask = cx.get(&ir.mask)?;
    let value = cx.get(&ir.value)?;
    let tensor = cx.builder.broadcast_to(&tensor, &out_dims);
    let mask = cx.builder.broadcast_to(&mask, &out_dims);
    let value = cx.builder.convert(&value, tensor.element_type);
    let value = cx.builder.broadcast_to(&value, &out_dims);
    let result = cx.builder.select(&mask, &value, &tensor);
    cx.set(&ir.out, result)
}

/// `mask_fill(tensor, mask, scalar)`.
pub(crate) fn mask_fill(cx: &mut Lowering, ir: &MaskFillOpIr) -> Lowered {
    let out_dims = dims(&ir.out);
    let tensor = cx.get(&ir.tensor)?;
    let mask = cx.get(&ir.mask)?;
    let tensor = cx.builder.broadcast_to(&tensor, &out_dims);
    let mask = cx.builder.broadcast_to(&mask, &out_dims);
    let fill = cx.scalar_filled(ir.value, ir.tensor.dtype, &out_dims)?;
    let result = cx.builder.select(&mask, &fill, &tensor);
    cx.set(&ir.out, result)
}

/// `embedding(weights [V, D], indices [..]) -> [.., D]`.
pub(crate) fn embedding(cx: &mut Lowering, ir: &EmbeddingOpIr) -> Lowered {
    let weights = cx.get(&ir.weights)?;
    let indices = cx.get(&ir.indices)?;
    let batch = indices.rank() as i64;
    let numbers = GatherDimensionNumbers {
        offset_dims: vec![batch],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: batch,
        ..Default::default()
    };
    let value = cx.builder.gather(
        &weights,
        &indices,
        numbers,
        &[1, weights.dims[1]],
        &dims(&ir.out),
    );
    cx.set(&ir.out, value)
}

/// The gradient of `embedding` for the weights: `out_grad` rows summed into `[V, D]`.
pub(crate) fn embedding_backward(cx: &mut Lowering, ir: &EmbeddingBackwardOpIr) -> Lowered {
    let gradient = cx.get(&ir.out_grad)?;
    let indices = cx.get(&ir.indices)?;
    let out_dims = dims(&ir.out);
    let zeros = cx.builder.filled(gradient.element_type, 0.0, &out_dims);
    let batch = indices.rank() as i64;
    let numbers = ScatterDimensionNumbers {
        update_window_dims: vec![batch],
        inserted_window_dims: vec![0],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: batch,
        ..Default::default()
    };
    let result = cx
        .builder
        .scatter(&zeros, &indices, &gradient, numbers, Combiner::Add);
    cx.set(&ir.out, result)
}

#[cfg(test)]
mod tests {
    use burn_ir::TensorStatus;

    use crate::capture::Segment;
    use crate::lower::lower_segment;
    use crate::test_operations::{scatter_add_along_rows, tensor};

    /// How many instructions of the lowered module are scatters.
    fn scatters(columns: usize) -> usize {
        let mut segment = Segment::default();
        segment.push(scatter_add_along_rows(
            tensor(1, TensorStatus::ReadOnly),
            2,
            3,
            columns,
            4,
        ));
        let module = lower_segment(segment.operations(), &segment.boundary())
            .unwrap()
            .module;
        module
            .computations
            .iter()
            .flat_map(|computation| &computation.instructions)
            .filter(|instruction| instruction.opcode == "scatter")
            .count()
    }

    #[test]
    fn one_index_per_line_lowers_without_a_scatter() {
        assert_eq!(
            scatters(1),
            0,
            "one index per row is a compare and a select"
        );
        assert_eq!(scatters(2), 1, "several indices per row stay a scatter");
    }
}
