//! What a training checkpoint holds besides the folder layout of [`hlat::checkpoint::run_folder`] (which
//! publishes it atomically): the model in the native layout (`model/`: `config.json`,
//! `model.bpk`, `tokenizer.json`), the optimizer state (`optimizer.bpk`, burnpack) and
//! `state.json` (step counters, LR schedule, data sampler, seed), written last.
//!
//! A job of W processes shards each checkpoint over them: rank 0 writes the model and
//! `state.json` into its folder, and every rank `R` writes the optimizer state of the parameters
//! at positions `R, R + W, …` (`optimizer-rank-RR-of-WW.bpk`) and its own `state.json` into its
//! own folder ([`hlat::checkpoint::run_folder::rank_output`]). A checkpoint is complete when every rank's
//! marker is there ([`hlat::checkpoint::run_folder::RunFolder::newest_complete_in_every_rank`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use hlat::checkpoint::run_folder::{CheckpointWriters, rank_share, write_atomic};
use hlat::parallel::{ParamPath, PathVisitor, visit_with_paths};

use burn::module::{Module, Param, ParamId};
use burn::optim::{RecordState, StateSink, StateSource};
use burn::tensor::{Device, Tensor, TensorData};
use burn_store::burn_pack::{self, Reader, Scalar, Writer};
use serde::{Deserialize, Serialize};

use crate::data::SamplerState;
use crate::error::TrainError;
use crate::optimizer::{AdamWState, HlatOptimizer, OptimizerRecord, StateRecord};
use crate::parallel::{
    ParallelLayout, Reshard, gather_stage_states, reshard_optimizer_state, scatter_stage_states,
};
use crate::precision::Precision;
use crate::progress::TrainingProgress;
use crate::schedule::WarmupCosine;
use hlat::pipeline::PipelineParallel;

/// Training state besides model and optimizer; written last, it marks the checkpoint complete.
pub const STATE_FILE: &str = hlat::checkpoint::run_folder::COMPLETION_MARKER;
/// Optimizer state, a burnpack file (`.bpk` added).
const OPTIMIZER_FILE: &str = "optimizer";
/// The scalar of a parameter's entry that holds the parameter's rank (`{position}.rank`).
const RANK_KEY: &str = "rank";

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

    /// The optimizer file of this share, without its `.bpk`.
    fn optimizer_file(&self) -> String {
        match self.processes {
            1 => OPTIMIZER_FILE.to_string(),
            processes => format!("{OPTIMIZER_FILE}-rank-{:02}-of-{processes:02}", self.rank),
        }
    }
}

/// The optimizer state of one parameter as its file holds it (host data): the parameter's rank,
/// its named tensors and scalars (an [`AdamWState`] flattened under the parameter's position).
struct StateItem {
    rank: usize,
    sink: StateSink,
}

impl StateItem {
    /// `state` read to the host, its entries named under `position`.
    fn from_record(state: StateRecord, position: usize) -> Self {
        let rank = state.rank();
        let mut sink = StateSink::default();
        let prefix = position.to_string();
        match rank {
            1 => state.into_state::<1>().state_flatten(&prefix, &mut sink),
            2 => state.into_state::<2>().state_flatten(&prefix, &mut sink),
            3 => state.into_state::<3>().state_flatten(&prefix, &mut sink),
            4 => state.into_state::<4>().state_flatten(&prefix, &mut sink),
            other => panic!("{}", unsupported_rank(other)),
        }
        Self { rank, sink }
    }
}

/// Why the state of a parameter of `rank` cannot be saved or loaded: HLAT's parameters have
/// ranks 1 to 4.
fn unsupported_rank(rank: usize) -> String {
    format!("optimizer state of a rank-{rank} parameter (HLAT's parameters have ranks 1 to 4)")
}

/// The state of the parameter at `position` from `source` (a share's file), on `device`
/// (`None` when the file holds an incomplete entry for it).
fn state_from_source(
    rank: usize,
    position: usize,
    source: &mut StateSource,
    device: &Device,
) -> Result<Option<StateRecord>, String> {
    let prefix = position.to_string();
    Ok(match rank {
        1 => AdamWState::<1>::state_unflatten(&prefix, source, device).map(StateRecord::from_state),
        2 => AdamWState::<2>::state_unflatten(&prefix, source, device).map(StateRecord::from_state),
        3 => AdamWState::<3>::state_unflatten(&prefix, source, device).map(StateRecord::from_state),
        4 => AdamWState::<4>::state_unflatten(&prefix, source, device).map(StateRecord::from_state),
        other => return Err(unsupported_rank(other)),
    })
}

/// Writes `items` (by position) as one burnpack file.
fn write_items(items: HashMap<usize, StateItem>, path: &Path) -> Result<(), String> {
    let mut tensors = Vec::new();
    let mut scalars = Vec::new();
    for (position, item) in items {
        scalars.push((format!("{position}.{RANK_KEY}"), Scalar::from(item.rank)));
        for (name, data) in item.sink.tensors {
            let (bytes, shape, dtype) = data.into_parts();
            tensors.push(burn_pack::Tensor::new(
                name,
                dtype,
                shape,
                Some(position as u64),
                bytes,
            ));
        }
        scalars.extend(item.sink.scalars);
    }
    let writer = scalars
        .into_iter()
        .fold(Writer::new(tensors), |writer, (key, value)| {
            writer.with_scalar(&key, value)
        });
    writer
        .overwrite(true)
        .write_to_file(path)
        .map_err(|error| error.to_string())
}

/// Reads a file of [`write_items`]: each parameter's position and rank, and its entries.
fn read_items(path: &Path) -> Result<(Vec<(usize, usize)>, StateSource), String> {
    let reader = Reader::from_file(path).map_err(|error| error.to_string())?;
    let scalars = reader.scalars().clone();
    let mut positions = Vec::new();
    for (key, value) in &scalars {
        let Some(position) = key.strip_suffix(&format!(".{RANK_KEY}")) else {
            continue;
        };
        let position = position
            .parse::<usize>()
            .map_err(|_| format!("holds an entry `{key}` of no parameter position"))?;
        let rank = usize::try_from(*value)
            .map_err(|_| format!("holds a rank `{key}` that is not a number"))?;
        positions.push((position, rank));
    }
    let mut source = StateSource::new(scalars);
    for tensor in reader.into_tensors().map_err(|error| error.to_string())? {
        let (name, dtype, shape, _, bytes) =
            tensor.into_parts().map_err(|error| error.to_string())?;
        source.insert_tensor(name, TensorData::from_bytes(bytes, shape, dtype));
    }
    Ok((positions, source))
}

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

/// `share` of a checkpoint's optimizer state, read to the host and ready to be written
/// ([`OptimizerSnapshot::write`]) by any thread.
pub struct OptimizerSnapshot {
    share: ProcessShare,
    items: HashMap<usize, StateItem>,
}

impl OptimizerSnapshot {
    /// Reads `share` of the optimizer state `record` of `module`'s parameters to the host,
    /// joined into the whole model's shapes when `layout` splits the model or the state.
    /// Parameter ids differ between processes, so the state is keyed by the parameter's position
    /// in the module. The state is joined one layer at a time (`param_groups`) and read to the
    /// host before the next, so the device holds one layer's whole state at most. Every process
    /// of a job calls this at the same point (the joins run collectives).
    pub fn read<M: Module + 'static>(
        mut record: OptimizerRecord,
        module: &M,
        layout: &ParallelLayout,
        pipeline: Option<&PipelineParallel>,
        share: ProcessShare,
    ) -> Result<Self, TrainError> {
        let checkpoint_error = |message: String| {
            TrainError::Model(format!(
                "reading the optimizer state for a checkpoint: {message}"
            ))
        };
        let mut items: HashMap<usize, StateItem> = HashMap::new();
        let positions = pipeline.map(|pipeline| StagePositions::new(module, pipeline));
        for group in param_groups(module) {
            let part: OptimizerRecord = group
                .iter()
                .filter_map(|(_, id)| record.remove(id).map(|state| (*id, state)))
                .collect();
            let mut joined = reshard_optimizer_state(module, part, layout, Reshard::Join);
            // A layer slot's state on every stage, under the position of each stage's layer.
            let mut stages = match &positions {
                Some(positions) => {
                    gather_stage_states(module, &mut joined, &positions.pipeline.groups)
                }
                None => HashMap::new(),
            };
            // Every process runs the group's join as one program, whichever states it then reads.
            sync(module).map_err(|error| checkpoint_error(format!("joining: {error}")))?;
            let mut keep = |position: usize, state: StateRecord| {
                if share.owns(position) {
                    items.insert(position, StateItem::from_record(state, position));
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
        Ok(Self { share, items })
    }

    /// Bytes of host memory the snapshot holds.
    pub fn bytes(&self) -> u64 {
        self.items
            .values()
            .flat_map(|item| item.sink.tensors.iter())
            .map(|(_, data)| data.as_bytes().len() as u64)
            .sum()
    }

    /// Writes the snapshot into the checkpoint folder `dir` (its share's file).
    pub fn write(self, dir: &Path) -> Result<(), TrainError> {
        let path = dir.join(format!("{}.bpk", self.share.optimizer_file()));
        write_items(self.items, &path).map_err(|message| TrainError::Checkpoint { path, message })
    }
}

/// Checks that a share's state for the parameter at `position` belongs to a model of
/// `parameters` and to that share.
fn check_owned(position: usize, parameters: usize, share: ProcessShare) -> Result<(), String> {
    if position >= parameters {
        return Err(format!(
            "holds optimizer state for parameter {position}, the model has {parameters}"
        ));
    }
    if !share.owns(position) {
        return Err(format!(
            "holds optimizer state for parameter {position}, which is not rank {}'s of {}",
            share.rank, share.processes
        ));
    }
    Ok(())
}

/// Loads optimizer state saved by [`OptimizerSnapshot::write`] for `module`'s parameters, split again
/// as `layout` splits the model and the state, one layer at a time (the device holds one layer's
/// whole state at most). `dir` is a checkpoint of the job's folder (rank 0's); a checkpoint
/// written by several processes is read from every one's share. The state is placed on `device`
/// (without autodiff: the moments are not part of any graph).
pub fn load_optimizer<M: Module + 'static>(
    dir: &Path,
    processes: usize,
    optimizer: HlatOptimizer,
    module: &M,
    layout: &ParallelLayout,
    pipeline: Option<&PipelineParallel>,
    device: &Device,
) -> Result<HlatOptimizer, TrainError> {
    if processes == 0 {
        return Err(TrainError::Checkpoint {
            path: dir.to_path_buf(),
            message: "was written by 0 processes; a checkpoint has at least one share".into(),
        });
    }
    let device = device.clone().inner();
    let groups = param_groups(module);
    let positions = pipeline.map(|pipeline| StagePositions::new(module, pipeline));
    let parameters: usize = match &positions {
        Some(positions) => positions.whole_count(),
        None => groups.iter().map(Vec::len).sum(),
    };
    let mut items: HashMap<usize, StateRecord> = HashMap::new();
    for rank in 0..processes {
        let share = ProcessShare { rank, processes };
        let share_path = share_dir(dir, rank)?;
        let path = share_path.join(format!("{}.bpk", share.optimizer_file()));
        let checkpoint_error = |message: String| TrainError::Checkpoint {
            path: path.clone(),
            message,
        };
        let (entries, mut source) = read_items(&path).map_err(checkpoint_error)?;
        for (position, param_rank) in entries {
            check_owned(position, parameters, share).map_err(checkpoint_error)?;
            let state = state_from_source(param_rank, position, &mut source, &device)
                .map_err(checkpoint_error)?
                .ok_or_else(|| {
                    checkpoint_error(format!(
                        "holds an incomplete optimizer state for parameter {position}"
                    ))
                })?;
            items.insert(position, state);
        }
    }
    let mut record = OptimizerRecord::default();
    for group in groups {
        let mut part = OptimizerRecord::default();
        let mut stages = HashMap::new();
        for (position, id) in group {
            let mut take = |whole: usize| items.remove(&whole);
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
pub(crate) fn sync<M: Module>(module: &M) -> Result<(), String> {
    match module.devices().first() {
        Some(device) => device.sync().map_err(|error| error.to_string()),
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
    fn new<M: Module>(module: &M, pipeline: &'a PipelineParallel) -> Self {
        struct Count {
            before: usize,
            in_layers: usize,
            after: usize,
        }
        impl PathVisitor for Count {
            fn visit_float<const D: usize>(&mut self, path: &ParamPath, _param: &Param<Tensor<D>>) {
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
fn param_groups<M: Module>(module: &M) -> Vec<Vec<(usize, ParamId)>> {
    struct Groups {
        /// The names the last group's parameters agree on.
        last_key: Option<Vec<String>>,
        groups: Vec<Vec<(usize, ParamId)>>,
        position: usize,
    }
    impl PathVisitor for Groups {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>) {
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
    use hlat::HlatConfig;

    use super::*;
    use crate::language_model::LanguageModel;

    #[test]
    fn optimizer_state_moves_one_layer_at_a_time() {
        let config = HlatConfig::preset("hlat-test").unwrap();
        let model = LanguageModel::new(config.init(&Device::flex().autodiff()), None);
        let groups = param_groups(&model);
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
