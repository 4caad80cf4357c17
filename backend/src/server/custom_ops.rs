//! The custom operations a Trainium device server answers: the collectives and the replica data
//! that `burn_trainium::collective` sends from a Burn device ([`crate::collective`]), and the
//! operations the executors compute themselves: the fused attention ([`crate::attention`]) and
//! burn-signal's FFTs (`signal::rfft`, `signal::irfft`).
//!
//! A malformed operation panics in its handler, which ends that client's session with the
//! message; the server and the other sessions go on.

use burn_backend::ops::FloatTensorOps;
use burn_backend::{DType, TensorData, TensorMetadata};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr, TensorStatus};
use burn_remote::server::BackendServer;
use burn_router::{RouterClient, RouterTensor};

use crate::attention::{self, fused_attention_arity};
use crate::collective::{
    Collective, CollectiveBackend, REMOTE_OPERATION, REPLICA_LAYOUT, REPLICAS_IN, REPLICAS_OUT,
};
use crate::distributed::ReplicaSpan;
use crate::lower::fft::{IRFFT, RFFT};
use crate::{Trainium, TrainiumDevice};

type Handles = HandleContainer<<Trainium as burn_ir::BackendIr>::Handle>;

/// `server` answering the custom operations of [`crate::collective`], [`crate::attention`] and
/// burn-signal's FFTs.
pub(crate) fn with_custom_ops(server: BackendServer<Trainium>) -> BackendServer<Trainium> {
    server
        .with_custom_op(REMOTE_OPERATION, collective)
        .with_custom_op(REPLICAS_IN, replicas_in)
        .with_custom_op(REPLICAS_OUT, replicas_out)
        .with_custom_op(REPLICA_LAYOUT, replica_layout)
        .with_custom_op(RFFT, captured)
        .with_custom_op(IRFFT, captured)
        .with_custom_op(attention::FORWARD, captured)
        .with_custom_op(attention::BACKWARD, captured)
}

/// A custom operation the executors compute themselves (the fused attention, burn-signal's
/// FFTs): captured as it came, on new tensors of the device, like any other operation of the
/// stream.
fn captured(handles: &mut Handles, ir: &CustomOpIr, _device: &TrainiumDevice) {
    let (inputs, outputs) = match ir.id.as_str() {
        RFFT => (1, 2),
        IRFFT => (2, 1),
        _ => fused_attention_arity(ir).expect("an operation `with_custom_ops` registered"),
    };
    arity(ir, inputs, outputs);
    let inputs: Vec<_> = ir
        .inputs
        .iter()
        .map(|input| handles.get_float_tensor::<Trainium>(input))
        .collect();
    let client = inputs[0].client.clone();
    let outputs: Vec<TensorIr> = ir
        .outputs
        .iter()
        .map(|output| TensorIr {
            id: client.create_empty_handle(),
            shape: output.shape.clone(),
            status: TensorStatus::NotInit,
            dtype: output.dtype,
        })
        .collect();
    let operation = CustomOpIr {
        id: ir.id.clone(),
        inputs: inputs.into_iter().map(RouterTensor::into_ir).collect(),
        outputs,
        scalars: ir.scalars.clone(),
    };
    let results = client.register(OperationIr::Custom(operation));
    for (output, result) in ir.outputs.iter().zip(results) {
        handles.register_float_tensor::<Trainium>(&output.id, result);
    }
}

/// Checks that `ir` has `inputs` inputs and `outputs` outputs.
fn arity(ir: &CustomOpIr, inputs: usize, outputs: usize) {
    assert!(
        ir.inputs.len() == inputs && ir.outputs.len() == outputs,
        "`{}` takes {inputs} input(s) and {outputs} output(s), {} and {} were sent",
        ir.id,
        ir.inputs.len(),
        ir.outputs.len()
    );
}

fn collective(handles: &mut Handles, ir: &CustomOpIr, _device: &TrainiumDevice) {
    arity(ir, 1, 1);
    let collective = Collective::from_scalars(&ir.scalars)
        .unwrap_or_else(|reason| panic!("`{}`: {reason}", ir.id));
    let input = handles.get_float_tensor::<Trainium>(&ir.inputs[0]);
    let output = Trainium::collective(collective, vec![input]).remove(0);
    handles.register_float_tensor::<Trainium>(&ir.outputs[0].id, output);
}

fn replicas_in(handles: &mut Handles, ir: &CustomOpIr, device: &TrainiumDevice) {
    arity(ir, 1, 1);
    let flat = handles.get_float_tensor::<Trainium>(&ir.inputs[0]);
    let data = burn_backend::read_sync(Trainium::float_into_data(flat))
        .unwrap_or_else(|error| panic!("`{}`: reading the replicas' data: {error}", ir.id));
    let shape = ir.outputs[0].shape.clone();
    let replicas = usize::from(device.replicas);
    let piece = shape.num_elements() * data.dtype().size();
    assert_eq!(
        data.as_bytes().len(),
        piece * replicas,
        "`{}`: {} replicas of shape {shape:?} were expected",
        ir.id,
        replicas
    );
    let pieces = data
        .as_bytes()
        .chunks(piece.max(1))
        .take(replicas)
        .map(|bytes| TensorData::from_bytes_vec(bytes.to_vec(), shape.clone(), data.dtype()))
        .collect();
    let output = Trainium::float_from_replicas(pieces, device);
    handles.register_float_tensor::<Trainium>(&ir.outputs[0].id, output);
}

fn replicas_out(handles: &mut Handles, ir: &CustomOpIr, device: &TrainiumDevice) {
    arity(ir, 1, 1);
    let count = ir
        .scalars
        .first()
        .map_or(u64::MAX, |scalar| scalar.elem::<u64>());
    let input = handles.get_float_tensor::<Trainium>(&ir.inputs[0]);
    let dtype = input.dtype();
    let replicas = if count == u64::MAX {
        Trainium::float_into_replicas(input)
    } else {
        Trainium::float_into_local_replicas(input, count as usize).map(|(_, local)| local)
    }
    .unwrap_or_else(|error| panic!("`{}`: reading the replicas: {error}", ir.id));
    let bytes: Vec<u8> = replicas
        .iter()
        .flat_map(|replica| replica.as_bytes().to_vec())
        .collect();
    let elements = bytes.len() / dtype.size();
    let flat = TensorData::from_bytes_vec(bytes, [elements], dtype);
    let output = Trainium::float_from_data(flat, device);
    handles.register_float_tensor::<Trainium>(&ir.outputs[0].id, output);
}

fn replica_layout(handles: &mut Handles, ir: &CustomOpIr, device: &TrainiumDevice) {
    arity(ir, 0, 1);
    let span = ReplicaSpan::of(device)
        .unwrap_or_else(|error| panic!("`{}`: the replicas of {device}: {error}", ir.id));
    let layout = TensorData::new(
        vec![span.total as i64, span.local as i64, span.first as i64],
        [3],
    )
    .convert_dtype(DType::I64);
    let output =
        <Trainium as burn_backend::ops::IntTensorOps<Trainium>>::int_from_data(layout, device);
    handles.register_int_tensor::<Trainium>(&ir.outputs[0].id, output);
}
