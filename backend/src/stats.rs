use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::TrainiumDevice;

/// Counters of one device, shared between its client and executor.
#[derive(Debug, Default)]
pub(crate) struct StatsCounters {
    pub operations_captured: AtomicU64,
    pub capture_micros: AtomicU64,
    pub segments_run: AtomicU64,
    pub prepare_micros: AtomicU64,
    pub segments_reused: AtomicU64,
    pub compiles: AtomicU64,
    pub compile_micros: AtomicU64,
    pub cache_hits: AtomicU64,
    pub programs_loaded: AtomicU64,
    pub host_fallbacks: AtomicU64,
    pub host_folded: AtomicU64,
    pub collectives: AtomicU64,
    pub collective_bytes: AtomicU64,
    pub bytes_to_device: AtomicU64,
    pub bytes_to_host: AtomicU64,
    pub live_tensors: AtomicU64,
    pub live_bytes: AtomicU64,
    pub largest_scratch_bytes: AtomicU64,
    pub non_finite_runs: AtomicU64,
    /// Host fallbacks by operation kind (`Module::Conv2d`, ...).
    pub fallbacks_by_kind: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl StatsCounters {
    /// Adds `amount` to one counter.
    pub fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }

    /// Raises one counter to `value` if it is below.
    pub fn raise(counter: &AtomicU64, value: u64) {
        counter.fetch_max(value, Ordering::Relaxed);
    }

    /// Adds the time elapsed since `start`, in microseconds, to one counter.
    pub fn add_elapsed(counter: &AtomicU64, start: std::time::Instant) {
        Self::add(counter, start.elapsed().as_micros() as u64);
    }

    fn snapshot(&self) -> Stats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Stats {
            operations_captured: load(&self.operations_captured),
            capture_seconds: load(&self.capture_micros) as f64 * 1e-6,
            segments_run: load(&self.segments_run),
            prepare_seconds: load(&self.prepare_micros) as f64 * 1e-6,
            segments_reused: load(&self.segments_reused),
            compiles: load(&self.compiles),
            compile_seconds: load(&self.compile_micros) as f64 * 1e-6,
            cache_hits: load(&self.cache_hits),
            programs_loaded: load(&self.programs_loaded),
            host_fallbacks: load(&self.host_fallbacks),
            host_folded: load(&self.host_folded),
            collectives: load(&self.collectives),
            collective_bytes: load(&self.collective_bytes),
            bytes_to_device: load(&self.bytes_to_device),
            bytes_to_host: load(&self.bytes_to_host),
            live_tensors: load(&self.live_tensors),
            live_bytes: load(&self.live_bytes),
            largest_scratch_bytes: load(&self.largest_scratch_bytes),
            non_finite_runs: load(&self.non_finite_runs),
        }
    }

    fn reset(&self) {
        self.fallbacks_by_kind
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
        for counter in [
            &self.operations_captured,
            &self.capture_micros,
            &self.segments_run,
            &self.prepare_micros,
            &self.segments_reused,
            &self.compiles,
            &self.compile_micros,
            &self.cache_hits,
            &self.programs_loaded,
            &self.host_fallbacks,
            &self.host_folded,
            &self.collectives,
            &self.collective_bytes,
            &self.bytes_to_device,
            &self.bytes_to_host,
            &self.largest_scratch_bytes,
            &self.non_finite_runs,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

/// A snapshot of one device's execution statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Operations captured from Burn (including `Drop`s).
    pub operations_captured: u64,
    /// Seconds spent capturing operations (the client's own overhead, execution excluded).
    pub capture_seconds: f64,
    /// Segments handed to the executor.
    pub segments_run: u64,
    /// Seconds executors spent preparing segments before running them: fingerprinting, lowering
    /// and compile cache look-ups (compiles themselves are counted in `compile_seconds`).
    pub prepare_seconds: f64,
    /// Segments recognised by their fingerprint as a repeat of one seen before, and prepared
    /// without lowering (`xla`, `neuron`).
    pub segments_reused: u64,
    /// Programs compiled (XLA or Neuron executors).
    pub compiles: u64,
    /// Seconds spent compiling.
    pub compile_seconds: f64,
    /// Segments whose program was found in a compile cache (in memory or on disk).
    pub cache_hits: u64,
    /// Programs loaded compiled from a cache on disk (the NEFF cache, the `xla` persistent
    /// cache) instead of compiled: with `compiles`, the programs this process needed.
    pub programs_loaded: u64,
    /// Operations that had no lowering and ran on the host executor instead.
    pub host_fallbacks: u64,
    /// Operations that only move data (a batcher's reshapes and stacking) on host data not yet
    /// uploaded, done on the host before the upload (`capture::host_values`).
    pub host_folded: u64,
    /// Collectives that exchanged data between replicas (each run of each one).
    pub collectives: u64,
    /// Bytes each replica sent into those collectives.
    pub collective_bytes: u64,
    /// Bytes copied from the host to the device.
    pub bytes_to_device: u64,
    /// Bytes copied from the device to the host.
    pub bytes_to_host: u64,
    /// Tensors currently held by the device (a gauge, not reset by [`reset_stats`]).
    pub live_tensors: u64,
    /// Bytes of those tensors on each replica (a gauge): what the program holds, whether
    /// computed yet or still captured.
    pub live_bytes: u64,
    /// The largest scratch memory (intermediate values) of a program run since the start or the
    /// last reset (compiled then or before), per replica, as the compiler counts it; 0 where the
    /// executor cannot tell (`host`, `neuron`, a PJRT plugin without `PJRT_Executable_GetCompiledMemoryStats`).
    pub largest_scratch_bytes: u64,
    /// Program runs the device reported as finished with NaN or infinite values (Neuron status
    /// 1003); their outputs were kept, so the trainer skips the step as for any non-finite loss.
    pub non_finite_runs: u64,
}

fn registry() -> &'static Mutex<HashMap<TrainiumDevice, Arc<StatsCounters>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<TrainiumDevice, Arc<StatsCounters>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// The shared counters of `device`, created on first use.
pub(crate) fn counters(device: &TrainiumDevice) -> Arc<StatsCounters> {
    let mut registry = registry()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    registry.entry(*device).or_default().clone()
}

/// The execution statistics of `device` since the start of the process (or the last reset).
pub fn stats(device: &TrainiumDevice) -> Stats {
    counters(device).snapshot()
}

/// The operations of `device` that ran on the host since the start of the process (or the last
/// reset), by kind, with their counts.
pub fn host_fallbacks_by_kind(device: &TrainiumDevice) -> Vec<(String, u64)> {
    counters(device)
        .fallbacks_by_kind
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .map(|(kind, &count)| (kind.clone(), count))
        .collect()
}

/// One line naming the operations of `device` that ran on the host, by kind with their counts
/// (`host fallbacks: 12 (ModuleOperationIr::CtcLoss ×8, …)`), or `None` when none did: what
/// `hlat`'s `--stats`, its benchmarks and its training log print.
pub fn host_fallback_report(device: &TrainiumDevice) -> Option<String> {
    let kinds = host_fallbacks_by_kind(device);
    let total: u64 = kinds.iter().map(|(_, count)| count).sum();
    if total == 0 {
        return None;
    }
    let kinds: Vec<String> = kinds
        .iter()
        .map(|(kind, count)| format!("{kind} ×{count}"))
        .collect();
    Some(format!("host fallbacks: {total} ({})", kinds.join(", ")))
}

/// Sets every counter of `device` back to zero, except the live tensor gauges.
pub fn reset_stats(device: &TrainiumDevice) {
    counters(device).reset();
}
