//! Collectives across the replicas of the `host` executor: the reference the compiled
//! collectives are checked against. When the device spans processes, every replica's input is
//! gathered first (see [`crate::distributed`]) and each process keeps its replicas' results.
//!
//! Reductions are computed in f64 and rounded once to the tensor's type (the lowering reduces
//! 16-bit floats in f32, so both round a sum once); gathers and splits move bytes.

use super::Runner;
use burn_backend::TensorData;
use burn_ir::TensorIr;

use super::{failure, read};
use crate::BackendError;
use crate::collective::{Collective, ReduceOp, ReplicaGroups};
use crate::distributed::ReplicaSpan;

/// Runs `collective` over the replicas: `inputs` (as captured, so a last use frees them) are
/// read from every runner of this process, `outputs` registered on every runner.
pub(super) fn run(
    runners: &mut [Runner],
    span: &ReplicaSpan,
    collective: &Collective,
    inputs: &[TensorIr],
    outputs: &[TensorIr],
) -> Result<(), BackendError> {
    let _span = tracing::info_span!(crate::profile::phase::COLLECTIVE).entered();
    collective
        .check_replicas(span.total)
        .map_err(|error| failure(format!("{collective}: {error}")))?;
    for (input, output) in inputs.iter().zip(outputs) {
        let local = runners
            .iter_mut()
            .map(|runner| read(runner, input))
            .collect::<Result<Vec<_>, _>>()?;
        let data = span.gather(local).map_err(failure)?;
        let results = match collective {
            Collective::Barrier => span.local_share(data),
            Collective::AllReduce { op, groups } => {
                per_group(groups, &data, span, |members, _| reduce(members, *op))?
            }
            Collective::AllGather { dim, groups } => {
                per_group(groups, &data, span, |members, _| {
                    Ok(concatenate(members, *dim))
                })?
            }
            Collective::ReduceScatter { dim, groups } => {
                per_group(groups, &data, span, |members, rank| {
                    Ok(chunk(
                        &reduce(members, ReduceOp::Sum)?,
                        *dim,
                        rank,
                        members.len(),
                    ))
                })?
            }
            Collective::Split { dim, groups } => {
                per_group(groups, &data, span, |members, rank| {
                    Ok(chunk(&members[rank], *dim, rank, members.len()))
                })?
            }
            Collective::AllToAll { dim, groups } => {
                per_group(groups, &data, span, |members, rank| {
                    let received: Vec<TensorData> = members
                        .iter()
                        .map(|member| chunk(member, *dim, rank, members.len()))
                        .collect();
                    Ok(concatenate(&received, *dim))
                })?
            }
            Collective::Permute { pairs } => (span.first..span.first + span.local)
                .map(|replica| match pairs.source_of(replica) {
                    Some(source) => data[source].clone(),
                    None => zeros_like(&data[replica]),
                })
                .collect(),
        };
        for (runner, result) in runners.iter_mut().zip(results) {
            runner.register_tensor_data_id(output.id, result);
        }
    }
    Ok(())
}

/// The result of each replica of this process, from every replica's `data`:
/// `result(members of its group in group order, its rank in the group)`.
fn per_group(
    groups: &ReplicaGroups,
    data: &[TensorData],
    span: &ReplicaSpan,
    result: impl Fn(&[TensorData], usize) -> Result<TensorData, BackendError>,
) -> Result<Vec<TensorData>, BackendError> {
    (span.first..span.first + span.local)
        .map(|replica| {
            let (group, rank) = groups
                .locate(replica)
                .expect("the groups cover every replica");
            let members: Vec<TensorData> =
                group.iter().map(|&member| data[member].clone()).collect();
            result(&members, rank)
        })
        .collect()
}

/// The elementwise sum, mean or maximum of `members` (of one shape and type).
fn reduce(members: &[TensorData], op: ReduceOp) -> Result<TensorData, BackendError> {
    let dtype = members[0].dtype();
    if !dtype.is_float() {
        return Err(BackendError::Unsupported {
            executor: "host",
            what: format!("collectives on {dtype:?} tensors (floats only)"),
        });
    }
    let values: Vec<Vec<f64>> = members
        .iter()
        .map(|member| member.clone().convert::<f64>().try_into_vec::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|error| failure(format!("{error:?}")))?;
    let combined: Vec<f64> = (0..values[0].len())
        .map(|index| {
            let column = values.iter().map(|member| member[index]);
            match op {
                ReduceOp::Sum => column.sum(),
                ReduceOp::Mean => column.sum::<f64>() / values.len() as f64,
                ReduceOp::Max => column.fold(f64::NEG_INFINITY, f64::max),
            }
        })
        .collect();
    Ok(TensorData::new(combined, members[0].shape().clone()).convert_dtype(dtype))
}

/// Zeros of the shape and type of `data`.
fn zeros_like(data: &TensorData) -> TensorData {
    let bytes = vec![0u8; data.as_bytes().len()];
    TensorData::from_bytes_vec(bytes, data.shape().clone(), data.dtype())
}

/// `(rows, row bytes)` of a row-major tensor cut before dimension `dim`.
fn rows(data: &TensorData, dim: usize) -> (usize, usize) {
    let outer: usize = data.shape()[..dim].iter().product();
    let bytes = data.as_bytes().len();
    (outer, bytes.checked_div(outer).unwrap_or(0))
}

/// `members` joined along `dim`, in order.
fn concatenate(members: &[TensorData], dim: usize) -> TensorData {
    let (outer, row) = rows(&members[0], dim);
    let mut bytes = Vec::with_capacity(row * outer * members.len());
    for index in 0..outer {
        for member in members {
            bytes.extend_from_slice(&member.as_bytes()[index * row..(index + 1) * row]);
        }
    }
    let mut shape = members[0].shape().clone();
    shape[dim] *= members.len();
    TensorData::from_bytes_vec(bytes, shape, members[0].dtype())
}

/// Chunk `rank` of `count` along `dim`.
fn chunk(data: &TensorData, dim: usize, rank: usize, count: usize) -> TensorData {
    let (outer, row) = rows(data, dim);
    let part = row / count;
    let mut bytes = Vec::with_capacity(part * outer);
    for index in 0..outer {
        let start = index * row + rank * part;
        bytes.extend_from_slice(&data.as_bytes()[start..start + part]);
    }
    let mut shape = data.shape().clone();
    shape[dim] /= count;
    TensorData::from_bytes_vec(bytes, shape, data.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(values: &[f32], shape: [usize; 2]) -> TensorData {
        TensorData::new(values.to_vec(), shape)
    }

    #[test]
    fn concatenate_and_chunk_are_inverse_along_any_dimension() {
        let a = data(&[1.0, 2.0, 3.0, 4.0], [2, 2]);
        let b = data(&[5.0, 6.0, 7.0, 8.0], [2, 2]);
        let columns = concatenate(&[a.clone(), b.clone()], 1);
        assert_eq!(columns.shape().as_slice(), [2, 4]);
        assert_eq!(
            columns.try_to_vec::<f32>().unwrap(),
            [1.0, 2.0, 5.0, 6.0, 3.0, 4.0, 7.0, 8.0]
        );
        assert_eq!(chunk(&columns, 1, 1, 2), b);
        let rows = concatenate(&[a.clone(), b], 0);
        assert_eq!(rows.shape().as_slice(), [4, 2]);
        assert_eq!(chunk(&rows, 0, 0, 2), a);
    }

    #[test]
    fn reductions_round_once_to_the_tensor_type() {
        let members = [data(&[1.0, -2.0], [1, 2]), data(&[3.0, 5.0], [1, 2])];
        let sum = reduce(&members, ReduceOp::Sum).unwrap();
        assert_eq!(sum.try_to_vec::<f32>().unwrap(), [4.0, 3.0]);
        let mean = reduce(&members, ReduceOp::Mean).unwrap();
        assert_eq!(mean.try_to_vec::<f32>().unwrap(), [2.0, 1.5]);
        let max = reduce(&members, ReduceOp::Max).unwrap();
        assert_eq!(max.try_to_vec::<f32>().unwrap(), [3.0, 5.0]);
        let ints = [TensorData::new(vec![1i32], [1])];
        assert!(reduce(&ints, ReduceOp::Sum).is_err());
    }
}
