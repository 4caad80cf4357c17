//! The layout of a training run's output folder, shared by the trainer (which writes it) and
//! [`crate::checkpoint::load_any`] (which reads the newest model from it).
//!
//! ```text
//! OUT/checkpoints/step-00000100/      one complete checkpoint per kept step
//!                  step-00000100/model/   the model in the native layout
//!                  step-00000100/state.json   written last: marks the checkpoint complete
//! OUT/checkpoints/newest              names the newest complete checkpoint folder
//! ```
//!
//! A checkpoint is written into a hidden temporary folder, renamed into place, and only then
//! named by `newest` (itself replaced atomically), so a run killed at any point leaves either the
//! previous or the new checkpoint, never a half-written one. Temporary folders and folders
//! without the completion marker are ignored, and cleared at the next publish.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Folder of the checkpoints under a run's output folder.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// Pointer file naming the newest complete checkpoint folder.
pub const NEWEST_FILE: &str = "newest";
/// The model inside a checkpoint folder, in the native layout of [`crate::checkpoint`].
pub const MODEL_DIR: &str = "model";
/// The file written last into a checkpoint folder: its presence marks the checkpoint complete.
pub const COMPLETION_MARKER: &str = "state.json";
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

/// The checkpoints of one training run.
#[derive(Debug, Clone)]
pub struct RunFolder {
    checkpoints: PathBuf,
}

impl RunFolder {
    /// The run whose output folder is `out`.
    pub fn new(out: &Path) -> Self {
        Self {
            checkpoints: out.join(CHECKPOINTS_DIR),
        }
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

    /// The newest checkpoint complete here and in every one of `others` (the run folders of a
    /// job's other processes): where every process of a restarted job resumes. `None` when no
    /// step is complete in all of them.
    pub fn newest_in_all(&self, others: &[RunFolder]) -> Result<Option<PathBuf>, RunFolderError> {
        let steps = |folder: &RunFolder| -> Result<Vec<u64>, RunFolderError> {
            Ok(folder
                .complete_steps()?
                .into_iter()
                .map(|(step, _)| step)
                .collect())
        };
        let mut common = steps(self)?;
        for other in others {
            let theirs = steps(other)?;
            common.retain(|step| theirs.contains(step));
        }
        Ok(common.last().map(|&step| self.step_dir(step)))
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

/// Writes `bytes` to a temporary sibling of `path`, syncs it and renames it over `path`: readers
/// see the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RunFolderError> {
    let file_name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{file_name}.tmp"));
    let mut file = std::fs::File::create(&temporary).map_err(io_error(&temporary))?;
    file.write_all(bytes).map_err(io_error(&temporary))?;
    file.sync_all().map_err(io_error(&temporary))?;
    std::fs::rename(&temporary, path).map_err(io_error(path))
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
    fn a_job_resumes_from_the_newest_step_every_rank_completed() {
        let root = tempfile::tempdir().unwrap();
        let rank0 = run_with(root.path(), "rank0", &[10, 20, 30], None);
        let rank1 = run_with(root.path(), "rank1", &[10, 20], Some(30));
        let rank2 = run_with(root.path(), "rank2", &[20, 30], None);
        assert_eq!(rank0.newest().unwrap(), Some(rank0.step_dir(30)));
        assert_eq!(
            rank0.newest_in_all(std::slice::from_ref(&rank1)).unwrap(),
            Some(rank0.step_dir(20))
        );
        assert_eq!(
            rank1
                .newest_in_all(&[rank0.clone(), rank2.clone()])
                .unwrap(),
            Some(rank1.step_dir(20))
        );
        let empty = RunFolder::new(&root.path().join("empty"));
        assert_eq!(rank0.newest_in_all(&[empty]).unwrap(), None);
        assert_eq!(rank0.newest_in_all(&[]).unwrap(), Some(rank0.step_dir(30)));
    }
}
