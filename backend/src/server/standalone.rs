//! Trainium devices served to other processes and machines (`hlat serve`).

use std::net::{SocketAddr, TcpListener};

use burn_ir::BackendIr;
use burn_remote::server::{BackendServer, WebSocketTransport};

use super::Access;
use super::gate::{self, GateLimits, Peers};
use crate::{BackendError, Trainium, TrainiumDevice};

/// What [`bind`] serves, where, and to whom.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The devices, in the order clients pick them by index
    /// (`RemoteOptions::device_index`).
    pub devices: Vec<TrainiumDevice>,
    /// The address to listen on (port 0: one the system picks).
    pub listen: SocketAddr,
    /// Who may open sessions.
    pub access: Access,
    /// The largest tensor, in bytes, a client may make on a served device
    /// ([`crate::set_max_tensor_bytes`]); `None`: `TRAINIUM_MAX_TENSOR_BYTES`, else the
    /// machine's physical memory.
    pub max_tensor_bytes: Option<u64>,
    /// The most bytes of live tensors one session may hold on a served device
    /// ([`crate::set_max_client_bytes`]); `None`: no limit but the device's.
    pub max_client_bytes: Option<u64>,
    /// The most client connections open at once; `None`: [`gate::DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: Option<usize>,
    /// The largest message a client may send, in bytes; `None`: the largest tensor allowed on a
    /// served device with 4 MiB to spare, at most Burn's own 1 GiB.
    pub max_message_bytes: Option<u64>,
}

impl ServeOptions {
    /// Serving `devices` on `listen` to whom `access` lets in, with the default limits.
    pub fn new(devices: Vec<TrainiumDevice>, listen: SocketAddr, access: Access) -> Self {
        Self {
            devices,
            listen,
            access,
            max_tensor_bytes: None,
            max_client_bytes: None,
            max_connections: None,
            max_message_bytes: None,
        }
    }

    /// The served devices, as a comma-separated list.
    fn described(&self) -> String {
        self.devices
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Devices bound to their listening address, not serving yet.
pub struct BoundServer {
    server: BackendServer<Trainium>,
    /// Where Burn's server listens: a loopback port of its own behind the gate, or the address
    /// clients reach.
    listener: TcpListener,
    /// The gate where clients connect, if the server has one.
    gate: Option<Gate>,
    address: SocketAddr,
    described: String,
}

/// A gate bound in front of Burn's server, not running yet.
struct Gate {
    /// The address clients reach.
    public: TcpListener,
    /// What it lets through.
    limits: GateLimits,
    /// The clients of its connections, which the server's authorizer reads.
    peers: std::sync::Arc<Peers>,
}

/// Checks `options` (a non-loopback address needs a shared secret; every device's executor must
/// open) and binds the listening address, with a gate there bounding connections and messages
/// (`gate`).
pub fn bind(options: &ServeOptions) -> Result<BoundServer, BackendError> {
    bind_with(options, true)
}

/// [`bind`], with the gate or without it (a server in this process, open only to its token).
pub(crate) fn bind_with(options: &ServeOptions, gated: bool) -> Result<BoundServer, BackendError> {
    let failed = |reason: String| BackendError::Server {
        device: options.described(),
        reason,
    };
    if options.devices.is_empty() {
        return Err(failed("no device to serve".to_string()));
    }
    options.access.check(&options.listen)?;
    for device in &options.devices {
        crate::check_device(device)?;
        if let Some(bytes) = options.max_tensor_bytes {
            crate::set_max_tensor_bytes(device, bytes);
        }
        if let Some(bytes) = options.max_client_bytes {
            crate::set_max_client_bytes(device, bytes);
        }
    }
    let bind_at = |listen: SocketAddr| {
        let listener = TcpListener::bind(listen)
            .map_err(|error| failed(format!("binding {listen}: {error}")))?;
        let address = listener
            .local_addr()
            .map_err(|error| failed(format!("reading the bound address: {error}")))?;
        Ok::<_, BackendError>((listener, address))
    };
    let (public, address) = bind_at(options.listen)?;
    let (listener, gate) = if gated {
        let (own, _) = bind_at((std::net::Ipv4Addr::LOCALHOST, 0).into())?;
        let limits = gate_limits(options);
        log::debug!("gate of {}: {limits:?}", options.described());
        let gate = Gate {
            public,
            limits,
            peers: std::sync::Arc::default(),
        };
        (own, Some(gate))
    } else {
        (public, None)
    };
    let peers = gate.as_ref().map(|gate| gate.peers.clone());
    let server = super::custom_ops::with_custom_ops(BackendServer::<Trainium>::new(
        options.devices.iter().copied(),
    ))
    .with_authorizer(options.access.authorizer(peers)?);
    Ok(BoundServer {
        server,
        listener,
        gate,
        address,
        described: options.described(),
    })
}

/// The gate's limits for `options`, once the devices' tensor limits are set.
fn gate_limits(options: &ServeOptions) -> GateLimits {
    let largest_tensor = options
        .devices
        .iter()
        .map(crate::capture::limits::max_tensor_bytes)
        .max()
        .unwrap_or(0);
    let max_message_bytes = options.max_message_bytes.unwrap_or_else(|| {
        largest_tensor
            .saturating_add(gate::MESSAGE_ENVELOPE_BYTES)
            .min(gate::BURN_MAX_MESSAGE_BYTES)
    });
    GateLimits::new(
        options
            .max_connections
            .unwrap_or(gate::DEFAULT_MAX_CONNECTIONS),
        max_message_bytes,
    )
}

impl BoundServer {
    /// The address clients reach (`ws://` it).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Where Burn's server itself listens (behind the gate, if there is one).
    #[cfg(test)]
    pub(crate) fn own_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener")
    }

    /// This server, its gate closing connections that send no handshake within `timeout`.
    #[cfg(test)]
    pub(crate) fn with_handshake_timeout(mut self, timeout: std::time::Duration) -> Self {
        if let Some(gate) = &mut self.gate {
            gate.limits.handshake_timeout = timeout;
        }
        self
    }

    /// Serves until Ctrl+C or SIGTERM, blocking the calling thread.
    pub fn serve(self) -> Result<(), BackendError> {
        log::info!("serving {} on ws://{}", self.described, self.address);
        let described = self.described;
        if let Some(gate) = self.gate {
            open_gate(gate, &self.listener, &described)?;
        }
        self.server
            .serve(WebSocketTransport::from_listener(self.listener))
            .map_err(|error| BackendError::Server {
                device: described,
                reason: error.to_string(),
            })
    }

    /// Serves on a Tokio runtime of its own in a background thread, for the life of the process
    /// (what tests and in-process tools use).
    pub fn serve_in_background(self) -> Result<SocketAddr, BackendError> {
        let address = self.address;
        if let Some(gate) = self.gate {
            open_gate(gate, &self.listener, &self.described)?;
        }
        run_in_background(self.server, self.listener, &self.described)?;
        Ok(address)
    }
}

/// Runs `gate` in front of Burn's server on `own`, in the background for the life of the
/// process.
fn open_gate(gate: Gate, own: &TcpListener, described: &str) -> Result<(), BackendError> {
    let Gate {
        public,
        limits,
        peers,
    } = gate;
    let failed = |reason: String| BackendError::Server {
        device: described.to_string(),
        reason,
    };
    let upstream = own
        .local_addr()
        .map_err(|error| failed(format!("reading the server's own address: {error}")))?;
    let name = format!("trainium-gate-{described}");
    spawn_runtime(&name, described, async move {
        let public = public
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(public))
            .map_err(|error| format!("listening: {error}"))?;
        gate::run(public, upstream, limits, peers).await;
        Ok(())
    })
}

/// Runs `server` on `listener` for the life of the process: on a Tokio runtime of its own, in a
/// background thread named after `described` (the devices it serves).
pub(crate) fn run_in_background<B: BackendIr>(
    server: BackendServer<B>,
    listener: TcpListener,
    described: &str,
) -> Result<(), BackendError> {
    let serving = server.serve_async(WebSocketTransport::from_listener(listener));
    let name = format!("trainium-server-{described}");
    spawn_runtime(&name, described, async move {
        serving.await.map_err(|error| error.to_string())
    })
}

/// Runs `task` on a one-worker Tokio runtime in a thread called `name`, logging why it stopped
/// if it fails; `described` names the served devices in an error.
fn spawn_runtime(
    name: &str,
    described: &str,
    task: impl Future<Output = Result<(), String>> + Send + 'static,
) -> Result<(), BackendError> {
    let failed = |reason: String| BackendError::Server {
        device: described.to_string(),
        reason,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|error| failed(format!("starting its runtime: {error}")))?;
    let thread = name.to_string();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            if let Err(error) = runtime.block_on(task) {
                log::error!("{thread} stopped: {error}");
            }
        })
        .map_err(|error| failed(format!("starting its thread: {error}")))?;
    Ok(())
}

/// Serves `options.devices` until Ctrl+C or SIGTERM, blocking the calling thread ([`bind`],
/// then [`BoundServer::serve`]).
pub fn serve(options: &ServeOptions) -> Result<(), BackendError> {
    bind(options)?.serve()
}

#[cfg(test)]
mod tests {
    use burn_tensor::remote::RemoteHost;
    use burn_tensor::{Device, Tensor};

    use super::*;

    fn options(listen: &str, access: Access) -> ServeOptions {
        ServeOptions::new(vec![TrainiumDevice::HOST], listen.parse().unwrap(), access)
    }

    fn connect(address: SocketAddr, credential: Option<&str>) -> Result<Device, String> {
        let mut host = RemoteHost::websocket(&format!("ws://{address}"));
        if let Some(credential) = credential {
            host = host.with_credential(credential);
        }
        Device::remote_options(&host)
            .init()
            .map_err(|error| error.to_string())
    }

    /// `device` computes: ones plus one, read back.
    fn computes(device: &Device) -> bool {
        let twos = Tensor::<1>::ones([3], device).add_scalar(1.0);
        twos.into_data().try_to_vec::<f32>().ok() == Some(vec![2.0; 3])
    }

    #[test]
    fn a_non_loopback_address_needs_a_shared_secret() {
        let error = bind(&options("0.0.0.0:0", Access::Loopback))
            .err()
            .expect("refused")
            .to_string();
        assert!(
            error.contains("0.0.0.0:0") && error.contains("--token-file"),
            "{error}"
        );
        let error = bind(&options("127.0.0.1:0", Access::Token(String::new())))
            .err()
            .expect("refused")
            .to_string();
        assert!(error.contains("empty"), "{error}");
    }

    #[test]
    fn only_clients_with_the_secret_get_in() {
        let server = bind(&options("127.0.0.1:0", Access::Token("s3cret".to_string()))).unwrap();
        let address = server.serve_in_background().unwrap();
        let device = connect(address, Some("s3cret")).expect("the right secret connects");
        assert!(computes(&device));
        for wrong in [None, Some("guess")] {
            let refused = connect(address, wrong).and_then(|device| {
                // A refusal may only show on first use.
                std::panic::catch_unwind(|| computes(&device))
                    .map_err(|_| "refused on first use".to_string())
            });
            assert!(
                !matches!(refused, Ok(true)),
                "a client with {wrong:?} computed on a server that wants a secret"
            );
        }
    }

    /// `count` tensors of 32 × 32 f32 (4 KiB each) on `device`, computed and kept.
    fn hold(device: &Device, count: usize) -> Vec<Tensor<2>> {
        (0..count)
            .map(|value| Tensor::<2>::full([32, 32], value as f32, device))
            .collect()
    }

    /// The error of reading `tensor`, which must fail.
    fn read_error(tensor: Tensor<2>) -> String {
        tensor
            .try_into_data()
            .expect_err("the read is refused")
            .to_string()
    }

    #[test]
    fn a_client_above_the_limits_is_refused_by_size_and_the_server_goes_on() {
        let mut options = options("127.0.0.1:0", Access::Loopback);
        options.devices = vec![TrainiumDevice::new(crate::ExecutorKind::Host, 7)];
        options.max_tensor_bytes = Some(4096);
        options.max_client_bytes = Some(4 * 4096);
        let address = bind(&options).unwrap().serve_in_background().unwrap();
        let client = connect(address, None).unwrap();

        let error = read_error(Tensor::<2>::zeros([32, 33], &client));
        assert!(
            error.contains("[32, 33]")
                && error.contains("4224 bytes")
                && error.contains("4096 bytes"),
            "{error}"
        );
        let absurd = read_error(Tensor::<2>::zeros([1 << 20, 1 << 20], &client).add_scalar(1.0));
        assert!(absurd.contains("4096 bytes"), "{absurd}");

        let held = hold(&client, 4);
        let error = read_error(Tensor::<2>::ones([32, 32], &client));
        assert!(
            error.contains("16384 bytes") && error.contains("--max-client-bytes"),
            "{error}"
        );
        // Another session (Burn keeps one per address and credential in a process).
        let other = Device::remote_options(&RemoteHost::websocket(&format!(
            "ws://localhost:{}",
            address.port()
        )))
        .init()
        .unwrap();
        let others = hold(&other, 4);
        for (value, tensor) in others.into_iter().enumerate() {
            assert_eq!(
                tensor.into_data().try_to_vec::<f32>().unwrap(),
                vec![value as f32; 1024]
            );
        }
        drop(held);
        assert_eq!(
            hold(&client, 4)[3]
                .clone()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap(),
            vec![3.0; 1024],
            "what a client frees it may take again"
        );
    }

    #[test]
    fn what_a_refused_operation_consumes_is_freed() {
        let device = TrainiumDevice::new(crate::ExecutorKind::Host, 8);
        let mut options = options("127.0.0.1:0", Access::Loopback);
        options.devices = vec![device];
        options.max_tensor_bytes = Some(4096);
        let address = bind(&options).unwrap().serve_in_background().unwrap();
        let client = connect(address, None).unwrap();
        client.sync().unwrap();
        let before = crate::stats(&device).live_bytes;
        let row = Tensor::<2>::ones([1, 1024], &client);
        let column = Tensor::<2>::ones([1024, 1], &client);
        // 4 MiB: refused, and both inputs consumed by it.
        let error = read_error(row + column);
        assert!(error.contains("4194304 bytes"), "{error}");
        client.sync().unwrap();
        assert_eq!(crate::stats(&device).live_bytes, before);
    }

    #[test]
    fn a_loopback_server_serves_loopback_clients_without_a_secret() {
        let address = bind(&options("127.0.0.1:0", Access::Loopback))
            .unwrap()
            .serve_in_background()
            .unwrap();
        let device = connect(address, None).expect("a loopback client connects");
        assert!(computes(&device));
    }
}
