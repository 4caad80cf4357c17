//! The router channel: how Burn's router reaches this crate's clients and moves tensors between
//! Trainium devices.

use burn_backend::{DType, Shape, TensorData};
use burn_ir::TensorIr;
use burn_router::{MultiBackendBridge, RouterChannel, RouterClient, RouterTensor};

use super::TrainiumClient;
use crate::TrainiumDevice;

/// Connects Burn's router to one `TrainiumClient` per [`TrainiumDevice`].
#[derive(Clone, Debug, Default)]
pub struct TrainiumChannel;

/// Moves tensors between Trainium devices through host memory.
pub struct TrainiumBridge;

impl MultiBackendBridge for TrainiumBridge {
    type TensorHandle = TensorData;
    type Device = TrainiumDevice;

    fn change_backend_float(data: TensorData, _: Shape, _: &TrainiumDevice) -> TensorData {
        data
    }

    fn change_backend_int(data: TensorData, _: Shape, _: &TrainiumDevice) -> TensorData {
        data
    }

    fn change_backend_bool(data: TensorData, _: Shape, _: &TrainiumDevice) -> TensorData {
        data
    }
}

impl RouterChannel for TrainiumChannel {
    type Device = TrainiumDevice;
    type Bridge = TrainiumBridge;
    type Client = TrainiumClient;

    fn name(device: &TrainiumDevice) -> String {
        format!("trainium<{device}>")
    }

    fn init_client(device: &TrainiumDevice) -> TrainiumClient {
        TrainiumClient::new(device)
    }

    fn get_tensor_handle(tensor: &TensorIr, client: &TrainiumClient) -> TensorData {
        client.read_data(tensor).unwrap_or_else(|error| {
            panic!(
                "moving tensor {:?} off {}: {error}",
                tensor.id,
                client.device()
            )
        })
    }

    fn register_tensor(
        client: &TrainiumClient,
        data: TensorData,
        _shape: Shape,
        _dtype: DType,
    ) -> RouterTensor<TrainiumClient> {
        client.register_tensor_data(data)
    }
}
