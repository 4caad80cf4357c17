//! Devices that span processes: one replicated device whose replicas live in several processes
//! (one per node, or per group of cores), as JAX's multi-process runtime arranges them.
//!
//! Every process of the job runs the same program (SPMD). After [`join`], a replicated device of
//! N replicas in a job of W processes holds replicas `rank × N/W .. (rank + 1) × N/W` in this
//! process: [`crate::collective`] groups still name global replicas, data given for every
//! replica keeps this process's share, and a read of every replica gathers the other processes'
//! (bit for bit, through rank 0). On `host` a collective gathers its inputs the same way and
//! computes from them as one process would; `neuron` and `xla` compile their collectives into
//! the program and leave them to the device's own library (the Neuron collectives, the PJRT
//! plugin's). A liveness connection from every rank to rank 0 turns a lost process into an error
//! naming its rank, instead of a wait that never ends.
//!
//! Rank 0 listens on the port after the job's `MASTER_PORT` (torchrun's own store listens on
//! `MASTER_PORT` itself) and serves the job's key-value store ([`share`], and the PJRT plugins'
//! callbacks) [`KEY_VALUE_PORT_OFFSET`] above it; the Neuron collectives meet between the two.
//!
//! burn-collective's multi-node all-reduce (Burn 0.21) was the first candidate for moving the
//! data; it hangs within a few calls on this machine: its tensor data service (burn-communication
//! 0.21, `TensorDataService::get_exposed_tensor_bytes`) looks for an exposed tensor, releases the
//! lock, and only then creates the `Notify` future it waits on, so an `expose` in between is
//! never seen.

mod exchange;
mod key_value;
mod monitor;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use burn_backend::TensorData;
use trainium_ffi::pjrt::{KeyValueError, KeyValueStore};

use crate::{BackendError, TrainiumDevice};
use exchange::Exchange;
use key_value::JobStore;
use monitor::Monitor;

pub use key_value::KEY_VALUE_PORT_OFFSET;

/// How long [`join`] waits for every process (seconds), unless set.
pub const JOIN_TIMEOUT_ENV: &str = crate::settings::JOIN_TIMEOUT.name;
/// How long one exchange between processes may take (seconds), unless set.
pub const EXCHANGE_TIMEOUT_ENV: &str = crate::settings::EXCHANGE_TIMEOUT.name;

pub(crate) const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(300);
pub(crate) const DEFAULT_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(1800);

/// This process's place in a job of several processes, as a launcher describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peers {
    /// This process's rank.
    pub rank: usize,
    /// Processes in the job.
    pub world_size: usize,
    /// Host of rank 0.
    pub master_addr: String,
    /// The launcher's port on rank 0's host (`MASTER_PORT`); rank 0 listens on the next one.
    pub master_port: u16,
}

/// Why processes could not join, or an exchange between them failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DistributedError {
    /// The peers are not a job (a rank outside the world), or a setting is unusable.
    #[error("invalid process group: {0}")]
    Invalid(String),
    /// This process already joined a job.
    #[error("this process already joined a job (rank {rank} of {world_size})")]
    AlreadyJoined {
        /// Its rank there.
        rank: usize,
        /// That job's size.
        world_size: usize,
    },
    /// Setting up the connections failed.
    #[error("joining the job as rank {rank}: {reason}")]
    Join {
        /// This process's rank.
        rank: usize,
        /// What failed.
        reason: String,
    },
    /// Another process stopped without leaving the job.
    #[error("rank {rank} was lost: {reason}")]
    Lost {
        /// The lost process's rank.
        rank: usize,
        /// How it was noticed.
        reason: String,
    },
    /// An exchange did not finish in time, though every process is still connected.
    #[error("{what} did not finish within {seconds} s (set {EXCHANGE_TIMEOUT_ENV} to wait longer)")]
    TimedOut {
        /// What was waited for.
        what: String,
        /// The limit.
        seconds: u64,
    },
    /// The processes disagree about an exchange.
    #[error("exchange between processes: {0}")]
    Collective(String),
}

/// The job this process joined.
pub(crate) struct Cluster {
    peers: Peers,
    /// How long a process waits for the others (`TRAINIUM_JOIN_TIMEOUT_S`).
    join_timeout: Duration,
    monitor: Monitor,
    exchange: Mutex<Exchange>,
    /// The store PJRT plugins joining the job exchange their topology through.
    key_value: Arc<JobStore>,
}

static CLUSTER: OnceLock<Arc<Cluster>> = OnceLock::new();

impl Cluster {
    /// Connects this process to the job `peers` describes (rank 0 listens on the port after
    /// `MASTER_PORT` and serves the key-value store), waiting up to `join_timeout`.
    fn connect(
        peers: Peers,
        join_timeout: Duration,
        exchange_timeout: Duration,
    ) -> Result<Self, DistributedError> {
        let port = peers.master_port.checked_add(1).ok_or_else(|| {
            DistributedError::Invalid(format!(
                "MASTER_PORT {} leaves no port after it to listen on",
                peers.master_port
            ))
        })?;
        let listener = Peers {
            master_port: port,
            ..peers.clone()
        };
        let key_value = Arc::new(JobStore::start(&peers, join_timeout)?);
        let (monitor, links) = Monitor::connect(&listener, join_timeout)?;
        let exchange = Exchange::new(peers.rank, links, exchange_timeout)?;
        Ok(Self {
            peers,
            join_timeout,
            monitor,
            exchange: Mutex::new(exchange),
            key_value,
        })
    }
}

/// Joins the job `peers` describes: connects to every other process (waiting up to
/// `TRAINIUM_JOIN_TIMEOUT_S`, default 300 s, for all of them). Replicated `host` devices opened
/// afterwards span the processes. Call it once, before the first tensor; a job of one process
/// joins nothing.
pub fn join(peers: Peers) -> Result<(), DistributedError> {
    if peers.world_size == 0 || peers.rank >= peers.world_size {
        return Err(DistributedError::Invalid(format!(
            "rank {} of {} processes",
            peers.rank, peers.world_size
        )));
    }
    if peers.world_size == 1 {
        return Ok(());
    }
    if let Some(cluster) = CLUSTER.get() {
        return Err(DistributedError::AlreadyJoined {
            rank: cluster.peers.rank,
            world_size: cluster.peers.world_size,
        });
    }
    let join_timeout = seconds_from_env(&crate::settings::JOIN_TIMEOUT, DEFAULT_JOIN_TIMEOUT)?;
    let exchange_timeout =
        seconds_from_env(&crate::settings::EXCHANGE_TIMEOUT, DEFAULT_EXCHANGE_TIMEOUT)?;
    let cluster = Arc::new(Cluster::connect(peers, join_timeout, exchange_timeout)?);
    log::info!(
        "joined a job of {} processes as rank {} (rank 0 at {}:{})",
        cluster.peers.world_size,
        cluster.peers.rank,
        cluster.peers.master_addr,
        cluster.peers.master_port
    );
    CLUSTER
        .set(cluster)
        .map_err(|cluster| DistributedError::AlreadyJoined {
            rank: cluster.peers.rank,
            world_size: cluster.peers.world_size,
        })
}

/// Leaves the job in order: tells the other processes this one is done (so its exit is not
/// reported as a loss); rank 0 first waits (bounded) for the others to leave. Nothing when this
/// process joined no job.
pub fn leave() {
    if let Some(cluster) = CLUSTER.get() {
        cluster.monitor.leave();
    }
}

/// The job this process joined, if any.
pub fn joined() -> Option<Peers> {
    CLUSTER.get().map(|cluster| cluster.peers.clone())
}

/// Every process's `ours` under `key`, by rank: each process publishes its own in the job's
/// key-value store and reads the others' (waiting up to `TRAINIUM_JOIN_TIMEOUT_S` for each, and
/// no longer once a process is lost). A process of no job gets its own alone. A key serves one
/// exchange: use a new one for each.
pub fn share(key: &str, ours: &[u8]) -> Result<Vec<Vec<u8>>, DistributedError> {
    match CLUSTER.get() {
        Some(cluster) => cluster.share(key, ours),
        None => Ok(vec![ours.to_vec()]),
    }
}

impl Cluster {
    /// [`share`] in this job.
    fn share(&self, key: &str, ours: &[u8]) -> Result<Vec<Vec<u8>>, DistributedError> {
        let rank_key = |rank: usize| format!("{key}/rank-{rank}");
        let ours_key = rank_key(self.peers.rank);
        self.key_value
            .put(ours_key.as_bytes(), ours)
            .map_err(|error| self.store_failure(&ours_key, error))?;
        (0..self.peers.world_size)
            .map(|rank| self.wait_for(&rank_key(rank)))
            .collect()
    }

    /// The value a process puts under `key`, waiting up to the join timeout, in slices, so that
    /// a process lost before it put it ends the wait at once.
    fn wait_for(&self, key: &str) -> Result<Vec<u8>, DistributedError> {
        let deadline = Instant::now() + self.join_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let error = match self.key_value.get(key.as_bytes(), left.min(SHARE_POLL)) {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            if let Some(lost) = self.monitor.loss() {
                return Err(lost);
            }
            if !matches!(error, KeyValueError::TimedOut(_)) || Instant::now() >= deadline {
                return Err(self.store_failure(key, error));
            }
        }
    }

    /// A failure of the job's store under `key`: the lost process behind it, if one was lost.
    fn store_failure(&self, key: &str, error: KeyValueError) -> DistributedError {
        self.monitor.loss().unwrap_or_else(|| {
            DistributedError::Collective(format!("sharing `{key}` between processes: {error}"))
        })
    }
}

/// Appends `bytes` to `frame` after their length (a little-endian `u64`): how the exchange's
/// frames and the key-value store's requests carry byte strings.
fn push_length_prefixed(frame: &mut Vec<u8>, bytes: &[u8]) {
    frame.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    frame.extend_from_slice(bytes);
}

/// How often [`share`] checks, while it waits, whether a process was lost.
const SHARE_POLL: Duration = Duration::from_secs(1);

/// Which replicas of a device this process holds, and how it reaches the others.
#[derive(Clone)]
pub(crate) struct ReplicaSpan {
    /// The global index of this process's first replica.
    pub first: usize,
    /// This process's replicas.
    pub local: usize,
    /// The device's replicas over every process.
    pub total: usize,
    cluster: Option<Arc<Cluster>>,
}

impl ReplicaSpan {
    /// Every replica in this process.
    pub fn local(replicas: usize) -> Self {
        Self {
            first: 0,
            local: replicas,
            total: replicas,
            cluster: None,
        }
    }

    /// The span of `device` in this process's job: a replicated device spans the processes, a
    /// single device (or a job of one process) stays in this process.
    pub fn of(device: &TrainiumDevice) -> Result<Self, BackendError> {
        let replicas = usize::from(device.replicas);
        let Some(cluster) = CLUSTER.get() else {
            return Ok(Self::local(replicas));
        };
        if replicas == 1 {
            return Ok(Self::local(1));
        }
        let world = cluster.peers.world_size;
        if !replicas.is_multiple_of(world) {
            return Err(BackendError::Unsupported {
                executor: device.executor.name(),
                what: format!(
                    "{device}: {replicas} replicas do not divide among the job's {world} processes"
                ),
            });
        }
        let local = replicas / world;
        Ok(Self {
            first: cluster.peers.rank * local,
            local,
            total: replicas,
            cluster: Some(Arc::clone(cluster)),
        })
    }

    /// Whether the device's replicas live in several processes.
    pub fn spans_processes(&self) -> bool {
        self.cluster.is_some()
    }

    /// The job the device spans (none when it stays in this process): this process's rank, the
    /// process count and the job's key-value store, as a PJRT client joining it takes them.
    pub fn distributed(&self) -> Option<trainium_ffi::pjrt::Distributed> {
        self.cluster
            .as_ref()
            .map(|cluster| trainium_ffi::pjrt::Distributed {
                node_id: cluster.peers.rank,
                num_nodes: cluster.peers.world_size,
                store: cluster.key_value.clone(),
            })
    }

    /// Every replica's data, given this process's (`local[i]` is replica `first + i`): the
    /// others come from their processes, bit for bit. Every process must ask in the same order.
    pub fn gather(&self, local: Vec<TensorData>) -> Result<Vec<TensorData>, DistributedError> {
        match &self.cluster {
            None => Ok(local),
            Some(cluster) => cluster.exchange.lock().expect("exchange lock").gather(
                &cluster.monitor,
                local,
                self.first,
                self.total,
            ),
        }
    }

    /// This process's share of data given for every replica.
    pub fn local_share(&self, mut every: Vec<TensorData>) -> Vec<TensorData> {
        every.truncate(self.first + self.local);
        every.split_off(self.first.min(every.len()))
    }
}

/// A duration in seconds read from `variable`, else `default`.
fn seconds_from_env(
    variable: &crate::settings::Variable,
    default: Duration,
) -> Result<Duration, DistributedError> {
    let name = variable.name;
    match variable.var() {
        Ok(text) => match text.trim().parse::<f64>() {
            Ok(seconds) if seconds > 0.0 && seconds.is_finite() => {
                Ok(Duration::from_secs_f64(seconds))
            }
            _ => Err(DistributedError::Invalid(format!(
                "{name}={text} is not a positive number of seconds"
            ))),
        },
        Err(_) => Ok(default),
    }
}

/// A free local port with the ports after it that a job uses free too, for tests.
#[cfg(test)]
pub(crate) fn free_base_port() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let free = |offset: u16| std::net::TcpListener::bind(("127.0.0.1", port + offset)).is_ok();
        if port < 65000 && (1..=KEY_VALUE_PORT_OFFSET).all(free) {
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank `rank` of a job of two on `port`, joined; waits of a minute at most.
    fn joined(rank: usize, port: u16) -> Cluster {
        let peers = Peers {
            rank,
            world_size: 2,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        };
        Cluster::connect(peers, Duration::from_secs(60), Duration::from_secs(60)).unwrap()
    }

    #[test]
    fn every_process_gets_every_value_by_rank() {
        let port = free_base_port();
        let rank1 = std::thread::spawn(move || {
            let cluster = joined(1, port);
            let every = cluster.share("test/values", b"one").unwrap();
            cluster.monitor.leave();
            every
        });
        let cluster = joined(0, port);
        let every = cluster.share("test/values", b"zero").unwrap();
        let theirs = rank1.join().unwrap();
        cluster.monitor.leave();
        let expected = vec![b"zero".to_vec(), b"one".to_vec()];
        assert_eq!(every, expected);
        assert_eq!(theirs, expected);
    }

    #[test]
    fn a_process_lost_before_it_shares_ends_the_wait_naming_it() {
        let port = free_base_port();
        let rank1 = std::thread::spawn(move || {
            // Joins, then goes away without sharing or leaving: a process that died.
            joined(1, port).monitor.sever();
        });
        let cluster = joined(0, port);
        rank1.join().unwrap();
        let started = Instant::now();
        let error = cluster.share("test/lost", b"zero").unwrap_err();
        assert!(
            matches!(error, DistributedError::Lost { rank: 1, .. }),
            "{error}"
        );
        // Not the minute a wait may take.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }
}
