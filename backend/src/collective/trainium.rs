//! Collectives on [`Trainium`]: captured as custom operations of the segment.

use burn_backend::tensor::{FloatTensor, IntTensor};
use burn_backend::{ExecutionError, TensorData, TensorMetadata};
use burn_ir::{OperationIr, TensorIr, TensorStatus};
use burn_router::{RouterClient, RouterTensor, get_client};

use super::{Collective, CollectiveBackend};
use crate::capture::TrainiumClient;
use crate::{Trainium, TrainiumChannel, TrainiumDevice};

impl CollectiveBackend for Trainium {
    fn replica_count(device: &TrainiumDevice) -> usize {
        usize::from(device.replicas)
    }

    fn float_from_replicas(data: Vec<TensorData>, device: &TrainiumDevice) -> FloatTensor<Self> {
        get_client::<TrainiumChannel>(device).register_replicas(data)
    }

    fn int_from_replicas(data: Vec<TensorData>, device: &TrainiumDevice) -> IntTensor<Self> {
        get_client::<TrainiumChannel>(device).register_replicas(data)
    }

    fn float_into_replicas(tensor: FloatTensor<Self>) -> Result<Vec<TensorData>, ExecutionError> {
        let client = tensor.client.clone();
        client
            .read_replicas(&tensor.into_ir())
            .map_err(ExecutionError::from)
    }

    fn float_into_local_replicas(
        tensor: FloatTensor<Self>,
        count: usize,
    ) -> Result<(usize, Vec<TensorData>), ExecutionError> {
        let client = tensor.client.clone();
        client
            .read_local_replicas(&tensor.into_ir(), count)
            .map_err(ExecutionError::from)
    }

    fn collective(
        collective: Collective,
        tensors: Vec<FloatTensor<Self>>,
    ) -> Vec<FloatTensor<Self>> {
        let client: TrainiumClient = match tensors.first() {
            Some(tensor) => tensor.client.clone(),
            None => return Vec::new(),
        };
        let device = client.device();
        if let Err(error) = collective.check_replicas(usize::from(device.replicas)) {
            panic!("{collective} on {device}: {error}");
        }
        let outputs: Vec<TensorIr> = tensors
            .iter()
            .map(|tensor| {
                let shape = collective
                    .output_shape(&tensor.shape())
                    .unwrap_or_else(|reason| panic!("{collective} on {device}: {reason}"));
                TensorIr {
                    id: client.create_empty_handle(),
                    shape: shape.into(),
                    status: TensorStatus::NotInit,
                    dtype: tensor.dtype(),
                }
            })
            .collect();
        let inputs = tensors.into_iter().map(RouterTensor::into_ir).collect();
        client.register(OperationIr::Custom(collective.to_ir(inputs, outputs)))
    }
}
