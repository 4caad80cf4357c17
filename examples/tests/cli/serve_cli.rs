//! `hlat serve` end to end: started on `127.0.0.1:0` it prints the `ws://` address it bound on
//! standard output, and a Burn 0.22 client computes on the served device there (the `host`
//! executor, and the `xla` one beside it, picked by index); a non-loopback address without
//! `--token-file`, an empty token file and two devices sharing a core exit 2 naming what is
//! wrong; with a token file only clients presenting the secret compute.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use burn::tensor::remote::RemoteHost;
use burn::tensor::{Device, Tensor, TensorData};

use super::{hlat, require_plugin, succeeded};

/// How long a server may take to print its address, and a refused client to be refused.
const PATIENCE: Duration = Duration::from_secs(120);

/// A running `hlat serve`, killed (and reaped) when dropped.
struct Server {
    child: Child,
    /// The address it printed, as printed (`ws://ADDRESS:PORT`).
    url: String,
    /// Its standard error, kept for failure messages.
    _folder: tempfile::TempDir,
    stderr: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// `hlat serve ARGUMENTS` (without `TRAINIUM_DEVICE`), once it has printed its address.
    fn start(arguments: &[&str]) -> Server {
        let folder = tempfile::tempdir().unwrap();
        let stderr = folder.path().join("stderr");
        let child = hlat()
            .arg("serve")
            .args(arguments)
            .env_remove(burn_trainium::DEVICE_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("starting hlat serve");
        let mut server = Server {
            child,
            url: String::new(),
            _folder: folder,
            stderr,
        };
        let stdout = server.child.stdout.take().unwrap();
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let read = BufReader::new(stdout).read_line(&mut line).map(|_| line);
            let _ = sender.send(read);
        });
        let line = match receiver.recv_timeout(PATIENCE) {
            Ok(Ok(line)) => line,
            Ok(Err(error)) => panic!("reading the address of hlat serve: {error}"),
            Err(_) => panic!(
                "hlat serve {arguments:?} printed no address in {PATIENCE:?}:\n{}",
                server.errors()
            ),
        };
        assert!(
            line.starts_with("ws://") && line.ends_with('\n'),
            "hlat serve {arguments:?} printed {line:?}, not its address:\n{}",
            server.errors()
        );
        server.url = line.trim_end().to_string();
        server
    }

    /// What the server wrote on standard error so far.
    fn errors(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The port it listens on.
    fn port(&self) -> u16 {
        let port = self.url.rsplit(':').next().unwrap();
        port.parse()
            .unwrap_or_else(|_| panic!("the port of {}", self.url))
    }

    /// The address a client on this machine reaches it at.
    fn loopback_url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port())
    }
}

/// The served device `index` at `url`, presenting `credential`.
fn connect(url: &str, index: usize, credential: Option<&str>) -> Result<Device, String> {
    let mut host = RemoteHost::websocket(url);
    if let Some(credential) = credential {
        host = host.with_credential(credential);
    }
    Device::remote_options(&host)
        .device_index(index)
        .init()
        .map_err(|error| error.to_string())
}

/// `[1, 2, 3] * 2 + 0.5` computed on `device` and read back (exact in f32).
fn compute(device: &Device) -> Vec<f32> {
    Tensor::<1>::from_data(TensorData::from([1.0f32, 2.0, 3.0]), device)
        .mul_scalar(2.0)
        .add_scalar(0.5)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

const EXPECTED: [f32; 3] = [2.5, 4.5, 6.5];

/// Device `index` at `url` with `credential` computes [`EXPECTED`].
fn assert_computes(server: &Server, url: &str, index: usize, credential: Option<&str>) {
    let device = connect(url, index, credential).unwrap_or_else(|error| {
        panic!(
            "connecting to device {index} of {url}: {error}\nserver:\n{}",
            server.errors()
        )
    });
    assert_eq!(compute(&device), EXPECTED, "device {index} of {url}");
}

/// Whether a client of device `index` at `url` presenting `credential` is refused, at connection
/// or on first use (a panic), within [`PATIENCE`]; fails if it computes or hangs.
fn assert_refused(url: &str, index: usize, credential: Option<&str>) {
    let (url, credential) = (url.to_string(), credential.map(str::to_string));
    let (sender, receiver) = mpsc::channel();
    let described = format!("a client of device {index} presenting {credential:?}");
    let client = std::thread::spawn(move || {
        let computed = connect(&url, index, credential.as_deref())
            .map(|device| compute(&device))
            .ok();
        let _ = sender.send(computed);
    });
    match receiver.recv_timeout(PATIENCE) {
        // Refused at connection.
        Ok(None) => {}
        Ok(Some(values)) => panic!("{described} computed {values:?}"),
        // The thread ended without sending: refused on first use (it panicked).
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            assert!(
                client.join().is_err(),
                "{described}: the client thread vanished"
            )
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{described} was neither served nor refused in {PATIENCE:?}")
        }
    }
}

/// `hlat serve ARGUMENTS` (without `TRAINIUM_DEVICE`), which must exit 2 before serving; returns
/// its standard error.
fn refused(arguments: &[&str]) -> String {
    refused_with(arguments, &[])
}

/// [`refused`] with the variables `environment` set.
fn refused_with(arguments: &[&str], environment: &[(&str, &str)]) -> String {
    let mut command = hlat();
    command
        .arg("serve")
        .args(arguments)
        .env_remove(burn_trainium::DEVICE_ENV)
        .envs(environment.iter().copied())
        .stdin(Stdio::null());
    let (sender, receiver) = mpsc::channel();
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting hlat serve");
    // A server that starts instead of refusing would run forever: kill it after a while.
    let id = child.id();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    let output = match receiver.recv_timeout(PATIENCE) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // SAFETY: kills the process this test started, by its id.
            unsafe { libc::kill(id as i32, libc::SIGKILL) };
            panic!("hlat serve {arguments:?} did not exit: it serves instead of refusing")
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(
        output.status.code(),
        Some(2),
        "hlat serve {arguments:?}:\n{stderr}"
    );
    assert!(
        output.stdout.is_empty(),
        "hlat serve {arguments:?} printed an address: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    stderr
}

fn write_token(folder: &Path, text: &str) -> String {
    let path = folder.join("token");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn serve_prints_its_address_and_a_client_computes_on_it() {
    let server = Server::start(&["--device", "host", "--listen", "127.0.0.1:0"]);
    assert!(
        server.url.starts_with("ws://127.0.0.1:") && server.port() != 0,
        "{}",
        server.url
    );
    assert_computes(&server, &server.url.clone(), 0, None);
    // A second client of the same server computes too.
    let url = server.url.replace("127.0.0.1", "localhost");
    assert_computes(&server, &url, 0, None);
}

#[test]
fn serve_serves_several_devices_picked_by_index() {
    require_plugin();
    let server = Server::start(&["--device", "host:0,xla:0", "--listen", "127.0.0.1:0"]);
    assert_computes(&server, &server.url.clone(), 0, None);
    assert_computes(&server, &server.url.clone(), 1, None);
    // It serves two devices, not more.
    assert_refused(&server.url, 2, None);
}

#[test]
fn serve_opens_its_devices_before_printing_an_address() {
    // The `xla` executor without its plugin: refused at start, not at a client's first use.
    let stderr = refused_with(
        &["--device", "host:0,xla:0", "--listen", "127.0.0.1:0"],
        &[(burn_trainium::PLUGIN_ENV, "/nonexistent/libpjrt_cpu.so")],
    );
    assert!(
        stderr.contains("/nonexistent/libpjrt_cpu.so")
            && stderr.contains(burn_trainium::PLUGIN_ENV),
        "{stderr}"
    );
}

#[test]
fn serve_on_a_non_loopback_address_needs_a_token_file() {
    let stderr = refused(&["--device", "host", "--listen", "0.0.0.0:0"]);
    assert!(
        stderr.contains("0.0.0.0:0") && stderr.contains("--token-file"),
        "{stderr}"
    );
}

#[test]
fn serve_refuses_an_empty_token_file() {
    let folder = tempfile::tempdir().unwrap();
    let token = write_token(folder.path(), " \n");
    let stderr = refused(&[
        "--device",
        "host",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        &token,
    ]);
    assert!(
        stderr.contains(&token) && stderr.contains("empty"),
        "{stderr}"
    );
}

#[test]
fn serve_refuses_two_devices_sharing_a_core() {
    let stderr = refused(&["--device", "host:0-1,host:1", "--listen", "127.0.0.1:0"]);
    assert!(
        stderr.contains("host:0-1") && stderr.contains("host:1") && stderr.contains("share"),
        "{stderr}"
    );
}

#[test]
fn serve_with_a_token_file_lets_in_only_clients_with_the_secret() {
    let folder = tempfile::tempdir().unwrap();
    // Trimmed: the trailing newline is not part of the secret.
    let token = write_token(folder.path(), "s3cret-token\n");
    let server = Server::start(&[
        "--device",
        "host",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        &token,
    ]);
    assert_refused(&server.url, 0, None);
    assert_refused(&server.url, 0, Some("guess"));
    // Refused by the server's check of the secret, which logs each refusal.
    let refusals = server.errors().matches("refused a session").count();
    assert!(refusals >= 2, "{}", server.errors());
    assert_computes(&server, &server.url.clone(), 0, Some("s3cret-token"));
}

#[test]
fn serve_on_every_address_with_a_token_file_serves_clients_with_the_secret() {
    let folder = tempfile::tempdir().unwrap();
    let token = write_token(folder.path(), "s3cret-token");
    let server = Server::start(&[
        "--device",
        "host",
        "--listen",
        "0.0.0.0:0",
        "--token-file",
        &token,
    ]);
    assert!(server.url.starts_with("ws://0.0.0.0:"), "{}", server.url);
    let url = server.loopback_url();
    assert_refused(&url, 0, None);
    assert_computes(&server, &url, 0, Some("s3cret-token"));
}

#[test]
fn serve_refuses_a_tensor_or_a_client_above_its_limits_by_size() {
    let server = Server::start(&[
        "--device",
        "host:5",
        "--listen",
        "127.0.0.1:0",
        "--max-tensor-bytes",
        "4096",
        "--max-client-bytes",
        "8192",
    ]);
    let device = connect(&server.url, 0, None).unwrap();
    let read_error = |tensor: Tensor<2>| {
        tensor
            .try_into_data()
            .expect_err("the read is refused")
            .to_string()
    };
    let too_large = read_error(Tensor::<2>::zeros([32, 33], &device));
    assert!(
        too_large.contains("4224 bytes") && too_large.contains("4096 bytes"),
        "{too_large}"
    );
    let held = [
        Tensor::<2>::ones([32, 32], &device),
        Tensor::<2>::ones([32, 32], &device),
    ];
    let over = read_error(Tensor::<2>::ones([32, 32], &device));
    assert!(
        over.contains("8192 bytes") && over.contains("--max-client-bytes"),
        "{over}"
    );
    drop(held);
    assert_eq!(compute(&device), EXPECTED, "{}", server.errors());
    for flag in [
        "--max-tensor-bytes",
        "--max-client-bytes",
        "--max-connections",
        "--max-message-bytes",
    ] {
        let stderr = refused(&[flag, "0"]);
        assert!(stderr.contains(flag), "{stderr}");
    }
}

/// A raw WebSocket handshake with `hlat serve` on `port`: the socket, or the HTTP status and body
/// it was refused with.
fn raw_session(port: u16) -> Result<tungstenite::WebSocket<std::net::TcpStream>, (u16, String)> {
    let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    match tungstenite::client(format!("ws://127.0.0.1:{port}/session"), stream) {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => Err((
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or(&[])).into_owned(),
        )),
        Err(other) => panic!("handshake with hlat serve: {other}"),
    }
}

#[test]
fn serve_bounds_its_connections_and_the_messages_of_each() {
    let server = Server::start(&[
        "--device",
        "host:6",
        "--listen",
        "127.0.0.1:0",
        "--max-connections",
        "2",
        "--max-message-bytes",
        "65536",
    ]);
    let port = server.port();
    let mut first = raw_session(port).expect("a first connection");
    let second = raw_session(port).expect("a second connection");
    let (status, body) = raw_session(port).expect_err("a third connection is refused");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("2 connections") && body.contains("--max-connections"),
        "{body}"
    );

    first
        .send(tungstenite::Message::binary(vec![0u8; 70_000]))
        .unwrap();
    let reason = loop {
        match first.read() {
            Ok(tungstenite::Message::Close(Some(frame))) => break frame.reason.to_string(),
            Ok(_) => continue,
            Err(error) => panic!(
                "no close frame: {error}
{}",
                server.errors()
            ),
        }
    };
    assert!(
        reason.contains("70000 bytes") && reason.contains("65536 bytes"),
        "{reason}"
    );
    drop((first, second));
    // The slots come back (once the gate has seen both connections end), and a Burn client
    // computes within the limits.
    let device = (0..600)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            connect(&server.url, 0, None).ok()
        })
        .unwrap_or_else(|| panic!("no slot came back:\n{}", server.errors()));
    assert_eq!(compute(&device), EXPECTED, "{}", server.errors());
    let errors = server.errors();
    assert!(
        errors.contains("refused a connection from 127.0.0.1")
            && errors.contains("closed the connection of 127.0.0.1")
            && errors.contains("70000 bytes"),
        "{errors}"
    );
}

#[test]
fn bench_serve_clients_train_at_once_as_one_alone_and_leave_nothing_behind() {
    let folder = tempfile::tempdir().unwrap();
    let json = folder.path().join("bench-serve.json");
    let json_text = json.to_str().unwrap();
    let arguments = [
        "bench",
        "serve",
        "--clients",
        "1,8",
        "--steps",
        "200",
        "--json",
        json_text,
    ];
    let output = hlat()
        .args(arguments)
        .env_remove(burn_trainium::DEVICE_ENV)
        .output()
        .unwrap();
    succeeded(&arguments, output);
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let measured = report["measurements"].as_array().unwrap();
    let (alone, eight) = (&measured[0], &measured[1]);
    assert_eq!(
        (alone["clients"].as_u64(), eight["clients"].as_u64()),
        (Some(1), Some(8))
    );
    for measurement in measured {
        assert_eq!(measurement["losses_equal_to_reference"], true, "{report}");
        assert_eq!(
            measurement["live_bytes_after"], measurement["live_bytes_before"],
            "{report}"
        );
        assert!(measurement["steps_per_second"].as_f64().unwrap() > 0.0);
    }
    let peak = |measurement: &serde_json::Value| measurement["peak_live_bytes"].as_u64().unwrap();
    assert!(
        peak(alone) > 0 && peak(eight) <= 8 * peak(alone),
        "8 clients held more than 8 times one alone: {report}"
    );
}
