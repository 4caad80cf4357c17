//! Executors: what runs a captured segment. `host` replays it on `burn-flex`; `xla` and `neuron`
//! are targets of the one [`DeviceExecutor`], which runs the segment's lowered programs.

mod atomic_write;
pub use atomic_write::write_atomically;
mod device;
mod fallback;
mod host;
mod mappings;
pub mod neuron;
mod plan_cache;
mod plugin_discovery;
mod plugin_kind;
mod program_cache;
mod xla;
mod xla_cache;
mod xla_stderr;

pub use device::set_operator_rules;
pub(crate) use device::{CompileOutcome, DeviceExecutor, Target};
pub use fallback::{
    HOST_FALLBACK_ENV, HOST_OPERATIONS_ENV, HostFallback, set_host_fallback, set_host_operations,
};
pub(crate) use fallback::{host_fallback_from_env, host_operations_from_env};
pub(crate) use host::HostExecutor;
pub use plugin_kind::{NEURON_PROCESS_DEVICES_ENV, NEURON_PROCESS_INDEX_ENV, PluginKind};
pub(crate) use program_cache::CacheLimits;
pub use xla::{
    COMPILE_CACHE_CAPACITY, COMPILE_CACHE_INSTRUCTIONS, COMPILER_OPTIONS_ENV, CPU_DEVICES_ENV,
    DEFAULT_CPU_DEVICES, PLUGIN_ENV, SMALL_TENSOR_SEGMENT_CAP,
};
pub use xla_cache::{
    CacheEntry, DEFAULT_MAX_BYTES, EntryDescription, XLA_CACHE_ENV, XLA_CACHE_MAX_BYTES_ENV,
    cache_entries, evict_to_bound, xla_cache_folder,
};

use burn_backend::TensorData;
use burn_ir::{TensorId, TensorIr};

use crate::capture::Segment;
use crate::distributed::ReplicaSpan;
use crate::stats::counters;
use crate::{BackendError, ExecutorKind, TrainiumDevice};

/// Runs segments and owns the device-side tensors of one Trainium device (every replica of it).
pub(crate) trait Executor: Send {
    /// Stores a tensor created from host data under `id`, the same data on every replica.
    fn register_data(&mut self, id: TensorId, data: TensorData) -> Result<(), BackendError>;

    /// Stores a tensor under `id` whose replica `r` holds `data[r]`.
    fn register_replicas(
        &mut self,
        id: TensorId,
        data: Vec<TensorData>,
    ) -> Result<(), BackendError>;

    /// Runs every operation of `segment`, in order.
    fn run(&mut self, segment: Segment) -> Result<(), BackendError>;

    /// Copies a tensor (its first replica) to the host. A `ReadWrite` status releases it.
    fn read(&mut self, tensor: &TensorIr) -> Result<TensorData, BackendError>;

    /// Copies every replica of a tensor to the host. A `ReadWrite` status releases it.
    fn read_replicas(&mut self, tensor: &TensorIr) -> Result<Vec<TensorData>, BackendError>;

    /// Copies this process's first `count` replicas of a tensor (all it holds, if fewer) to the
    /// host, with the index of the first among every replica. A `ReadWrite` status releases it.
    fn read_local_replicas(
        &mut self,
        tensor: &TensorIr,
        count: usize,
    ) -> Result<(usize, Vec<TensorData>), BackendError>;

    /// Whether a run of `computing` operations producing `computed_elements` elements in all
    /// should be a program of its own though the default segment cap is not reached. The client
    /// asks only when no cap was set (`TRAINIUM_SEGMENT_CAP`,
    /// [`set_segment_cap`](crate::set_segment_cap)).
    fn cuts_early(&self, _computing: usize, _computed_elements: u64) -> bool {
        false
    }

    /// Seeds the executor's random number generator.
    fn seed(&mut self, seed: u64);
}

/// Opens the executor a device asks for, or says why it is unavailable.
pub(crate) fn open(device: &TrainiumDevice) -> Result<Box<dyn Executor>, BackendError> {
    let span = ReplicaSpan::of(device)?;
    Ok(match device.executor {
        ExecutorKind::Host => Box::new(HostExecutor::new(span)),
        ExecutorKind::Xla => {
            let target = xla::XlaTarget::open(device, &span)?;
            Box::new(DeviceExecutor::new(device, span, target, counters(device)))
        }
        ExecutorKind::Neuron => {
            let target = neuron::NeuronCores::open(device, &span)?;
            Box::new(DeviceExecutor::new(device, span, target, counters(device)))
        }
    })
}
