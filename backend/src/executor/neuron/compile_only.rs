use std::sync::atomic::{AtomicBool, Ordering};

/// The environment variable that puts the `neuron` executor in compile-only mode (`1`).
pub const COMPILE_ONLY_ENV: &str = crate::settings::NEURON_COMPILE_ONLY.name;

static COMPILE_ONLY: AtomicBool = AtomicBool::new(false);
static CHECK_ONLY: AtomicBool = AtomicBool::new(false);

/// Puts `neuron` executors opened from now on in compile-only mode, or takes them out of it.
///
/// In compile-only mode (the ahead-of-time mode of `hlat compile`, like `neuron_parallel_compile`)
/// every segment is lowered and compiled into the NEFF cache but nothing runs: no Neuron runtime
/// is loaded, and every tensor read from the device holds zeros. A training script run in this
/// mode fills the cache with the programs of its steps.
pub fn set_compile_only(enabled: bool) {
    COMPILE_ONLY.store(enabled, Ordering::Relaxed);
}

/// Whether `neuron` executors open in compile-only mode: [`set_compile_only`],
/// `HLAT_NEURON_COMPILE_ONLY=1`, or check-only mode.
pub fn compile_only() -> bool {
    check_only()
        || COMPILE_ONLY.load(Ordering::Relaxed)
        || crate::settings::NEURON_COMPILE_ONLY
            .var()
            .is_ok_and(|value| matches!(value.trim(), "1" | "true" | "TRUE"))
}

/// Puts `neuron` executors opened from now on in check-only mode (`hlat compile --check-only`),
/// or takes them out of it: compile-only mode without the compiler, every module checked by the
/// Neuron lint and nothing compiled or cached, so no Neuron SDK is needed at all.
pub fn set_check_only(enabled: bool) {
    CHECK_ONLY.store(enabled, Ordering::Relaxed);
}

/// Whether `neuron` executors open in check-only mode ([`set_check_only`]).
pub fn check_only() -> bool {
    CHECK_ONLY.load(Ordering::Relaxed)
}
