//! Tensors cut into the slices each tensor-parallel rank holds, and slices put back together:
//! byte copies, so a split then join is bit-exact.

use std::path::Path;

use burn::tensor::TensorData;
use burn_store::bridge;
use burn_store::burn_pack::Tensor as PackTensor;

use crate::checkpoint::error::CheckpointError;
use crate::parallel::{Placement, placement_with};

/// `snapshot`'s data cut for the `degree` tensor-parallel ranks (in rank order), as
/// `parallel::placement` places it when each KV head is held by `copies` ranks.
pub(super) fn split_for_ranks(
    snapshot: &PackTensor,
    degree: usize,
    copies: usize,
    dir: &Path,
) -> Result<Vec<TensorData>, CheckpointError> {
    let path = snapshot_path(snapshot);
    let data = bridge::to_data(snapshot).map_err(|error| {
        CheckpointError::burnpack(dir, format!("`{}`: {error}", path.join(".")))
    })?;
    Ok(match placement_with(&path, copies) {
        Placement::Split(dim) => split_data(&data, dim, degree),
        // Rank `r` holds head `r / copies`.
        Placement::ReplicatedHeads { dim, copies } => split_data(&data, dim, degree / copies)
            .into_iter()
            .flat_map(|head| vec![head; copies])
            .collect(),
        Placement::Replicated => vec![data; degree],
    })
}

/// The parameter path of a snapshot (`layers.0.mlp.up_proj.weight` as its names).
fn snapshot_path(snapshot: &PackTensor) -> Vec<String> {
    snapshot.name.split('.').map(str::to_string).collect()
}

/// A snapshot with the name and parameter id of `like` holding `data`.
pub(super) fn rank_snapshot(like: &PackTensor, data: TensorData) -> PackTensor {
    bridge::from_data(data, like.name.clone(), like.param_id)
}

/// `data` cut into `degree` equal contiguous slices along `dim` (the caller checked that the
/// dimension divides).
fn split_data(data: &TensorData, dim: usize, degree: usize) -> Vec<TensorData> {
    let shape = data.shape().to_vec();
    let element = data.dtype().size();
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product::<usize>() * element;
    let slice = shape[dim] / degree * inner;
    let bytes = data.as_bytes();
    (0..degree)
        .map(|rank| {
            let mut part = Vec::with_capacity(outer * slice);
            for row in 0..outer {
                let start = row * shape[dim] * inner + rank * slice;
                part.extend_from_slice(&bytes[start..start + slice]);
            }
            let mut part_shape = shape.clone();
            part_shape[dim] /= degree;
            TensorData::from_bytes_vec(part, part_shape, data.dtype())
        })
        .collect()
}

/// The slices `parts` put back together along `dim`.
pub(super) fn join_data(parts: &[TensorData], dim: usize) -> Result<TensorData, String> {
    let first = &parts[0];
    let shape = first.shape().to_vec();
    if dim >= shape.len() {
        return Err(format!(
            "has {} dimensions, not a dimension {dim}",
            shape.len()
        ));
    }
    if let Some(part) = parts
        .iter()
        .find(|part| part.shape() != first.shape() || part.dtype() != first.dtype())
    {
        return Err(format!(
            "rank slices differ: {:?} {:?} and {:?} {:?}",
            shape,
            first.dtype(),
            part.shape().to_vec(),
            part.dtype()
        ));
    }
    let element = first.dtype().size();
    let outer: usize = shape[..dim].iter().product();
    let slice = shape[dim..].iter().product::<usize>() * element;
    let mut bytes = Vec::with_capacity(slice * outer * parts.len());
    for row in 0..outer {
        for part in parts {
            bytes.extend_from_slice(&part.as_bytes()[row * slice..(row + 1) * slice]);
        }
    }
    let mut whole = shape;
    whole[dim] *= parts.len();
    Ok(TensorData::from_bytes_vec(bytes, whole, first.dtype()))
}
