//! Liveness of the job's processes, as torchrun's agent watches its workers: every rank keeps a
//! TCP connection to rank 0's listener. A connection that closes before its process said it
//! leaves means the process is lost; rank 0 tells every other rank which one, and a rank whose
//! connection to rank 0 closes knows rank 0 is lost. Exchanges poll [`Monitor::loss`], so a lost
//! process becomes an error naming its rank within a fraction of a second.
//!
//! Lines on a connection: `join R` (rank R connects), `ready` (every rank joined), `lost K`
//! (rank 0: rank K was lost), `leave` (a rank is done), `bye` (rank 0 is done). Each rank also
//! opens a second connection, greeted `data R`, which [`super::exchange`] moves tensors on.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{DistributedError, Peers};

/// How long rank 0 waits for the other ranks to leave before it goes (and the orchestrator
/// they may still use with it).
const LEAVE_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause between attempts to reach rank 0.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// What the connection threads found out.
#[derive(Default)]
struct Health {
    /// The first process found lost, and how.
    lost: Option<(usize, String)>,
    /// Ranks that said they leave (rank 0's view).
    left: HashSet<usize>,
}

/// Shared between the monitor and its connection threads.
#[derive(Default)]
struct Shared {
    health: Mutex<Health>,
    changed: Condvar,
    /// This process is leaving: connections closing now are expected.
    leaving: AtomicBool,
}

impl Shared {
    fn lose(&self, rank: usize, reason: String) {
        let mut health = self.health.lock().expect("health lock");
        if health.lost.is_none() && !self.leaving.load(Ordering::SeqCst) {
            log::error!("rank {rank} was lost: {reason}");
            health.lost = Some((rank, reason));
        }
        self.changed.notify_all();
    }
}

/// This process's connections to the others (rank 0: to every rank; others: to rank 0).
pub(crate) struct Monitor {
    rank: usize,
    world_size: usize,
    shared: Arc<Shared>,
    /// Where to write: `(rank, connection)`.
    links: Arc<Mutex<Vec<(usize, TcpStream)>>>,
}

impl Monitor {
    /// Connects the job: rank 0 listens on the master port until every rank joined; the others
    /// connect to it. Waits at most `timeout`. Returns the monitor and the data connections
    /// (rank 0: one per other rank; the others: one to rank 0) for [`super::exchange`].
    pub fn connect(
        peers: &Peers,
        timeout: Duration,
    ) -> Result<(Self, Vec<(usize, TcpStream)>), DistributedError> {
        let deadline = Instant::now() + timeout;
        let monitor = Monitor {
            rank: peers.rank,
            world_size: peers.world_size,
            shared: Arc::new(Shared::default()),
            links: Arc::new(Mutex::new(Vec::new())),
        };
        let join_error = |reason: String| DistributedError::Join {
            rank: peers.rank,
            reason,
        };
        let data = if peers.rank == 0 {
            monitor.accept_ranks(peers, deadline).map_err(join_error)?
        } else {
            monitor
                .reach_rank_zero(peers, deadline)
                .map_err(join_error)?
        };
        Ok((monitor, data))
    }

    /// The first process found lost, as an error.
    pub fn loss(&self) -> Option<DistributedError> {
        let health = self.shared.health.lock().expect("health lock");
        health
            .lost
            .as_ref()
            .map(|(rank, reason)| DistributedError::Lost {
                rank: *rank,
                reason: reason.clone(),
            })
    }

    /// Closes this process's liveness connections as its death would (for tests in one process,
    /// where a "dead" rank's threads live on).
    #[cfg(test)]
    pub fn sever(&self) {
        for (_, link) in self.links.lock().expect("links lock").iter() {
            let _ = link.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Says this process is done. Rank 0 first waits (bounded) for the others to say so.
    pub fn leave(&self) {
        if self.rank == 0 {
            let others = self.world_size - 1;
            let health = self.shared.health.lock().expect("health lock");
            let (health, _) = self
                .shared
                .changed
                .wait_timeout_while(health, LEAVE_TIMEOUT, |health| {
                    health.left.len() < others && health.lost.is_none()
                })
                .expect("health lock");
            if health.left.len() < others && health.lost.is_none() {
                log::warn!(
                    "rank 0 leaves the job while {} of {others} ranks have not",
                    others - health.left.len()
                );
            }
        }
        self.shared.leaving.store(true, Ordering::SeqCst);
        let line = if self.rank == 0 { "bye" } else { "leave" };
        for (_, link) in self.links.lock().expect("links lock").iter_mut() {
            // A rank that is already gone cannot be told.
            let _ = writeln!(link, "{line}");
        }
    }

    /// Rank 0: accepts two connections from every other rank (its liveness line and its data),
    /// then tells them all to start.
    fn accept_ranks(
        &self,
        peers: &Peers,
        deadline: Instant,
    ) -> Result<Vec<(usize, TcpStream)>, String> {
        let listener = TcpListener::bind(("0.0.0.0", peers.master_port))
            .map_err(|error| format!("listening on port {}: {error}", peers.master_port))?;
        listener
            .set_nonblocking(true)
            .map_err(|error| error.to_string())?;
        let mut readers = Vec::new();
        let mut data = Vec::new();
        let others = peers.world_size - 1;
        while readers.len() < others || data.len() < others {
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = (1..peers.world_size)
                            .filter(|rank| {
                                !readers.iter().any(|(joined, _)| joined == rank)
                                    || !data.iter().any(|(joined, _)| joined == rank)
                            })
                            .map(|rank| rank.to_string())
                            .collect();
                        return Err(format!(
                            "ranks {} did not connect to port {} in time",
                            missing.join(", "),
                            peers.master_port
                        ));
                    }
                    std::thread::sleep(RETRY_PAUSE);
                    continue;
                }
                Err(error) => return Err(format!("accepting a rank: {error}")),
            };
            let (kind, rank, reader) = read_greeting(stream, peers.world_size, deadline)?;
            let twice = match kind {
                Greeting::Join => readers.iter().any(|(joined, _)| *joined == rank),
                Greeting::Data => data.iter().any(|(joined, _)| *joined == rank),
            };
            if twice {
                return Err(format!("rank {rank} connected twice"));
            }
            match kind {
                Greeting::Join => readers.push((rank, reader)),
                Greeting::Data => data.push((rank, reader.into_inner())),
            }
        }
        for (rank, reader) in &readers {
            let mut link = reader.get_ref().try_clone().map_err(|e| e.to_string())?;
            writeln!(link, "ready").map_err(|error| format!("starting rank {rank}: {error}"))?;
            self.links.lock().expect("links lock").push((*rank, link));
        }
        for (rank, reader) in readers {
            let shared = Arc::clone(&self.shared);
            let links = Arc::clone(&self.links);
            std::thread::Builder::new()
                .name(format!("trainium-monitor-{rank}"))
                .spawn(move || watch_rank(rank, reader, &shared, &links))
                .map_err(|error| error.to_string())?;
        }
        data.sort_by_key(|(rank, _)| *rank);
        Ok(data)
    }

    /// Another rank: connects to rank 0 twice (retrying until `deadline`) and waits for the
    /// start.
    fn reach_rank_zero(
        &self,
        peers: &Peers,
        deadline: Instant,
    ) -> Result<Vec<(usize, TcpStream)>, String> {
        let connect = |greeting: &str| -> Result<TcpStream, String> {
            let address = (peers.master_addr.as_str(), peers.master_port);
            let mut stream = loop {
                match TcpStream::connect(address) {
                    Ok(stream) => break stream,
                    Err(error) if Instant::now() >= deadline => {
                        return Err(format!(
                            "rank 0 at {}:{} could not be reached in time: {error}",
                            peers.master_addr, peers.master_port
                        ));
                    }
                    Err(_) => std::thread::sleep(RETRY_PAUSE),
                }
            };
            writeln!(stream, "{greeting} {}", peers.rank).map_err(|error| error.to_string())?;
            Ok(stream)
        };
        let stream = connect("join")?;
        let data = connect("data")?;
        let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
        let line = read_line_before(&mut reader, deadline)
            .map_err(|error| format!("waiting for every rank to join: {error}"))?;
        if line != "ready" {
            return Err(format!("rank 0 answered `{line}` instead of `ready`"));
        }
        self.links.lock().expect("links lock").push((0, stream));
        let shared = Arc::clone(&self.shared);
        std::thread::Builder::new()
            .name("trainium-monitor-0".into())
            .spawn(move || watch_rank_zero(reader, &shared))
            .map_err(|error| error.to_string())?;
        Ok(vec![(0, data)])
    }
}

/// What a new connection is for.
enum Greeting {
    /// The liveness line of a rank.
    Join,
    /// The data connection of a rank.
    Data,
}

/// Reads the first line of a new connection: `join R` or `data R`.
fn read_greeting(
    stream: TcpStream,
    world_size: usize,
    deadline: Instant,
) -> Result<(Greeting, usize, BufReader<TcpStream>), String> {
    stream
        .set_nonblocking(false)
        .map_err(|error| error.to_string())?;
    let mut reader = BufReader::new(stream);
    let line = read_line_before(&mut reader, deadline)?;
    let parsed = line.split_once(' ').and_then(|(kind, rank)| {
        let kind = match kind {
            "join" => Greeting::Join,
            "data" => Greeting::Data,
            _ => return None,
        };
        let rank = rank.parse::<usize>().ok()?;
        (1..world_size).contains(&rank).then_some((kind, rank))
    });
    let (kind, rank) = parsed.ok_or_else(|| {
        format!(
            "a connection said `{line}` instead of `join RANK` or `data RANK` (1..{world_size})"
        )
    })?;
    Ok((kind, rank, reader))
}

/// One line, without its end, read before `deadline`.
fn read_line_before(
    reader: &mut BufReader<TcpStream>,
    deadline: Instant,
) -> Result<String, String> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    reader
        .get_ref()
        .set_read_timeout(Some(left))
        .map_err(|error| error.to_string())?;
    let mut line = String::new();
    let read = reader
        .read_line(&mut line)
        .map_err(|error| error.to_string())?;
    reader
        .get_ref()
        .set_read_timeout(None)
        .map_err(|error| error.to_string())?;
    if read == 0 {
        return Err("the connection closed".into());
    }
    Ok(line.trim_end().to_string())
}

/// Rank 0's thread for rank `rank`'s connection: records its leave, or its loss (and tells the
/// other ranks).
fn watch_rank(
    rank: usize,
    mut reader: BufReader<TcpStream>,
    shared: &Shared,
    links: &Mutex<Vec<(usize, TcpStream)>>,
) {
    let mut line = String::new();
    loop {
        line.clear();
        let ended = match reader.read_line(&mut line) {
            Ok(0) => Some("its connection to rank 0 closed before it left the job".to_string()),
            Ok(_) if line.trim_end() == "leave" => {
                let mut health = shared.health.lock().expect("health lock");
                health.left.insert(rank);
                shared.changed.notify_all();
                return;
            }
            Ok(_) => None,
            Err(error) => Some(format!("its connection to rank 0 failed: {error}")),
        };
        if let Some(reason) = ended {
            shared.lose(rank, reason);
            for (other, link) in links.lock().expect("links lock").iter_mut() {
                if *other != rank {
                    let _ = writeln!(link, "lost {rank}");
                }
            }
            return;
        }
    }
}

/// Another rank's thread for its connection to rank 0: a loss rank 0 reports, rank 0's own
/// loss, or its goodbye.
fn watch_rank_zero(mut reader: BufReader<TcpStream>, shared: &Shared) {
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => {
                shared.lose(0, "its connection closed before it left the job".into());
                return;
            }
            Ok(_) => {
                let text = line.trim_end();
                if text == "bye" {
                    shared.leaving.store(true, Ordering::SeqCst);
                    return;
                }
                if let Some(rank) = text.strip_prefix("lost ").and_then(|r| r.parse().ok()) {
                    shared.lose(rank, "rank 0 found its connection closed".into());
                }
            }
            Err(error) => {
                shared.lose(0, format!("the connection to it failed: {error}"));
                return;
            }
        }
    }
}
