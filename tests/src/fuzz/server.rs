//! Fuzzing of a served device's `/session` route (`hlat serve`, `burn_trainium::device`): the
//! messages a real Burn client sends in one session are recorded through a proxy, then sent to
//! the server mutated (bit flips, truncation, boundary lengths), shuffled, cut short, replayed
//! without the uploads they name (tensors that do not exist in the new session) or naming the
//! recorded session's own tensors (another client's), and as random bytes.
//!
//! Of every input: the server answers, ends the session or waits, but it does not stop; every
//! connection ends when the fuzzing client closes; a session served beside the fuzzing keeps
//! computing, and the recorded session's tensors keep their values; when the fuzzing sessions
//! have ended, the device holds the bytes it held before them.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::tensor::remote::RemoteHost;
use burn::tensor::{Device, Tensor};
use burn_trainium::server::ServeOptions;
use burn_trainium::{ExecutorKind, TrainiumDevice};
use tungstenite::handshake::server::{Callback, ErrorResponse, Request, Response};
use tungstenite::{Message, WebSocket};

use super::inputs;
use super::mutate::{Random, mutate};

/// The device the fuzzed server serves (a `host` index of its own).
const DEVICE: TrainiumDevice = TrainiumDevice::new(ExecutorKind::Host, 31);
/// How long a fuzzing connection may stay open after its client closes.
const CLOSE_LIMIT: Duration = Duration::from_secs(10);
/// How long the device may take to free the fuzzing sessions' tensors once they end.
const FREE_LIMIT: Duration = Duration::from_secs(30);

/// A server of [`DEVICE`] on loopback, with limits small enough that no input allocates much.
fn serve() -> SocketAddr {
    crate::support::serve_on_loopback(vec![DEVICE], |options| ServeOptions {
        max_tensor_bytes: Some(16 << 20),
        max_client_bytes: Some(64 << 20),
        ..options
    })
}

/// A Burn device reaching `url`.
fn remote(url: &str) -> Device {
    Device::remote_options(&RemoteHost::websocket(url))
        .init()
        .unwrap_or_else(|error| panic!("connecting to {url}: {error}"))
}

/// Binary messages a client sent, in order, shared with the proxy's thread.
type Recording = Arc<Mutex<Vec<Vec<u8>>>>;

/// A proxy in front of `server` that records every binary message its clients send, and the
/// address clients reach it on.
fn recording_proxy(server: SocketAddr) -> (SocketAddr, Recording) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let recording = Recording::default();
    let recorded = recording.clone();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let recorded = recorded.clone();
            std::thread::spawn(move || relay(client, server, &recorded));
        }
    });
    (address, recording)
}

/// Keeps the path a WebSocket handshake asks for.
struct PathOf<'a>(&'a mut String);

impl Callback for PathOf<'_> {
    fn on_request(self, request: &Request, response: Response) -> Result<Response, ErrorResponse> {
        *self.0 = request.uri().path().to_string();
        Ok(response)
    }
}

/// Relays one client connection to `server`, recording what the client sends.
fn relay(client: TcpStream, server: SocketAddr, recorded: &Mutex<Vec<Vec<u8>>>) {
    let mut path = String::new();
    let Ok(mut client) = tungstenite::accept_hdr(client, PathOf(&mut path)) else {
        return;
    };
    let Ok((mut upstream, _)) = tungstenite::connect(format!("ws://{server}{path}")) else {
        return;
    };
    for socket in [client.get_ref(), stream_of(&upstream)] {
        socket
            .set_read_timeout(Some(Duration::from_millis(1)))
            .unwrap();
    }
    loop {
        match forward(&mut client, &mut upstream) {
            Ok(Some(message)) => recorded.lock().unwrap().push(message),
            Ok(None) => {}
            Err(()) => return,
        }
        if forward(&mut upstream, &mut client).is_err() {
            return;
        }
    }
}

/// The TCP stream under a client WebSocket made by `tungstenite::connect`.
fn stream_of(socket: &WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>) -> &TcpStream {
    match socket.get_ref() {
        tungstenite::stream::MaybeTlsStream::Plain(stream) => stream,
        _ => unreachable!("a ws:// connection is plain TCP"),
    }
}

/// Moves one message from `from` to `to`, if one has arrived; returns a binary one's bytes.
fn forward<A, B>(from: &mut WebSocket<A>, to: &mut WebSocket<B>) -> Result<Option<Vec<u8>>, ()>
where
    A: std::io::Read + std::io::Write,
    B: std::io::Read + std::io::Write,
{
    match from.read() {
        Ok(message) => {
            let binary = match &message {
                Message::Binary(bytes) => Some(bytes.to_vec()),
                _ => None,
            };
            if message.is_close() {
                return Err(());
            }
            to.send(message).map_err(drop)?;
            Ok(binary)
        }
        Err(tungstenite::Error::Io(error))
            if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
        {
            to.flush().map_err(drop)?;
            Ok(None)
        }
        Err(_) => Err(()),
    }
}

/// What a fuzzing connection sends, made from the recorded session's messages.
fn fuzzed_messages(recorded: &[Vec<u8>], index: usize, random: &mut Random) -> Vec<Vec<u8>> {
    let (handshake, batches) = recorded.split_first().expect("a recorded handshake");
    let batch = |random: &mut Random| batches[random.below(batches.len())].clone();
    match index % 7 {
        // Random bytes in place of the handshake.
        0 => vec![
            (0..random.below(256))
                .map(|_| random.below(256) as u8)
                .collect(),
        ],
        // A mutated handshake (wrong version, device, credential), then real batches.
        1 => vec![mutate(handshake, handshake.len(), random), batch(random)],
        // A real handshake and a mutated batch.
        2 => vec![handshake.clone(), mutate(&batch(random), 64, random)],
        // A real handshake and a batch cut short.
        3 => {
            let mut cut = batch(random);
            cut.truncate(random.below(cut.len().max(1)));
            vec![handshake.clone(), cut]
        }
        // The batches without the uploads before them: tensors this session never made (and
        // ids the recorded session still holds).
        4 => std::iter::once(handshake.clone())
            .chain(
                batches
                    .iter()
                    .skip(1 + random.below(batches.len()))
                    .cloned(),
            )
            .collect(),
        // The batches shuffled.
        5 => {
            let mut shuffled = batches.to_vec();
            for at in (1..shuffled.len()).rev() {
                shuffled.swap(at, random.below(at + 1));
            }
            std::iter::once(handshake.clone()).chain(shuffled).collect()
        }
        // Several mutated batches.
        _ => std::iter::once(handshake.clone())
            .chain((0..1 + random.below(4)).map(|_| mutate(&batch(random), 64, random)))
            .collect(),
    }
}

/// Sends `messages` on a new `/session` connection to `server`, closes it, and waits for the
/// server to end it. Errors are for connections the server does not end in time.
fn send_and_close(server: SocketAddr, messages: Vec<Vec<u8>>) -> Result<(), String> {
    let (mut socket, _) = tungstenite::connect(format!("ws://{server}/session"))
        .map_err(|error| format!("the server stopped accepting connections: {error}"))?;
    stream_of(&socket)
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    for message in messages {
        if socket.send(Message::Binary(message.into())).is_err() {
            // The server ended the session: what a refused frame should do.
            return Ok(());
        }
    }
    let _ = socket.close(None);
    let start = Instant::now();
    while start.elapsed() < CLOSE_LIMIT {
        match socket.read() {
            Ok(_) => {}
            Err(tungstenite::Error::Io(error))
                if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Ok(()),
        }
    }
    Err(format!(
        "the connection was still open {CLOSE_LIMIT:?} after the client closed it"
    ))
}

/// The values of `tensor`.
fn values(tensor: &Tensor<2>) -> Vec<f32> {
    tensor.clone().into_data().try_to_vec::<f32>().unwrap()
}

/// A small computation of `device` and its expected values: (x + 1) · 2 of a known x.
fn computes(device: &Device, seed: usize) -> bool {
    let x: Vec<f32> = (0..12).map(|value| (value + seed) as f32).collect();
    let y = Tensor::<1>::from_floats(x.as_slice(), device)
        .reshape([3, 4])
        .add_scalar(1.0)
        .mul_scalar(2.0);
    values(&y)
        == x.iter()
            .map(|value| (value + 1.0) * 2.0)
            .collect::<Vec<_>>()
}

/// Operations of many kinds on `device`, read back: what the recorded session sends.
fn record_varied_work(device: &Device) {
    let trained = device.clone().autodiff();
    let weights =
        Tensor::<2>::from_floats([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], &trained).require_grad();
    let inputs = Tensor::<2>::from_floats([[1.0, 2.0], [3.0, -4.0], [0.5, 0.0]], &trained);
    let logits = inputs.matmul(weights.clone());
    let loss = burn::tensor::activation::log_softmax(logits, 1)
        .slice([0..3, 1..2])
        .mean();
    let gradients = loss.backward();
    let gradient = weights.grad(&gradients).unwrap();
    assert_eq!(gradient.into_data().num_elements(), 6);
    let ints = Tensor::<1, burn::tensor::Int>::arange(0..8, device);
    let mask = ints.clone().greater_elem(3);
    let picked = Tensor::<1>::ones([8], device).mask_fill(mask, 7.0);
    let joined = Tensor::cat(vec![picked.clone(), ints.float()], 0).reshape([4, 4]);
    let largest = joined.clone().argmax(1).into_data();
    assert_eq!(largest.num_elements(), 4);
    assert_eq!(values(&joined.sort(1)).len(), 16);
}

#[test]
fn served_device_sessions() {
    let server = serve();
    let bystander = remote(&format!("ws://{server}"));
    assert!(computes(&bystander, 0));

    let (proxy, recording) = recording_proxy(server);
    let recorded_session = remote(&format!("ws://{proxy}"));
    let kept = Tensor::<1>::from_floats([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &recorded_session)
        .reshape([2, 3])
        .exp();
    let kept_values = values(&kept);
    record_varied_work(&recorded_session);
    let recorded = recording.lock().unwrap().clone();
    assert!(
        recorded.len() >= 3,
        "the proxy recorded {} messages of a session",
        recorded.len()
    );
    // What both sessions hold, once what they dropped has reached the server.
    for device in [&recorded_session, &bystander] {
        device.sync().unwrap();
    }
    let held_before = burn_trainium::stats(&DEVICE).live_bytes;

    let count = inputs() / 4;
    let oversized = vec![recorded[0].clone(), vec![0xc1; 8 << 20]];
    send_and_close(server, oversized).unwrap();
    for index in 0..count {
        let mut random = Random::new(0x5e55_1015 ^ (index as u64).wrapping_mul(0x9e37_79b9));
        let messages = fuzzed_messages(&recorded, index, &mut random);
        if let Err(failure) = send_and_close(server, messages) {
            panic!("fuzzing session {index} of {count}: {failure}");
        }
        if index % 50 == 49 {
            assert!(computes(&bystander, index), "after fuzzing session {index}");
        }
    }
    assert!(computes(&bystander, count));
    assert_eq!(
        values(&kept),
        kept_values,
        "the recorded session's tensor kept its values"
    );
    for device in [&recorded_session, &bystander] {
        device.sync().unwrap();
    }
    let start = Instant::now();
    let mut held = burn_trainium::stats(&DEVICE).live_bytes;
    while held != held_before && start.elapsed() < FREE_LIMIT {
        std::thread::sleep(Duration::from_millis(50));
        held = burn_trainium::stats(&DEVICE).live_bytes;
    }
    assert_eq!(
        held, held_before,
        "the device's live bytes after {count} fuzzing sessions ended"
    );
    eprintln!(
        "fuzz /session: {count} mutated sessions and one of 8 MiB from {} recorded messages; \
         the server served on, {held} live bytes before and after",
        recorded.len()
    );
}
