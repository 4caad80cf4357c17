//! `hlat serve`: serves Trainium devices to other processes (and, with a shared secret, other
//! machines) as Burn 0.22 remote devices, through `burn_trainium::server`.
//!
//! A client reaches the `N`-th served device (in `--device` order, from 0) with
//! `RemoteHost::websocket("ws://ADDRESS")` and `RemoteOptions::device_index(N)`, presenting the
//! secret of `--token-file` with `RemoteHost::with_credential` when the server has one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn_trainium::server::{Access, ServeOptions};
use burn_trainium::{DEVICE_ENV, TrainiumDevice};
use clap::Args;

/// Arguments of `hlat serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// A device to serve, as TRAINIUM_DEVICE names one (`host`, `xla:0`, `xla:0-3`, `neuron:0`,
    /// ...). Give the flag several times or a comma-separated list to serve several devices;
    /// clients pick them by index in the order given (from 0). Devices of one executor may not
    /// share a core [default: TRAINIUM_DEVICE, else host:0].
    #[arg(long, value_name = "DEVICE", value_delimiter = ',')]
    device: Vec<String>,
    /// The IP address and port to listen on (port 0: one the system picks, printed). A
    /// non-loopback address (e.g. 0.0.0.0:3000) needs --token-file.
    #[arg(long, value_name = "ADDRESS:PORT", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// A file whose contents (trimmed) are the shared secret every client must present. Without
    /// it, only clients on this machine's loopback are let in.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// The largest tensor, in bytes, a client may make: an operation asking for more is refused
    /// before anything is allocated, and the client's read of it names the size and the limit
    /// [default: TRAINIUM_MAX_TENSOR_BYTES, else this machine's physical memory].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    max_tensor_bytes: Option<u64>,
    /// The most bytes of live tensors one client session may hold on a device: an operation
    /// that would take it above is refused before anything is allocated, and the client's
    /// read of it names what it holds and the limit [default: no limit but the device's].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    max_client_bytes: Option<u64>,
    /// The most client connections open at once: one more is answered `503 Service
    /// Unavailable` naming the limit, and a connection that has not sent its handshake within
    /// 10 s is closed [default: 64].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: Option<u64>,
    /// The largest message a client may send, in bytes: a larger one ends its connection with a
    /// close frame naming the size and the limit, before the server buffers it. What the server
    /// may buffer for clients is at most --max-connections × this [default: the largest tensor
    /// allowed (--max-tensor-bytes) plus 4 MiB, at most 1 GiB].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    max_message_bytes: Option<u64>,
}

/// Runs `hlat serve`: prints the address clients reach (`ws://ADDRESS:PORT`) on standard output
/// once the devices are open and the address bound, then serves until Ctrl+C or SIGTERM.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let devices = devices(&args.device)?;
    let access = match &args.token_file {
        Some(path) => Access::Token(read_secret(path)?),
        None => Access::Loopback,
    };
    let options = ServeOptions {
        max_tensor_bytes: args.max_tensor_bytes,
        max_client_bytes: args.max_client_bytes,
        max_connections: args.max_connections.map(|count| count as usize),
        max_message_bytes: args.max_message_bytes,
        ..ServeOptions::new(devices, args.listen, access)
    };
    let server = burn_trainium::server::bind(&options)
        .with_context(|| format!("hlat serve --listen {}", args.listen))?;
    println!("ws://{}", server.local_addr());
    std::io::Write::flush(&mut std::io::stdout()).context("writing the address")?;
    server.serve()?;
    Ok(())
}

/// The devices `--device` names, in order (`TRAINIUM_DEVICE`'s, else `host:0`, without it):
/// an invalid name, or two devices of one executor sharing a core, is an error naming them.
fn devices(names: &[String]) -> anyhow::Result<Vec<TrainiumDevice>> {
    let devices = if names.is_empty() {
        vec![TrainiumDevice::from_env().with_context(|| format!("{DEVICE_ENV} (no --device)"))?]
    } else {
        names
            .iter()
            .map(|name| {
                name.trim()
                    .parse::<TrainiumDevice>()
                    .with_context(|| format!("--device {name}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    for (position, device) in devices.iter().enumerate() {
        if let Some(other) = devices[..position]
            .iter()
            .find(|other| overlap(other, device))
        {
            bail!(
                "--device {other} and --device {device} share a core of `{}`: serve each core \
                 once",
                device.executor.name()
            );
        }
    }
    Ok(devices)
}

/// Whether `a` and `b` are devices of one executor with a replica in common.
fn overlap(a: &TrainiumDevice, b: &TrainiumDevice) -> bool {
    let range = |device: &TrainiumDevice| {
        let first = u32::from(device.index);
        first..first + u32::from(device.replicas)
    };
    let (a_range, b_range) = (range(a), range(b));
    a.executor == b.executor && a_range.start < b_range.end && b_range.start < a_range.end
}

/// The shared secret of `--token-file PATH`: its contents, trimmed, which must not be empty.
fn read_secret(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --token-file {}", path.display()))?;
    let secret = text.trim();
    if secret.is_empty() {
        bail!(
            "--token-file {}: the file is empty; write the shared secret into it",
            path.display()
        );
    }
    Ok(secret.to_string())
}
