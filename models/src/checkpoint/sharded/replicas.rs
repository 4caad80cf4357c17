//! Reading the shards of a split model straight from the replicas that hold them (what a
//! training run checkpoints), with nothing gathered on the device.

use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Tensor, TensorData};
use burn_store::bridge;
use burn_store::burn_pack::Tensor as PackTensor;
use burn_trainium::collective;

use super::layout::StageLayout;
use super::write::{FolderLayout, RankShards};
use crate::checkpoint::error::CheckpointError;
use crate::model::Hlat;
use crate::parallel::ParamPath;
use crate::pipeline::PipelineParallel;

/// Reads a tensor-parallel model (split by `Hlat::shard` over the first `degree` replicas of its
/// device, among others) as rank shards for the checkpoint folder `dir` (named in errors): rank
/// `r`'s shard holds replica `r`'s values, read from the replica without gathering them into one
/// tensor. Only this process's replicas are read, nothing moves between processes: on a device
/// spanning the processes of a job, the process holding replicas `0..degree` (rank 0, as
/// tensor-parallel groups stay inside a process) reads alone.
pub fn read_ranks(model: &Hlat, degree: usize, dir: &Path) -> Result<RankShards, CheckpointError> {
    let mut reader = ReplicaReader::new(Plan::Tensor { degree }, degree);
    model.visit(&mut reader);
    match reader.failure {
        Some(reason) => Err(CheckpointError::burnpack(dir, reason)),
        None => Ok(RankShards::tensor_parallel(reader.files)),
    }
}

/// The replica holding tensor-parallel rank `rank` of stage `stage` at data-parallel rank 0, by
/// stage then rank. On a device arranged as `hlat-train` arranges it (pipeline outermost,
/// tensor-parallel ranks consecutive), stage `s`'s rank `r` is replica `s × tp × dp + r`.
pub fn stage_replicas(pipeline: &PipelineParallel, degree: usize) -> Vec<Vec<usize>> {
    (0..pipeline.stages())
        .map(|stage| {
            (0..degree)
                .map(|rank| {
                    let (group, _) = pipeline
                        .groups
                        .locate(rank)
                        .expect("the pipeline groups hold every replica of the first stage");
                    group[stage]
                })
                .collect()
        })
        .collect()
}

/// Reads a model cut into `pipeline`'s stages ([`Hlat::into_stages`], after `Hlat::shard` over
/// `degree` ranks when `degree > 1`) as the shards of a pipeline checkpoint for the folder `dir`
/// (named in errors). Stage `s`'s rank `r` file holds the values of the replica
/// [`stage_replicas`] names, read from that replica with nothing gathered on the device: the
/// stage's real layers (slot `J` named as model layer `pipeline.layer_at(s, J)`, padding slots
/// left out) and the shared tensors the stage uses. Only this process's replicas are read: every
/// stage's must be among them, so on a device spanning the processes of a job (whose later
/// stages sit in other processes) this is an error.
pub fn read_stages(
    model: &Hlat,
    pipeline: &PipelineParallel,
    degree: usize,
    dir: &Path,
) -> Result<RankShards, CheckpointError> {
    let layout = StageLayout::of_pipeline(pipeline, degree);
    let replicas = stage_replicas(pipeline, degree);
    let count = replicas.iter().flatten().max().map_or(0, |last| last + 1);
    let plan = Plan::Stages {
        pipeline: pipeline.clone(),
        layout,
        replicas,
        tied: model.config().tie_word_embeddings,
    };
    let mut reader = ReplicaReader::new(plan, count);
    model.visit(&mut reader);
    match reader.failure {
        Some(reason) => Err(CheckpointError::burnpack(dir, reason)),
        None => {
            let Plan::Stages { layout, .. } = reader.plan else {
                unreachable!("the plan is the stages'")
            };
            Ok(RankShards {
                layout: FolderLayout::Pipeline(layout),
                files: reader.files,
            })
        }
    }
}

/// Which replicas [`ReplicaReader`] reads, into which files under which names.
enum Plan {
    /// Rank `r`'s file holds replica `r`'s values.
    Tensor { degree: usize },
    /// Stage `s` rank `r`'s file (at `s × degree + r`) holds the values of `replicas[s][r]`.
    Stages {
        pipeline: PipelineParallel,
        layout: StageLayout,
        replicas: Vec<Vec<usize>>,
        tied: bool,
    },
}

impl Plan {
    /// For the parameter at `names`: each file it goes to, the replica whose value it takes and
    /// the name it is stored under.
    fn destinations(&self, names: &[String]) -> Vec<(usize, usize, Vec<String>)> {
        match self {
            Plan::Tensor { degree } => (0..*degree)
                .map(|rank| (rank, rank, names.to_vec()))
                .collect(),
            Plan::Stages {
                pipeline,
                layout,
                replicas,
                tied,
            } => {
                let degree = layout.tensor_parallel;
                let slot = match names {
                    [first, slot, ..] if first == "layers" => slot.parse::<usize>().ok(),
                    _ => None,
                };
                let stages: Vec<(usize, Vec<String>)> = match slot {
                    // Slot `J` of stage `s` holds model layer `layer_at(s, J)`, or padding.
                    Some(slot) => (0..layout.stages)
                        .filter_map(|stage| {
                            let layer = pipeline.layer_at(stage, slot)?;
                            let mut renamed = names.to_vec();
                            renamed[1] = layer.to_string();
                            Some((stage, renamed))
                        })
                        .collect(),
                    None => layout
                        .holders(&names.join("."), *tied)
                        .into_iter()
                        .map(|stage| (stage, names.to_vec()))
                        .collect(),
                };
                stages
                    .into_iter()
                    .flat_map(|(stage, names)| {
                        (0..degree).map(move |rank| (stage, rank, names.clone()))
                    })
                    .map(|(stage, rank, names)| {
                        (stage * degree + rank, replicas[stage][rank], names)
                    })
                    .collect()
            }
        }
    }
}

/// Reads each parameter's shards from this process's first `count` replicas, as `plan` says.
struct ReplicaReader {
    plan: Plan,
    count: usize,
    path: ParamPath,
    files: Vec<Vec<PackTensor>>,
    failure: Option<String>,
}

impl ReplicaReader {
    fn new(plan: Plan, count: usize) -> Self {
        let files = match &plan {
            Plan::Tensor { degree } => *degree,
            Plan::Stages { layout, .. } => layout.stages * layout.tensor_parallel,
        };
        Self {
            plan,
            count,
            path: ParamPath::default(),
            files: vec![Vec::new(); files],
            failure: None,
        }
    }
}

impl ModuleVisitor for ReplicaReader {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.enter(name);
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.exit();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.failure.is_some() {
            return;
        }
        let name = self.path.names().join(".");
        let (first, replicas) = match collective::into_local_replicas(param.val(), self.count) {
            Ok(local) => local,
            Err(error) => {
                self.failure = Some(format!("reading `{name}`: {error}"));
                return;
            }
        };
        if first != 0 || replicas.len() < self.count {
            self.failure = Some(format!(
                "`{name}`: this process holds replicas {first}..{} of its device, not the \
                 replicas 0..{} the shards are read from",
                first + replicas.len(),
                self.count
            ));
            return;
        }
        let mut replicas: Vec<Option<TensorData>> = replicas.into_iter().map(Some).collect();
        for (file, replica, names) in self.plan.destinations(self.path.names()) {
            let data = replicas[replica]
                .take()
                .expect("each replica's value goes to one file");
            let snapshot = bridge::from_data(data, names.join("."), Some(param.id.val()));
            self.files[file].push(snapshot);
        }
    }
}
