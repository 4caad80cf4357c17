//! [`CheckpointWriter`]: publishes a run's checkpoints into its folder, either on the training
//! thread (the step loop waits until every byte is on disk) or, with `async_checkpoint`, on a
//! thread of its own while training goes on. At most one checkpoint is written in the background:
//! the next one waits for it. A checkpoint becomes the one a run resumes from only once complete
//! (`RunFolder::publish`: a temporary folder, renamed into place, then named by `newest`), so a
//! process killed at any moment of a background write resumes from the previous one.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Instant;

use hlat::checkpoint::run_folder::RunFolder;

use crate::error::TrainError;

use super::snapshot::CheckpointSnapshot;

/// A checkpoint the writer completed.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Written {
    /// The step it is the checkpoint of.
    pub step: u64,
    /// Its folder.
    pub dir: PathBuf,
}

/// A failed checkpoint write, with the step it was the checkpoint of.
#[derive(Debug)]
pub(super) struct WriteFailure {
    /// The step of the checkpoint.
    pub step: u64,
    /// What went wrong (naming the file or folder).
    pub error: TrainError,
}

/// What a finished write gives.
pub(super) type WriteOutcome = Result<Written, WriteFailure>;

/// Publishes checkpoints (see the module documentation).
pub(super) struct CheckpointWriter {
    folder: RunFolder,
    keep: usize,
    background: bool,
    in_flight: Option<InFlight>,
}

/// A checkpoint being written in the background.
struct InFlight {
    step: u64,
    thread: JoinHandle<Result<PathBuf, TrainError>>,
}

impl CheckpointWriter {
    /// A writer into `folder` keeping the newest `keep` complete checkpoints, writing in the
    /// background when `background` is set.
    pub fn new(folder: RunFolder, keep: usize, background: bool) -> Self {
        Self {
            folder,
            keep,
            background,
            in_flight: None,
        }
    }

    /// Whether checkpoints are written in the background.
    pub fn in_background(&self) -> bool {
        self.background
    }

    /// Publishes `snapshot`. A background write still under way (the caller waits for it before
    /// copying the next checkpoint) is waited for first and its outcome returned with this one's
    /// (this one's too when it is written here, on the training thread).
    pub fn publish(&mut self, snapshot: CheckpointSnapshot) -> Vec<WriteOutcome> {
        let mut outcomes: Vec<WriteOutcome> = self.wait().into_iter().collect();
        let step = snapshot.step;
        let (folder, keep) = (self.folder.clone(), self.keep);
        let write = move || folder.publish(step, keep, |dir| snapshot.write(dir));
        if !self.background {
            outcomes.push(outcome(step, write()));
            return outcomes;
        }
        let spawned = std::thread::Builder::new()
            .name(format!("checkpoint-{step}"))
            .spawn(write);
        match spawned {
            Ok(thread) => self.in_flight = Some(InFlight { step, thread }),
            Err(source) => outcomes.push(Err(WriteFailure {
                step,
                error: TrainError::Io {
                    path: self.folder.step_dir(step),
                    source,
                },
            })),
        }
        outcomes
    }

    /// The outcome of the background write, once it has finished (without waiting for it).
    pub fn finished(&mut self) -> Option<WriteOutcome> {
        match &self.in_flight {
            Some(in_flight) if in_flight.thread.is_finished() => self.wait(),
            _ => None,
        }
    }

    /// Waits for the background write, if one is under way, and returns its outcome; says in the
    /// log when it had to wait, and for how long.
    pub fn wait(&mut self) -> Option<WriteOutcome> {
        let in_flight = self.in_flight.take()?;
        let step = in_flight.step;
        let waited = Instant::now();
        let busy = !in_flight.thread.is_finished();
        if busy {
            log::info!("waiting for the checkpoint of step {step} to be written");
        }
        let result = in_flight.thread.join().unwrap_or_else(|panic| {
            let reason = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            Err(TrainError::Checkpoint {
                path: self.folder.step_dir(step),
                message: format!("the writer stopped: {reason}"),
            })
        });
        if busy {
            log::info!(
                "the checkpoint of step {step} was written {:.2} s later",
                waited.elapsed().as_secs_f64()
            );
        }
        Some(outcome(step, result))
    }
}

fn outcome(step: u64, result: Result<PathBuf, TrainError>) -> WriteOutcome {
    result
        .map(|dir| Written { step, dir })
        .map_err(|error| WriteFailure { step, error })
}

impl Drop for CheckpointWriter {
    /// A run never leaves a checkpoint half-written behind it on purpose: whoever drops the
    /// writer without waiting (an unwinding thread) still waits for the background write.
    fn drop(&mut self) {
        if let Some(Err(failure)) = self.wait() {
            log::error!(
                "the checkpoint of step {} was not written: {}",
                failure.step,
                failure.error
            );
        }
    }
}
