//! The integration tests of `hlat-train`, in one binary: the data pipeline (`data_*`),
//! evaluation (`eval_*`) and the trainer (`train_*`).

mod align_job;
mod align_trl;
mod data_builtin;
mod data_formats;
mod data_ingest;
mod data_mixing;
mod data_packing;
mod data_piece_encoding;
mod data_sampler;
mod data_tokenizer;
mod eval_scoring;
mod train_fixture;
mod train_learner;
mod train_optimizer;
mod train_precision;
mod train_pretrain;
mod train_recipe;
mod train_resume;
mod train_step;

// Tests that seed the `host` device or draw from it take turns (`exclusive_random`): the host
// executor draws from burn-flex's one process-wide generator, so a test drawing concurrently
// would change what another test's seed gives.
use test_support::fixtures::fixture;
use test_support::random::exclusive_random;

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
