//! The tensors a device still holds, and their bytes.

use std::collections::HashMap;

use burn_backend::{DType, Shape};
use burn_ir::TensorId;

/// The live tensors of a device (computed or still captured) with their size on each replica.
#[derive(Debug, Default)]
pub(crate) struct LiveTensors {
    bytes_by_id: HashMap<TensorId, u64>,
    total_bytes: u64,
}

impl LiveTensors {
    /// Counts a new tensor of `shape` and `dtype`.
    pub(crate) fn insert(&mut self, id: TensorId, shape: &Shape, dtype: DType) {
        let bytes = (shape.num_elements() * dtype.size()) as u64;
        if let Some(previous) = self.bytes_by_id.insert(id, bytes) {
            self.total_bytes -= previous;
        }
        self.total_bytes += bytes;
    }

    /// Forgets a tensor (dropped or consumed).
    pub(crate) fn remove(&mut self, id: &TensorId) {
        if let Some(bytes) = self.bytes_by_id.remove(id) {
            self.total_bytes -= bytes;
        }
    }

    /// How many tensors are live.
    pub(crate) fn count(&self) -> u64 {
        self.bytes_by_id.len() as u64
    }

    /// Their bytes on each replica.
    pub(crate) fn bytes(&self) -> u64 {
        self.total_bytes
    }
}
