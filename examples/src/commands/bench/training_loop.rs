//! The timed training loop of the benchmarks of Burn models other than HLAT (`hlat bench
//! unrolled`, `hlat bench cnn`): the first step apart (its compiles), untimed warmup steps, then
//! timed steps, each ending with its loss read and the device synchronised.

use std::time::Instant;

use burn::module::Module;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use super::backends::{BackendName, BenchDevice, median, peak_resident_bytes};

/// What the loop measured.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct LoopTiming {
    /// Seconds from the start to the end of the first step (its compiles included).
    pub first_step_seconds: f64,
    /// Median seconds per timed step.
    pub median_step_seconds: f64,
    /// Programs compiled in the first step.
    pub first_step_compiles: u64,
    /// Programs compiled after the first step (a steady step compiles nothing).
    pub later_compiles: u64,
    /// Seconds spent compiling.
    pub compile_seconds: f64,
    /// Operations captured per timed step (Trainium only).
    pub operations_per_step: u64,
    /// Operations that ran on the host instead of the device (Trainium's compiled executors).
    #[serde(default)]
    pub host_fallbacks: u64,
    /// The loss of the last step (every backend trains the same model on the same data).
    pub final_loss: f64,
}

/// One backend's measurement of a training loop: what its benchmark measured (`T`), and the
/// process around it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoopMeasurement<T = LoopTiming> {
    /// The backend measured.
    pub backend: String,
    /// The timings of the loop.
    #[serde(flatten)]
    pub timing: T,
    /// Peak resident memory of the process, bytes.
    pub peak_rss_bytes: u64,
    /// What ran.
    pub version: String,
}

/// A training-loop benchmark, timed on any device with autodiff.
pub trait LoopBenchmark {
    /// What one run of the loop measures.
    type Timing;

    /// Times the loop on `device` (its Burn device has autodiff).
    fn time(&self, device: &BenchDevice) -> anyhow::Result<Self::Timing>;

    /// Whether the loop measures on Burn's default device of its process (for programs that
    /// create tensors on `Device::default()`).
    fn on_default_device(&self) -> bool {
        false
    }
}

/// Measures `benchmark` on `backend` (Trainium's executors, NdArray or Flex, with autodiff).
pub fn measure_on<L: LoopBenchmark>(
    backend: BackendName,
    benchmark: &L,
) -> anyhow::Result<LoopMeasurement<L::Timing>> {
    let mut device = if benchmark.on_default_device() {
        BenchDevice::process_default(backend)?
    } else {
        backend.device(1)?
    };
    device.device = device.device.autodiff();
    let timing = benchmark.time(&device)?;
    Ok(LoopMeasurement {
        backend: backend.name().to_string(),
        timing,
        peak_rss_bytes: peak_resident_bytes().unwrap_or(0),
        version: backend.description().to_string(),
    })
}

/// The steps of a loop.
#[derive(Debug, Clone, Copy)]
pub struct Steps {
    /// Untimed steps after the first.
    pub warmup: usize,
    /// Timed steps.
    pub timed: usize,
    /// The optimizer's learning rate.
    pub learning_rate: f64,
}

/// Trains `model` with `optimizer` on `loss` for `steps` and times it.
pub fn time_training<M: Module>(
    device: &BenchDevice,
    mut model: M,
    mut optimizer: ModuleOptimizer,
    steps: Steps,
    loss_of: impl Fn(&M) -> Tensor<1>,
) -> anyhow::Result<LoopTiming> {
    device.sync()?;
    let start = device.stats();
    let mut after_first = start;
    let mut timed_start = start;
    let mut timing = LoopTiming::default();
    let mut step_seconds = Vec::new();
    for step in 0..1 + steps.warmup + steps.timed {
        if step == 1 + steps.warmup {
            timed_start = device.stats();
        }
        let clock = Instant::now();
        let loss = loss_of(&model);
        let gradients = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(steps.learning_rate, model, gradients);
        // Reading the loss runs the step; the sync runs the update too.
        timing.final_loss = loss
            .into_data()
            .convert::<f64>()
            .try_into_vec::<f64>()
            .map_err(|error| anyhow::anyhow!("reading the loss: {error:?}"))?[0];
        device.sync()?;
        let seconds = clock.elapsed().as_secs_f64();
        if step == 0 {
            timing.first_step_seconds = seconds;
            after_first = device.stats();
        } else if step > steps.warmup {
            step_seconds.push(seconds);
        }
    }
    let end = device.stats();
    timing.median_step_seconds = median(&step_seconds);
    timing.first_step_compiles = after_first.compiles - start.compiles;
    timing.later_compiles = end.compiles - after_first.compiles;
    timing.compile_seconds = end.compile_seconds - start.compile_seconds;
    timing.operations_per_step =
        (end.operations_captured - timed_start.operations_captured) / steps.timed as u64;
    timing.host_fallbacks = end.host_fallbacks - start.host_fallbacks;
    device.report_host_fallbacks();
    Ok(timing)
}
