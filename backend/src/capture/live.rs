//! The tensors a device still holds, their bytes, and the client holding each.

use std::collections::HashMap;
use std::thread::ThreadId;

use burn_backend::{DType, Shape};
use burn_ir::TensorId;

/// A client of a device: the thread that registered a tensor's operation (a served device runs
/// each session on a thread of its own).
pub(crate) type ClientId = ThreadId;

/// The client registering on the calling thread.
pub(crate) fn current_client() -> ClientId {
    std::thread::current().id()
}

/// A live tensor's shape, type and the client that made it.
#[derive(Debug, Clone)]
struct LiveTensor {
    shape: Shape,
    dtype: DType,
    client: ClientId,
}

impl LiveTensor {
    fn bytes(&self) -> u64 {
        (self.shape.num_elements() * self.dtype.size()) as u64
    }
}

/// The live tensors of a device (computed or still captured) with their shape, type and size on
/// each replica, in total and by client.
#[derive(Debug, Default)]
pub(crate) struct LiveTensors {
    by_id: HashMap<TensorId, LiveTensor>,
    total_bytes: u64,
    by_client: HashMap<ClientId, u64>,
}

impl LiveTensors {
    /// Counts a new tensor of `shape` and `dtype`, made by the calling thread's client.
    pub(crate) fn insert(&mut self, id: TensorId, shape: &Shape, dtype: DType) {
        self.remove(&id);
        let tensor = LiveTensor {
            shape: shape.clone(),
            dtype,
            client: current_client(),
        };
        self.total_bytes += tensor.bytes();
        *self.by_client.entry(tensor.client).or_default() += tensor.bytes();
        self.by_id.insert(id, tensor);
    }

    /// Forgets a tensor (dropped or consumed).
    pub(crate) fn remove(&mut self, id: &TensorId) {
        if let Some(tensor) = self.by_id.remove(id) {
            self.total_bytes -= tensor.bytes();
            if let Some(held) = self.by_client.get_mut(&tensor.client) {
                *held -= tensor.bytes();
                if *held == 0 {
                    self.by_client.remove(&tensor.client);
                }
            }
        }
    }

    /// How many tensors are live.
    pub(crate) fn count(&self) -> u64 {
        self.by_id.len() as u64
    }

    /// The shape and type of a live tensor.
    pub(crate) fn get(&self, id: &TensorId) -> Option<(Shape, DType)> {
        self.by_id
            .get(id)
            .map(|tensor| (tensor.shape.clone(), tensor.dtype))
    }

    /// The bytes a live tensor takes, if `client` made it.
    pub(crate) fn bytes_held_by(&self, id: &TensorId, client: ClientId) -> u64 {
        self.by_id
            .get(id)
            .filter(|tensor| tensor.client == client)
            .map_or(0, LiveTensor::bytes)
    }

    /// Their bytes on each replica.
    pub(crate) fn bytes(&self) -> u64 {
        self.total_bytes
    }

    /// The bytes `client`'s tensors take on each replica.
    pub(crate) fn client_bytes(&self, client: ClientId) -> u64 {
        self.by_client.get(&client).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_counted_by_the_client_that_made_them_and_freed_by_any() {
        let mut live = LiveTensors::default();
        live.insert(TensorId::new(1), &Shape::new([4, 4]), DType::F32);
        let other = std::thread::spawn(move || {
            live.insert(TensorId::new(2), &Shape::new([8]), DType::F16);
            (current_client(), live)
        });
        let (other, mut live) = other.join().unwrap();
        assert_eq!(live.client_bytes(current_client()), 64);
        assert_eq!(live.client_bytes(other), 16);
        assert_eq!(live.bytes(), 80);
        live.remove(&TensorId::new(2));
        assert_eq!((live.client_bytes(other), live.bytes()), (0, 64));
    }
}
