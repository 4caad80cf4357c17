//! # burn-trainium
//!
//! A [Burn](https://burn.dev) backend for AWS Trainium.
//!
//! The pipeline reads as the folders do: [`capture`](TrainiumChannel) (the router's client
//! buffers operations into segments) → [`lower`] (a segment becomes one XLA HLO module) →
//! executors (`host`, `xla`, `neuron`) → the native bindings of `trainium-ffi`.
//!
//! Trainium is an XLA device: instead of dispatching every operation, the backend captures Burn's
//! intermediate representation ([`burn_ir::OperationIr`]) lazily and runs it in *segments* when a
//! tensor is read or on `sync`, cut into programs at its size cap; a read from another thread (a
//! metrics thread) runs only the operations it needs and teaches the capture where steps end
//! (docs/xla.md, "Where a segment is cut"). A segment is handed to an executor:
//!
//! - `host`: replays the segment on [`burn_flex`] through [`burn_router::Runner`]. It is the
//!   default device and the reference every other executor is checked against.
//! - `xla`: lowers the segment to one XLA HLO module and runs it through a PJRT plugin.
//! - `neuron`: compiles the same HLO module with `neuronx-cc` and runs it on NeuronCores.
//!
//! ```no_run
//! use burn_trainium::{Trainium, TrainiumDevice};
//! type B = Trainium; // or `burn::backend::Autodiff<Trainium>` for training
//! let device = TrainiumDevice::default(); // reads TRAINIUM_DEVICE, `host:0` when unset
//! ```
//!
//! A device may stand for several replicas (`xla:0-3`): one program runs on each, and the
//! [`collective`] operations combine them.

pub mod attention;
mod capture;
pub mod collective;
mod device;
pub mod distributed;
mod error;
mod executor;
pub mod hlo;
pub mod lower;
mod per_device;
pub mod profile;
pub mod server;
pub mod settings;
mod stats;
#[cfg(test)]
mod test_operations;

pub use capture::{
    DEFAULT_SEGMENT_CAP, MAX_TENSOR_BYTES_ENV, SEGMENT_CAP_ENV, Segment, SegmentBoundary,
    TrainiumChannel, check_device, set_max_client_bytes, set_max_tensor_bytes, set_segment_cap,
};
pub use device::{DEVICE_ENV, ExecutorKind, MAX_REPLICAS, TrainiumDevice};
pub use error::{BackendError, panic_message};
pub use executor::neuron;
pub use executor::write_atomically;
pub use server::{device, device_from_env, flex_device, set_default_device};
/// The `xla` executor's persistent compile cache, for tools that list and prune it.
pub mod xla_cache {
    pub use crate::executor::{
        CacheEntry, DEFAULT_MAX_BYTES, EntryDescription, XLA_CACHE_MAX_BYTES_ENV, cache_entries,
        evict_to_bound, xla_cache_folder,
    };
}
pub use executor::{
    COMPILE_CACHE_CAPACITY, COMPILE_CACHE_INSTRUCTIONS, COMPILER_OPTIONS_ENV, CPU_DEVICES_ENV,
    DEFAULT_CPU_DEVICES, HOST_FALLBACK_ENV, HOST_OPERATIONS_ENV, HostFallback,
    NEURON_PROCESS_DEVICES_ENV, NEURON_PROCESS_INDEX_ENV, PLUGIN_ENV, PluginKind,
    SMALL_TENSOR_SEGMENT_CAP, XLA_CACHE_ENV, set_host_fallback, set_host_operations,
    set_operator_rules,
};
pub use stats::{Stats, host_fallback_report, host_fallbacks_by_kind, reset_stats, stats};

/// The Trainium backend: Burn's router backend over this crate's channel and client.
///
/// Use `burn::backend::Autodiff<Trainium>` to train.
pub type Trainium = burn_router::BackendRouter<TrainiumChannel>;
