//! Clients of one served device in processes of their own, as `hlat serve` sees them: a client
//! killed with SIGKILL in the middle of its steps frees everything it held, and 8 clients
//! training at once each get the losses they get alone while the server's memory stays flat.
//!
//! The clients are this test binary run again on one ignored test (`client_*`), told the server's
//! address in [`URL_ENV`].

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::{Device, Tensor};
use burn_trainium::server::{Access, ServeOptions};
use burn_trainium::{ExecutorKind, TrainiumDevice};

/// The environment variable that gives a client process the server's address.
const URL_ENV: &str = "HLAT_SERVED_CLIENT_URL";
/// The clients of the soak test, and the steps each trains.
const SOAK_CLIENTS: usize = 8;
const SOAK_STEPS: usize = 200;
/// How long the server may take to free a client's tensors once its connection is gone.
const FREE_LIMIT: Duration = Duration::from_secs(30);

/// A server of `device` on loopback.
fn serve(device: TrainiumDevice) -> SocketAddr {
    let options = ServeOptions {
        devices: vec![device],
        listen: "127.0.0.1:0".parse().unwrap(),
        access: Access::Loopback,
        max_tensor_bytes: None,
        max_client_bytes: None,
    };
    burn_trainium::server::bind(&options)
        .unwrap()
        .serve_in_background()
        .unwrap()
}

/// This test binary run on the ignored test `name`, as a client of `server`.
fn client_process(name: &str, server: SocketAddr) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(URL_ENV, format!("ws://{server}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("starting the client {name}: {error}"))
}

/// What follows `prefix` on the first line of `child`'s standard output that holds it (the test
/// harness prints the test's name on the same line first).
fn line_of(child: &mut Child, prefix: &str) -> String {
    let mut output = BufReader::new(child.stdout.take().expect("a piped standard output")).lines();
    for line in output.by_ref() {
        let line = line.expect("reading the client's output");
        if let Some((_, rest)) = line.split_once(prefix) {
            // The rest is read to its end, so that the client's last lines find their pipe open.
            std::thread::spawn(move || output.for_each(drop));
            return rest.trim().to_string();
        }
    }
    panic!("the client ended without printing `{prefix}`");
}

/// The Burn device a client process reaches.
fn client_device() -> Device {
    let url = std::env::var(URL_ENV).expect("run by a test that serves a device");
    Device::remote_options(&burn::tensor::remote::RemoteHost::websocket(&url))
        .init()
        .unwrap_or_else(|error| panic!("connecting to {url}: {error}"))
}

/// Waits until `device`'s live bytes are `expected` (the server frees a session's tensors
/// after its connection ends), returning what they were when it stopped waiting.
fn live_bytes_return_to(device: &TrainiumDevice, expected: u64) -> u64 {
    let start = Instant::now();
    loop {
        let held = burn_trainium::stats(device).live_bytes;
        if held == expected || start.elapsed() > FREE_LIMIT {
            return held;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Samples `device`'s live bytes every few milliseconds on a thread of its own until the
/// returned flag is set; the largest sample is in the returned gauge.
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

#[test]
fn a_client_killed_in_the_middle_of_its_steps_frees_what_it_held() {
    let device = TrainiumDevice::new(ExecutorKind::Host, 32);
    let server = serve(device);
    let before = burn_trainium::stats(&device).live_bytes;
    let mut client = client_process("served_clients::client_killed_while_stepping", server);
    let held: u64 = line_of(&mut client, "holding").parse().unwrap();
    let during = burn_trainium::stats(&device).live_bytes;
    assert!(
        during >= before + held,
        "the server holds {during} bytes while the client holds {held} (before it: {before})"
    );
    client.kill().unwrap();
    client.wait().unwrap();
    let after = live_bytes_return_to(&device, before);
    assert_eq!(
        after, before,
        "live bytes {FREE_LIMIT:?} after the client holding {held} was killed"
    );
}

#[test]
#[ignore = "a client process of a_client_killed_in_the_middle_of_its_steps_frees_what_it_held"]
fn client_killed_while_stepping() {
    let device = client_device();
    let weights = Tensor::<2>::ones([512, 512], &device);
    let bytes = weights.clone().into_data().as_bytes().len();
    println!("holding {bytes}");
    loop {
        let step = weights.clone().matmul(weights.clone()).mean();
        assert!(step.into_scalar::<f32>().is_finite());
    }
}

/// Trains a small two-layer regression with plain gradient descent on `device` for
/// [`SOAK_STEPS`] steps from fixed weights and data; the loss of every step.
fn train_small_model(device: &Device) -> Vec<f32> {
    let device = device.clone().autodiff();
    let values = |count: usize, scale: f32| -> Vec<f32> {
        (0..count)
            .map(|index| ((index * 37 % 101) as f32 / 101.0 - 0.5) * scale)
            .collect()
    };
    let inputs = Tensor::<1>::from_floats(values(16 * 8, 2.0).as_slice(), &device).reshape([16, 8]);
    let targets = Tensor::<1>::from_floats(values(16, 1.0).as_slice(), &device).reshape([16, 1]);
    let mut first = Tensor::<1>::from_floats(values(8 * 16, 0.5).as_slice(), &device)
        .reshape([8, 16])
        .require_grad();
    let mut second = Tensor::<1>::from_floats(values(16, 0.5).as_slice(), &device)
        .reshape([16, 1])
        .require_grad();
    (0..SOAK_STEPS)
        .map(|_| {
            let hidden = inputs.clone().matmul(first.clone()).tanh();
            let error = hidden.matmul(second.clone()) - targets.clone();
            let loss = error.clone().mul(error).mean();
            let gradients = loss.backward();
            let step = |weights: &Tensor<2>| {
                let gradient = weights.grad(&gradients).expect("a gradient");
                Tensor::from_inner(weights.clone().inner() - gradient.mul_scalar(0.1))
                    .require_grad()
            };
            first = step(&first);
            second = step(&second);
            loss.into_scalar::<f32>()
        })
        .collect()
}

#[test]
#[ignore = "a client process of eight_clients_train_as_they_train_alone"]
fn client_training() {
    let losses = train_small_model(&client_device());
    println!("losses {}", serde_json::to_string(&losses).unwrap());
}

/// Runs `count` training clients of `server` at once: their losses, and the largest live bytes
/// `device` held meanwhile.
fn train_clients(device: TrainiumDevice, server: SocketAddr, count: usize) -> (Vec<Vec<f32>>, u64) {
    let (stop, peak) = sample_peak(device);
    let mut clients: Vec<Child> = (0..count)
        .map(|_| client_process("served_clients::client_training", server))
        .collect();
    let losses = clients
        .iter_mut()
        .map(|client| {
            let line = line_of(client, "losses");
            assert!(client.wait().unwrap().success());
            serde_json::from_str(&line).unwrap()
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    (losses, peak.load(Ordering::Relaxed))
}

#[test]
fn eight_clients_train_as_they_train_alone() {
    let device = TrainiumDevice::new(ExecutorKind::Host, 33);
    let server = serve(device);
    let before = burn_trainium::stats(&device).live_bytes;
    let (alone, peak_alone) = train_clients(device, server, 1);
    assert_eq!(live_bytes_return_to(&device, before), before);
    let (together, peak_together) = train_clients(device, server, SOAK_CLIENTS);
    for (client, losses) in together.iter().enumerate() {
        assert_eq!(
            losses, &alone[0],
            "the losses of client {client} of {SOAK_CLIENTS}"
        );
    }
    assert!(
        alone[0].last() < alone[0].first(),
        "the model learns: {:?}",
        alone[0]
    );
    assert!(
        peak_together <= SOAK_CLIENTS as u64 * peak_alone.max(1),
        "{SOAK_CLIENTS} clients held up to {peak_together} bytes, one alone {peak_alone}"
    );
    assert_eq!(
        live_bytes_return_to(&device, before),
        before,
        "the live bytes once every client ended"
    );
    eprintln!(
        "served clients: {SOAK_CLIENTS} × {SOAK_STEPS} steps, losses equal to one alone; live \
         bytes at most {peak_together} (one alone: {peak_alone}), {before} before and after"
    );
}
