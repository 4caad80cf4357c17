//! The job's key-value store, for PJRT plugins that join the processes of a job (they exchange
//! their topology through the `kv_*` callbacks of `PJRT_Client_Create`). Rank 0 holds the map
//! and serves it on the port [`KEY_VALUE_PORT_OFFSET`] above `MASTER_PORT`; the other ranks
//! connect for each request.
//!
//! Requests: an operation byte (`P` put, `G` get, `T` try-get), the key (`u64` length, bytes),
//! then a put's value (length, bytes) or a get's timeout (`u64` milliseconds). Answers: a status
//! byte ([`FOUND`] with the value as length and bytes, [`STORED`], [`MISSING`]). All integers
//! little-endian.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use trainium_ffi::pjrt::{KeyValueError, KeyValueStore};

use super::{DistributedError, Peers, push_length_prefixed};

/// How far above the launcher's `MASTER_PORT` rank 0 serves the store (the job's exchange is on
/// the port after `MASTER_PORT`, the Neuron collectives meet on the one after that).
pub const KEY_VALUE_PORT_OFFSET: u16 = 3;

const PUT: u8 = b'P';
const GET: u8 = b'G';
const TRY_GET: u8 = b'T';
/// The key holds a value, which follows.
const FOUND: u8 = 0;
/// The value was stored.
const STORED: u8 = 1;
/// No value under the key (in time, for a get).
const MISSING: u8 = 2;
/// The largest key or value the server accepts (plugins exchange topologies of a few KiB).
const LARGEST_ENTRY: u64 = 64 << 20;
/// How long the server waits for the bytes of a request.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The map rank 0 holds, and a signal for gets waiting on a key.
#[derive(Default)]
pub(crate) struct Entries {
    values: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
}

impl Entries {
    fn put(&self, key: &[u8], value: &[u8]) {
        let mut values = self.values.lock().expect("key-value lock");
        values.insert(key.to_vec(), value.to_vec());
        self.changed.notify_all();
    }

    fn get(&self, key: &[u8], timeout: Duration) -> Option<Vec<u8>> {
        let values = self.values.lock().expect("key-value lock");
        let (values, _) = self
            .changed
            .wait_timeout_while(values, timeout, |values| !values.contains_key(key))
            .expect("key-value lock");
        values.get(key).cloned()
    }

    fn try_get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.values
            .lock()
            .expect("key-value lock")
            .get(key)
            .cloned()
    }
}

/// The job's store as one process reaches it.
pub(crate) enum JobStore {
    /// Rank 0: the map itself (its server answers the others).
    Holder(Arc<Entries>),
    /// Another rank: requests to rank 0's server.
    Remote {
        /// Where rank 0 serves.
        address: (String, u16),
        /// How long a request may wait for the server to be there.
        connect_timeout: Duration,
    },
}

impl JobStore {
    /// This process's access to the store of the job `peers` describes; rank 0 starts serving
    /// it.
    pub fn start(peers: &Peers, connect_timeout: Duration) -> Result<Self, DistributedError> {
        let port = peers
            .master_port
            .checked_add(KEY_VALUE_PORT_OFFSET)
            .ok_or_else(|| {
                DistributedError::Invalid(format!(
                    "MASTER_PORT {} leaves no port {KEY_VALUE_PORT_OFFSET} above it for the \
                     job's key-value store",
                    peers.master_port
                ))
            })?;
        if peers.rank != 0 {
            return Ok(JobStore::Remote {
                address: (peers.master_addr.clone(), port),
                connect_timeout,
            });
        }
        let listener =
            TcpListener::bind(("0.0.0.0", port)).map_err(|error| DistributedError::Join {
                rank: 0,
                reason: format!("serving the key-value store on port {port}: {error}"),
            })?;
        let entries = Arc::new(Entries::default());
        let served = Arc::clone(&entries);
        std::thread::Builder::new()
            .name("key-value store".into())
            .spawn(move || serve(listener, served))
            .map_err(|error| DistributedError::Join {
                rank: 0,
                reason: format!("starting the key-value store: {error}"),
            })?;
        Ok(JobStore::Holder(entries))
    }
}

/// One request to rank 0's server: the answer's status and value.
fn request(
    address: &(String, u16),
    connect_timeout: Duration,
    message: &[u8],
    wait: Duration,
) -> Result<(u8, Vec<u8>), KeyValueError> {
    let unavailable = |error: std::io::Error| {
        KeyValueError::Unavailable(format!(
            "the job's key-value store at {}:{}: {error}",
            address.0, address.1
        ))
    };
    let deadline = Instant::now() + connect_timeout;
    let stream = loop {
        // Every address the host resolves to, in turn (`localhost` may be `::1` first).
        let attempt = (address.0.as_str(), address.1)
            .to_socket_addrs()
            .and_then(|addresses| {
                let mut last = std::io::Error::new(ErrorKind::NotFound, "the host has no address");
                for socket in addresses {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match TcpStream::connect_timeout(&socket, left.max(Duration::from_millis(10))) {
                        Ok(stream) => return Ok(stream),
                        Err(error) => last = error,
                    }
                }
                Err(last)
            });
        match attempt {
            Ok(stream) => break stream,
            Err(error) if Instant::now() >= deadline => return Err(unavailable(error)),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    stream
        .set_read_timeout(Some(wait + connect_timeout))
        .map_err(unavailable)?;
    let mut writer = BufWriter::new(&stream);
    writer
        .write_all(message)
        .and_then(|()| writer.flush())
        .map_err(unavailable)?;
    drop(writer);
    let mut reader = BufReader::new(&stream);
    let status = read_byte(&mut reader).map_err(unavailable)?;
    let value = match status {
        FOUND => read_bytes(&mut reader).map_err(unavailable)?,
        _ => Vec::new(),
    };
    Ok((status, value))
}

impl KeyValueStore for JobStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KeyValueError> {
        if let Some(size) = [key.len(), value.len()]
            .into_iter()
            .find(|&size| size as u64 > LARGEST_ENTRY)
        {
            return Err(KeyValueError::Unavailable(format!(
                "an entry of {size} bytes under `{}` (the job's store takes at most \
                 {LARGEST_ENTRY})",
                String::from_utf8_lossy(&key[..key.len().min(64)])
            )));
        }
        match self {
            JobStore::Holder(entries) => {
                entries.put(key, value);
                Ok(())
            }
            JobStore::Remote {
                address,
                connect_timeout,
            } => {
                let mut message = vec![PUT];
                push_length_prefixed(&mut message, key);
                push_length_prefixed(&mut message, value);
                request(address, *connect_timeout, &message, Duration::ZERO).map(drop)
            }
        }
    }

    fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, KeyValueError> {
        let found = match self {
            JobStore::Holder(entries) => entries.get(key, timeout),
            JobStore::Remote {
                address,
                connect_timeout,
            } => {
                let mut message = vec![GET];
                push_length_prefixed(&mut message, key);
                message.extend_from_slice(&(timeout.as_millis() as u64).to_le_bytes());
                match request(address, *connect_timeout, &message, timeout)? {
                    (FOUND, value) => Some(value),
                    _ => None,
                }
            }
        };
        found.ok_or_else(|| {
            KeyValueError::TimedOut(format!(
                "no process put `{}` within {timeout:?}",
                String::from_utf8_lossy(key)
            ))
        })
    }

    fn try_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KeyValueError> {
        match self {
            JobStore::Holder(entries) => Ok(entries.try_get(key)),
            JobStore::Remote {
                address,
                connect_timeout,
            } => {
                let mut message = vec![TRY_GET];
                push_length_prefixed(&mut message, key);
                match request(address, *connect_timeout, &message, Duration::ZERO)? {
                    (FOUND, value) => Ok(Some(value)),
                    _ => Ok(None),
                }
            }
        }
    }
}

/// Rank 0's server: one thread per connection, each answering one request.
fn serve(listener: TcpListener, entries: Arc<Entries>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let entries = Arc::clone(&entries);
        let spawned = std::thread::Builder::new()
            .name("key-value request".into())
            .spawn(move || {
                if let Err(error) = answer(&stream, &entries) {
                    log::warn!("the job's key-value store: a request failed: {error}");
                }
            });
        if let Err(error) = spawned {
            log::warn!("the job's key-value store: {error}");
        }
    }
}

/// Reads one request from `stream` and answers it.
fn answer(stream: &TcpStream, entries: &Entries) -> std::io::Result<()> {
    stream.set_read_timeout(Some(REQUEST_READ_TIMEOUT))?;
    let mut reader = BufReader::new(stream);
    let operation = read_byte(&mut reader)?;
    let key = read_bytes(&mut reader)?;
    let mut reply = Vec::new();
    let found = match operation {
        PUT => {
            entries.put(&key, &read_bytes(&mut reader)?);
            reply.push(STORED);
            None
        }
        GET => {
            let timeout = Duration::from_millis(read_u64(&mut reader)?);
            Some(entries.get(&key, timeout))
        }
        TRY_GET => Some(entries.try_get(&key)),
        other => {
            return Err(std::io::Error::other(format!(
                "unknown operation byte {other}"
            )));
        }
    };
    match found {
        Some(Some(value)) => {
            reply.push(FOUND);
            push_length_prefixed(&mut reply, &value);
        }
        Some(None) => reply.push(MISSING),
        None => {}
    }
    let mut writer = BufWriter::new(stream);
    writer.write_all(&reply)?;
    writer.flush()
}

fn read_byte(reader: &mut impl Read) -> std::io::Result<u8> {
    let mut byte = [0u8; 1];
    reader.read_exact(&mut byte)?;
    Ok(byte[0])
}

fn read_u64(reader: &mut impl Read) -> std::io::Result<u64> {
    let mut bytes = [0u8; 8];
    reader.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

fn read_bytes(reader: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let length = read_u64(reader)?;
    if length > LARGEST_ENTRY {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("an entry of {length} bytes (at most {LARGEST_ENTRY})"),
        ));
    }
    let mut bytes = vec![0u8; length as usize];
    reader.read_exact(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distributed::free_base_port;

    fn peers(rank: usize, port: u16) -> Peers {
        Peers {
            rank,
            world_size: 3,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        }
    }

    #[test]
    fn ranks_put_and_get_through_rank_0_and_a_get_waits_for_the_put() {
        let port = free_base_port();
        let holder = JobStore::start(&peers(0, port), Duration::from_secs(10)).unwrap();
        let first = JobStore::start(&peers(1, port), Duration::from_secs(10)).unwrap();
        let second = JobStore::start(&peers(2, port), Duration::from_secs(10)).unwrap();

        // Rank 2 waits for a key rank 1 puts a little later.
        let waiting = std::thread::spawn(move || {
            second
                .get(b"topology/1", Duration::from_secs(10))
                .map(|value| (value, second))
        });
        std::thread::sleep(Duration::from_millis(200));
        first.put(b"topology/1", b"\x00bytes\xff").unwrap();
        let (value, second) = waiting.join().unwrap().unwrap();
        assert_eq!(value, b"\x00bytes\xff");

        // Everyone sees what anyone put, rank 0 included; an empty value is a value.
        holder.put(b"empty", b"").unwrap();
        assert_eq!(second.try_get(b"empty").unwrap(), Some(Vec::new()));
        assert_eq!(
            holder.try_get(b"topology/1").unwrap().unwrap(),
            b"\x00bytes\xff"
        );
        assert_eq!(first.try_get(b"absent").unwrap(), None);

        // A get of a key nobody puts ends at its timeout, naming the key.
        let error = first
            .get(b"absent", Duration::from_millis(100))
            .unwrap_err();
        assert!(
            matches!(&error, KeyValueError::TimedOut(message) if message.contains("absent")),
            "{error}"
        );
    }

    #[test]
    fn a_store_nobody_serves_is_unavailable_in_bounded_time() {
        let port = free_base_port();
        let orphan = JobStore::start(&peers(1, port), Duration::from_millis(200)).unwrap();
        let started = Instant::now();
        let error = orphan.try_get(b"key").unwrap_err();
        assert!(matches!(error, KeyValueError::Unavailable(_)), "{error}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
