//! What a training checkpoint holds besides the folder layout of [`hlat::run_folder`] (which
//! publishes it atomically): the model in the native layout (`model/`: `config.json`,
//! `model.bpk`, `tokenizer.json`), the optimizer state (`optimizer.bin`) and `state.json` (step
//! counters, LR schedule, data sampler, seed), written last.
//!
//! A job of W processes shards each checkpoint over them: rank 0 writes the model and
//! `state.json` into its folder, and every rank `R` writes the optimizer state of the parameters
//! at positions `R, R + W, …` (`optimizer-rank-RR-of-WW.bin`) and its own `state.json` into its
//! own folder ([`hlat::run_folder::rank_output`]). A checkpoint is complete when every rank's
//! marker is there ([`hlat::run_folder::RunFolder::newest_complete_in_every_rank`]).

use std::path::{Path, PathBuf};

use hlat::run_folder::{CheckpointWriters, rank_share, write_atomic};

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

/// Training state besides model and optimizer; written last, it marks the checkpoint complete.
pub const STATE_FILE: &str = hlat::run_folder::COMPLETION_MARKER;
/// Optimizer state (Burn's binary recorder adds `.bin`).
const OPTIMIZER_FILE: &str = "optimizer";

/// Which share of a checkpoint this process writes: all of it in a job of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessShare {
    /// This process's rank.
    pub rank: usize,
    /// Processes in the job.
    pub processes: usize,
}

impl ProcessShare {
    /// The share of the only process of a job.
    pub const WHOLE: Self = Self {
        rank: 0,
        processes: 1,
    };

    /// Whether this process writes the model (rank 0 does; the others hold the same values).
    pub fn writes_model(&self) -> bool {
        self.rank == 0
    }

    /// Whether this process writes the optimizer state of the parameter at `position`.
    fn owns(&self, position: usize) -> bool {
        position % self.processes == self.rank
    }

    /// The optimizer file of this share, without Burn's `.bin`.
    fn optimizer_file(&self) -> String {
        match self.processes {
            1 => OPTIMIZER_FILE.to_string(),
            processes => format!("{OPTIMIZER_FILE}-rank-{:02}-of-{processes:02}", self.rank),
        }
    }
}

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
    /// Processes that wrote the checkpoint, each its [`ProcessShare`] (1 when absent: a
    /// checkpoint of a job of one process).
    #[serde(default = "one_process")]
    pub processes: usize,
    /// The id of the job's start that wrote the checkpoint, the same in every process's share
    /// (empty in checkpoints of one process written before there were shares).
    #[serde(default)]
    pub job: String,
}

impl CheckpointState {
    /// Who wrote the checkpoint, as [`hlat::run_folder::RunFolder::newest_complete_in_every_rank`]
    /// compares the shares.
    pub fn writers(&self) -> CheckpointWriters {
        CheckpointWriters {
            processes: self.processes,
            job: self.job.clone(),
        }
    }
}

fn one_process() -> usize {
    1
}

/// Writes `state.json` into a checkpoint folder (do this last: it marks the folder complete).
pub fn write_state(dir: &Path, state: &CheckpointState) -> Result<(), TrainError> {
    let text = serde_json::to_string_pretty(state).expect("the checkpoint state serializes");
    Ok(write_atomic(&dir.join(STATE_FILE), text.as_bytes())?)
}

/// Reads `state.json` of a checkpoint folder.
pub fn read_state(dir: &Path) -> Result<CheckpointState, TrainError> {
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| TrainError::Io {
        path: path.clone(),
        source,
    })?;
    let state: CheckpointState =
        serde_json::from_str(&text).map_err(|error| TrainError::Checkpoint {
            path: path.clone(),
            message: error.to_string(),
        })?;
    if state.processes == 0 {
        return Err(TrainError::Checkpoint {
            path,
            message: "`processes` is 0; a checkpoint is written by at least one process".into(),
        });
    }
    Ok(state)
}

/// Saves `share` of the optimizer state of `module`'s parameters into a checkpoint folder,
/// joined into the whole model's shapes when `layout` splits the model or the state. Parameter
/// ids differ between processes, so the state is keyed by the parameter's position in the
/// module. Every process of a job calls this at the same point (the join runs collectives).
pub fn save_optimizer<B, M>(
    dir: &Path,
    optimizer: &HlatOptimizer<M, B>,
    module: &M,
    layout: &ParallelLayout,
    share: ProcessShare,
) -> Result<(), TrainError>
where
    B: TrainingBackend,
    M: AutodiffModule<B>,
{
    let mut record = reshard_optimizer_state(module, optimizer.to_record(), layout, Reshard::Join);
    // Every process runs the join as one program, whichever parameters it then reads.
    if let Some(device) = module.devices().first() {
        B::sync(device).map_err(|error| TrainError::Checkpoint {
            path: dir.to_path_buf(),
            message: format!("joining the optimizer state: {error}"),
        })?;
    }
    let positional: OptimizerRecord<M, B> = param_ids(module)
        .into_iter()
        .enumerate()
        .filter(|&(position, _)| share.owns(position))
        .filter_map(|(position, id)| {
            record
                .remove(&id)
                .map(|state| (ParamId::from(position as u64), state))
        })
        .collect();
    let path = dir.join(share.optimizer_file());
    BinFileRecorder::<FullPrecisionSettings>::new()
        .record(positional, path.clone())
        .map_err(|error| TrainError::Checkpoint {
            path,
            message: error.to_string(),
        })
}

/// Loads optimizer state saved by [`save_optimizer`] for `module`'s parameters, split again
/// as `layout` splits the model and the state. `dir` is a checkpoint of the job's folder
/// (rank 0's); a checkpoint written by several processes is read from every one's share.
pub fn load_optimizer<B, M>(
    dir: &Path,
    processes: usize,
    optimizer: HlatOptimizer<M, B>,
    module: &M,
    layout: &ParallelLayout,
    device: &B::Device,
) -> Result<HlatOptimizer<M, B>, TrainError>
where
    B: TrainingBackend,
    M: AutodiffModule<B>,
{
    let ids = param_ids(module);
    let mut positional = OptimizerRecord::<M, B>::default();
    for rank in 0..processes.max(1) {
        let share = ProcessShare { rank, processes };
        let path = share_dir(dir, rank)?.join(format!("{}.bin", share.optimizer_file()));
        let checkpoint_error = |message: String| TrainError::Checkpoint {
            path: path.clone(),
            message,
        };
        let part: OptimizerRecord<M, B> = BinFileRecorder::<FullPrecisionSettings>::new()
            .load(path.clone(), device)
            .map_err(|error| checkpoint_error(error.to_string()))?;
        for (id, state) in part {
            let position = id.val() as usize;
            if position >= ids.len() {
                return Err(checkpoint_error(format!(
                    "holds optimizer state for parameter {position}, the model has {}",
                    ids.len()
                )));
            }
            if !share.owns(position) {
                return Err(checkpoint_error(format!(
                    "holds optimizer state for parameter {position}, which is not rank {rank}'s \
                     of {processes}"
                )));
            }
            positional.insert(id, state);
        }
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

/// The folder of process `rank`'s share of the checkpoint `dir` of a job's folder.
fn share_dir(dir: &Path, rank: usize) -> Result<PathBuf, TrainError> {
    rank_share(dir, rank).ok_or_else(|| TrainError::Checkpoint {
        path: dir.to_path_buf(),
        message: "is not a checkpoint of a run folder (OUT/checkpoints/step-N), where the shares \
                  of the job's other processes are found"
            .into(),
    })
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
