//! The layout of a training run's output folder, shared by the trainer (which writes it) and
//! [`crate::checkpoint::load_any`] (which reads the newest model from it).
//!
//! ```text
//! OUT/checkpoints/step-00000100/      one complete checkpoint per kept step
//!                  step-00000100/model/   the model in the native layout
//!                  step-00000100/state.json   written last: marks the checkpoint complete
//! OUT/checkpoints/newest              names the newest complete checkpoint folder
//! OUT/ranks/rank-01/checkpoints/...   process 1's share of each checkpoint, in a job of several
//! ```
//!
//! A checkpoint is written into a hidden temporary folder, renamed into place, and only then
//! named by `newest` (itself replaced atomically), so a run killed at any point leaves either the
//! previous or the new checkpoint, never a half-written one. Temporary folders and folders
//! without the completion marker are ignored, and cleared at the next publish.

use std::path::{Path, PathBuf};

/// Folder of the checkpoints under a run's output folder.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// Pointer file naming the newest complete checkpoint folder.
pub const NEWEST_FILE: &str = "newest";
/// The model inside a checkpoint folder, in the native layout of [`crate::checkpoint`].
pub const MODEL_DIR: &str = "model";
/// The file written last into a checkpoint folder: its presence marks the checkpoint complete.
pub const COMPLETION_MARKER: &str = "state.json";
/// Folder under a job's output folder holding the output folders of its processes but rank 0.
pub const RANKS_DIR: &str = "ranks";
const STEP_PREFIX: &str = "step-";
const TEMPORARY_PREFIX: &str = ".tmp-";

/// Errors of reading or writing a run folder.
#[derive(Debug, thiserror::Error)]
pub enum RunFolderError {
    /// A file-system operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A checkpoint writer returned without writing the completion marker.
    #[error("{}: the checkpoint writer left no {COMPLETION_MARKER}", path.display())]
    Incomplete {
        /// The temporary checkpoint folder.
        path: PathBuf,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> RunFolderError {
    let path = path.to_path_buf();
    move |source| RunFolderError::Io { path, source }
}

/// The output folder of process `rank` of a job writing to `out`: `out` itself for rank 0,
/// `out/ranks/rank-RR` for the others. Each process writes its own metrics there and its share of
/// every checkpoint, with a completion marker of its own.
pub fn rank_output(out: &Path, rank: usize) -> PathBuf {
    match rank {
        0 => out.to_path_buf(),
        _ => out.join(RANKS_DIR).join(format!("rank-{rank:02}")),
    }
}

/// The folder of process `rank`'s share of the checkpoint `step_dir` of a job's folder
/// (`OUT/checkpoints/step-N` → `OUT/ranks/rank-RR/checkpoints/step-N`; `step_dir` itself for
/// rank 0). `None` when `step_dir` is not a checkpoint of a run folder.
pub fn rank_share(step_dir: &Path, rank: usize) -> Option<PathBuf> {
    if rank == 0 {
        return Some(step_dir.to_path_buf());
    }
    let name = step_dir.file_name()?;
    let checkpoints = step_dir.parent()?;
    if checkpoints.file_name()? != CHECKPOINTS_DIR {
        return None;
    }
    let out = checkpoints.parent()?;
    Some(rank_output(out, rank).join(CHECKPOINTS_DIR).join(name))
}

/// Who wrote a checkpoint: how many processes, and the job they were (an id every process of one
/// start of a job records), so that a share left at the same step by an earlier start is not
/// taken for this one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointWriters {
    /// Processes that wrote the checkpoint, each its share.
    pub processes: usize,
    /// The job's id.
    pub job: String,
}

/// The checkpoints of one training run.
#[derive(Debug, Clone)]
pub struct RunFolder {
    out: PathBuf,
    checkpoints: PathBuf,
}

impl RunFolder {
    /// The run whose output folder is `out`.
    pub fn new(out: &Path) -> Self {
        Self {
            out: out.to_path_buf(),
            checkpoints: out.join(CHECKPOINTS_DIR),
        }
    }

    /// The checkpoints process `rank` of a job writes, when this is the job's folder (rank 0's).
    pub fn rank(&self, rank: usize) -> RunFolder {
        RunFolder::new(&rank_output(&self.out, rank))
    }

    /// Whether `out` looks like a run folder (it has a `checkpoints/newest` pointer).
    pub fn is_run(out: &Path) -> bool {
        out.join(CHECKPOINTS_DIR).join(NEWEST_FILE).is_file()
    }

    /// The folder of the checkpoint of `step`.
    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.checkpoints.join(format!("{STEP_PREFIX}{step:08}"))
    }

    /// The newest complete checkpoint: the folder `newest` names when it is complete, else the
    /// complete checkpoint of the highest step (a run killed between renaming the folder and
    /// rewriting `newest`). `None` when there is none.
    pub fn newest(&self) -> Result<Option<PathBuf>, RunFolderError> {
        let pointer = self.checkpoints.join(NEWEST_FILE);
        if let Ok(name) = std::fs::read_to_string(&pointer) {
            let dir = self.checkpoints.join(name.trim());
            if is_complete(&dir) {
                return Ok(Some(dir));
            }
            log::warn!(
                "{} names `{}`, which is not a complete checkpoint; looking for others",
                pointer.display(),
                name.trim()
            );
        }
        Ok(self.complete_steps()?.last().map(|(_, dir)| dir.clone()))
    }

    /// The newest checkpoint of a job (this is its folder, rank 0's) that every process which
    /// wrote it completed: `writers(dir)` reads who wrote the checkpoint or share in `dir`, and
    /// process `R`'s share of a step is that step in [`RunFolder::rank`]`(R)`, complete only with
    /// its own marker and the same writers as rank 0's. A job restarted after losing a process
    /// resumes there, never from a step some process left half-written or wrote for another
    /// start of the job. `None` when no step is complete everywhere.
    pub fn newest_complete_in_every_rank<E: From<RunFolderError>>(
        &self,
        writers: impl Fn(&Path) -> Result<CheckpointWriters, E>,
    ) -> Result<Option<PathBuf>, E> {
        for (step, dir) in self.complete_steps()?.into_iter().rev() {
            let ours = writers(&dir)?;
            let processes = ours.processes;
            let share_complete = |rank: usize| {
                let share = self.rank(rank).step_dir(step);
                is_complete(&share) && writers(&share).is_ok_and(|theirs| theirs == ours)
            };
            if (1..processes).all(share_complete) {
                return Ok(Some(dir));
            }
            log::info!(
                "{}: not every one of its {processes} processes completed it",
                dir.display()
            );
        }
        Ok(None)
    }

    /// Publishes a checkpoint for `step`: `fill` writes its files into a temporary folder (the
    /// [`COMPLETION_MARKER`] last), which is then renamed into place and named by `newest`;
    /// checkpoints beyond the last `keep` are deleted. Returns the checkpoint folder.
    pub fn publish<E: From<RunFolderError>>(
        &self,
        step: u64,
        keep: usize,
        fill: impl FnOnce(&Path) -> Result<(), E>,
    ) -> Result<PathBuf, E> {
        std::fs::create_dir_all(&self.checkpoints).map_err(io_error(&self.checkpoints))?;
        let final_dir = self.step_dir(step);
        let name = format!("{STEP_PREFIX}{step:08}");
        let temporary = self.checkpoints.join(format!("{TEMPORARY_PREFIX}{name}"));
        if temporary.exists() {
            std::fs::remove_dir_all(&temporary).map_err(io_error(&temporary))?;
        }
        std::fs::create_dir_all(&temporary).map_err(io_error(&temporary))?;
        fill(&temporary)?;
        if !is_complete(&temporary) {
            return Err(RunFolderError::Incomplete { path: temporary }.into());
        }
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(io_error(&final_dir))?;
        }
        std::fs::rename(&temporary, &final_dir).map_err(io_error(&final_dir))?;
        write_atomic(&self.checkpoints.join(NEWEST_FILE), name.as_bytes())?;
        self.prune(keep)?;
        Ok(final_dir)
    }

    /// Deletes all but the last `keep` complete checkpoints and any leftover temporary folder.
    fn prune(&self, keep: usize) -> Result<(), RunFolderError> {
        let complete = self.complete_steps()?;
        let excess = complete.len().saturating_sub(keep);
        for (_, dir) in &complete[..excess] {
            std::fs::remove_dir_all(dir).map_err(io_error(dir))?;
        }
        for entry in self.entries()? {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(TEMPORARY_PREFIX)
            {
                let path = entry.path();
                std::fs::remove_dir_all(&path).map_err(io_error(&path))?;
            }
        }
        Ok(())
    }

    /// Complete checkpoints, ordered by step.
    fn complete_steps(&self) -> Result<Vec<(u64, PathBuf)>, RunFolderError> {
        let mut steps: Vec<(u64, PathBuf)> = self
            .entries()?
            .into_iter()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let step = name.strip_prefix(STEP_PREFIX)?.parse().ok()?;
                let dir = entry.path();
                is_complete(&dir).then_some((step, dir))
            })
            .collect();
        steps.sort();
        Ok(steps)
    }

    fn entries(&self) -> Result<Vec<std::fs::DirEntry>, RunFolderError> {
        match std::fs::read_dir(&self.checkpoints) {
            Ok(entries) => entries
                .collect::<Result<_, _>>()
                .map_err(io_error(&self.checkpoints)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(io_error(&self.checkpoints)(source)),
        }
    }
}

fn is_complete(dir: &Path) -> bool {
    dir.join(COMPLETION_MARKER).is_file()
}

/// [`burn_trainium::write_atomically`] with the error a run folder reports: readers see the old
/// file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RunFolderError> {
    burn_trainium::write_atomically(path, bytes).map_err(io_error(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run folder with complete checkpoints of `steps` (and an unfinished one of `partial`).
    fn run_with(root: &Path, name: &str, steps: &[u64], partial: Option<u64>) -> RunFolder {
        let folder = RunFolder::new(&root.join(name));
        for &step in steps {
            folder
                .publish::<RunFolderError>(step, usize::MAX, |dir| {
                    write_atomic(&dir.join(COMPLETION_MARKER), b"{}")
                })
                .unwrap();
        }
        if let Some(step) = partial {
            std::fs::create_dir_all(folder.step_dir(step)).unwrap();
        }
        folder
    }

    #[test]
    fn a_job_resumes_from_the_newest_step_every_rank_that_wrote_it_completed() {
        let root = tempfile::tempdir().unwrap();
        let job = root.path().join("job");
        let rank0 = run_with(&job, "", &[10, 20, 30, 40], None);
        run_with(&job, "ranks/rank-01", &[10, 20, 30], Some(40));
        run_with(&job, "ranks/rank-02", &[20, 30], None);
        assert_eq!(rank0.rank(1).out, job.join("ranks/rank-01"));
        assert_eq!(
            rank_share(&rank0.step_dir(30), 2),
            Some(rank0.rank(2).step_dir(30))
        );
        assert_eq!(rank_share(Path::new("step-00000030"), 1), None);
        assert_eq!(rank0.newest().unwrap(), Some(rank0.step_dir(40)));
        // Rank 1's step 20 was written by another start of the job.
        let stale = job.join("ranks/rank-01/checkpoints/step-00000020");
        let newest = |writers: fn(u64) -> usize| {
            rank0
                .newest_complete_in_every_rank(|dir| {
                    let step = dir.file_name().unwrap().to_str().unwrap()[STEP_PREFIX.len()..]
                        .parse()
                        .unwrap();
                    Ok::<_, RunFolderError>(CheckpointWriters {
                        processes: writers(step),
                        job: if dir == stale { "earlier" } else { "this" }.into(),
                    })
                })
                .unwrap()
        };
        // Written by 3 processes: step 40 misses rank 1's marker, step 10 rank 2's share.
        assert_eq!(newest(|_| 3), Some(rank0.step_dir(30)));
        // By 2 processes: rank 2's folder does not matter.
        assert_eq!(newest(|_| 2), Some(rank0.step_dir(30)));
        // By one process (a job that grew): the newest step of rank 0.
        assert_eq!(newest(|_| 1), Some(rank0.step_dir(40)));
        // Steps 30 and 40 by 4 processes, of which rank 3 wrote nothing; step 20's share of
        // rank 1 is another start's: step 10, by 2.
        assert_eq!(
            newest(|step| if step >= 30 { 4 } else { 2 }),
            Some(rank0.step_dir(10))
        );
        let empty = RunFolder::new(&root.path().join("empty"));
        assert_eq!(
            empty
                .newest_complete_in_every_rank(|_| Ok::<_, RunFolderError>(CheckpointWriters {
                    processes: 1,
                    job: String::new(),
                }))
                .unwrap(),
            None
        );
    }
}
