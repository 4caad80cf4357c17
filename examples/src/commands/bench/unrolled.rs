//! `hlat bench unrolled`: a training step of about ten thousand operations, an LSTM unrolled
//! over its sequence as Burn users write one (burn-nn's `Lstm` and a linear head, mean squared
//! error, Adam), timed on several backends in one run. On a compiled device such a step is one
//! large program: the report gives the time to the first step (compiles included), the compile
//! seconds and the steady-state step time.

use std::path::PathBuf;

use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Lstm, LstmConfig};
use burn::optim::AdamConfig;
use burn::tensor::{Device, Tensor, TensorData};
use clap::Args;
use hlat::rng::SplitMix64;
use serde::{Deserialize, Serialize};

use super::backends::{
    self, BenchDevice, emit_result, reference_device, same_weights, worker_backend,
};
use super::report;
use super::training_loop::{
    LoopBenchmark, LoopMeasurement, LoopTiming, Steps, measure_on, time_training,
};
use crate::commands::ranges::at_least_one;

/// Features of each input step.
const FEATURES: usize = 8;

/// Arguments of `hlat bench unrolled`.
#[derive(Args, Clone)]
pub struct UnrolledBenchArgs {
    /// Backends to compare, comma-separated: host, xla, ndarray, flex.
    #[arg(long, default_value = "host,xla,ndarray")]
    pub backends: String,
    /// The backend the ratios are computed against.
    #[arg(long, default_value = "ndarray")]
    pub baseline: String,
    /// Time steps the LSTM is unrolled over (the operations of a step grow with it).
    #[arg(long, default_value_t = 64, value_parser = at_least_one::<usize>())]
    pub seq_len: usize,
    /// Width of the LSTM state.
    #[arg(long, default_value_t = 64, value_parser = at_least_one::<usize>())]
    pub hidden: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 8, value_parser = at_least_one::<usize>())]
    pub batch: usize,
    /// Untimed steps after the first.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 5, value_parser = at_least_one::<usize>())]
    pub steps: usize,
    /// Operations after which a segment of the Trainium backends runs as a program of its own
    /// (a step longer than this compiles as several smaller programs) [default:
    /// TRAINIUM_SEGMENT_CAP, else 65536, and on xla 2048 for operations of small tensors].
    #[arg(long, value_parser = at_least_one::<usize>())]
    pub segment_cap: Option<usize>,
    /// Where to write the JSON results: a file there is replaced, a path inside another
    /// command's output folder (a training run, a model) refused.
    #[arg(long, default_value = "bench-unrolled.json")]
    pub json: PathBuf,
    /// Internal: measure one backend in this process and print its result.
    #[arg(long, hide = true)]
    pub worker: bool,
}

/// What a `hlat bench unrolled` run trained with (its report is a [`report::LoopReport`] of
/// them).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnrolledParameters {
    /// Time steps unrolled.
    pub seq_len: usize,
    /// LSTM width.
    pub hidden: usize,
    /// Sequences per step.
    pub batch: usize,
    /// The segment cap of the Trainium backends (`--segment-cap`), if one was set.
    pub segment_cap: Option<usize>,
}

/// The recurrent network: an LSTM over the sequence and a linear head on its last state.
#[derive(Module, Debug)]
struct Recurrent {
    lstm: Lstm,
    head: Linear,
}

impl Recurrent {
    fn new(hidden: usize, device: &Device) -> Self {
        Self {
            lstm: LstmConfig::new(FEATURES, hidden, true).init(device),
            head: LinearConfig::new(hidden, 1).init(device),
        }
    }

    /// `inputs` [batch, seq, features] to one prediction per sequence, [batch, 1].
    fn forward(&self, inputs: Tensor<3>) -> Tensor<2> {
        let (_, state) = self.lstm.forward(inputs, None);
        self.head.forward(state.hidden)
    }
}

/// Runs `hlat bench unrolled`.
pub fn run(args: UnrolledBenchArgs) -> anyhow::Result<()> {
    if args.worker {
        let backend = worker_backend(&args.backends)?;
        return emit_result(&measure_on(backend, &args)?);
    }
    let (results, failures) =
        backends::measure_each::<LoopMeasurement>(&args.backends, &[], "the unrolled step")?;
    let parameters = UnrolledParameters {
        seq_len: args.seq_len,
        hidden: args.hidden,
        batch: args.batch,
        segment_cap: args.segment_cap,
    };
    report::LoopReport::new(parameters, &args.baseline, results, failures).publish(&args.json)
}

/// Deterministic values in [-1, 1) for the inputs and targets (the project's SplitMix64).
fn values(count: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..count)
        .map(|_| rng.below(2000) as f32 / 1000.0 - 1.0)
        .collect()
}

impl LoopBenchmark for UnrolledBenchArgs {
    type Timing = LoopTiming;

    fn time(&self, bench: &BenchDevice) -> anyhow::Result<LoopTiming> {
        let args = self;
        let device = &bench.device;
        if let (Some(cap), Some(trainium)) = (args.segment_cap, &bench.trainium) {
            burn_trainium::set_segment_cap(trainium, cap);
        }
        // The same initial weights on every backend: drawn on Flex, moved to the device.
        let reference = Recurrent::new(args.hidden, &reference_device(7, device));
        let model = same_weights(reference, device);
        let inputs = Tensor::<3>::from_data(
            TensorData::new(
                values(args.batch * args.seq_len * FEATURES, 1),
                [args.batch, args.seq_len, FEATURES],
            ),
            device,
        );
        let targets = Tensor::<2>::from_data(
            TensorData::new(values(args.batch, 2), [args.batch, 1]),
            device,
        );
        let optimizer = AdamConfig::new().init();
        let steps = Steps {
            warmup: args.warmup,
            timed: args.steps,
            learning_rate: 1e-3,
        };
        time_training(bench, model, optimizer, steps, |model| {
            (model.forward(inputs.clone()) - targets.clone())
                .powi_scalar(2)
                .mean()
        })
    }
}
