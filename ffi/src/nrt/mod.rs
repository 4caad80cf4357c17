//! Bindings to the Neuron runtime (`libnrt`), loaded at run time with `libloading`.
//!
//! The declarations follow the headers the Neuron SDK publishes in aws-neuron/aws-neuron-sdk
//! `src/libnrt/include/nrt/`: `nrt.h` (runtime 2.0 API), `nrt_status.h`, `nrt_version.h` and
//! `nrt_experimental.h` (`nrt_get_model_tensor_info`). Only the calls the `neuron` executor needs
//! are bound. None of this has run against a real `libnrt` yet: the layouts are checked against the
//! header text by the unit tests of `raw.rs`, not against the library.
//!
//! The library is searched in `NEURON_RT_LIB_DIR`, then `/opt/aws/neuron/lib`, then on the dynamic
//! loader's search path, as `libnrt.so.1` and then `libnrt.so`. [`NeuronRuntime::global`] loads it
//! and calls `nrt_init` once per process.

mod c_text;
mod error;
mod library;
mod model;
mod raw;
mod runtime;
mod status;
mod tensor;
mod version;

pub use error::{LoadAttempt, NrtError};
pub use library::{DEFAULT_LIB_DIR, LIB_DIR_ENV, LIB_NAMES, NeuronLibrary, library_candidates};
pub use model::{Model, ModelTensorInfo, TensorUsage};
pub use runtime::NeuronRuntime;
pub use status::NrtStatus;
pub use tensor::{Tensor, TensorPlacement, TensorSet};
pub use version::RuntimeVersion;
