//! Tests that seed or draw random numbers take turns: seeding any `Trainium` device also seeds
//! the host executor's process-wide generator (burn-flex's), which host fallbacks draw from.

use std::sync::{Mutex, MutexGuard};

/// The random state of the test process.
static RANDOM_STATE: Mutex<()> = Mutex::new(());

/// Takes the random state for the caller alone until the guard drops.
pub fn exclusive_random() -> MutexGuard<'static, ()> {
    RANDOM_STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
