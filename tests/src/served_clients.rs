//! A client of a served device in a process of its own, as `hlat serve` sees it: killed with
//! SIGKILL in the middle of its steps, it frees everything it held. (Many clients at once:
//! `hlat bench serve`, tested in the CLI tests.)
//!
//! The client is this test binary run again on an ignored test, told the server's address in
//! [`URL_ENV`].

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use burn::tensor::{Device, Tensor};
use burn_trainium::{ExecutorKind, TrainiumDevice};

/// The environment variable that gives a client process the server's address.
const URL_ENV: &str = "HLAT_SERVED_CLIENT_URL";
/// How long the server may take to free a client's tensors once its connection is gone.
const FREE_LIMIT: Duration = Duration::from_secs(30);

/// A server of `device` on loopback.
fn serve(device: TrainiumDevice) -> SocketAddr {
    crate::support::serve_on_loopback(vec![device], |options| options)
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
