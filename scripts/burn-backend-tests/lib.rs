//! Harness for Burn 0.21.0's backend test suite (fetched from tracel-ai/burn
//! v0.21.0:crates/burn-backend-tests/tests) with `TestBackend = burn_trainium::Trainium`.
extern crate alloc;

#[cfg(feature = "std")]
pub use burn_tensor_testgen::might_panic;
