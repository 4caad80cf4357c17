//! The `neuron` target and its toolchain: settings, the `neuronx-cc` driver, the persistent NEFF
//! cache, the SDK's kernels (`kernels.rs`), and how a loaded NEFF binds to the module it was
//! compiled from.
//!
//! A segment lowered to an XLA HLO module (the bytes the `xla` executor compiles, but for
//! attention as the SDK's flash kernel where `kernels.rs` can trace it) is
//! checked against the Neuron SDK's documented operator rules (`lint.rs`), then compiled by
//! `neuronx-cc compile --framework XLA --target trn1|trn2` into a NEFF, which the
//! Neuron runtime loads on a NeuronCore. Compiles take minutes, so NEFFs are kept in a cache
//! shared by every process of the machine (`NEURON_COMPILE_CACHE_URL`, default
//! `/var/tmp/neuron-compile-cache`), which `hlat compile` can fill ahead of time.

mod binding;
mod cache;
mod compile_only;
mod compiler;
mod error;
mod job;
mod kernels;
mod lint;
mod names;
mod peak;
mod precision;
mod settings;
mod target;

pub(crate) use binding::{Binding, bind};
pub use cache::{CacheKey, CacheOutcome, CachedNeff, NeffCache};
pub use compile_only::{
    COMPILE_ONLY_ENV, check_only, compile_only, set_check_only, set_compile_only,
};
pub use compiler::{CompiledNeff, MODULE_FILE, NEFF_FILE, NeuronCompiler};
pub use error::NeuronError;
pub use job::{NeuronProcess, ROOT_COMM_PORT_OFFSET, process_environment};
pub use kernels::{
    FLASH_ATTENTION_ENV, FlashAttention, KERNEL_TRACER_ENV, KernelTracer, NEURON_KERNEL_TARGET,
    TRACER_SCRIPT, TracedKernel,
};
pub use lint::{
    Acceptance, CUSTOM_CALL_TARGETS, LINT_ENV, LintMode, OPERATORS, Operator, Rule, Violation,
    lint_module,
};
pub use names::{INPUT_NAMES_ATTRIBUTE, OUTPUT_NAMES_ATTRIBUTE, request_neff_names};
pub use peak::{NEURON_CORE_PEAK_BF16, NEURON_CORE_PEAK_F32, neuron_peak_flops};
pub use precision::{AUTO_CAST_PREFIX, FULL_PRECISION_FLAGS, has_full_precision_matmul};
pub use settings::{
    CACHE_URL_ENV, COMPILER_ENV, DEFAULT_CACHE_ROOT, DEFAULT_COMPILER, DEFAULT_FLAGS, FLAGS_ENV,
    NeuronSettings, NeuronTarget, RawSettings, TARGET_ENV, set_settings,
};
pub(crate) use target::NeuronCores;
pub use target::{
    LOADED_MODEL_CAPACITY, ROOT_COMM_ID_ENV, STOCHASTIC_ROUNDING_ENV, VISIBLE_CORES_ENV,
};
