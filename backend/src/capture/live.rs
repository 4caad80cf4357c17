//! The tensors a device still holds, and their bytes.

use std::collections::HashMap;

use burn_backend::{DType, Shape};
use burn_ir::TensorId;

/// The live tensors of a device (computed or still captured) with their shape, type and size on
/// each replica.
#[derive(Debug, Default)]
pub(crate) struct LiveTensors {
    by_id: HashMap<TensorId, (Shape, DType)>,
    total_bytes: u64,
}

fn bytes_of(shape: &Shape, dtype: DType) -> u64 {
    (shape.num_elements() * dtype.size()) as u64
}

impl LiveTensors {
    /// Counts a new tensor of `shape` and `dtype`.
    pub(crate) fn insert(&mut self, id: TensorId, shape: &Shape, dtype: DType) {
        if let Some((shape, dtype)) = self.by_id.insert(id, (shape.clone(), dtype)) {
            self.total_bytes -= bytes_of(&shape, dtype);
        }
        self.total_bytes += bytes_of(shape, dtype);
    }

    /// Forgets a tensor (dropped or consumed).
    pub(crate) fn remove(&mut self, id: &TensorId) {
        if let Some((shape, dtype)) = self.by_id.remove(id) {
            self.total_bytes -= bytes_of(&shape, dtype);
        }
    }

    /// How many tensors are live.
    pub(crate) fn count(&self) -> u64 {
        self.by_id.len() as u64
    }

    /// The shape and type of a live tensor.
    pub(crate) fn get(&self, id: &TensorId) -> Option<&(Shape, DType)> {
        self.by_id.get(id)
    }

    /// Their bytes on each replica.
    pub(crate) fn bytes(&self) -> u64 {
        self.total_bytes
    }
}
