//! The integration tests of `hlat`, in one binary: the model, native checkpoints, the Hugging
//! Face bridge (against the transformers fixtures in `fixtures/`), tensor and sequence
//! parallelism, and activation checkpointing.

mod blocked_attention;
mod checkpoint;
mod hf;
mod lora;
mod merge;
mod mergekit;
mod model;
mod parallel;
mod parallel_support;
mod pipeline;
mod pipeline_checkpoint;
mod recompute;
mod sharded_checkpoint;

use test_support::fixtures::fixture;

use burn::tensor::Device;
use burn_trainium::TrainiumDevice;

/// The `host` executor (one replica) served as a Burn device.
pub fn host() -> Device {
    trainium(TrainiumDevice::HOST)
}

/// `device` served as a Burn device (`burn_trainium::device`).
pub fn trainium(device: TrainiumDevice) -> Device {
    burn_trainium::device(&device.to_string())
        .unwrap_or_else(|error| panic!("serving {device}: {error}"))
}
