//! What the executors that hold tensors in device memory (`xla`, `neuron`) share: running a
//! planned segment, host fallbacks, reads.

use burn_backend::TensorData;
use burn_ir::{OperationIr, TensorId, TensorIr, TensorStatus};

use super::{Executor, HostExecutor};
use crate::lower::{self, LowerOptions, LoweredProgram, Step};
use crate::segment::Segment;
use crate::stats::StatsCounters;
use crate::{BackendError, TrainiumDevice};

/// An executor whose tensors live in device memory and whose programs come from the shared
/// lowering. The provided methods hold everything the `xla` and `neuron` executors do alike.
pub(crate) trait DeviceExecutor {
    /// The device this executor serves.
    fn device(&self) -> TrainiumDevice;
    /// The device's statistics counters.
    fn counters(&self) -> &StatsCounters;
    /// Copies a tensor off the device.
    fn download(&self, id: TensorId) -> Result<TensorData, BackendError>;
    /// Copies host data onto the device under `id`.
    fn upload_as(&mut self, id: TensorId, data: &TensorData) -> Result<(), BackendError>;
    /// Frees a device tensor whose life has ended.
    fn release(&mut self, id: TensorId);
    /// Runs one lowered program on the device.
    fn execute(&mut self, program: &LoweredProgram) -> Result<(), BackendError>;

    /// Splits `operations` into lowered programs and host fallbacks, and runs them in order.
    fn run_planned(
        &mut self,
        operations: &[OperationIr],
        options: &LowerOptions,
    ) -> Result<(), BackendError> {
        let start = std::time::Instant::now();
        let steps =
            lower::plan_segment(operations, options).map_err(|error| BackendError::Execution {
                executor: self.device().executor.name(),
                reason: error.to_string(),
            })?;
        StatsCounters::add_elapsed(&self.counters().prepare_micros, start);
        for step in steps {
            match step {
                Step::Program(program) => self.execute(&program)?,
                Step::Fallback(operation) => self.run_on_host(&operation)?,
            }
        }
        Ok(())
    }

    /// Runs one operation that has no lowering on a fresh host executor: inputs copied off the
    /// device, outputs copied back, ended inputs released. Counted in `host_fallbacks`.
    fn run_on_host(&mut self, operation: &OperationIr) -> Result<(), BackendError> {
        let mut segment = Segment::default();
        segment.push(operation.clone());
        let boundary = segment.boundary();
        let mut host = HostExecutor::new();
        for input in &boundary.inputs {
            host.register_data(input.id, self.download(input.id)?)?;
        }
        host.run(segment)?;
        for output in &boundary.outputs {
            let readable = TensorIr {
                status: TensorStatus::ReadOnly,
                ..output.clone()
            };
            self.upload_as(output.id, &host.read(&readable)?)?;
        }
        for id in &boundary.released_inputs {
            self.release(*id);
        }
        StatsCounters::add(&self.counters().host_fallbacks, 1);
        log::debug!(
            "{}: ran {} on the host",
            self.device(),
            lower::operation_name(operation)
        );
        Ok(())
    }

    /// Copies a tensor to the host; a `ReadWrite` read is its last use and frees it.
    fn read_tensor(&mut self, tensor: &TensorIr) -> Result<TensorData, BackendError> {
        let data = self.download(tensor.id)?;
        if tensor.status == TensorStatus::ReadWrite {
            self.release(tensor.id);
        }
        Ok(data)
    }
}
