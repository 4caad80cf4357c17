//! Dynamic bindings to the PJRT C API and the Neuron runtime, loaded with `libloading`.

pub mod nrt;
pub mod pjrt;
