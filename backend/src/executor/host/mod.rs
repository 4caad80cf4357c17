//! The `host` executor: replays segments on `burn-flex` through Burn's own router runner.

use burn_backend::{Backend, TensorData};
use burn_flex::{Flex, FlexDevice};
use burn_ir::{OperationIr, TensorId, TensorIr};
use burn_router::{Runner, RunnerClient};
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::Executor;
use crate::BackendError;
use crate::segment::Segment;

/// Replays captured operations one by one on the embedded CPU backend.
pub(crate) struct HostExecutor {
    runner: Runner<Flex>,
    /// Why the runner can no longer be used: a panic inside a `burn-flex` kernel poisons the
    /// runner's tensor store for good, so every later call reports the first failure instead.
    broken: Option<String>,
}

impl HostExecutor {
    /// A host executor with an empty tensor store.
    pub fn new() -> Self {
        Self {
            runner: Runner::new(FlexDevice),
            broken: None,
        }
    }

    /// Runs `work` on the runner; a panic becomes an error (described by `what`) and marks the
    /// runner as broken.
    fn guarded<T>(
        &mut self,
        what: impl FnOnce() -> String,
        work: impl FnOnce(&Runner<Flex>) -> T,
    ) -> Result<T, BackendError> {
        if let Some(reason) = &self.broken {
            return Err(failure(format!(
                "the host device is unusable after an earlier failure: {reason}"
            )));
        }
        catch_unwind(AssertUnwindSafe(|| work(&self.runner))).map_err(|payload| {
            let reason = format!("{} panicked: {}", what(), panic_message(payload.as_ref()));
            self.broken = Some(reason.clone());
            failure(reason)
        })
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| {
            payload
                .downcast_ref::<&str>()
                .map(|message| message.to_string())
        })
        .unwrap_or_else(|| "a panic without a message".to_string())
}

fn failure(reason: impl ToString) -> BackendError {
    BackendError::Execution {
        executor: "host",
        reason: reason.to_string(),
    }
}

impl Executor for HostExecutor {
    fn register_data(&mut self, id: TensorId, data: TensorData) -> Result<(), BackendError> {
        self.guarded(
            || format!("registering tensor {id:?}"),
            |runner| runner.register_tensor_data_id(id, data),
        )
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
            self.guarded(
                || format!("{operation:?}").chars().take(200).collect(),
                |runner| runner.register_op(operation.clone()),
            )?;
        }
        Ok(())
    }

    fn read(&mut self, tensor: &TensorIr) -> Result<TensorData, BackendError> {
        self.guarded(
            || format!("reading tensor {:?}", tensor.id),
            |runner| burn_backend::read_sync(runner.read_tensor_async(tensor.clone())),
        )?
        .map_err(failure)
    }

    fn seed(&mut self, seed: u64) {
        Flex::seed(&FlexDevice, seed);
    }
}
