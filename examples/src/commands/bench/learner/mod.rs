//! `hlat bench learner`: training as Burn users write it — burn-train's `Learner` with
//! `SupervisedTraining`, a `DataLoader` over a dataset and a batcher, Burn's loss (and accuracy)
//! metrics and a validation pass every epoch — for Burn's modern-lstm example as written
//! ([`modern_lstm`]), a small recurrent model and a small CNN ([`tasks`]), on several backends
//! side by side.
//!
//! Each backend runs each task in a process of its own: **cold**, with an empty `xla` compile
//! cache (the time includes compiling), and `xla` again **warm**, with the programs of the cold
//! run in the cache (as a user's second run); the other backends keep nothing between runs, so
//! their one run is both. The table gives both times, the warm time
//! against the baseline, and per iteration (training and validation batches) the segments run
//! and the bytes sent to the device, with the programs compiled cold, host fallbacks and the
//! final losses.

mod modern_lstm;
mod recorder;
mod tasks;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::{Dataset, InMemDataset};
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::Device;
use burn::train::metric::{AccuracyMetric, Adaptor, LossInput, LossMetric};
use burn::train::{InferenceStep, Learner, LearnerModel, SupervisedTraining, TrainStep};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use super::backends::{
    self, BackendName, BenchDevice, emit_result, reference_device, same_weights, worker_backend,
};
use super::report;
use super::training_loop::{LoopBenchmark, LoopMeasurement, measure_on};
use crate::commands::ranges::at_least_one;
use modern_lstm::ModernLstm;
use recorder::MetricRecorder;
pub use recorder::MetricValues;
use tasks::{
    BatchLoss, ImageBatcher, ImageClassifier, SequenceBatcher, SequenceItem, SequenceRegressor,
};

/// The seed of the training items (validation items use the next one).
const DATA_SEED: u64 = 42;
/// The seed of the loaders' shuffling.
const SHUFFLE_SEED: u64 = 5;
/// The seed of the initial weights (drawn on Flex and copied to every backend).
const WEIGHTS_SEED: u64 = 7;
/// Adam's learning rate.
const LEARNING_RATE: f64 = 1e-3;

/// A task of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// Burn's LSTM predicting the next value of a sequence.
    Recurrent,
    /// The network of Burn's `modern-lstm` example as it writes it: bidirectional stacked
    /// layer-normalised cells step by step, dropout, Adam with gradients clipped to norm 1.
    ModernLstm,
    /// A small CNN classifying generated images (Burn's MNIST example).
    Cnn,
}

/// How a task's training loop is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainingLoop {
    /// burn-train's `Learner` with `SupervisedTraining` and its metrics thread.
    #[default]
    Learner,
    /// The loop Burn's examples write by hand (`modern-lstm`'s `training.rs`, the
    /// `custom-training-loop` example): each batch's loss read with `into_scalar` before
    /// `backward`, the optimizer stepped by hand, then a validation pass on `model.valid()`
    /// reading every loss.
    Written,
}

/// Arguments of `hlat bench learner`.
#[derive(Args, Clone)]
pub struct LearnerBenchArgs {
    /// Backends to compare, comma-separated: host, xla, ndarray, flex, remote-flex (Flex behind
    /// the route the Trainium devices are reached by).
    #[arg(long, default_value = "host,xla,flex")]
    pub backends: String,
    /// The backend the warm times are compared with.
    #[arg(long, default_value = "host")]
    pub baseline: String,
    /// Tasks to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "modern-lstm,recurrent,cnn"
    )]
    pub tasks: Vec<Task>,
    /// Training loops to run each task with, comma-separated: learner (burn-train's), written
    /// (by hand, as Burn's examples write it).
    #[arg(long, value_delimiter = ',', default_value = "learner,written")]
    pub loops: Vec<TrainingLoop>,
    /// Epochs of each run (each ends with a validation pass).
    #[arg(long, default_value_t = 2, value_parser = at_least_one::<usize>())]
    pub epochs: usize,
    /// Items per batch.
    #[arg(long, default_value_t = 32, value_parser = at_least_one::<usize>())]
    pub batch: usize,
    /// Training items (the last batch of an epoch holds the remainder, as in Burn's examples).
    #[arg(long, default_value_t = 1000, value_parser = at_least_one::<usize>())]
    pub train_items: usize,
    /// Validation items.
    #[arg(long, default_value_t = 200, value_parser = at_least_one::<usize>())]
    pub valid_items: usize,
    /// Threads making batches (0: the training thread makes them, Burn's default; more threads
    /// deliver batches in an order that varies from run to run, so losses do too).
    #[arg(long, default_value_t = 0)]
    pub loader_workers: usize,
    /// Where to write the JSON results: a file there is replaced, a path inside another
    /// command's output folder (a training run, a model) refused.
    #[arg(long, default_value = "bench-learner.json")]
    pub json: PathBuf,
    /// Internal: run one task on one backend in this process and print the result.
    #[arg(long, hide = true)]
    pub worker: bool,
}

/// What one run of a task measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LearnerTiming {
    /// Seconds of the whole training (every epoch, its validation included).
    pub seconds: f64,
    /// Training batches of the run.
    pub train_iterations: u64,
    /// Validation batches of the run.
    pub valid_iterations: u64,
    /// Segments the Trainium backend ran (captured operations handed to the executor together).
    pub segments: u64,
    /// Segments recognised as a repeat of one seen before (prepared without lowering).
    pub segments_reused: u64,
    /// Seconds spent preparing segments (fingerprints, lowering, cache look-ups).
    pub prepare_seconds: f64,
    /// Operations captured.
    pub operations: u64,
    /// Programs compiled.
    pub compiles: u64,
    /// Programs loaded compiled from the persistent cache.
    pub programs_loaded: u64,
    /// Seconds spent compiling.
    pub compile_seconds: f64,
    /// Bytes copied to the device.
    pub bytes_to_device: u64,
    /// Bytes copied from the device.
    pub bytes_to_host: u64,
    /// Operations that ran on the host instead of the device.
    pub host_fallbacks: u64,
    /// Operations that only moved host data before its upload (a batcher's stacking).
    pub host_folded: u64,
    /// The loss of every item, as Burn's `LossMetric` reported it (the `learner` loop) or as
    /// the loop read it (the `written` loop).
    pub loss: MetricValues,
}

impl LearnerTiming {
    /// Batches of the run, training and validation.
    pub fn iterations(&self) -> u64 {
        self.train_iterations + self.valid_iterations
    }
}

/// One task on one backend: the cold run and the warm run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LearnerResult {
    /// The task.
    pub task: Task,
    /// How its training loop is written.
    #[serde(default)]
    pub training_loop: TrainingLoop,
    /// The backend.
    pub backend: String,
    /// What the backend is.
    pub version: String,
    /// The first run, with an empty compile cache.
    pub cold: LearnerTiming,
    /// The second run, with the programs of the first in the cache (the first again for a
    /// backend that keeps nothing between runs).
    pub warm: LearnerTiming,
    /// Peak resident memory of the warm run, bytes.
    pub peak_rss_bytes: u64,
}

/// A full `hlat bench learner` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LearnerReport {
    /// The command line that produced the report.
    pub command: String,
    /// Epochs per run.
    pub epochs: usize,
    /// Items per batch.
    pub batch: usize,
    /// The baseline of the ratios.
    pub baseline: String,
    /// One entry per task and backend that ran.
    pub results: Vec<LearnerResult>,
    /// Tasks and backends that could not run, with the reason.
    pub failures: Vec<(String, String)>,
    /// A description of the machine.
    pub machine: String,
    /// How this `hlat` binary was built.
    pub build: String,
}

/// Runs `hlat bench learner`.
pub fn run(args: LearnerBenchArgs) -> anyhow::Result<()> {
    if args.worker {
        let backend = worker_backend(&args.backends)?;
        return emit_result(&measure_on(backend, &args)?);
    }
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for (&task, &training_loop) in args.tasks.iter().flat_map(|task| {
        args.loops
            .iter()
            .map(move |training_loop| (task, training_loop))
    }) {
        let task_name = task_name(task);
        let loop_name = value_name(training_loop);
        let cache = tempfile::tempdir().context("creating a compile cache folder")?;
        let overrides = [
            ("--tasks", task_name.clone()),
            ("--loops", loop_name.clone()),
        ];
        let environment = [(burn_trainium::XLA_CACHE_ENV, cache.path())];
        let what = match training_loop {
            TrainingLoop::Learner => format!("the {task_name} task"),
            TrainingLoop::Written => format!("the {task_name} task's written loop"),
        };
        let (cold, cold_failures) = backends::measure_each_with::<LoopMeasurement<LearnerTiming>>(
            &args.backends,
            &overrides,
            &environment,
            &format!("{what}, cold,"),
        )?;
        // Only `xla` keeps compiled programs between runs: the other backends' second run
        // would repeat the first.
        let (warm, warm_failures) = match cached_backends(&args.backends)? {
            Some(cached) => backends::measure_each_with::<LoopMeasurement<LearnerTiming>>(
                &cached,
                &overrides,
                &environment,
                &format!("{what}, warm,"),
            )?,
            None => (Vec::new(), Vec::new()),
        };
        for failure in cold_failures.into_iter().chain(warm_failures) {
            failures.push((
                format!("{task_name} ({loop_name} loop) on {}", failure.0),
                failure.1,
            ));
        }
        for cold in cold {
            let warm = warm.iter().find(|warm| warm.backend == cold.backend);
            let failed = warm.is_none() && cached_backend(&cold.backend);
            if failed {
                continue;
            }
            let warm = warm.unwrap_or(&cold);
            results.push(LearnerResult {
                task,
                training_loop,
                backend: cold.backend.clone(),
                version: cold.version.clone(),
                cold: cold.timing.clone(),
                warm: warm.timing.clone(),
                peak_rss_bytes: warm.peak_rss_bytes,
            });
        }
    }
    let report = LearnerReport {
        command: report::command_line(),
        epochs: args.epochs,
        batch: args.batch,
        baseline: args.baseline.clone(),
        results,
        failures,
        machine: report::machine_description(),
        build: report::build_description(),
    };
    report::publish(&table(&report), &report, &args.json)
}

/// Whether `backend` keeps compiled programs between runs (in its persistent compile cache).
fn cached_backend(backend: &str) -> bool {
    backend == BackendName::TrainiumXla.name()
}

/// The backends of `list` that keep compiled programs between runs, comma-separated, if any.
fn cached_backends(list: &str) -> anyhow::Result<Option<String>> {
    let cached: Vec<&str> = backends::parse_backends(list)?
        .into_iter()
        .map(BackendName::name)
        .filter(|name| cached_backend(name))
        .collect();
    Ok((!cached.is_empty()).then(|| cached.join(",")))
}

/// The name of `task` on the command line (its `ValueEnum` name).
fn task_name(task: Task) -> String {
    value_name(task)
}

/// The name of `value` on the command line.
fn value_name(value: impl ValueEnum) -> String {
    value
        .to_possible_value()
        .expect("every variant is a value of its flag")
        .get_name()
        .to_string()
}

/// The Markdown table of a report: one row per task and backend.
pub fn table(report: &LearnerReport) -> String {
    use std::fmt::Write;
    let mut table = String::from(
        "| task | loop | backend | cold s | compiles cold | warm s | warm vs baseline | segments/iteration | KiB to device/iteration | host fallbacks | last train loss | last valid loss |\n\
         | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for result in &report.results {
        let baseline = report
            .results
            .iter()
            .find(|other| {
                other.task == result.task
                    && other.training_loop == result.training_loop
                    && other.backend == report.baseline
            })
            .map(|other| other.warm.seconds);
        let ratio = baseline.map_or_else(
            || "n/a".to_string(),
            |base| format!("{:.2}×", base / result.warm.seconds),
        );
        let warm = &result.warm;
        let iterations = warm.iterations().max(1) as f64;
        let last = |values: &[f64]| values.last().copied().unwrap_or(f64::NAN);
        let _ = writeln!(
            table,
            "| {} | {} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {:.1} | {} | {:.6} | {:.6} |",
            task_name(result.task),
            value_name(result.training_loop),
            result.backend,
            result.cold.seconds,
            result.cold.compiles,
            warm.seconds,
            ratio,
            warm.segments as f64 / iterations,
            warm.bytes_to_device as f64 / iterations / 1024.0,
            warm.host_fallbacks,
            last(&warm.loss.train),
            last(&warm.loss.valid),
        );
    }
    for (what, why) in &report.failures {
        let _ = writeln!(table, "| {what} | failed: {} |", why.replace('\n', " "));
    }
    table
}

impl LoopBenchmark for LearnerBenchArgs {
    type Timing = LearnerTiming;

    fn on_default_device(&self) -> bool {
        self.loops == [TrainingLoop::Written]
    }

    fn time(&self, device: &BenchDevice) -> anyhow::Result<LearnerTiming> {
        let ([task], [training_loop]) = (&self.tasks[..], &self.loops[..]) else {
            anyhow::bail!("a worker runs exactly one task with one loop");
        };
        let reference = reference_device(WEIGHTS_SEED, &device.device);
        match task {
            Task::Recurrent => self.run_loop(
                *training_loop,
                (
                    same_weights(SequenceRegressor::new(&reference), &device.device),
                    AdamConfig::new(),
                ),
                SequenceBatcher,
                self.sequences(),
                device,
                loss_metrics,
            ),
            Task::ModernLstm => self.run_loop(
                *training_loop,
                (
                    same_weights(ModernLstm::new(&reference), &device.device),
                    modern_lstm::optimizer(),
                ),
                SequenceBatcher,
                self.sequences(),
                device,
                loss_metrics,
            ),
            Task::Cnn => {
                let model = same_weights(ImageClassifier::new(&reference), &device.device);
                let datasets = (
                    tasks::images(self.train_items, DATA_SEED),
                    tasks::images(self.valid_items, DATA_SEED + 1),
                );
                self.run_loop(
                    *training_loop,
                    (model, AdamConfig::new()),
                    ImageBatcher,
                    datasets,
                    device,
                    |training| {
                        loss_metrics(training)
                            .metric_train_numeric(AccuracyMetric::new())
                            .metric_valid_numeric(AccuracyMetric::new())
                    },
                )
            }
        }
    }
}

/// A batcher of a task's training and validation batches from items `I`, for a model `M`.
trait TaskBatcher<I, M: LearnerModel>:
    Batcher<I, <M as TrainStep>::Input> + Batcher<I, <M as InferenceStep>::Input> + Clone + 'static
{
}

impl<I, M: LearnerModel, T> TaskBatcher<I, M> for T where
    T: Batcher<I, <M as TrainStep>::Input>
        + Batcher<I, <M as InferenceStep>::Input>
        + Clone
        + 'static
{
}

/// Burn's loss metric on training and validation batches.
fn loss_metrics<M: LearnerModel>(training: SupervisedTraining<M>) -> SupervisedTraining<M>
where
    <M as TrainStep>::Output: Adaptor<LossInput>,
    <M as InferenceStep>::Output: Adaptor<LossInput>,
{
    training
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
}

impl LearnerBenchArgs {
    /// The training and validation sequences of the recurrent tasks.
    fn sequences(&self) -> (InMemDataset<SequenceItem>, InMemDataset<SequenceItem>) {
        (
            tasks::sequences(self.train_items, DATA_SEED),
            tasks::sequences(self.valid_items, DATA_SEED + 1),
        )
    }

    /// A run's timing before it starts: the batches of `train_items` and `valid_items` items
    /// over every epoch.
    fn timing_of(&self, train_items: usize, valid_items: usize) -> LearnerTiming {
        let iterations = |items: usize| items.div_ceil(self.batch) as u64 * self.epochs as u64;
        LearnerTiming {
            train_iterations: iterations(train_items),
            valid_iterations: iterations(valid_items),
            ..LearnerTiming::default()
        }
    }

    /// Trains `model` with `training_loop` and Adam configured as `optimizer`:
    /// [`Self::train`] with the metrics `metrics` registers, or [`Self::train_written`].
    fn run_loop<M, I, Bt>(
        &self,
        training_loop: TrainingLoop,
        (model, optimizer): (M, AdamConfig),
        batcher: Bt,
        datasets: (impl Dataset<I> + 'static, impl Dataset<I> + 'static),
        device: &BenchDevice,
        metrics: impl FnOnce(SupervisedTraining<M>) -> SupervisedTraining<M>,
    ) -> anyhow::Result<LearnerTiming>
    where
        M: LearnerModel + BatchLoss<<M as TrainStep>::Input>,
        <M as TrainStep>::Input: Clone + std::fmt::Debug,
        <M as InferenceStep>::Input: Clone + std::fmt::Debug,
        I: Send + Sync + Clone + std::fmt::Debug + 'static,
        Bt: TaskBatcher<I, M>,
    {
        match training_loop {
            TrainingLoop::Learner => {
                self.train((model, optimizer), batcher, datasets, device, metrics)
            }
            TrainingLoop::Written => {
                self.train_written((model, optimizer), batcher, datasets, device)
            }
        }
    }

    /// Trains `model` on the `(training, validation)` datasets through burn-train's `Learner`
    /// with Adam configured as `optimizer`, with the metrics `metrics` registers, and measures
    /// the run. Training batches are made on `device` (with autodiff), validation batches on it
    /// without autodiff.
    fn train<M, I, Bt>(
        &self,
        (model, optimizer): (M, AdamConfig),
        batcher: Bt,
        (train_items, valid_items): (impl Dataset<I> + 'static, impl Dataset<I> + 'static),
        device: &BenchDevice,
        metrics: impl FnOnce(SupervisedTraining<M>) -> SupervisedTraining<M>,
    ) -> anyhow::Result<LearnerTiming>
    where
        M: LearnerModel,
        <M as TrainStep>::Input: Clone + std::fmt::Debug,
        <M as InferenceStep>::Input: Clone + std::fmt::Debug,
        I: Send + Sync + Clone + std::fmt::Debug + 'static,
        Bt: TaskBatcher<I, M>,
    {
        let mut timing = self.timing_of(train_items.len(), valid_items.len());
        let train = self.loader::<_, <M as TrainStep>::Input>(
            batcher.clone(),
            train_items,
            Some(device.device.clone()),
        );
        let valid = self.loader::<_, <M as InferenceStep>::Input>(
            batcher,
            valid_items,
            Some(device.device.clone().inner()),
        );
        let folder = tempfile::tempdir().context("creating the run's folder")?;
        let (recorder, recorded) = MetricRecorder::new();
        let training = metrics(SupervisedTraining::new(folder.path(), train, valid))
            .with_application_logger(None)
            .num_epochs(self.epochs)
            .renderer(Box::new(recorder));
        let learner = Learner::new(model, optimizer.init(), LEARNING_RATE);
        measured(device, &mut timing, || {
            let result = training.launch(learner);
            // Every update has run once the trained weights are read.
            drop(result.model.into_record());
            Ok(())
        })?;
        timing.loss = recorded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(LOSS_METRIC)
            .unwrap_or_default();
        Ok(timing)
    }

    /// Trains `model` as Burn's examples write the loop by hand (modern-lstm's `training.rs`):
    /// each batch's loss read with `into_scalar` before `backward`, Adam stepped by hand, and a
    /// validation pass on `model.valid()` every epoch reading each loss. As in modern-lstm, the
    /// validation loader is given no device: its batches land on Burn's default device, which
    /// the benchmark made its device ([`BenchDevice::process_default`]); NdArray and
    /// `remote-flex`, which cannot be the default in process, give it their device.
    fn train_written<M, I, B>(
        &self,
        (mut model, optimizer): (M, AdamConfig),
        batcher: impl Batcher<I, B> + Clone + 'static,
        (train_items, valid_items): (impl Dataset<I> + 'static, impl Dataset<I> + 'static),
        device: &BenchDevice,
    ) -> anyhow::Result<LearnerTiming>
    where
        M: Module + BatchLoss<B>,
        I: Send + Sync + Clone + std::fmt::Debug + 'static,
        B: Send + Clone + std::fmt::Debug + 'static,
    {
        let mut timing = self.timing_of(train_items.len(), valid_items.len());
        let train = self.loader(batcher.clone(), train_items, Some(device.device.clone()));
        let valid_device = device.device.clone().inner();
        let valid_device = (valid_device != Device::default()).then_some(valid_device);
        let valid = self.loader(batcher, valid_items, valid_device);
        let mut optimizer = optimizer.init();
        let mut losses = MetricValues::default();
        measured(device, &mut timing, || {
            for _ in 0..self.epochs {
                for batch in train.iter() {
                    let batch = batch.map_err(|error| anyhow::anyhow!("a batch: {error:?}"))?;
                    let loss = model.batch_loss(batch);
                    losses.train.push(loss.clone().into_scalar::<f32>() as f64);
                    let gradients = GradientsParams::from_grads(loss.backward(), &model);
                    model = optimizer.step(LEARNING_RATE, model.clone(), gradients);
                }
                let valid_model = model.valid();
                for batch in valid.iter() {
                    let batch = batch.map_err(|error| anyhow::anyhow!("a batch: {error:?}"))?;
                    let loss = valid_model.batch_loss(batch);
                    losses.valid.push(loss.into_scalar::<f32>() as f64);
                }
            }
            drop(model.clone().into_record());
            Ok(())
        })?;
        timing.loss = losses;
        Ok(timing)
    }

    /// A loader of `items` in batches, shuffled, its batches made on `device` (Burn's default
    /// device when `None`).
    fn loader<I, O>(
        &self,
        batcher: impl Batcher<I, O> + 'static,
        items: impl Dataset<I> + 'static,
        device: Option<Device>,
    ) -> Arc<dyn DataLoader<O>>
    where
        I: Send + Sync + Clone + std::fmt::Debug + 'static,
        O: Send + Clone + std::fmt::Debug + 'static,
    {
        let builder = DataLoaderBuilder::new(batcher)
            .batch_size(self.batch)
            .shuffle(SHUFFLE_SEED);
        let builder = match device {
            Some(device) => builder.set_device(device),
            None => builder,
        };
        let builder = if self.loader_workers > 0 {
            builder.num_workers(self.loader_workers)
        } else {
            builder
        };
        builder.build(items)
    }
}

/// The name Burn's `LossMetric` registers under.
const LOSS_METRIC: &str = "Loss";

/// Runs `run` on `device` between syncs and fills `timing` with its seconds and what the
/// device's statistics counted meanwhile.
fn measured(
    device: &BenchDevice,
    timing: &mut LearnerTiming,
    run: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    device.sync()?;
    let start = device.stats();
    let clock = Instant::now();
    run()?;
    device.sync()?;
    timing.seconds = clock.elapsed().as_secs_f64();
    let end = device.stats();
    timing.segments = end.segments_run - start.segments_run;
    timing.segments_reused = end.segments_reused - start.segments_reused;
    timing.prepare_seconds = end.prepare_seconds - start.prepare_seconds;
    timing.operations = end.operations_captured - start.operations_captured;
    timing.compiles = end.compiles - start.compiles;
    timing.programs_loaded = end.programs_loaded - start.programs_loaded;
    timing.compile_seconds = end.compile_seconds - start.compile_seconds;
    timing.bytes_to_device = end.bytes_to_device - start.bytes_to_device;
    timing.bytes_to_host = end.bytes_to_host - start.bytes_to_host;
    timing.host_fallbacks = end.host_fallbacks - start.host_fallbacks;
    timing.host_folded = end.host_folded - start.host_folded;
    device.report_host_fallbacks();
    Ok(())
}
