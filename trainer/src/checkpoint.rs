//! Training checkpoints: `OUT/checkpoints/step-NNNNNNNN/` holding the model in the native layout
//! (`model/`: `config.json`, `model.bpk`, `tokenizer.json`), the optimizer state
//! (`optimizer.bin`) and `state.json` (step counters, LR schedule, data sampler, seed).
//!
//! A checkpoint is written into a hidden temporary folder, renamed into place, and only then
//! named by the `newest` pointer file (itself replaced atomically), so a run killed at any point
//! leaves either the previous or the new checkpoint, never a half-written one. Temporary folders
//! and folders without `state.json` are ignored and cleared. The last `keep` checkpoints are kept.

use std::path::{Path, PathBuf};

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::data::SamplerState;
use crate::error::TrainError;
use crate::optimizer::HlatOptimizer;
use crate::parallel::{ParallelLayout, Reshard, TrainingBackend, reshard_optimizer_state};
use crate::precision::Precision;
use crate::schedule::WarmupCosine;
use crate::trainer::TrainerProgress;

/// Folder of the checkpoints under a run's output folder.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// Pointer file naming the newest complete checkpoint folder.
pub const NEWEST_FILE: &str = "newest";
/// The model, in the native layout of `hlat::checkpoint`.
pub const MODEL_DIR: &str = "model";
/// Training state besides model and optimizer; written last.
pub const STATE_FILE: &str = "state.json";
/// Optimizer state (Burn's binary recorder adds `.bin`).
const OPTIMIZER_FILE: &str = "optimizer";
const STEP_PREFIX: &str = "step-";
const TEMPORARY_PREFIX: &str = ".tmp-";

/// The optimizer state as Burn records it (per parameter id).
type OptimizerRecord<M, B> = <HlatOptimizer<M, B> as Optimizer<M, B>>::Record;

/// What `state.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Step and token counters.
    pub progress: TrainerProgress,
    /// The learning-rate schedule.
    pub schedule: WarmupCosine,
    /// The training data sampler.
    pub sampler: SamplerState,
    /// The run seed: the random numbers of step `s` derive from `(seed, s)` alone
    /// (`trainer::step_seed`), so the seed is the whole RNG state.
    pub seed: u64,
    /// Precision the run trains in.
    pub precision: Precision,
}

/// The checkpoints of one run.
#[derive(Debug, Clone)]
pub struct RunCheckpoints {
    root: PathBuf,
}

impl RunCheckpoints {
    /// The checkpoints of the run whose output folder is `out`.
    pub fn new(out: &Path) -> Self {
        Self {
            root: out.join(CHECKPOINTS_DIR),
        }
    }

    /// The folder of the checkpoint of `step`.
    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.root.join(format!("{STEP_PREFIX}{step:08}"))
    }

    /// The newest complete checkpoint: the folder `newest` names when it is complete, else the
    /// complete checkpoint of the highest step (a run killed between renaming the folder and
    /// rewriting `newest`). `None` when there is none.
    pub fn newest(&self) -> Result<Option<PathBuf>, TrainError> {
        let pointer = self.root.join(NEWEST_FILE);
        if let Ok(name) = std::fs::read_to_string(&pointer) {
            let dir = self.root.join(name.trim());
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

    /// Publishes a checkpoint for `step`: `fill` writes its files into a temporary folder, which
    /// is then renamed into place and named by `newest`; checkpoints beyond the last `keep` are
    /// deleted. Returns the checkpoint folder.
    pub fn publish(
        &self,
        step: u64,
        keep: usize,
        fill: impl FnOnce(&Path) -> Result<(), TrainError>,
    ) -> Result<PathBuf, TrainError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TrainError::Io { path, source }
        };
        std::fs::create_dir_all(&self.root).map_err(io(&self.root))?;
        let final_dir = self.step_dir(step);
        let name = final_dir
            .file_name()
            .expect("step folders have a name")
            .to_string_lossy()
            .into_owned();
        let temporary = self.root.join(format!("{TEMPORARY_PREFIX}{name}"));
        if temporary.exists() {
            std::fs::remove_dir_all(&temporary).map_err(io(&temporary))?;
        }
        std::fs::create_dir_all(&temporary).map_err(io(&temporary))?;
        fill(&temporary)?;
        if !is_complete(&temporary) {
            return Err(TrainError::Checkpoint {
                path: temporary,
                message: format!("the writer left no {STATE_FILE}"),
            });
        }
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
        }
        std::fs::rename(&temporary, &final_dir).map_err(io(&final_dir))?;
        crate::fs::write_atomic(&self.root.join(NEWEST_FILE), name.as_bytes())?;
        self.prune(keep)?;
        Ok(final_dir)
    }

    /// Deletes all but the last `keep` complete checkpoints and any leftover temporary folder.
    fn prune(&self, keep: usize) -> Result<(), TrainError> {
        let complete = self.complete_steps()?;
        let excess = complete.len().saturating_sub(keep);
        for (_, dir) in &complete[..excess] {
            std::fs::remove_dir_all(dir).map_err(|source| TrainError::Io {
                path: dir.clone(),
                source,
            })?;
        }
        for entry in self.entries()? {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(TEMPORARY_PREFIX) {
                let path = entry.path();
                std::fs::remove_dir_all(&path).map_err(|source| TrainError::Io { path, source })?;
            }
        }
        Ok(())
    }

    /// Complete checkpoints, ordered by step.
    fn complete_steps(&self) -> Result<Vec<(u64, PathBuf)>, TrainError> {
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

    fn entries(&self) -> Result<Vec<std::fs::DirEntry>, TrainError> {
        match std::fs::read_dir(&self.root) {
            Ok(entries) => entries
                .collect::<Result<_, _>>()
                .map_err(|source| TrainError::Io {
                    path: self.root.clone(),
                    source,
                }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(TrainError::Io {
                path: self.root.clone(),
                source,
            }),
        }
    }
}

fn is_complete(dir: &Path) -> bool {
    dir.join(STATE_FILE).is_file()
}

/// Writes `state.json` into a checkpoint folder (do this last: it marks the folder complete).
pub fn write_state(dir: &Path, state: &CheckpointState) -> Result<(), TrainError> {
    let text = serde_json::to_string_pretty(state).expect("the checkpoint state serializes");
    crate::fs::write_atomic(&dir.join(STATE_FILE), text.as_bytes())
}

/// Reads `state.json` of a checkpoint folder.
pub fn read_state(dir: &Path) -> Result<CheckpointState, TrainError> {
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| TrainError::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|error| TrainError::Checkpoint {
        path,
        message: error.to_string(),
    })
}

/// Saves the optimizer state of `module`'s parameters into a checkpoint folder, joined into the
/// whole model's shapes when `layout` splits the model or the state. Parameter ids differ between
/// processes, so the state is keyed by the parameter's position in the module.
pub fn save_optimizer<B, M>(
    dir: &Path,
    optimizer: &HlatOptimizer<M, B>,
    module: &M,
    layout: &ParallelLayout,
) -> Result<(), TrainError>
where
    B: TrainingBackend,
    M: AutodiffModule<B>,
{
    let mut record = reshard_optimizer_state(module, optimizer.to_record(), layout, Reshard::Join);
    let positional: OptimizerRecord<M, B> = param_ids(module)
        .into_iter()
        .enumerate()
        .filter_map(|(position, id)| {
            record
                .remove(&id)
                .map(|state| (ParamId::from(position as u64), state))
        })
        .collect();
    let path = dir.join(OPTIMIZER_FILE);
    BinFileRecorder::<FullPrecisionSettings>::new()
        .record(positional, path.clone())
        .map_err(|error| TrainError::Checkpoint {
            path,
            message: error.to_string(),
        })
}

/// Loads optimizer state saved by [`save_optimizer`] for `module`'s parameters, split again
/// as `layout` splits the model and the state.
pub fn load_optimizer<B, M>(
    dir: &Path,
    optimizer: HlatOptimizer<M, B>,
    module: &M,
    layout: &ParallelLayout,
    device: &B::Device,
) -> Result<HlatOptimizer<M, B>, TrainError>
where
    B: TrainingBackend,
    M: AutodiffModule<B>,
{
    let path = dir.join(OPTIMIZER_FILE);
    let mut positional: OptimizerRecord<M, B> = BinFileRecorder::<FullPrecisionSettings>::new()
        .load(path.clone(), device)
        .map_err(|error| TrainError::Checkpoint {
            path: path.clone(),
            message: error.to_string(),
        })?;
    let ids = param_ids(module);
    if positional.len() > ids.len() {
        return Err(TrainError::Checkpoint {
            path,
            message: format!(
                "holds optimizer state for {} parameters, the model has {}",
                positional.len(),
                ids.len()
            ),
        });
    }
    let record = ids
        .into_iter()
        .enumerate()
        .filter_map(|(position, id)| {
            positional
                .remove(&ParamId::from(position as u64))
                .map(|state| (id, state))
        })
        .collect();
    let record = reshard_optimizer_state(module, record, layout, Reshard::Split);
    Ok(optimizer.load_record(record))
}

/// The ids of `module`'s float parameters in visiting order.
fn param_ids<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) -> Vec<ParamId> {
    struct Ids(Vec<ParamId>);
    impl<B: burn::tensor::backend::Backend> ModuleVisitor<B> for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.id);
        }
    }
    let mut ids = Ids(Vec::new());
    module.visit(&mut ids);
    ids.0
}
