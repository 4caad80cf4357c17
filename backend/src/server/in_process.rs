//! A Trainium device served inside the calling process: `burn_trainium::device("xla:0")`.
//!
//! Burn 0.22 has no in-process transport for its remote target, so each device gets a
//! `BackendServer` on a loopback WebSocket: the listener is bound to `127.0.0.1:0` before the
//! device is returned (no port race), the server runs on a Tokio runtime of its own in a
//! background thread for the life of the process ([`super::BoundServer::serve_in_background`]),
//! and it opens sessions only for clients that present this process's random token.
//! `BackendServer::serve` is not used: it takes over Ctrl+C and SIGTERM, which a library must
//! not do.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Mutex, OnceLock};

use burn_tensor::Device;
use burn_tensor::remote::RemoteHost;

use super::Access;
use crate::{BackendError, TrainiumDevice};

/// A device served in this process: its address, the client device that first reached it, and
/// whether it is Burn's default device ([`set_default_device`]).
#[derive(Clone)]
struct Served {
    url: String,
    client: Option<Device>,
    default: bool,
}

/// The devices served in this process, by the device they serve.
static SERVED: OnceLock<Mutex<HashMap<TrainiumDevice, Served>>> = OnceLock::new();

/// The token every in-process server checks: random, drawn once per process.
fn process_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let bytes: [u8; 32] = rand::random();
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    })
}

/// The Burn device served by the project's executors in this process: `spec` is a device string
/// as `TRAINIUM_DEVICE` takes it (`host`, `xla:0`, `xla:0-3` for four replicas, `neuron:0`, ...).
///
/// The first call for a device opens its executor and starts its server; later calls return
/// another handle on the same server. Train with `device.autodiff()`.
///
/// ```no_run
/// let device = burn_trainium::device("xla:0")?;
/// let x = burn_tensor::Tensor::<2>::ones([2, 3], &device);
/// # Ok::<(), burn_trainium::BackendError>(())
/// ```
pub fn device(spec: &str) -> Result<Device, BackendError> {
    let trainium: TrainiumDevice = spec.parse()?;
    if lock_served()
        .get(&trainium)
        .is_some_and(|served| served.default)
    {
        return Ok(Device::default());
    }
    let url = serve_in_process(trainium)?;
    let device = connect(&url, &trainium.to_string())?;
    if let Some(served) = lock_served().get_mut(&trainium) {
        served.client.get_or_insert_with(|| device.clone());
    }
    Ok(device)
}

/// Waits until every device served in this process has applied what its clients sent so far
/// (a profile is finished only once no operation is still being captured).
pub(crate) fn sync_served() {
    let clients: Vec<(TrainiumDevice, Device)> = lock_served()
        .iter()
        .filter_map(|(trainium, served)| Some((*trainium, served.client.clone()?)))
        .collect();
    for (trainium, client) in clients {
        if let Err(error) = client.sync() {
            log::warn!("{trainium}: waiting for the served device failed: {error}");
        }
    }
}

fn lock_served() -> std::sync::MutexGuard<'static, HashMap<TrainiumDevice, Served>> {
    SERVED
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Makes the device `spec` names Burn's default device in this process and returns it: from then
/// on `Device::default()` (and every Burn program, loader or example that creates tensors on it)
/// is that device, as on `hlat serve` with `BURN_DEVICE=remote`, and [`device`] of `spec` returns
/// it too. Call it once, at the start of `main`, before the program starts threads: it sets
/// `BURN_DEVICE` and `BURN_REMOTE_ADDRESS`, which Burn reads for its default device.
///
/// The device is served on a loopback port open to every client of this machine without a
/// secret (as `hlat serve` by default): `Device::default()` presents none. It fails if another
/// device is the default already, or if `spec`'s device was served by [`device`] before (call
/// this first; tensors on that earlier handle live in another session).
///
/// ```no_run
/// let device = burn_trainium::set_default_device("xla:0")?;
/// assert!(device == burn_tensor::Device::default());
/// # Ok::<(), burn_trainium::BackendError>(())
/// ```
pub fn set_default_device(spec: &str) -> Result<Device, BackendError> {
    let trainium: TrainiumDevice = spec.parse()?;
    let refused = |reason: String| BackendError::Server {
        device: trainium.to_string(),
        reason,
    };
    let mut served = lock_served();
    if let Some((other, _)) = served
        .iter()
        .find(|(other, entry)| entry.default && **other != trainium)
    {
        return Err(refused(format!(
            "{other} is Burn's default device in this process already"
        )));
    }
    match served.get(&trainium) {
        Some(entry) if entry.default => {}
        Some(_) => {
            return Err(refused(
                "burn_trainium::device served it in this process before; call \
                 set_default_device first, at the start of the program"
                    .to_string(),
            ));
        }
        None => {
            let url = start_server(trainium, Access::Loopback)?;
            // SAFETY: Burn reads these variables for `Device::default()`; the documented use is
            // one call at the start of `main`, before other threads read the environment.
            unsafe {
                std::env::set_var(BURN_DEVICE_ENV, "remote");
                std::env::set_var(BURN_REMOTE_ADDRESS_ENV, &url);
            }
            log::info!("{trainium} is Burn's default device in this process ({url})");
            served.insert(
                trainium,
                Served {
                    url,
                    client: Some(Device::default()),
                    default: true,
                },
            );
        }
    }
    Ok(Device::default())
}

/// The variable Burn reads to pick its default backend.
const BURN_DEVICE_ENV: &str = "BURN_DEVICE";
/// The variable Burn reads for the address of its default remote device.
const BURN_REMOTE_ADDRESS_ENV: &str = "BURN_REMOTE_ADDRESS";

/// [`device`] of the device `TRAINIUM_DEVICE` names (`host:0` when unset).
pub fn device_from_env() -> Result<Device, BackendError> {
    let trainium = TrainiumDevice::from_env()?;
    device(&trainium.to_string())
}

/// The address of the server of `device` in this process, started on first use.
fn serve_in_process(device: TrainiumDevice) -> Result<String, BackendError> {
    let mut served = lock_served();
    if let Some(existing) = served.get(&device) {
        return Ok(existing.url.clone());
    }
    let url = start_server(device, Access::Token(process_token().to_string()))?;
    served.insert(
        device,
        Served {
            url: url.clone(),
            client: None,
            default: false,
        },
    );
    Ok(url)
}

/// Starts serving `device` in this process on a loopback port, to the clients `access` admits,
/// and returns its address (`ws://...`).
fn start_server(device: TrainiumDevice, access: Access) -> Result<String, BackendError> {
    batch_remote_operations();
    let options = super::ServeOptions::new(vec![device], (Ipv4Addr::LOCALHOST, 0).into(), access);
    // No gate, and no hop through one: the clients are this process's own.
    let address = super::standalone::bind_with(&options, false)?.serve_in_background()?;
    log::debug!("serving {device} in process on {address}");
    Ok(format!("ws://{address}"))
}

/// Burn's own Flex served in this process the way [`device`] serves a Trainium device (a
/// `BackendServer` on a loopback WebSocket, open to this process's token): the reference a
/// benchmark measures the route's own cost against (`hlat bench route`).
pub fn flex_device() -> Result<Device, BackendError> {
    static URL: Mutex<Option<String>> = Mutex::new(None);
    let failed = |reason: String| BackendError::Server {
        device: "flex".to_string(),
        reason,
    };
    batch_remote_operations();
    let mut served = URL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let url = match served.as_ref() {
        Some(url) => url.clone(),
        None => {
            let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .map_err(|error| failed(format!("binding a loopback port: {error}")))?;
            let address = listener
                .local_addr()
                .map_err(|error| failed(format!("reading the bound address: {error}")))?;
            let server =
                burn_remote::server::BackendServer::<burn_flex::Flex>::new([burn_flex::FlexDevice])
                    .with_authorizer(Access::Token(process_token().to_string()).authorizer(None)?);
            super::standalone::run_in_background(server, listener, "flex")?;
            served.insert(format!("ws://{address}")).clone()
        }
    };
    drop(served);
    connect(&url, "flex")
}

/// Operations Burn's remote client sends to a device in one message. Burn's default, 4, makes
/// a message of every few small operations, each handled by both sides' WebSocket runtimes:
/// Burn's modern-lstm as written (`hlat bench learner --tasks modern-lstm`, `host`, 2 cores)
/// ran in 14.4–21.4 s at 4 and 12.0–16.3 s at 32 to 128. A read or a sync sends what waits.
const REMOTE_FLUSH_THRESHOLD: usize = 64;

/// Burn's default [`REMOTE_FLUSH_THRESHOLD`].
const BURN_FLUSH_THRESHOLD: usize = 4;

/// Makes Burn's remote clients in this process send [`REMOTE_FLUSH_THRESHOLD`] operations a
/// message, unless the application chose otherwise: a `burn.toml` (or `BURN_*` variable) setting
/// another threshold is kept, and so is a configuration Burn read or was given before the first
/// in-process device (Burn's configuration is set once per process).
fn batch_remote_operations() {
    use burn_std::config::{BurnConfig, RuntimeConfig};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let config = BurnConfig::from_current_dir().override_from_env();
        if config.remote().flush_threshold != BURN_FLUSH_THRESHOLD {
            return;
        }
        // The configuration's fields are private: change the one field through its serde form.
        let batched = serde_json::to_value(&config).and_then(|mut value| {
            value["remote"]["flush_threshold"] = REMOTE_FLUSH_THRESHOLD.into();
            serde_json::from_value::<BurnConfig>(value)
        });
        match batched.map(BurnConfig::try_set) {
            Ok(true) => {
                log::debug!(
                    "Burn's remote clients send {REMOTE_FLUSH_THRESHOLD} operations a message"
                )
            }
            Ok(false) => log::debug!(
                "Burn's configuration was read before the first in-process device: its remote \
                 clients keep their flush threshold"
            ),
            Err(error) => log::warn!("could not batch Burn's remote operations: {error}"),
        }
    });
}

/// The Burn device reaching the in-process server at `url` with this process's token;
/// `described` names the served device in an error.
fn connect(url: &str, described: &str) -> Result<Device, BackendError> {
    let host = RemoteHost::websocket(url).with_credential(process_token());
    Device::remote_options(&host)
        .init()
        .map_err(|error| BackendError::Server {
            device: described.to_string(),
            reason: format!("connecting to {url}: {error}"),
        })
}
