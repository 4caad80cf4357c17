//! `hlat bench route`: what Burn 0.22's remote route costs, side by side in one run. A Burn
//! program reaches the Trainium executors as a remote device (a loopback WebSocket to a
//! `BackendServer` in the process); this measures a chain of small operations and a series of
//! reads on Flex directly, on Flex behind the same route (`remote-flex`, the route's own cost),
//! and on the Trainium devices (`host`, `xla`: the route plus capture and execution).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use burn::tensor::{Device, Tensor, TensorData};
use clap::Args;
use serde::{Deserialize, Serialize};

use super::backends::median;
use super::report;

/// Arguments of `hlat bench route`.
#[derive(Args, Clone)]
pub struct RouteBenchArgs {
    /// Devices to compare, comma-separated: flex, remote-flex, host, xla.
    #[arg(long, default_value = "flex,remote-flex,host,xla")]
    pub devices: String,
    /// Operations in the measured chain (elementwise, on 16 elements), read once at its end.
    #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u64).range(2..))]
    pub operations: u64,
    /// Reads measured (each of a tensor made by one new operation).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub reads: u64,
    /// Timed repetitions of each measurement (after two untimed ones), of which the median is
    /// reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub repeats: u64,
    /// Where to write the JSON results: a file there is replaced, a path inside another
    /// command's output folder (a training run, a model) refused.
    #[arg(long, default_value = "bench-route.json")]
    pub json: PathBuf,
}

/// What one device measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouteMeasurement {
    /// The device: `flex`, `remote-flex`, `host` or `xla`.
    pub device: String,
    /// Median microseconds per operation of the chain (its one read included).
    pub micros_per_operation: f64,
    /// Median microseconds per read (the one operation making the tensor included).
    pub micros_per_read: f64,
    /// `micros_per_operation` less Flex's, when Flex was measured.
    pub operation_overhead_micros: Option<f64>,
    /// `micros_per_read` less Flex's, when Flex was measured.
    pub read_overhead_micros: Option<f64>,
}

/// A full `hlat bench route` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouteReport {
    /// The command line that produced the report.
    pub command: String,
    /// The machine.
    pub machine: String,
    /// Operations in the chain.
    pub operations: u64,
    /// Reads measured.
    pub reads: u64,
    /// One entry per device, in the order asked.
    pub devices: Vec<RouteMeasurement>,
    /// Operations Burn's remote clients of this process send in one message (its
    /// `[remote] flush_threshold`, which in-process devices raise unless a `burn.toml` sets it).
    pub remote_flush_threshold: usize,
}

/// The devices `hlat bench route` knows, by name.
fn open_device(name: &str) -> anyhow::Result<Device> {
    let device = match name {
        "flex" => Device::flex(),
        "remote-flex" => burn_trainium::flex_device()?,
        "host" => burn_trainium::device("host")?,
        "xla" => burn_trainium::device("xla:0")?,
        other => anyhow::bail!(
            "--devices: unknown device `{other}` (known: flex, remote-flex, host, xla)"
        ),
    };
    Ok(device)
}

/// The median seconds of `repeats` runs of `measure` (after two untimed ones, where programs
/// compile).
fn median_seconds(
    repeats: u64,
    mut measure: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let mut samples = Vec::new();
    for run in 0..2 + repeats {
        let start = Instant::now();
        measure()?;
        if run >= 2 {
            samples.push(start.elapsed().as_secs_f64());
        }
    }
    Ok(median(&samples))
}

/// A chain of `operations` elementwise operations on `device`, read at its end.
fn chain(device: &Device, operations: u64) -> anyhow::Result<()> {
    let mut value = Tensor::<1>::from_data(TensorData::new(vec![1.0f32; 16], [16]), device);
    for _ in 0..operations / 2 {
        value = value * 0.5 + 1.0;
    }
    value
        .into_data()
        .try_to_vec::<f32>()
        .map_err(|error| anyhow::anyhow!("{error:?}"))?;
    Ok(())
}

/// `reads` reads on `device`, each of a tensor one new operation makes.
fn reads(device: &Device, reads: u64) -> anyhow::Result<()> {
    let base = Tensor::<1>::from_data(TensorData::new(vec![1.0f32; 16], [16]), device);
    for _ in 0..reads {
        (base.clone() * 2.0)
            .into_data()
            .try_to_vec::<f32>()
            .map_err(|error| anyhow::anyhow!("{error:?}"))?;
    }
    Ok(())
}

/// Measures one device.
fn measure(name: &str, args: &RouteBenchArgs) -> anyhow::Result<RouteMeasurement> {
    let device = open_device(name)?;
    let operations = args.operations / 2 * 2;
    let chain_seconds = median_seconds(args.repeats, || chain(&device, operations))
        .with_context(|| format!("the chain on {name}"))?;
    let read_seconds = median_seconds(args.repeats, || reads(&device, args.reads))
        .with_context(|| format!("the reads on {name}"))?;
    Ok(RouteMeasurement {
        device: name.to_string(),
        micros_per_operation: chain_seconds * 1e6 / operations as f64,
        micros_per_read: read_seconds * 1e6 / args.reads as f64,
        operation_overhead_micros: None,
        read_overhead_micros: None,
    })
}

/// Runs `hlat bench route`.
pub fn run(args: RouteBenchArgs) -> anyhow::Result<()> {
    let mut measured = Vec::new();
    for name in args.devices.split(',').map(str::trim) {
        eprintln!("measuring the route on {name}...");
        measured.push(measure(name, &args)?);
    }
    let flex = measured
        .iter()
        .find(|measurement| measurement.device == "flex")
        .map(|flex| (flex.micros_per_operation, flex.micros_per_read));
    if let Some((per_operation, per_read)) = flex {
        for measurement in &mut measured {
            measurement.operation_overhead_micros =
                Some(measurement.micros_per_operation - per_operation);
            measurement.read_overhead_micros = Some(measurement.micros_per_read - per_read);
        }
    }
    let report = RouteReport {
        command: report::command_line(),
        machine: report::machine_description(),
        operations: args.operations / 2 * 2,
        reads: args.reads,
        devices: measured,
        remote_flush_threshold: burn::runtime_config().remote().flush_threshold,
    };
    let difference =
        |value: Option<f64>| value.map_or("-".to_string(), |value| format!("{value:+.1}"));
    println!("| device | µs/operation | over Flex | µs/read | over Flex |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for measurement in &report.devices {
        println!(
            "| {} | {:.1} | {} | {:.1} | {} |",
            measurement.device,
            measurement.micros_per_operation,
            difference(measurement.operation_overhead_micros),
            measurement.micros_per_read,
            difference(measurement.read_overhead_micros),
        );
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    Ok(())
}
