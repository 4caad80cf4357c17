//! What a training checkpoint holds besides the folder layout of [`hlat::checkpoint::run_folder`] (which
//! publishes it atomically): the model in the native layout (`model/`: `config.json`,
//! `model.bpk`, `tokenizer.json`), the optimizer state (`optimizer.bin`) and `state.json` (step
//! counters, LR schedule, data sampler, seed), written last.
//!
//! A job of W processes shards each checkpoint over them: rank 0 writes the model and
//! `state.json` into its folder, and every rank `R` writes the optimizer state of the parameters
//! at positions `R, R + W, …` (`optimizer-rank-RR-of-WW.bin`) and its own `state.json` into its
//! own folder ([`hlat::checkpoint::run_folder::rank_output`]). A checkpoint is complete when every rank's
//! marker is there ([`hlat::checkpoint::run_folder::RunFolder::newest_complete_in_every_rank`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use hlat::checkpoint::run_folder::{CheckpointWriters, rank_share, write_atomic};
use hlat::parallel::{ParamPath, PathVisitor, visit_with_paths};

use burn::module::{AutodiffModule, Param, ParamId};
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, BurnRecord, FullPrecisionSettings, Record, Recorder};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::data::SamplerState;
use crate::error::TrainError;
use crate::optimizer::HlatOptimizer;
use crate::parallel::{
    ParallelLayout, Reshard, StateRecord, TrainingBackend, gather_stage_states,
    reshard_optimizer_state, scatter_stage_states,
};
use crate::precision::Precision;
use crate::progress::TrainingProgress;
use crate::schedule::WarmupCosine;
use hlat::pipeline::PipelineParallel;

/// Training state besides model and optimizer; written last, it marks the checkpoint complete.
pub const STATE_FILE: &str = hlat::checkpoint::run_folder::COMPLETION_MARKER;
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
/// The optimizer state of one parameter as its file holds it (host data).
type StateItem<B> = <StateRecord<B> as Record<B>>::Item<FullPrecisionSettings>;

/// What `state.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Step and token counters.
    pub progress: TrainingProgress,
    /// The learning-rate schedule.
    pub schedule: WarmupCosine,
    /// The training data sampler.
    pub sampler: SamplerState,
    /// The run seed: the random numbers of step `s` derive from `(seed, s)` alone
    /// (`learner::step_seed`), so the seed is the whole RNG state.
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
    /// Who wrote the checkpoint, as [`hlat::checkpoint::run_folder::RunFolder::newest_complete_in_every_rank`]
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
/// module. The state is joined one layer at a time (`param_groups`) and read to the host
/// before the next, so the device holds one layer's whole state at most. Every process of a job
/// calls this at the same point (the joins run collectives).
pub fn save_optimizer<B, M>(
    dir: &Path,
    optimizer: &HlatOptimizer<M, B>,
    module: &M,
    layout: &ParallelLayout,
    pipeline: Option<&PipelineParallel>,
    share: ProcessShare,
) -> Result<(), TrainError>
where
    B: TrainingBackend,
    M: AutodiffModule<B> + 'static,
{
    let path = dir.join(share.optimizer_file());
    let checkpoint_error = |message: String| TrainError::Checkpoint {
        path: path.clone(),
        message,
    };
    let mut record = optimizer.to_record();
    let mut items: HashMap<String, StateItem<B>> = HashMap::new();
    let positions = pipeline.map(|pipeline| StagePositions::new(module, pipeline));
    for group in param_groups(module) {
        let part: OptimizerRecord<M, B> = group
            .iter()
            .filter_map(|(_, id)| record.remove(id).map(|state| (*id, state)))
            .collect();
        let mut joined = reshard_optimizer_state(module, part, layout, Reshard::Join);
        // A layer slot's state on every stage, under the position of each stage's layer.
        let mut stages = match &positions {
            Some(positions) => gather_stage_states(module, &mut joined, &positions.pipeline.groups),
            None => HashMap::new(),
        };
        // Every process runs the group's join as one program, whichever states it then reads.
        sync(module).map_err(|error| checkpoint_error(format!("joining: {error}")))?;
        let mut keep = |position: usize, state: StateRecord<B>| {
            if share.owns(position) {
                items.insert(
                    ParamId::from(position as u64).serialize(),
                    state.into_item::<FullPrecisionSettings>(),
                );
            }
        };
        for (position, id) in group {
            if let Some(per_stage) = stages.remove(&id) {
                let positions = positions.as_ref().expect("stage states come from stages");
                for (stage, state) in per_stage.into_iter().enumerate() {
                    if let Some(whole) = positions.whole(position, stage) {
                        keep(whole, state);
                    }
                }
            } else if let Some(state) = joined.remove(&id) {
                let whole = positions
                    .as_ref()
                    .map_or(Some(position), |positions| positions.whole(position, 0));
                keep(
                    whole.expect("a shared parameter has a whole position"),
                    state,
                );
            }
        }
    }
    let file = BurnRecord::<_, B>::new::<BinFileRecorder<FullPrecisionSettings>>(items);
    <BinFileRecorder<FullPrecisionSettings> as Recorder<B>>::save_item(
        &BinFileRecorder::new(),
        file,
        path.clone(),
    )
    .map_err(|error| checkpoint_error(error.to_string()))
}

/// Loads optimizer state saved by [`save_optimizer`] for `module`'s parameters, split again
/// as `layout` splits the model and the state, one layer at a time (the device holds one layer's
/// whole state at most). `dir` is a checkpoint of the job's folder (rank 0's); a checkpoint
/// written by several processes is read from every one's share.
pub fn load_optimizer<B, M>(
    dir: &Path,
    processes: usize,
    optimizer: HlatOptimizer<M, B>,
    module: &M,
    layout: &ParallelLayout,
    pipeline: Option<&PipelineParallel>,
    device: &B::Device,
) -> Result<HlatOptimizer<M, B>, TrainError>
where
    B: TrainingBackend,
    M: AutodiffModule<B> + 'static,
{
    if processes == 0 {
        return Err(TrainError::Checkpoint {
            path: dir.to_path_buf(),
            message: "was written by 0 processes; a checkpoint has at least one share".into(),
        });
    }
    let groups = param_groups(module);
    let positions = pipeline.map(|pipeline| StagePositions::new(module, pipeline));
    let parameters: usize = match &positions {
        Some(positions) => positions.whole_count(),
        None => groups.iter().map(Vec::len).sum(),
    };
    let mut items: HashMap<usize, StateItem<B>> = HashMap::new();
    for rank in 0..processes {
        let share = ProcessShare { rank, processes };
        let path = share_dir(dir, rank)?.join(format!("{}.bin", share.optimizer_file()));
        let checkpoint_error = |message: String| TrainError::Checkpoint {
            path: path.clone(),
            message,
        };
        let file: BurnRecord<HashMap<String, StateItem<B>>, B> =
            <BinFileRecorder<FullPrecisionSettings> as Recorder<B>>::load_item(
                &BinFileRecorder::new(),
                &mut path.clone(),
            )
            .map_err(|error| checkpoint_error(error.to_string()))?;
        for (id, item) in file.item {
            let position = ParamId::try_deserialize(&id)
                .ok_or_else(|| checkpoint_error(format!("holds a parameter id `{id}`")))?
                .val() as usize;
            if position >= parameters {
                return Err(checkpoint_error(format!(
                    "holds optimizer state for parameter {position}, the model has {parameters}"
                )));
            }
            if !share.owns(position) {
                return Err(checkpoint_error(format!(
                    "holds optimizer state for parameter {position}, which is not rank {rank}'s \
                     of {processes}"
                )));
            }
            items.insert(position, item);
        }
    }
    let mut record = OptimizerRecord::<M, B>::default();
    for group in groups {
        let mut part = OptimizerRecord::<M, B>::default();
        let mut stages = HashMap::new();
        for (position, id) in group {
            let mut take = |whole: usize| {
                items
                    .remove(&whole)
                    .map(|item| StateRecord::<B>::from_item(item, device))
            };
            match &positions {
                Some(positions) if positions.slot_of(position).is_some() => {
                    let per_stage: Vec<_> = (0..positions.pipeline.stages())
                        .map(|stage| positions.whole(position, stage).and_then(&mut take))
                        .collect();
                    stages.insert(id, per_stage);
                }
                _ => {
                    let whole = positions
                        .as_ref()
                        .map_or(Some(position), |positions| positions.whole(position, 0));
                    if let Some(state) = whole.and_then(take) {
                        part.insert(id, state);
                    }
                }
            }
        }
        if let Some(positions) = &positions {
            part.extend(scatter_stage_states(
                module,
                stages,
                &positions.pipeline.groups,
            ));
        }
        record.extend(reshard_optimizer_state(
            module,
            part,
            layout,
            Reshard::Split,
        ));
        // The group's whole state leaves the device before the next group arrives.
        sync(module).map_err(|error| TrainError::Checkpoint {
            path: dir.to_path_buf(),
            message: format!("splitting the optimizer state: {error}"),
        })?;
    }
    Ok(optimizer.load_record(record))
}

/// Runs what is queued on `module`'s device.
pub(crate) fn sync<B: TrainingBackend, M: AutodiffModule<B>>(module: &M) -> Result<(), String> {
    match module.devices().first() {
        Some(device) => B::sync(device).map_err(|error| error.to_string()),
        None => Ok(()),
    }
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

/// Where the parameters of a model cut into pipeline stages sit in the whole model's visiting
/// order, the order a checkpoint's optimizer state is keyed by (so that any layout reads it):
/// the parameters before the layers, then each layer's, then those after.
struct StagePositions<'a> {
    pipeline: &'a PipelineParallel,
    /// Parameters before the first layer (the embedding).
    before_layers: usize,
    /// Parameters of one layer.
    per_layer: usize,
    /// Layer slots of the staged model.
    slots: usize,
    /// Layers of the whole model.
    layers: usize,
    /// Parameters after the layers (the final norm, the head).
    after_layers: usize,
}

impl<'a> StagePositions<'a> {
    fn new<B: AutodiffBackend, M: AutodiffModule<B>>(
        module: &M,
        pipeline: &'a PipelineParallel,
    ) -> Self {
        struct Count {
            before: usize,
            in_layers: usize,
            after: usize,
        }
        impl<B: burn::tensor::backend::Backend> PathVisitor<B> for Count {
            fn visit_float<const D: usize>(
                &mut self,
                path: &ParamPath,
                _param: &Param<Tensor<B, D>>,
            ) {
                if path.names().iter().any(|name| name == "layers") {
                    self.in_layers += 1;
                } else if self.in_layers == 0 {
                    self.before += 1;
                } else {
                    self.after += 1;
                }
            }
        }
        let mut count = Count {
            before: 0,
            in_layers: 0,
            after: 0,
        };
        visit_with_paths(module, ParamPath::default(), &mut count);
        let slots = pipeline.local_layers();
        Self {
            pipeline,
            before_layers: count.before,
            per_layer: count.in_layers / slots,
            slots,
            layers: pipeline.chunk_layers.iter().sum(),
            after_layers: count.after,
        }
    }

    /// The parameters of the whole model.
    fn whole_count(&self) -> usize {
        self.before_layers + self.layers * self.per_layer + self.after_layers
    }

    /// The layer slot and the index within its layer of the staged model's parameter at
    /// `position`, when it belongs to a slot.
    fn slot_of(&self, position: usize) -> Option<(usize, usize)> {
        let within = position.checked_sub(self.before_layers)?;
        (within < self.slots * self.per_layer)
            .then(|| (within / self.per_layer, within % self.per_layer))
    }

    /// The whole model's position of the staged model's parameter at `position` on stage
    /// `stage` (`None`: a padding slot).
    fn whole(&self, position: usize, stage: usize) -> Option<usize> {
        match self.slot_of(position) {
            Some((slot, index)) => self
                .pipeline
                .layer_at(stage, slot)
                .map(|layer| self.before_layers + layer * self.per_layer + index),
            None if position < self.before_layers => Some(position),
            None => Some(position - self.slots * self.per_layer + self.layers * self.per_layer),
        }
    }
}

/// The float parameters of `module` as `(position, id)` in visiting order, grouped by layer:
/// consecutive parameters whose names agree down to the first numeric one (`layers.7`), or on
/// the first name when there is none (`embed_tokens`). Every layer's group is the same program
/// when joined or split.
fn param_groups<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
) -> Vec<Vec<(usize, ParamId)>> {
    struct Groups {
        /// The names the last group's parameters agree on.
        last_key: Option<Vec<String>>,
        groups: Vec<Vec<(usize, ParamId)>>,
        position: usize,
    }
    impl<B: burn::tensor::backend::Backend> PathVisitor<B> for Groups {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<B, D>>) {
            let names = path.names();
            let end = names
                .iter()
                .position(|name| name.parse::<usize>().is_ok())
                .map_or(1, |index| index + 1)
                .min(names.len());
            if self.last_key.as_deref() != Some(&names[..end]) {
                self.last_key = Some(names[..end].to_vec());
                self.groups.push(Vec::new());
            }
            self.groups
                .last_mut()
                .expect("a group was just pushed")
                .push((self.position, param.id));
            self.position += 1;
        }
    }
    let mut groups = Groups {
        last_key: None,
        groups: Vec::new(),
        position: 0,
    };
    visit_with_paths(module, ParamPath::default(), &mut groups);
    groups.groups
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};
    use hlat::HlatConfig;

    use super::*;
    use crate::language_model::LanguageModel;

    #[test]
    fn optimizer_state_moves_one_layer_at_a_time() {
        type B = Autodiff<NdArray>;
        let config = HlatConfig::preset("hlat-test").unwrap();
        let model = LanguageModel::new(config.init::<B>(&Default::default()), None);
        let groups = param_groups::<B, _>(&model);
        // The embedding, each layer, then the final norm with the head.
        assert_eq!(groups.len(), config.num_layers + 2, "{groups:?}");
        let layer_sizes: Vec<usize> = groups[1..=config.num_layers].iter().map(Vec::len).collect();
        assert!(
            layer_sizes
                .iter()
                .all(|&size| size == layer_sizes[0] && size > 1)
        );
        // Positions run in visiting order over every parameter, once.
        let positions: Vec<usize> = groups
            .iter()
            .flatten()
            .map(|(position, _)| *position)
            .collect();
        assert_eq!(positions, (0..positions.len()).collect::<Vec<_>>());
    }
}
