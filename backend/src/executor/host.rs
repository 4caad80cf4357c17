//! The `host` executor: replays segments on `burn-flex` through Burn's own router runner.

use burn_backend::{Backend, TensorData};
use burn_flex::{Flex, FlexDevice};
use burn_ir::{OperationIr, TensorId, TensorIr};
use burn_router::{Runner, RunnerClient};

use super::Executor;
use crate::BackendError;
use crate::segment::Segment;

/// Replays captured operations one by one on the embedded CPU backend.
pub(crate) struct HostExecutor {
    runner: Runner<Flex>,
}

impl HostExecutor {
    /// A host executor with an empty tensor store.
    pub fn new() -> Self {
        Self {
            runner: Runner::new(FlexDevice),
        }
    }
}

fn failure(reason: impl ToString) -> BackendError {
    BackendError::Execution {
        executor: "host",
        reason: reason.to_string(),
    }
}

impl Executor for HostExecutor {
    fn register_data(&mut self, id: TensorId, data: TensorData) -> Result<(), BackendError> {
        self.runner.register_tensor_data_id(id, data);
        Ok(())
    }

    fn run(&mut self, segment: Segment) -> Result<(), BackendError> {
        for operation in segment.operations() {
            if let OperationIr::Custom(custom) = operation {
                return Err(BackendError::Unsupported {
                    executor: "host",
                    what: format!("custom operation `{}`", custom.id),
                });
            }
        }
        for operation in segment.operations() {
            self.runner.register_op(operation.clone());
        }
        Ok(())
    }

    fn read(&mut self, tensor: &TensorIr) -> Result<TensorData, BackendError> {
        let future = self.runner.read_tensor_async(tensor.clone());
        burn_backend::read_sync(future).map_err(failure)
    }

    fn seed(&mut self, seed: u64) {
        Flex::seed(&FlexDevice, seed);
    }
}
