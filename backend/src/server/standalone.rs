//! Trainium devices served to other processes and machines (`hlat serve`).

use std::net::{SocketAddr, TcpListener};

use burn_remote::server::{BackendServer, WebSocketTransport};

use super::Access;
use crate::{BackendError, Trainium, TrainiumDevice};

/// What [`serve`] serves, where, and to whom.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The devices, in the order clients pick them by index
    /// (`RemoteOptions::device_index`).
    pub devices: Vec<TrainiumDevice>,
    /// The address to listen on.
    pub listen: SocketAddr,
    /// Who may open sessions.
    pub access: Access,
}

/// Serves `options.devices` until Ctrl+C or SIGTERM, blocking the calling thread.
///
/// Refuses a non-loopback address without a shared secret, and checks every device's executor
/// before listening.
pub fn serve(options: &ServeOptions) -> Result<(), BackendError> {
    let described = || {
        options
            .devices
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let failed = |reason: String| BackendError::Server {
        device: described(),
        reason,
    };
    if options.devices.is_empty() {
        return Err(failed("no device to serve".to_string()));
    }
    options.access.check(&options.listen)?;
    for device in &options.devices {
        crate::check_device(device)?;
    }
    let listener = TcpListener::bind(options.listen)
        .map_err(|error| failed(format!("binding {}: {error}", options.listen)))?;
    let address = listener
        .local_addr()
        .map_err(|error| failed(format!("reading the bound address: {error}")))?;
    log::info!("serving {} on ws://{address}", described());
    super::custom_ops::with_collectives(BackendServer::<Trainium>::new(
        options.devices.iter().copied(),
    ))
    .with_authorizer(options.access.authorizer()?)
    .serve(WebSocketTransport::from_listener(listener))
    .map_err(|error| failed(error.to_string()))
}
