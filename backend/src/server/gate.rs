//! The gate of a device server (`hlat serve`): every client connection passes through it before
//! Burn's WebSocket server, which listens on a loopback port of its own, sees a byte.
//!
//! Burn's server reads a message whole before handing it on, up to 1 GiB, and accepts any number
//! of connections, so a client could make it hold gigabytes before any limit of the device
//! applies. The gate bounds that: only the `/session` route (Burn's `/data` route, for tensors
//! moved between servers, checks no secret and is answered `404`), at most `max_connections`
//! connections at once (more are answered `503` naming the limit), a handshake within
//! `handshake_timeout` (read by the gate before the server sees it), and no message larger
//! than `max_message_bytes` (the connection gets a close frame naming the size and the limit, and
//! Burn's server ends the session, freeing its tensors). What the server may buffer for clients is
//! then at most `max_connections × max_message_bytes`.
//!
//! It also tells the server's authorizer which client each of its upstream connections carries
//! ([`Peers`]), so sessions are judged and logged by the client's address.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use super::frames::{FrameMeter, Refusal, close_frame};

/// The most connections a device server keeps open at once unless told otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// How long a client has to send its whole handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server may keep a connection open once its client has gone.
const CLOSE_GRACE: Duration = Duration::from_secs(10);
/// Burn's own bound on a WebSocket message.
pub(crate) const BURN_MAX_MESSAGE_BYTES: u64 = 1 << 30;
/// What a message may hold beyond the largest tensor: Burn's client batches up to 1 MiB of
/// smaller uploads and a few operations with an upload.
pub(crate) const MESSAGE_ENVELOPE_BYTES: u64 = 4 << 20;
/// The WebSocket close code for a message too big to process.
const MESSAGE_TOO_BIG: u16 = 1009;

/// What the gate lets through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GateLimits {
    /// The most client connections open at once.
    pub max_connections: usize,
    /// The largest message a client may send, in bytes.
    pub max_message_bytes: u64,
    /// How long a client has to send its handshake.
    pub handshake_timeout: Duration,
}

impl GateLimits {
    /// Limits of `max_connections` and `max_message_bytes`, with the usual handshake timeout.
    pub(crate) fn new(max_connections: usize, max_message_bytes: u64) -> Self {
        Self {
            max_connections,
            max_message_bytes,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }
}

/// The client each of the gate's open upstream connections carries, by the upstream
/// connection's local address (the peer address Burn's server sees).
#[derive(Debug, Default)]
pub(crate) struct Peers(Mutex<HashMap<SocketAddr, SocketAddr>>);

impl Peers {
    /// The client behind the upstream connection from `upstream`, if the gate opened it.
    pub(crate) fn client_of(&self, upstream: &SocketAddr) -> Option<SocketAddr> {
        self.lock().get(upstream).copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, SocketAddr>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Forgets an upstream connection's client when the connection ends.
struct Registered<'a> {
    peers: &'a Peers,
    upstream: SocketAddr,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.peers.lock().remove(&self.upstream);
    }
}

/// Accepts clients on `listener` for ever, passing each to the server at `upstream` within
/// `limits`.
pub(crate) async fn run(
    listener: TcpListener,
    upstream: SocketAddr,
    limits: GateLimits,
    peers: Arc<Peers>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let (client, address) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, most often: wait for some to close.
                log::warn!("accepting a client: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let peers = peers.clone();
                tokio::spawn(async move {
                    if let Err(reason) = pass(client, address, upstream, limits, &peers).await {
                        log::warn!("closed the connection of {address}: {reason}");
                    }
                    drop(slot);
                });
            }
            Err(_) => {
                log::warn!(
                    "refused a connection from {address}: {} connections are open \
                     (--max-connections)",
                    limits.max_connections
                );
                tokio::spawn(answer_busy(client, limits.max_connections));
            }
        }
    }
}

/// Answers a client over the connection limit with `503` naming the limit, and closes.
async fn answer_busy(mut client: TcpStream, max_connections: usize) {
    let text = format!(
        "this device server has its {max_connections} connections open (--max-connections); \
         try again later"
    );
    answer(&mut client, "503 Service Unavailable", &text).await;
}

/// How a client's direction of a connection ended.
enum ClientEnd {
    /// The client closed its side.
    Closed,
    /// The gate stopped it.
    Refused(Refusal),
}

/// Passes the connection of `client` (from `address`) to the server at `upstream` within
/// `limits`, until either side closes or the gate refuses what the client sends.
async fn pass(
    mut client: TcpStream,
    address: SocketAddr,
    upstream: SocketAddr,
    limits: GateLimits,
    peers: &Peers,
) -> Result<(), String> {
    let mut meter = FrameMeter::new(Some(limits.max_message_bytes));
    let Some(head) = read_head(&mut client, &mut meter, limits)
        .await
        .map_err(|error| error.to_string())?
    else {
        return Ok(());
    };
    let line = request_line(&head);
    if !requests_a_session(line) {
        let line = String::from_utf8_lossy(&line[..line.len().min(80)]).into_owned();
        answer(&mut client, "404 Not Found", SESSION_ONLY).await;
        return Err(format!("refused `{line}`: {SESSION_ONLY}"));
    }
    let server = TcpStream::connect(upstream)
        .await
        .map_err(|error| format!("reaching the device server: {error}"))?;
    for stream in [&client, &server] {
        stream
            .set_nodelay(true)
            .map_err(|error| error.to_string())?;
    }
    let upstream_address = server.local_addr().map_err(|error| error.to_string())?;
    peers.lock().insert(upstream_address, address);
    let _registered = Registered {
        peers,
        upstream: upstream_address,
    };

    let (client_read, client_write) = client.into_split();
    let (server_read, mut server_write) = server.into_split();
    server_write
        .write_all(&head)
        .await
        .map_err(|error| error.to_string())?;
    let (refused, refusal) = watch::channel(None);
    let requests = forward_requests(client_read, server_write, meter);
    let responses = forward_responses(server_read, client_write, refusal);
    let mut requests = std::pin::pin!(requests);
    let mut responses = std::pin::pin!(responses);
    tokio::select! {
        // The server closed: nothing more can pass.
        ended = &mut responses => ended.map_err(|error| error.to_string()),
        ended = &mut requests => match ended {
            // The server ends the session once it sees the client gone; a connection it keeps
            // waiting on is not kept for it.
            Ok(ClientEnd::Closed) => {
                match tokio::time::timeout(CLOSE_GRACE, responses).await {
                    Ok(ended) => ended.map_err(|error| error.to_string()),
                    Err(_) => Err("the server kept a closed client's connection open".into()),
                }
            }
            Ok(ClientEnd::Refused(refusal)) => {
                let reason = refusal.to_string();
                let _ = refused.send(Some(reason.clone()));
                // The close frame goes out once the server's frame in flight has ended.
                let _ = responses.await;
                Err(reason)
            }
            Err(error) => Err(error.to_string()),
        },
    }
}

/// The client's handshake head (and whatever followed it in the same reads), read within the
/// handshake timeout through `meter`; `None` when the client closed before sending it all.
async fn read_head(
    client: &mut TcpStream,
    meter: &mut FrameMeter,
    limits: GateLimits,
) -> std::io::Result<Option<Vec<u8>>> {
    let deadline = Instant::now() + limits.handshake_timeout;
    let mut head = Vec::new();
    let mut buffer = [0; 4096];
    while meter.in_http_head() {
        let read = tokio::time::timeout_at(deadline, client.read(&mut buffer))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no handshake within {:?}", limits.handshake_timeout),
                )
            })??;
        if read == 0 {
            return Ok(None);
        }
        meter
            .consume(&buffer[..read], false)
            .map_err(|refusal| std::io::Error::other(refusal.to_string()))?;
        head.extend_from_slice(&buffer[..read]);
    }
    Ok(Some(head))
}

/// Why the gate serves `/session` alone.
const SESSION_ONLY: &str = "this device server serves /session only: Burn's /data route, for \
     tensors moved between servers, checks no secret";

/// The request line of a handshake `head` (`GET /session HTTP/1.1`).
fn request_line(head: &[u8]) -> &[u8] {
    head.split(|&byte| byte == b'\r').next().unwrap_or_default()
}

/// Whether a request `line` asks for the `/session` route.
fn requests_a_session(line: &[u8]) -> bool {
    let mut parts = line.split(|&byte| byte == b' ');
    let (method, target) = (parts.next(), parts.next());
    let path = target.map(|target| {
        target
            .split(|&byte| byte == b'?')
            .next()
            .unwrap_or_default()
    });
    method == Some(b"GET".as_slice()) && path == Some(b"/session".as_slice())
}

/// Answers `client` with the HTTP `status` and `text`, and closes.
async fn answer(client: &mut TcpStream, status: &str, text: &str) {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{text}\n",
        text.len() + 1
    );
    let answered = async {
        client.write_all(response.as_bytes()).await?;
        client.shutdown().await
    };
    // A client that does not read its answer is not waited for.
    let _ = tokio::time::timeout(Duration::from_secs(1), answered).await;
}

/// Forwards what the client sends after its handshake to the server, frame by frame through
/// `meter`.
async fn forward_requests(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut meter: FrameMeter,
) -> std::io::Result<ClientEnd> {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            to.shutdown().await?;
            return Ok(ClientEnd::Closed);
        }
        if let Err(refusal) = meter.consume(&buffer[..read], false) {
            return Ok(ClientEnd::Refused(refusal));
        }
        to.write_all(&buffer[..read]).await?;
    }
}

/// Forwards what the server sends to the client; once `refusal` holds a reason, finishes the
/// frame in flight, then sends the client a close frame with that reason and closes.
async fn forward_responses(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut refusal: watch::Receiver<Option<String>>,
) -> std::io::Result<()> {
    let mut meter = FrameMeter::new(None);
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let reason = refusal.borrow().clone();
        if let Some(reason) = &reason
            && meter.at_frame_boundary()
        {
            to.write_all(&close_frame(MESSAGE_TOO_BIG, reason)).await?;
            return to.shutdown().await;
        }
        let read = if reason.is_some() {
            from.read(&mut buffer).await?
        } else {
            tokio::select! {
                read = from.read(&mut buffer) => read?,
                _ = refusal.changed() => continue,
            }
        };
        if read == 0 {
            return to.shutdown().await;
        }
        let passed = meter
            .consume(&buffer[..read], reason.is_some())
            .map_err(|refusal| std::io::Error::other(format!("the server sent {refusal}")))?;
        to.write_all(&buffer[..passed]).await?;
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    use burn_tensor::remote::{RemoteHost, RemoteOptions};
    use burn_tensor::{Device, Tensor, TensorData};
    use tungstenite::protocol::frame::coding::CloseCode;
    use tungstenite::{Message, WebSocket};

    use crate::server::{Access, BoundServer, ServeOptions, bind};
    use crate::{ExecutorKind, TrainiumDevice};

    /// A gated server of host device `index` on loopback, with `limits` applied to its options.
    fn server(index: u16, limits: impl FnOnce(&mut ServeOptions)) -> BoundServer {
        let mut options = ServeOptions::new(
            vec![TrainiumDevice::new(ExecutorKind::Host, index)],
            "127.0.0.1:0".parse().unwrap(),
            Access::Loopback,
        );
        limits(&mut options);
        bind(&options).unwrap()
    }

    /// A Burn device reaching the server at `address`, as `url_host` names it (Burn keeps one
    /// session per URL in a process).
    fn burn_client(url_host: &str, address: std::net::SocketAddr) -> Device {
        remote_device(url_host, address).init().unwrap()
    }

    /// The options of a Burn device reaching the server at `address` as `url_host` names it.
    fn remote_device(url_host: &str, address: std::net::SocketAddr) -> RemoteOptions {
        Device::remote_options(&RemoteHost::websocket(&format!(
            "ws://{url_host}:{}",
            address.port()
        )))
    }

    fn computes(device: &Device) -> bool {
        let sum = Tensor::<1>::ones([4], device).add_scalar(1.0).sum();
        sum.into_data().try_to_vec::<f32>().ok() == Some(vec![8.0])
    }

    /// A raw WebSocket client of the server's `/session` route.
    fn raw_client(address: std::net::SocketAddr) -> WebSocket<TcpStream> {
        let stream = TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        tungstenite::client(format!("ws://{address}/session"), stream)
            .map(|(socket, _)| socket)
            .unwrap_or_else(|error| panic!("handshake with {address}: {error}"))
    }

    /// Waits for `condition`, failing after 30 s with `what`.
    fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
        let start = Instant::now();
        while !condition() {
            assert!(start.elapsed() < Duration::from_secs(30), "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_message_over_the_limit_ends_its_connection_with_the_size_and_the_limit() {
        let device = TrainiumDevice::new(ExecutorKind::Host, 11);
        let address = server(11, |options| options.max_message_bytes = Some(64 * 1024))
            .serve_in_background()
            .unwrap();
        let bystander = burn_client("127.0.0.1", address);
        assert!(computes(&bystander));
        bystander.sync().unwrap();
        let before = crate::stats(&device).live_bytes;

        // A raw client sending 100 KiB in one frame gets a close frame naming both numbers.
        let mut raw = raw_client(address);
        raw.send(Message::binary(vec![0u8; 100 * 1024])).unwrap();
        let close = loop {
            match raw.read() {
                Ok(Message::Close(frame)) => break frame.expect("a close frame with a reason"),
                Ok(_) => continue,
                Err(error) => panic!("the connection ended without a close frame: {error}"),
            }
        };
        assert_eq!(close.code, CloseCode::Size);
        assert!(
            close.reason.contains("102400 bytes") && close.reason.contains("65536 bytes"),
            "{}",
            close.reason
        );

        // A Burn client uploading 1 MiB loses its session, and what it held is freed.
        let client = burn_client("localhost", address);
        let held = Tensor::<1>::ones([1024], &client);
        assert_eq!(held.clone().sum().into_scalar::<f32>(), 1024.0);
        let big =
            Tensor::<1>::from_data(TensorData::new(vec![1.0f32; 1 << 18], [1 << 18]), &client);
        assert!(big.sum().try_into_data().is_err());
        eventually("the refused session's tensors are freed", || {
            crate::stats(&device).live_bytes == before
        });
        assert!(computes(&bystander), "another session goes on");
    }

    #[test]
    fn connections_past_the_limit_are_answered_503_until_one_closes() {
        let address = server(12, |options| options.max_connections = Some(2))
            .serve_in_background()
            .unwrap();
        let first = raw_client(address);
        let _second = raw_client(address);
        let third = TcpStream::connect(address).unwrap();
        third
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let refused = tungstenite::client(format!("ws://{address}/session"), third)
            .map(|_| ())
            .expect_err("a third connection is refused");
        match refused {
            tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 503);
                let body =
                    String::from_utf8_lossy(response.body().as_deref().unwrap_or(&[])).into_owned();
                assert!(
                    body.contains("2 connections") && body.contains("--max-connections"),
                    "{body}"
                );
            }
            other => panic!("refused otherwise: {other:?}"),
        }
        drop(first);
        eventually("a closed connection's slot is given back", || {
            let stream = TcpStream::connect(address).unwrap();
            tungstenite::client(format!("ws://{address}/session"), stream).is_ok()
        });
    }

    #[test]
    fn a_connection_without_a_handshake_is_closed_and_frees_its_slot() {
        let address = server(13, |options| options.max_connections = Some(1))
            .with_handshake_timeout(Duration::from_millis(300))
            .serve_in_background()
            .unwrap();
        let mut silent = TcpStream::connect(address).unwrap();
        // Half a request head, then nothing.
        silent.write_all(b"GET /session HTTP/1.1\r\n").unwrap();
        silent
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut rest = Vec::new();
        let read = silent.read_to_end(&mut rest);
        assert!(
            matches!(read, Ok(0)) || read.is_err(),
            "the gate closes it: {read:?}"
        );
        // The slot is freed once the gate has seen the close, so the first tries may still be
        // answered 503 (a refusal Burn's client reports as one to try again).
        let mut device = None;
        eventually("the slot comes back", || {
            device = remote_device("127.0.0.1", address).init().ok();
            device.is_some()
        });
        assert!(computes(&device.unwrap()));
    }

    /// Burn's `/data` route (tensors moved between servers) checks no secret: the gate answers it
    /// `404`, and whatever else is not the `/session` handshake, and the sessions go on.
    #[test]
    fn only_the_session_route_is_served() {
        let address = server(15, |_| ()).serve_in_background().unwrap();
        for request in [
            "GET /data HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n",
            "POST /session HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /sessions HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            let mut stream = TcpStream::connect(address).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            stream.write_all(request.as_bytes()).unwrap();
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer);
            assert!(
                answer.starts_with("HTTP/1.1 404") && answer.contains("/session only"),
                "{request:?}: {answer:?}"
            );
        }
        let stream = TcpStream::connect(address).unwrap();
        tungstenite::client(format!("ws://{address}/session?client=1"), stream)
            .expect("a session with a query string is served");
        assert!(computes(&burn_client("127.0.0.1", address)));
    }

    #[test]
    fn a_session_that_goes_around_the_gate_is_refused() {
        let server = server(14, |_| ());
        let own = server.own_addr();
        let address = server.serve_in_background().unwrap();
        assert!(computes(&burn_client("127.0.0.1", address)));
        let around = Device::remote_options(&RemoteHost::websocket(&format!("ws://{own}")))
            .init()
            .map_err(|error| error.to_string())
            .and_then(|device| {
                std::panic::catch_unwind(|| computes(&device))
                    .map_err(|_| "refused on first use".to_string())
            });
        assert!(
            !matches!(around, Ok(true)),
            "a client that skipped the gate computed"
        );
    }
}
