//! The collectives on Burn 0.22 tensors: what models call.
//!
//! On a Trainium device served as a Burn device ([`crate::device`], `hlat serve`) they travel to
//! the server as custom operations and run on the device's replicas, differentiable under
//! autodiff ([`super::extension`]). On any other device (Flex, a GPU) the device is its own only
//! replica: every group has one member and each collective returns its input (a permute that
//! sends the one replica nothing gives zeros), so models written with them run anywhere.

use std::sync::Mutex;

use burn::backend::{Dispatch, DispatchDevice};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_backend::ExecutionError;
use burn_backend::ops::IntTensorOps;
use burn_ir::{CustomOpIr, TensorIr, TensorStatus};
use burn_remote::{CustomOpClient, RemoteDevice};

use super::extension::{CollectiveExtension, REPLICA_LAYOUT};
use super::{Collective, ReduceOp, ReplicaGroups, SourceTargetPairs};
use burn::backend::Remote;

/// How the replicas of a served device are laid out, as its server reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReplicaLayout {
    /// Every replica of the device.
    total: usize,
    /// The replicas this process's server holds.
    local: usize,
    /// The index of the first of those.
    first: usize,
}

/// The layouts already asked for, by remote device.
static LAYOUTS: Mutex<Vec<(RemoteDevice, ReplicaLayout)>> = Mutex::new(Vec::new());

/// The remote device `device` reaches, if it is one.
pub(crate) fn remote_device(device: &Device) -> Option<RemoteDevice> {
    match device.clone().inner().as_dispatch() {
        DispatchDevice::Remote(remote) => Some(remote.clone()),
        _ => None,
    }
}

/// The replica layout of the device server `device` reaches (asked once, then remembered).
fn layout(device: &RemoteDevice) -> ReplicaLayout {
    let mut layouts = LAYOUTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, layout)) = layouts.iter().find(|(known, _)| known == device) {
        return *layout;
    }
    let client = CustomOpClient::new(device);
    let output = TensorIr {
        id: client.create_empty_handle(),
        shape: [3].into(),
        status: TensorStatus::NotInit,
        dtype: burn_backend::DType::I64,
    };
    let reported = client
        .register(CustomOpIr {
            id: REPLICA_LAYOUT.to_string(),
            inputs: Vec::new(),
            outputs: vec![output],
            scalars: Vec::new(),
        })
        .remove(0);
    let data = burn_backend::read_sync(<Remote as IntTensorOps<Remote>>::int_into_data(reported))
        .unwrap_or_else(|error| panic!("asking {device:?} for its replicas: {error}"));
    let values: Vec<i64> = data
        .convert::<i64>()
        .try_into_vec()
        .unwrap_or_else(|error| panic!("the replica layout of {device:?}: {error:?}"));
    let layout = ReplicaLayout {
        total: values[0] as usize,
        local: values[1] as usize,
        first: values[2] as usize,
    };
    assert!(
        layout.total >= 1 && layout.local >= 1,
        "{device:?} reported {layout:?}: a device has one replica at least"
    );
    layouts.push((device.clone(), layout));
    layout
}

/// How many replicas `device` stands for: those of its Trainium device when it is served
/// (`xla:0-3`: 4), else 1.
pub fn replica_count(device: &Device) -> usize {
    remote_device(device).map_or(1, |remote| layout(&remote).total)
}

/// Runs `collective` on `tensor`: on the server of a served device, else as the identity of a
/// device that is its own only replica.
fn run_one<const D: usize>(collective: Collective, tensor: Tensor<D>) -> Tensor<D> {
    let device = tensor.device();
    if remote_device(&device).is_some() {
        return Tensor::from_dispatch(Dispatch::collective_of(tensor.into_dispatch(), collective));
    }
    single_replica(collective, vec![tensor], &device).remove(0)
}

/// `collective` on a device that is its own only replica: its inputs (zeros for a permute that
/// sends the one replica nothing).
///
/// # Panics
/// When the collective names more than one replica.
fn single_replica<const D: usize>(
    collective: Collective,
    tensors: Vec<Tensor<D>>,
    device: &Device,
) -> Vec<Tensor<D>> {
    if let Err(error) = collective.check_replicas(1) {
        panic!("{collective} on {device:?}, its own only replica: {error}");
    }
    match &collective {
        Collective::Permute { pairs } if pairs.source_of(0).is_none() => tensors
            .into_iter()
            .map(|tensor| tensor.zeros_like())
            .collect(),
        _ => tensors,
    }
}

/// Each replica gets the reduction of its group's values.
pub fn all_reduce<const D: usize>(
    tensor: Tensor<D>,
    op: ReduceOp,
    groups: &ReplicaGroups,
) -> Tensor<D> {
    let groups = groups.clone();
    run_one(Collective::AllReduce { op, groups }, tensor)
}

/// Each replica gets its group's values concatenated along `dim`, in group order.
pub fn all_gather<const D: usize>(
    tensor: Tensor<D>,
    dim: usize,
    groups: &ReplicaGroups,
) -> Tensor<D> {
    let groups = groups.clone();
    run_one(Collective::AllGather { dim, groups }, tensor)
}

/// The group's values are summed and cut along `dim`; each replica gets the chunk of its
/// position in the group.
pub fn reduce_scatter<const D: usize>(
    tensor: Tensor<D>,
    dim: usize,
    groups: &ReplicaGroups,
) -> Tensor<D> {
    let groups = groups.clone();
    run_one(Collective::ReduceScatter { dim, groups }, tensor)
}

/// Each replica cuts `tensor` along `dim` into one chunk per member of its group and sends chunk
/// `j` to the group's `j`-th member; it gets the chunks sent to it, joined along `dim` in group
/// order (the shape is unchanged): the token exchange of expert parallelism. Its gradient is the
/// same exchange.
pub fn all_to_all<const D: usize>(
    tensor: Tensor<D>,
    dim: usize,
    groups: &ReplicaGroups,
) -> Tensor<D> {
    let groups = groups.clone();
    run_one(Collective::AllToAll { dim, groups }, tensor)
}

/// Each replica keeps the chunk along `dim` of its position in its group.
pub fn split<const D: usize>(tensor: Tensor<D>, dim: usize, groups: &ReplicaGroups) -> Tensor<D> {
    let groups = groups.clone();
    run_one(Collective::Split { dim, groups }, tensor)
}

/// Each replica passes `tensor` to the replica `pairs` pair it with and gets the value of the
/// replica paired with it, zeros if none: the stage-to-stage step of a pipeline. Its gradient
/// goes the other way round.
pub fn permute<const D: usize>(tensor: Tensor<D>, pairs: &SourceTargetPairs) -> Tensor<D> {
    let pairs = pairs.clone();
    run_one(Collective::Permute { pairs }, tensor)
}

/// `tensor` unchanged; its gradient is summed over `groups`: Megatron's "copy to the
/// tensor-parallel region", paired with an all-reduce whose gradient is the identity.
pub fn copy_to_group<const D: usize>(tensor: Tensor<D>, groups: &ReplicaGroups) -> Tensor<D> {
    let device = tensor.device();
    if remote_device(&device).is_none() {
        return single_replica(
            Collective::AllReduce {
                op: ReduceOp::Sum,
                groups: groups.clone(),
            },
            vec![tensor],
            &device,
        )
        .remove(0);
    }
    Tensor::from_dispatch(Dispatch::copy_to_group_of(
        tensor.into_dispatch(),
        groups.clone(),
    ))
}

/// `tensors` unchanged, fenced: a compiler may not move computation into or out of the barrier.
/// Tensors of one dtype pass it together, flattened into one (Burn's extensions take no list of
/// tensors that autodiff follows) and cut apart after it; each dtype has a barrier of its own.
pub fn optimization_barrier<const D: usize>(tensors: Vec<Tensor<D>>) -> Vec<Tensor<D>> {
    let mut outputs: Vec<Option<Tensor<D>>> = vec![None; tensors.len()];
    let mut by_dtype: Vec<(burn_backend::DType, Vec<(usize, Tensor<D>)>)> = Vec::new();
    for (index, tensor) in tensors.into_iter().enumerate() {
        let dtype = tensor.dtype();
        match by_dtype.iter_mut().find(|(known, _)| *known == dtype) {
            Some((_, group)) => group.push((index, tensor)),
            None => by_dtype.push((dtype, vec![(index, tensor)])),
        }
    }
    for (_, group) in by_dtype {
        for (index, fenced) in fence_together(group) {
            outputs[index] = Some(fenced);
        }
    }
    outputs
        .into_iter()
        .map(|output| output.expect("every tensor fenced"))
        .collect()
}

/// One barrier over `group` (tensors of one dtype, with their positions).
fn fence_together<const D: usize>(group: Vec<(usize, Tensor<D>)>) -> Vec<(usize, Tensor<D>)> {
    if group.len() == 1 {
        let (index, tensor) = group.into_iter().next().expect("one tensor");
        return vec![(index, run_one(Collective::Barrier, tensor))];
    }
    let shapes: Vec<_> = group
        .iter()
        .map(|(index, tensor)| (*index, tensor.shape()))
        .collect();
    let flat: Vec<Tensor<1>> = group
        .into_iter()
        .map(|(_, tensor)| tensor.flatten::<1>(0, D - 1))
        .collect();
    let fenced = run_one(Collective::Barrier, Tensor::cat(flat, 0));
    let mut start = 0;
    shapes
        .into_iter()
        .map(|(index, shape)| {
            let elements = shape.num_elements();
            let piece = fenced.clone().slice(start..start + elements);
            start += elements;
            (index, piece.reshape(shape))
        })
        .collect()
}

/// The replicas' data one after the other, flat, and the shape of one.
fn stacked(data: Vec<TensorData>, device: &Device) -> (TensorData, Vec<usize>) {
    let shape = data
        .first()
        .map(|first| first.shape().to_vec())
        .unwrap_or_default();
    let dtype = data.first().map(TensorData::dtype);
    let mut bytes = Vec::new();
    for replica in &data {
        assert_eq!(
            (replica.shape().to_vec(), Some(replica.dtype())),
            (shape.clone(), dtype),
            "every replica's data has one shape and type on {device:?}"
        );
        bytes.extend_from_slice(replica.as_bytes());
    }
    let dtype = dtype.unwrap_or(burn_backend::DType::F32);
    let elements = bytes.len() / dtype.size();
    (TensorData::from_bytes_vec(bytes, [elements], dtype), shape)
}

/// A float tensor whose replica `r` holds `data[r]` (one entry per replica of `device`).
pub fn from_replicas<const D: usize>(data: Vec<TensorData>, device: &Device) -> Tensor<D> {
    if remote_device(device).is_none() {
        return Tensor::from_data(only_replica(data, device), device);
    }
    let (flat, shape) = stacked(data, device);
    let flat = Tensor::<1>::from_data(flat, device).into_dispatch();
    Tensor::from_dispatch(Dispatch::replicas_in(flat, shape))
}

/// An int tensor whose replica `r` holds `data[r]` (one entry per replica of `device`).
pub fn int_from_replicas<const D: usize>(data: Vec<TensorData>, device: &Device) -> Tensor<D, Int> {
    if remote_device(device).is_none() {
        return Tensor::from_data(only_replica(data, device), device);
    }
    // The replicas travel as float bits and are reinterpreted on the server.
    let floats: Vec<TensorData> = data.into_iter().map(integers_as_float).collect();
    from_replicas::<D>(floats, device).int()
}

/// The one replica's data of a device that is its own only replica.
fn only_replica(mut data: Vec<TensorData>, device: &Device) -> TensorData {
    assert_eq!(
        data.len(),
        1,
        "{device:?} holds one replica, {} were given",
        data.len()
    );
    data.remove(0)
}

/// Integer data as f64 values (exact for the integers a model moves: token ids, positions).
fn integers_as_float(data: TensorData) -> TensorData {
    data.convert::<f64>()
}

/// The data of every replica of a float tensor, in replica order.
pub fn into_replicas<const D: usize>(tensor: Tensor<D>) -> Result<Vec<TensorData>, ExecutionError> {
    let device = tensor.device();
    match remote_device(&device) {
        None => Ok(vec![tensor.into_data()]),
        Some(remote) => {
            let rows = layout(&remote).total;
            let shape = tensor.shape().to_vec();
            unstack(read_stacked(tensor, rows as u64, false)?, rows, shape)
        }
    }
}

/// The data of this process's first `count` replicas of a float tensor (fewer if it holds
/// fewer), and the index of the first among every replica: 0 unless the device spans the
/// processes of a job.
pub fn into_local_replicas<const D: usize>(
    tensor: Tensor<D>,
    count: usize,
) -> Result<(usize, Vec<TensorData>), ExecutionError> {
    let device = tensor.device();
    match remote_device(&device) {
        None => Ok((0, vec![tensor.into_data()])),
        Some(remote) => {
            let layout = layout(&remote);
            let rows = layout.local.min(count);
            let shape = tensor.shape().to_vec();
            let replicas = unstack(read_stacked(tensor, rows as u64, true)?, rows, shape)?;
            Ok((layout.first, replicas))
        }
    }
}

fn read_stacked<const D: usize>(
    tensor: Tensor<D>,
    rows: u64,
    local: bool,
) -> Result<TensorData, ExecutionError> {
    let stacked = Dispatch::replicas_out(tensor.into_dispatch(), rows, local);
    Tensor::<1>::from_dispatch(stacked).try_into_data()
}

/// The `rows` pieces of `stacked`, one `TensorData` of `row_shape` each.
fn unstack(
    stacked: TensorData,
    rows: usize,
    row_shape: Vec<usize>,
) -> Result<Vec<TensorData>, ExecutionError> {
    let dtype = stacked.dtype();
    let bytes = stacked.as_bytes();
    let row_bytes = bytes.len().checked_div(rows).unwrap_or(0);
    Ok((0..rows)
        .map(|row| {
            TensorData::from_bytes_vec(
                bytes[row * row_bytes..(row + 1) * row_bytes].to_vec(),
                row_shape.clone(),
                dtype,
            )
        })
        .collect())
}
