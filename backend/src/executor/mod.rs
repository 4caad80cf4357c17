//! Executors: what runs a captured segment. One file per executor, behind one trait.

mod device;
mod host;
mod neuron;
mod xla;

pub(crate) use host::HostExecutor;
pub(crate) use xla::XlaExecutor;
pub use xla::{COMPILE_CACHE_CAPACITY, COMPILE_CACHE_INSTRUCTIONS, CPU_DEVICES_ENV, PLUGIN_ENV};

use burn_backend::TensorData;
use burn_ir::{TensorId, TensorIr};

use crate::segment::Segment;
use crate::{BackendError, ExecutorKind, TrainiumDevice};

/// Runs segments and owns the device-side tensors of one Trainium device.
pub(crate) trait Executor: Send {
    /// Stores a tensor created from host data under `id`.
    fn register_data(&mut self, id: TensorId, data: TensorData) -> Result<(), BackendError>;

    /// Runs every operation of `segment`, in order.
    fn run(&mut self, segment: Segment) -> Result<(), BackendError>;

    /// Copies a tensor to the host. A `ReadWrite` status releases the device tensor.
    fn read(&mut self, tensor: &TensorIr) -> Result<TensorData, BackendError>;

    /// Seeds the executor's random number generator.
    fn seed(&mut self, seed: u64);
}

/// Opens the executor a device asks for, or says why it is unavailable.
pub(crate) fn open(device: &TrainiumDevice) -> Result<Box<dyn Executor>, BackendError> {
    match device.executor {
        ExecutorKind::Host => Ok(Box::new(HostExecutor::new())),
        ExecutorKind::Xla => Ok(Box::new(XlaExecutor::new(
            device,
            crate::stats::counters(device),
        )?)),
        ExecutorKind::Neuron => Ok(Box::new(neuron::NeuronExecutor::new(
            device,
            crate::stats::counters(device),
        )?)),
    }
}
