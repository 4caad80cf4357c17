use std::sync::atomic::{AtomicBool, Ordering};

/// The environment variable that puts the `neuron` executor in compile-only mode (`1`).
pub const COMPILE_ONLY_ENV: &str = "HLAT_NEURON_COMPILE_ONLY";

static COMPILE_ONLY: AtomicBool = AtomicBool::new(false);

/// Puts `neuron` executors opened from now on in compile-only mode, or takes them out of it.
///
/// In compile-only mode (the ahead-of-time mode of `hlat compile`, like `neuron_parallel_compile`)
/// every segment is lowered and compiled into the NEFF cache but nothing runs: no Neuron runtime
/// is loaded, and every tensor read from the device holds zeros. A training script run in this
/// mode fills the cache with the programs of its steps.
pub fn set_compile_only(enabled: bool) {
    COMPILE_ONLY.store(enabled, Ordering::Relaxed);
}

/// Whether `neuron` executors open in compile-only mode: [`set_compile_only`] or
/// `HLAT_NEURON_COMPILE_ONLY=1`.
pub fn compile_only() -> bool {
    COMPILE_ONLY.load(Ordering::Relaxed)
        || std::env::var(COMPILE_ONLY_ENV)
            .is_ok_and(|value| matches!(value.trim(), "1" | "true" | "TRUE"))
}
