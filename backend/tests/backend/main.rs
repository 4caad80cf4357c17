//! The integration tests of `burn-trainium`, in one binary: the `xla` executor on the XLA CPU
//! plugin (replicated devices and collectives included), the lowering, and the `neuron`
//! executor's toolchain with a stand-in compiler.
//!
//! Tensors are Burn 0.22's: the tests reach the executors through the devices
//! `burn_trainium::device` serves in the process and compare them with Flex; statistics and
//! settings are read and set on the `TrainiumDevice` a served device stands for.
//!
//! Tests that count statistics use a device of their own: statistics are kept per device.

mod attention_kernels;
mod burn_device;
mod collectives;
mod coverage;
mod data_parallel;
mod errors;
mod executor;
mod fused_attention;
mod host_sums;
mod lowering;
mod neuron_cache;
mod neuron_compile_only;
mod neuron_on_chip;
mod neuron_support;
mod support;
