//! # test-support
//!
//! What the tests of every crate in the workspace share, written once: each crate lists it
//! under `[dev-dependencies]`.
//!
//! - [`plugin`]: the XLA CPU PJRT plugin the tests require (they fail, never skip, without it).
//! - [`fixtures`]: the repository's `fixtures/` folder, its tiny Hugging Face models and what
//!   transformers computed for them.
//! - [`stand_in`]: the stand-in `neuronx-cc` and kernel tracer (NOT the Neuron SDK) the tests
//!   of compile-only Neuron runs point the executor at.
//! - [`files`]: finding files by name under a folder (the modules of a NEFF cache).
//! - [`random`]: the lock tests take turns on when they seed Burn's process-wide generator.
//! - [`image`]: the size of a PNG file the tools wrote.
//! - [`module`]: a Burn module's parameter values, to compare models.
//! - [`tokenizer`]: word-level `tokenizer.json` files written by hand.
//! - `training` (feature `training`): models trained step by step through HLAT's optimizer step.

pub mod files;
pub mod fixtures;
pub mod image;
pub mod module;
pub mod plugin;
pub mod random;
pub mod stand_in;
pub mod tokenizer;
#[cfg(feature = "training")]
pub mod training;
