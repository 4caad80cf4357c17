//! The integration tests of `burn-trainium`, in one binary: the `xla` executor on the XLA CPU
//! plugin (replicated devices and collectives included), the lowering, and the `neuron`
//! executor's toolchain with a stand-in compiler.
//!
//! Tests that count statistics use a device of their own: statistics are kept per device.

mod collectives;
mod coverage;
mod data_parallel;
mod errors;
mod executor;
mod fft;
mod lowering;
mod neuron_cache;
mod neuron_compile_only;
mod neuron_on_chip;
mod neuron_support;
mod support;
