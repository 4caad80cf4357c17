//! The integration tests of `hlat-train`, in one binary: the data pipeline (`data_*`),
//! evaluation (`eval_*`) and the trainer (`train_*`).

mod data_builtin;
mod data_formats;
mod data_ingest;
mod data_mixing;
mod data_packing;
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

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// Tests that seed the `host` device or draw from it take turns: the host executor draws from
/// burn-flex's one process-wide generator, so a test drawing concurrently would change what
/// another test's seed gives (two runs expected to be identical would then differ).
static RANDOM_STATE: Mutex<()> = Mutex::new(());

/// Takes the host's random state for the caller alone (see [`RANDOM_STATE`]).
fn exclusive_random() -> MutexGuard<'static, ()> {
    RANDOM_STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A file or folder of the repository's `fixtures/`.
fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name)
}
