//! Moving replicas' data between processes, for the `host` executor: every rank sends the bytes
//! of its replicas to rank 0 on its data connection, rank 0 answers each with every replica's.
//! Bytes are moved, never recomputed, so a gather is bit-exact for any type; each process then
//! computes its collective results from the same inputs in the same order as one process would.
//!
//! Frames: a little-endian `u64` count of replicas, then for each a `u64` length and its bytes.
//! Waiting for a frame polls the monitor, so a lost process ends the wait with its rank.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use burn_backend::TensorData;

use super::monitor::Monitor;
use super::{DistributedError, push_length_prefixed};

/// How often a waiting exchange checks whether a process was lost.
const POLL: Duration = Duration::from_millis(100);

/// This process's data connections (rank 0: one per other rank, by rank; others: to rank 0).
pub(crate) struct Exchange {
    rank: usize,
    links: Vec<(usize, TcpStream)>,
    timeout: Duration,
}

impl Exchange {
    /// The exchange over `links`, each wait bounded by `timeout`.
    pub fn new(
        rank: usize,
        links: Vec<(usize, TcpStream)>,
        timeout: Duration,
    ) -> Result<Self, DistributedError> {
        for (_, link) in &links {
            link.set_read_timeout(Some(POLL))
                .and_then(|()| link.set_nodelay(true))
                .map_err(|error| DistributedError::Join {
                    rank,
                    reason: format!("setting up a data connection: {error}"),
                })?;
        }
        Ok(Self {
            rank,
            links,
            timeout,
        })
    }

    /// Every replica's data from this process's (`local[i]` is replica `first + i` of `total`).
    /// The replicas of one tensor share shape and type.
    pub fn gather(
        &mut self,
        monitor: &Monitor,
        local: Vec<TensorData>,
        first: usize,
        total: usize,
    ) -> Result<Vec<TensorData>, DistributedError> {
        let Some(like) = local.first() else {
            return Ok(local);
        };
        let (shape, dtype) = (like.shape().clone(), like.dtype());
        let ours: Vec<Vec<u8>> = local.iter().map(|data| data.bytes().to_vec()).collect();
        let every = if self.rank == 0 {
            let mut every = vec![Vec::new(); total];
            for (index, bytes) in ours.into_iter().enumerate() {
                every[first + index] = bytes;
            }
            let local_count = local.len();
            for (rank, link) in &mut self.links {
                let theirs = receive(link, *rank, monitor, self.timeout)?;
                if theirs.len() != local_count {
                    return Err(mismatch(*rank, theirs.len(), local_count));
                }
                for (index, bytes) in theirs.into_iter().enumerate() {
                    every[*rank * local_count + index] = bytes;
                }
            }
            for (rank, link) in &mut self.links {
                send(link, *rank, &every)?;
            }
            every
        } else {
            let (_, link) = &mut self.links[0];
            send(link, 0, &ours)?;
            let every = receive(link, 0, monitor, self.timeout)?;
            if every.len() != total {
                return Err(mismatch(0, every.len(), total));
            }
            every
        };
        Ok(every
            .into_iter()
            .map(|bytes| TensorData::from_bytes_vec(bytes, shape.clone(), dtype))
            .collect())
    }
}

fn mismatch(rank: usize, found: usize, expected: usize) -> DistributedError {
    DistributedError::Collective(format!(
        "rank {rank} sent {found} replicas where {expected} were expected: the processes do not \
         run the same program"
    ))
}

/// Writes one frame of `replicas` to rank `rank`.
fn send(link: &mut TcpStream, rank: usize, replicas: &[Vec<u8>]) -> Result<(), DistributedError> {
    let mut frame = Vec::with_capacity(8 + replicas.iter().map(|r| 8 + r.len()).sum::<usize>());
    frame.extend_from_slice(&(replicas.len() as u64).to_le_bytes());
    for bytes in replicas {
        push_length_prefixed(&mut frame, bytes);
    }
    link.write_all(&frame)
        .map_err(|error| DistributedError::Lost {
            rank,
            reason: format!("sending to it failed: {error}"),
        })
}

/// Reads one frame from rank `rank`, polling the monitor while waiting.
fn receive(
    link: &mut TcpStream,
    rank: usize,
    monitor: &Monitor,
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, DistributedError> {
    let deadline = Instant::now() + timeout;
    let mut reader = Reader {
        link,
        rank,
        monitor,
        deadline,
        timeout,
    };
    let count = reader.length()?;
    (0..count)
        .map(|_| {
            let length = reader.length()?;
            let mut bytes = vec![0u8; length];
            reader.fill(&mut bytes)?;
            Ok(bytes)
        })
        .collect()
}

/// Reads exactly what it is asked, through read timeouts, until the deadline or a loss.
struct Reader<'a> {
    link: &'a mut TcpStream,
    rank: usize,
    monitor: &'a Monitor,
    deadline: Instant,
    timeout: Duration,
}

impl Reader<'_> {
    fn length(&mut self) -> Result<usize, DistributedError> {
        let mut bytes = [0u8; 8];
        self.fill(&mut bytes)?;
        usize::try_from(u64::from_le_bytes(bytes)).map_err(|_| {
            DistributedError::Collective(format!("rank {} sent an impossible length", self.rank))
        })
    }

    fn fill(&mut self, buffer: &mut [u8]) -> Result<(), DistributedError> {
        let mut filled = 0;
        while filled < buffer.len() {
            match self.link.read(&mut buffer[filled..]) {
                Ok(0) => return Err(self.lost("its connection closed")),
                Ok(read) => filled += read,
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    if let Some(loss) = self.monitor.loss() {
                        return Err(loss);
                    }
                    if Instant::now() >= self.deadline {
                        return Err(DistributedError::TimedOut {
                            what: format!("waiting for rank {}'s replicas", self.rank),
                            seconds: self.timeout.as_secs(),
                        });
                    }
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) => return Err(self.lost(&format!("reading from it failed: {error}"))),
            }
        }
        Ok(())
    }

    /// The connection to `rank` failed: the loss the monitor knows of (the first one, maybe
    /// another rank's, which made this one leave), else this rank's.
    fn lost(&self, reason: &str) -> DistributedError {
        // A rank that leaves because another was lost closes its connections right after
        // telling: give the news a moment to arrive.
        for _ in 0..10 {
            if let Some(loss) = self.monitor.loss() {
                return loss;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        DistributedError::Lost {
            rank: self.rank,
            reason: reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distributed::{Peers, free_base_port};
    use burn_backend::DType;

    fn peers(rank: usize, port: u16) -> Peers {
        Peers {
            rank,
            world_size: 2,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        }
    }

    /// Rank `rank` of a job of two, joined.
    fn joined(rank: usize, port: u16) -> (Monitor, Exchange) {
        let (monitor, links) =
            Monitor::connect(&peers(rank, port), Duration::from_secs(30)).unwrap();
        let exchange = Exchange::new(rank, links, Duration::from_secs(30)).unwrap();
        (monitor, exchange)
    }

    /// bf16 values whose bits a float sum would not keep: -0, a NaN payload, a subnormal.
    fn awkward(first: u16) -> TensorData {
        let bits = [first, 0x8000, 0x7fc3, 0x0001];
        let bytes = bits.iter().flat_map(|bits| bits.to_le_bytes()).collect();
        TensorData::from_bytes_vec(bytes, [2, 2], DType::BF16)
    }

    #[test]
    fn two_ranks_gather_every_replica_bit_for_bit() {
        let port = free_base_port();
        let rank1 = std::thread::spawn(move || {
            let (monitor, mut exchange) = joined(1, port);
            let every = exchange
                .gather(&monitor, vec![awkward(3), awkward(4)], 2, 4)
                .unwrap();
            monitor.leave();
            every
        });
        let (monitor, mut exchange) = joined(0, port);
        let every = exchange
            .gather(&monitor, vec![awkward(1), awkward(2)], 0, 4)
            .unwrap();
        let theirs = rank1.join().unwrap();
        monitor.leave();
        for replicas in [every, theirs] {
            let expected: Vec<TensorData> = (1..=4).map(awkward).collect();
            assert_eq!(replicas.len(), 4);
            for (found, expected) in replicas.iter().zip(&expected) {
                assert_eq!(found.bytes().to_vec(), expected.bytes().to_vec());
                assert_eq!(
                    (&found.shape(), found.dtype()),
                    (&expected.shape(), expected.dtype())
                );
            }
        }
    }

    #[test]
    fn a_rank_that_goes_away_is_named_by_the_one_waiting_for_it() {
        let port = free_base_port();
        let rank1 = std::thread::spawn(move || {
            // Joins, then drops its connections without leaving: a process that died.
            drop(joined(1, port));
        });
        let (monitor, mut exchange) = joined(0, port);
        rank1.join().unwrap();
        let error = exchange
            .gather(&monitor, vec![awkward(1)], 0, 2)
            .unwrap_err();
        assert!(
            matches!(error, DistributedError::Lost { rank: 1, .. }),
            "{error}"
        );
    }

    #[test]
    fn rank_zero_names_the_ranks_that_never_connected() {
        let error = match Monitor::connect(&peers(0, free_base_port()), Duration::from_millis(300))
        {
            Ok(_) => panic!("rank 0 joined a job without rank 1"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains("ranks 1 did not connect"), "{error}");
    }
}
