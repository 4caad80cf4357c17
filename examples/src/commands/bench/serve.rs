//! `hlat bench serve`: one device server under N clients at once. The server (as `hlat serve`
//! runs it) is started in this process; each client is a process of its own (this `hlat`,
//! started with the hidden `--worker` flag) that trains a small two-layer regression with plain
//! gradient descent, one read a step. For each client count the benchmark reports the steps per
//! second of all clients together, the step latency (median and 99th percentile), whether every
//! client's losses equal those of one client alone, and the server's live bytes: the peak while
//! the clients run, and what is left once they have gone.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use burn::tensor::remote::RemoteHost;
use burn::tensor::{Device, Tensor};
use burn_trainium::TrainiumDevice;
use burn_trainium::server::{Access, ServeOptions};
use clap::Args;
use serde::{Deserialize, Serialize};

use super::backends::{emit_result, median, run_worker};
use super::report;

/// Arguments of `hlat bench serve`.
#[derive(Args, Clone)]
pub struct ServeBenchArgs {
    /// The device served, as `hlat serve --device` names it.
    #[arg(long, default_value = "host")]
    pub device: String,
    /// Client counts to measure, comma-separated; each runs that many client processes at once.
    /// The first count is the reference the others' losses are compared with (use 1).
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub clients: Vec<usize>,
    /// Training steps of each client.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    /// Where to write the JSON results: a file there is replaced, a path inside another
    /// command's output folder (a training run, a model) refused.
    #[arg(long, default_value = "bench-serve.json")]
    pub json: PathBuf,
    /// Internal: run one client of the server at this address and print its result.
    #[arg(long, hide = true, value_name = "URL")]
    pub client_of: Option<String>,
    /// Internal: set with `--client-of`.
    #[arg(long, hide = true)]
    pub worker: bool,
}

/// What one client process measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClientResult {
    /// The loss of every step.
    losses: Vec<f32>,
    /// Microseconds of every step (its loss read included).
    step_micros: Vec<f64>,
}

/// What one client count measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServeMeasurement {
    /// Client processes running at once.
    pub clients: usize,
    /// Steps per second of all clients together (from the first client's start to the last
    /// one's end, process start-up included).
    pub steps_per_second: f64,
    /// Median step latency, in milliseconds, over every step of every client.
    pub median_step_ms: f64,
    /// 99th-percentile step latency, in milliseconds.
    pub p99_step_ms: f64,
    /// Whether every client's losses equal, bit for bit, those of the first client count's
    /// first client.
    pub losses_equal_to_reference: bool,
    /// The most bytes of live tensors the device held while the clients ran (sampled every
    /// 2 ms).
    pub peak_live_bytes: u64,
    /// The device's live bytes before the clients started and once they had all gone.
    pub live_bytes_before: u64,
    /// See `live_bytes_before`.
    pub live_bytes_after: u64,
}

/// A full `hlat bench serve` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServeReport {
    /// The command line that produced the report.
    pub command: String,
    /// The machine.
    pub machine: String,
    /// The device served.
    pub device: String,
    /// Steps of each client.
    pub steps: u64,
    /// One entry per client count, in the order asked.
    pub measurements: Vec<ServeMeasurement>,
}

/// Trains the small model on `device` for `steps` steps from fixed weights and data.
fn train_small_model(device: &Device, steps: u64) -> anyhow::Result<ClientResult> {
    let device = device.clone().autodiff();
    let values = |count: usize, scale: f32| -> Vec<f32> {
        (0..count)
            .map(|index| ((index * 37 % 101) as f32 / 101.0 - 0.5) * scale)
            .collect()
    };
    let matrix = |count: usize, scale: f32, shape: [usize; 2]| {
        Tensor::<1>::from_floats(values(count, scale).as_slice(), &device).reshape(shape)
    };
    let inputs = matrix(16 * 8, 2.0, [16, 8]);
    let targets = matrix(16, 1.0, [16, 1]);
    let mut first = matrix(8 * 16, 0.5, [8, 16]).require_grad();
    let mut second = matrix(16, 0.5, [16, 1]).require_grad();
    let mut result = ClientResult {
        losses: Vec::new(),
        step_micros: Vec::new(),
    };
    for _ in 0..steps {
        let start = Instant::now();
        let hidden = inputs.clone().matmul(first.clone()).tanh();
        let error = hidden.matmul(second.clone()) - targets.clone();
        let loss = error.clone().mul(error).mean();
        let gradients = loss.backward();
        let step = |weights: &Tensor<2>| -> anyhow::Result<Tensor<2>> {
            let gradient = weights
                .grad(&gradients)
                .context("a weight without a gradient")?;
            Ok(
                Tensor::from_inner(weights.clone().inner() - gradient.mul_scalar(0.1))
                    .require_grad(),
            )
        };
        first = step(&first)?;
        second = step(&second)?;
        let loss = loss
            .into_data()
            .try_to_vec::<f32>()
            .map_err(|error| anyhow::anyhow!("reading the loss: {error:?}"))?;
        result.losses.push(loss[0]);
        result.step_micros.push(start.elapsed().as_secs_f64() * 1e6);
    }
    Ok(result)
}

/// One client process: connects to `url` and trains.
fn run_client(url: &str, steps: u64) -> anyhow::Result<()> {
    let device = Device::remote_options(&RemoteHost::websocket(url))
        .init()
        .map_err(|error| anyhow::anyhow!("connecting to {url}: {error}"))?;
    emit_result(&train_small_model(&device, steps)?)
}

/// Samples `device`'s live bytes every 2 ms until the returned flag is set; the largest sample
/// is in the returned gauge.
fn sample_peak(device: TrainiumDevice) -> (Arc<AtomicBool>, Arc<AtomicU64>) {
    let (stop, peak) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let (stopped, largest) = (stop.clone(), peak.clone());
    std::thread::spawn(move || {
        while !stopped.load(Ordering::Relaxed) {
            largest.fetch_max(burn_trainium::stats(&device).live_bytes, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    (stop, peak)
}

/// The device's live bytes once they are back to `expected` (the server frees a session's
/// tensors after its connection ends), or what they are after 30 s.
fn settled_live_bytes(device: &TrainiumDevice, expected: u64) -> u64 {
    let start = Instant::now();
    loop {
        let held = burn_trainium::stats(device).live_bytes;
        if held == expected || start.elapsed() > Duration::from_secs(30) {
            return held;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `fraction` quantile of `values` (nearest rank).
fn quantile(values: &mut [f64], fraction: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64 * fraction).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// Runs `clients` client processes of `server` at once.
fn measure(
    device: TrainiumDevice,
    server: SocketAddr,
    clients: usize,
    steps: u64,
) -> anyhow::Result<(Vec<ClientResult>, f64, u64)> {
    let arguments: Vec<String> = [
        "bench",
        "serve",
        "--steps",
        &steps.to_string(),
        "--client-of",
        &format!("ws://{server}"),
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    let (stop, peak) = sample_peak(device);
    let start = Instant::now();
    let results = std::thread::scope(|scope| {
        let running: Vec<_> = (0..clients)
            .map(|client| {
                let arguments = &arguments;
                scope.spawn(move || {
                    run_worker::<ClientResult>(arguments, &format!("client {client} of {clients}"))
                })
            })
            .collect();
        running
            .into_iter()
            .map(|client| client.join().expect("a client thread panicked"))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let seconds = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    Ok((results, seconds, peak.load(Ordering::Relaxed)))
}

/// Runs `hlat bench serve`.
pub fn run(args: ServeBenchArgs) -> anyhow::Result<()> {
    if let Some(url) = &args.client_of {
        return run_client(url, args.steps);
    }
    anyhow::ensure!(
        !args.clients.is_empty() && !args.clients.contains(&0),
        "--clients: give one or more counts of at least 1 (e.g. 1,8)"
    );
    let device: TrainiumDevice = args
        .device
        .parse()
        .with_context(|| format!("--device {}", args.device))?;
    let options = ServeOptions::new(
        vec![device],
        (std::net::Ipv4Addr::LOCALHOST, 0).into(),
        Access::Loopback,
    );
    let server = burn_trainium::server::bind(&options)
        .context("starting the server")?
        .serve_in_background()?;
    let mut reference: Option<Vec<f32>> = None;
    let mut measurements = Vec::new();
    for &clients in &args.clients {
        eprintln!(
            "{clients} clients × {} steps against {device}...",
            args.steps
        );
        let before = burn_trainium::stats(&device).live_bytes;
        let (results, seconds, peak) = measure(device, server, clients, args.steps)?;
        let after = settled_live_bytes(&device, before);
        let reference = reference.get_or_insert_with(|| results[0].losses.clone());
        let mut latencies: Vec<f64> = results
            .iter()
            .flat_map(|result| result.step_micros.iter().map(|micros| micros / 1e3))
            .collect();
        measurements.push(ServeMeasurement {
            clients,
            steps_per_second: (clients as u64 * args.steps) as f64 / seconds,
            median_step_ms: median(&latencies),
            p99_step_ms: quantile(&mut latencies, 0.99),
            losses_equal_to_reference: results.iter().all(|result| result.losses == *reference),
            peak_live_bytes: peak,
            live_bytes_before: before,
            live_bytes_after: after,
        });
    }
    let report = ServeReport {
        command: report::command_line(),
        machine: report::machine_description(),
        device: device.to_string(),
        steps: args.steps,
        measurements,
    };
    println!(
        "| clients | steps/s | median step ms | p99 step ms | losses as alone | peak live bytes | \
         live bytes before → after |"
    );
    println!("| ---: | ---: | ---: | ---: | --- | ---: | ---: |");
    for measured in &report.measurements {
        println!(
            "| {} | {:.1} | {:.2} | {:.2} | {} | {} | {} → {} |",
            measured.clients,
            measured.steps_per_second,
            measured.median_step_ms,
            measured.p99_step_ms,
            if measured.losses_equal_to_reference {
                "yes"
            } else {
                "no"
            },
            measured.peak_live_bytes,
            measured.live_bytes_before,
            measured.live_bytes_after,
        );
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    Ok(())
}
