//! The integration tests of `burn-trainium`, in one binary: the `xla` executor on the XLA CPU
//! plugin (replicated devices and collectives included), the lowering, and the `neuron`
//! executor's toolchain with a stand-in compiler.
//!
//! Tests that count statistics use a device of their own: statistics are kept per device.
//!
//! During the move to Burn 0.22 only the modules below build; `collectives`, `data_parallel`,
//! `errors`, `executor`, `lowering`, `neuron_*` and `support` are ported next (they used
//! `Tensor<Trainium, D>`, which Burn 0.22 removed).

mod burn_device;
mod coverage;
