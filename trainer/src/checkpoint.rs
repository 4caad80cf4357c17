//! What a training checkpoint holds besides the folder layout of [`hlat::run_folder`] (which
//! publishes it atomically): the model in the native layout (`model/`: `config.json`,
//! `model.bpk`, `tokenizer.json`), the optimizer state (`optimizer.bin`) and `state.json` (step
//! counters, LR schedule, data sampler, seed), written last.

use std::path::Path;

use hlat::run_folder::write_atomic;

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
