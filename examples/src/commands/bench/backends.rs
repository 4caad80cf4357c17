//! The backends a benchmark can compare, and running one measurement in a child process.

use std::fmt;
use std::path::Path;
use std::process::Command;
use std::str::FromStr;

use anyhow::{Context, bail};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Bool, Device, Int, Tensor};
use burn_trainium::TrainiumDevice;
use serde::de::DeserializeOwned;

/// What `hlat bench train` and `hlat bench generate` compare: one model on several backends.
#[derive(clap::Args, Clone, Debug)]
pub struct Comparison {
    /// Model preset (or a config JSON file).
    #[arg(long, default_value = "bench-tiny")]
    pub preset: String,
    /// Backends to compare, comma-separated: host, xla, ndarray, flex.
    #[arg(long, default_value = "host,xla,ndarray,flex")]
    pub backends: String,
    /// The backend the ratios are computed against.
    #[arg(long, default_value = "ndarray")]
    pub baseline: String,
}

/// A backend (and executor) that `hlat bench` can measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendName {
    /// `Trainium` on the `host` executor.
    TrainiumHost,
    /// `Trainium` on the `xla` executor (plugin from `TRAINIUM_PJRT_PLUGIN`).
    TrainiumXla,
    /// Burn's `NdArray` backend.
    NdArray,
    /// Burn's `Flex` backend.
    Flex,
    /// Burn's `Flex` backend behind Burn's remote route, served in this process as the Trainium
    /// devices are: the route's own cost, beside `host`'s.
    RemoteFlex,
}

impl BackendName {
    /// Every backend, in table order.
    pub const ALL: [BackendName; 5] = [
        BackendName::TrainiumHost,
        BackendName::TrainiumXla,
        BackendName::NdArray,
        BackendName::Flex,
        BackendName::RemoteFlex,
    ];

    /// What the backend is, for reports.
    pub fn description(self) -> &'static str {
        match self {
            BackendName::TrainiumHost => {
                "burn 0.22 Trainium, host executor (burn-flex), served in process"
            }
            BackendName::TrainiumXla => {
                "burn 0.22 Trainium, xla executor (TRAINIUM_PJRT_PLUGIN), served in process"
            }
            BackendName::NdArray => {
                "burn-ndarray 0.22 (deprecated; default features: simd, multi-threads)"
            }
            BackendName::Flex => "burn-flex 0.22 (default features)",
            BackendName::RemoteFlex => {
                "burn-flex 0.22 behind Burn's remote route, served in process"
            }
        }
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BackendName::TrainiumHost => "host",
            BackendName::TrainiumXla => "xla",
            BackendName::NdArray => "ndarray",
            BackendName::Flex => "flex",
            BackendName::RemoteFlex => "remote-flex",
        }
    }
}

impl BackendName {
    /// The device this backend measures on, standing for `replicas` replicas (only Trainium's
    /// devices stand for more than one): a Trainium device is served in this process, its
    /// executor opened (the `xla` plugin found) first.
    pub fn device(self, replicas: u16) -> anyhow::Result<BenchDevice> {
        let single = |name: &str| {
            anyhow::ensure!(
                replicas == 1,
                "{replicas} replicas: {name} is a single device (use host or xla)"
            );
            Ok(())
        };
        match self {
            BackendName::TrainiumHost => {
                BenchDevice::trainium(TrainiumDevice::HOST.with_replicas(replicas))
            }
            BackendName::TrainiumXla => {
                BenchDevice::trainium(xla_device()?.with_replicas(replicas))
            }
            BackendName::NdArray => {
                single("ndarray")?;
                #[allow(deprecated)]
                let device = Device::ndarray();
                Ok(BenchDevice {
                    device,
                    trainium: None,
                })
            }
            BackendName::Flex => {
                single("flex")?;
                Ok(BenchDevice {
                    device: Device::flex(),
                    trainium: None,
                })
            }
            BackendName::RemoteFlex => {
                single("remote-flex")?;
                Ok(BenchDevice {
                    device: burn_trainium::flex_device().context("serving Flex in process")?,
                    trainium: None,
                })
            }
        }
    }
}

/// The device a benchmark measures on: the Burn device, and the Trainium device whose
/// statistics (compiles, segments, host fallbacks) it reports, when it is one.
#[derive(Clone)]
pub struct BenchDevice {
    /// Where the benchmark's tensors live.
    pub device: Device,
    /// The Trainium device serving `device`, if any.
    pub trainium: Option<TrainiumDevice>,
}

impl BenchDevice {
    /// `trainium`, checked and served in this process.
    pub fn trainium(trainium: TrainiumDevice) -> anyhow::Result<Self> {
        Self::served_by(trainium, crate::commands::served)
    }

    /// `backend`'s device as Burn's default device of this process (`Device::default()`):
    /// a Trainium device made the default ([`burn_trainium::set_default_device`]), Flex as it
    /// is. NdArray and Flex behind the route cannot be made the default in process: their
    /// devices are not the default.
    pub fn process_default(backend: BackendName) -> anyhow::Result<Self> {
        let trainium = match backend {
            BackendName::TrainiumHost => TrainiumDevice::HOST,
            BackendName::TrainiumXla => xla_device()?,
            BackendName::Flex | BackendName::NdArray | BackendName::RemoteFlex => {
                return backend.device(1);
            }
        };
        Self::served_by(trainium, |trainium| {
            burn_trainium::set_default_device(&trainium.to_string())
                .with_context(|| format!("making {trainium} Burn's default device"))
        })
    }

    /// `trainium`, checked, and the Burn device `serve` makes of it.
    fn served_by(
        trainium: TrainiumDevice,
        serve: impl FnOnce(&TrainiumDevice) -> anyhow::Result<Device>,
    ) -> anyhow::Result<Self> {
        burn_trainium::check_device(&trainium).with_context(|| format!("device {trainium}"))?;
        Ok(Self {
            device: serve(&trainium)?,
            trainium: Some(trainium),
        })
    }

    /// Trainium statistics, for counters other backends lack (zeros elsewhere).
    pub fn stats(&self) -> burn_trainium::Stats {
        self.trainium
            .as_ref()
            .map(burn_trainium::stats)
            .unwrap_or_default()
    }

    /// Waits until the device has run everything queued on it.
    pub fn sync(&self) -> anyhow::Result<()> {
        self.device.sync().context("synchronising the device")
    }

    /// Says on stderr which operations ran on the host, by kind, when any did.
    pub fn report_host_fallbacks(&self) {
        if let Some(trainium) = &self.trainium
            && let Some(report) = burn_trainium::host_fallback_report(trainium)
        {
            eprintln!("{trainium}: {report}");
        }
    }
}

impl fmt::Display for BackendName {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl FromStr for BackendName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|backend| backend.name() == text)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|backend| backend.name()).collect();
                format!(
                    "unknown backend `{text}` (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// The marker line a worker prints before its JSON result, so that logs cannot be mistaken for it.
const RESULT_MARKER: &str = "HLAT-BENCH-RESULT ";

/// Prints a worker's result for the parent process.
pub fn emit_result<T: serde::Serialize>(result: &T) -> anyhow::Result<()> {
    println!("{RESULT_MARKER}{}", serde_json::to_string(result)?);
    Ok(())
}

/// Runs this executable again with `arguments` plus `--worker`, and parses the result it emits.
pub fn run_worker<T: DeserializeOwned>(arguments: &[String], what: &str) -> anyhow::Result<T> {
    run_worker_with(arguments, &[], what)
}

/// [`run_worker`] with the environment variables of `environment` set in the worker.
pub fn run_worker_with<T: DeserializeOwned>(
    arguments: &[String],
    environment: &[(&str, &Path)],
    what: &str,
) -> anyhow::Result<T> {
    let executable = std::env::current_exe().context("locating the hlat executable")?;
    // A worker records its profile into a folder of its own (`worker_flag`), never into the
    // one given to this process.
    let mut arguments = arguments.to_vec();
    remove_flag(&mut arguments, "--profile");
    let output = Command::new(&executable)
        .args(&arguments)
        .envs(environment.iter().copied())
        .arg("--worker")
        .args(crate::commands::profile::worker_flag(what))
        .output()
        .with_context(|| format!("starting {} for {what}", executable.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "{what} failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix(RESULT_MARKER))
        .with_context(|| format!("{what} printed no result"))?;
    serde_json::from_str(line).with_context(|| format!("parsing the result of {what}"))
}

/// The peak resident memory of this process so far, in bytes (Linux `VmHWM`).
pub fn peak_resident_bytes() -> Option<u64> {
    process_status_bytes("VmHWM:")
}

/// Starts the process's peak resident memory (`VmHWM`) again from its present size, so that a
/// later [`peak_resident_bytes`] covers only what follows (Linux `clear_refs`).
pub fn reset_peak_resident() -> std::io::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5")
}

/// The resident memory of this process now, in bytes (Linux `VmRSS`).
pub fn resident_bytes() -> Option<u64> {
    process_status_bytes("VmRSS:")
}

/// A size field of `/proc/self/status` (given in kB there), in bytes.
fn process_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kilobytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kilobytes * 1024)
}

/// Median of a non-empty list of seconds.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let middle = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    } else {
        sorted[middle]
    }
}

/// Parses a comma-separated list of backends.
pub fn parse_backends(text: &str) -> anyhow::Result<Vec<BackendName>> {
    text.split(',')
        .map(|name| {
            name.trim()
                .parse::<BackendName>()
                .map_err(anyhow::Error::msg)
        })
        .collect()
}

/// Backends that could not be measured, each with the reason.
pub type Failures = Vec<(String, String)>;

/// The one backend a worker process measures (its `--backends` value).
pub fn worker_backend(text: &str) -> anyhow::Result<BackendName> {
    match parse_backends(text)?[..] {
        [backend] => Ok(backend),
        _ => bail!("a worker measures exactly one backend, got `{text}`"),
    }
}

/// Measures each backend of `backends` in a worker process: this command line again with
/// `--backends` set to that backend and the flags of `overrides` set to their values. Returns
/// the results, and the backends that failed with why.
pub fn measure_each<T: DeserializeOwned>(
    backends: &str,
    overrides: &[(&str, String)],
    what: &str,
) -> anyhow::Result<(Vec<T>, Failures)> {
    measure_each_with(backends, overrides, &[], what)
}

/// [`measure_each`] with the environment variables of `environment` set in every worker.
pub fn measure_each_with<T: DeserializeOwned>(
    backends: &str,
    overrides: &[(&str, String)],
    environment: &[(&str, &Path)],
    what: &str,
) -> anyhow::Result<(Vec<T>, Failures)> {
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for backend in parse_backends(backends)? {
        let mut arguments: Vec<String> = std::env::args().skip(1).collect();
        replace_flag(&mut arguments, "--backends", backend.name());
        for (flag, value) in overrides {
            replace_flag(&mut arguments, flag, value);
        }
        eprintln!("measuring {what} on {backend}...");
        let worker = format!("{} on {backend}", what.trim_end_matches(','));
        match run_worker_with::<T>(&arguments, environment, &worker) {
            Ok(measurement) => results.push(measurement),
            Err(error) => {
                eprintln!("{backend}: {error:#}");
                failures.push((backend.name().to_string(), format!("{error:#}")));
            }
        }
    }
    Ok((results, failures))
}

/// Replaces (or appends) `--flag value` in an argument list.
fn replace_flag(arguments: &mut Vec<String>, flag: &str, value: &str) {
    remove_flag(arguments, flag);
    arguments.extend([flag.to_string(), value.to_string()]);
}

/// Removes every `--flag value` and `--flag=value` from an argument list.
fn remove_flag(arguments: &mut Vec<String>, flag: &str) {
    let prefix = format!("{flag}=");
    let mut kept = Vec::with_capacity(arguments.len());
    let mut given = std::mem::take(arguments).into_iter();
    while let Some(argument) = given.next() {
        if argument == flag {
            given.next();
        } else if !argument.starts_with(&prefix) {
            kept.push(argument);
        }
    }
    *arguments = kept;
}

/// The `xla` device a benchmark measures, its executor opened (the plugin found) first.
pub fn xla_device() -> anyhow::Result<TrainiumDevice> {
    let device = TrainiumDevice::xla(0);
    burn_trainium::check_device(&device)?;
    Ok(device)
}

/// `reference` moved to `device` (a parameter that requires a gradient still does, a leaf of
/// `device`'s autodiff graph): every backend then measures the same model, drawn once on
/// [`reference_device`] from a fixed seed (`xla` draws random numbers on the device, so its own
/// initialisation differs).
pub fn same_weights<M: Module>(reference: M, device: &Device) -> M {
    // Burn initialises parameters lazily, and one not initialised yet would be drawn on the
    // device it moves to: draw every one on the reference device first.
    reference.visit(&mut Initialise);
    reference.fork(device)
}

/// Initialises every parameter it visits (`Param::val` draws a lazy one).
struct Initialise;

impl ModuleVisitor for Initialise {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        drop(param.val());
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        drop(param.val());
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        drop(param.val());
    }
}

/// The device the reference weights of [`same_weights`] are drawn on for `target`: Flex,
/// seeded with `seed`, with autodiff when `target` has it (a module keeps its parameters'
/// autodiff context when it moves).
pub fn reference_device(seed: u64, target: &Device) -> Device {
    let device = if target.is_autodiff() {
        Device::flex().autodiff()
    } else {
        Device::flex()
    };
    device.seed(seed);
    device
}
