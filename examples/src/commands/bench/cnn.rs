//! `hlat bench cnn`: a small CNN in Burn's MNIST style (`hlat::vision::SmallCnn`: conv2d, ReLU,
//! max-pool, conv2d, adaptive average pool, linear; cross-entropy, Adam) trained on generated
//! images, timed on several backends in one run, and with `--with-pytorch` the same network in
//! PyTorch eager beside them. Host fallbacks are counted per backend: on `xla` every operation
//! of the step is compiled.

use std::path::PathBuf;

use burn::optim::AdamConfig;
use clap::Args;
use hlat::vision::{SmallCnn, generated_batch};
use serde::{Deserialize, Serialize};

use super::backends::{
    self, BenchDevice, emit_result, reference_device, same_weights, worker_backend,
};
use super::peers;
use super::report;
use super::training_loop::{
    LoopBenchmark, LoopMeasurement, LoopTiming, Steps, measure_on, time_training,
};
use crate::commands::ranges::at_least_one;

/// The seed of the generated images (the PyTorch peer generates the same ones).
const IMAGES_SEED: u64 = 5;
/// Adam's learning rate.
const LEARNING_RATE: f64 = 1e-3;

/// Arguments of `hlat bench cnn`.
#[derive(Args, Clone)]
pub struct CnnBenchArgs {
    /// Backends to compare, comma-separated: host, xla, ndarray, flex.
    #[arg(long, default_value = "host,xla,ndarray")]
    pub backends: String,
    /// The backend the ratios are computed against.
    #[arg(long, default_value = "ndarray")]
    pub baseline: String,
    /// Images per step.
    #[arg(long, default_value_t = 32, value_parser = at_least_one::<usize>())]
    pub batch: usize,
    /// Untimed steps after the first.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 10, value_parser = at_least_one::<usize>())]
    pub steps: usize,
    /// Also time the same network and step in PyTorch (eager), when torch is installed.
    #[arg(long)]
    pub with_pytorch: bool,
    /// The Python interpreter of the PyTorch peer.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Where to write the JSON results: a file there is replaced, a path inside another
    /// command's output folder (a training run, a model) refused.
    #[arg(long, default_value = "bench-cnn.json")]
    pub json: PathBuf,
    /// Internal: measure one backend in this process and print its result.
    #[arg(long, hide = true)]
    pub worker: bool,
}

/// What a `hlat bench cnn` run trained with (its report is a [`report::LoopReport`] of them,
/// whose PyTorch row starts from its own initial weights, so its loss differs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CnnParameters {
    /// Images per step.
    pub batch: usize,
}

/// Runs `hlat bench cnn`.
pub fn run(args: CnnBenchArgs) -> anyhow::Result<()> {
    if args.worker {
        let backend = worker_backend(&args.backends)?;
        return emit_result(&measure_on(backend, &args)?);
    }
    let (mut results, mut failures) =
        backends::measure_each::<LoopMeasurement>(&args.backends, &[], "the CNN step")?;
    if args.with_pytorch {
        let step = peers::CnnStep {
            batch: args.batch,
            seed: IMAGES_SEED,
            warmup: args.warmup,
            steps: args.steps,
            learning_rate: LEARNING_RATE,
        };
        match peers::run_cnn(&args.python, &step) {
            Ok(peer) => results.push(LoopMeasurement {
                backend: "pytorch".to_string(),
                timing: LoopTiming {
                    first_step_seconds: peer.first_step_seconds,
                    median_step_seconds: peer.median_step_seconds,
                    final_loss: peer.final_loss,
                    ..LoopTiming::default()
                },
                peak_rss_bytes: peer.peak_rss_bytes,
                version: peer.version,
            }),
            Err(error) => failures.push(("pytorch".to_string(), format!("{error:#}"))),
        }
    }
    let parameters = CnnParameters { batch: args.batch };
    report::LoopReport::new(parameters, &args.baseline, results, failures).publish(&args.json)
}

impl LoopBenchmark for CnnBenchArgs {
    type Timing = LoopTiming;

    fn time(&self, bench: &BenchDevice) -> anyhow::Result<LoopTiming> {
        let args = self;
        let device = &bench.device;
        // The same initial weights on every backend: drawn on Flex, moved to the device.
        let model = same_weights(SmallCnn::new(&reference_device(7, device)), device);
        let (images, labels) = generated_batch(args.batch, IMAGES_SEED, device);
        let optimizer = AdamConfig::new().init();
        let steps = Steps {
            warmup: args.warmup,
            timed: args.steps,
            learning_rate: LEARNING_RATE,
        };
        time_training(bench, model, optimizer, steps, |model| {
            model.loss(images.clone(), labels.clone())
        })
    }
}
