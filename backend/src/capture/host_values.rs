//! Batches made on the host stay on the host until a program uses them.
//!
//! Burn's batchers make one small tensor per item from host data and reshape and stack them
//! (`Tensor::from_floats(...).unsqueeze()`, `Tensor::stack`, `Tensor::cat`). On a compiled device
//! each item would be a transfer of its own and an input of the step's program, and each of those
//! operations part of the program. Instead a tensor made from a small amount of host data is held
//! here, not yet on the device; an operation that only moves data (reshape, transpose, slice,
//! concatenation...) whose inputs are all held here is done on the host at once (burn-flex, the
//! `host` executor's kernels) and its result held in turn; any other use uploads a held tensor,
//! once, as one input of the program that uses it, and a sync uploads them all. The operations
//! done here are counted in [`Stats::host_folded`](crate::Stats::host_folded); nothing that
//! computes, and no tensor the device already holds, is ever handled here.

use std::collections::HashMap;

use burn_backend::TensorData;
use burn_ir::{BaseOperationIr, OperationIr, TensorId, TensorIr, TensorStatus};

use super::Segment;
use crate::BackendError;
use crate::distributed::ReplicaSpan;
use crate::executor::{Executor, HostExecutor};

/// The largest tensor (in bytes) kept on the host until used, and the largest result folded.
pub const HOST_VALUE_BYTES: usize = 1 << 20;

/// The tensors of one device made from host data and not yet uploaded.
#[derive(Default)]
pub struct HostValues {
    values: HashMap<TensorId, TensorData>,
}

impl HostValues {
    /// Whether `data` is small enough to be held until used.
    pub fn holds_data_of(data: &TensorData) -> bool {
        data.as_bytes().len() <= HOST_VALUE_BYTES
    }

    /// Holds `data` as tensor `id`.
    pub fn insert(&mut self, id: TensorId, data: TensorData) {
        self.values.insert(id, data);
    }

    /// Whether no tensor is held here.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The tensors held here, in no particular order.
    pub fn ids(&self) -> impl Iterator<Item = TensorId> + '_ {
        self.values.keys().copied()
    }

    /// Whether tensor `id` is held here.
    pub fn contains(&self, id: &TensorId) -> bool {
        self.values.contains_key(id)
    }

    /// The data held as tensor `id`, if it is held here.
    pub fn get(&self, id: &TensorId) -> Option<&TensorData> {
        self.values.get(id)
    }

    /// Takes tensor `id` out, if it is held here.
    pub fn take(&mut self, id: &TensorId) -> Option<TensorData> {
        self.values.remove(id)
    }

    /// Whether `operation` can be done here now: an operation that only moves data, every input
    /// held here, every output small.
    pub fn can_fold(&self, operation: &OperationIr) -> bool {
        let kind_folds = match operation {
            OperationIr::BaseFloat(base)
            | OperationIr::BaseInt(base)
            | OperationIr::BaseBool(base) => {
                matches!(
                    base,
                    BaseOperationIr::Reshape(_)
                        | BaseOperationIr::SwapDims(_)
                        | BaseOperationIr::Permute(_)
                        | BaseOperationIr::Flip(_)
                        | BaseOperationIr::Expand(_)
                        | BaseOperationIr::Slice(_)
                        | BaseOperationIr::Cat(_)
                )
            }
            _ => false,
        };
        let mut inputs = operation.inputs().peekable();
        kind_folds
            && inputs.peek().is_some()
            && inputs.all(|input| self.contains(&input.id))
            && operation
                .outputs()
                .all(|output| output.shape.num_elements() * output.dtype.size() <= HOST_VALUE_BYTES)
    }

    /// Computes `operation` ([`can_fold`](Self::can_fold)) on the host and holds its outputs;
    /// inputs at their last use are released.
    pub fn fold(&mut self, operation: OperationIr) -> Result<(), BackendError> {
        let mut host = HostExecutor::new(ReplicaSpan::local(1));
        for input in operation.inputs() {
            let data = match input.status {
                TensorStatus::ReadWrite => self.values.remove(&input.id),
                _ => self.values.get(&input.id).cloned(),
            };
            if let Some(data) = data {
                host.register_data(input.id, data)?;
            }
        }
        let outputs: Vec<TensorIr> = operation.outputs().cloned().collect();
        host.run(Segment::from_operations(vec![operation]))?;
        for output in outputs {
            let data = host.read(&TensorIr {
                status: TensorStatus::ReadWrite,
                ..output.clone()
            })?;
            self.values.insert(output.id, data);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use burn_ir::TensorStatus::{ReadOnly, ReadWrite};

    use super::*;
    use crate::test_operations::{add, exp, tensor};

    #[test]
    fn only_data_movement_and_scalar_arithmetic_on_held_tensors_folds() {
        let mut values = HostValues::default();
        values.insert(TensorId::new(1), TensorData::new(vec![1.0f32, 2.0], [2]));
        // exp computes: it stays for the device even on a held tensor.
        assert!(!values.can_fold(&exp(tensor(1, ReadOnly), 2)));
        // A held and an uploaded input: not foldable either.
        assert!(!values.can_fold(&add(tensor(1, ReadOnly), tensor(9, ReadOnly), 3)));
        assert!(values.contains(&TensorId::new(1)));
        assert!(values.take(&TensorId::new(1)).is_some());
        assert!(!values.contains(&TensorId::new(1)));
        let _ = ReadWrite;
    }
}
