//! Sharded checkpoints, as NeuronX Distributed saves them: one burnpack file per tensor-parallel
//! rank, or per pipeline stage × tensor-parallel rank.
//!
//! ```text
//! DIR/config.json               the whole model's configuration
//! DIR/tensor_parallel.json      {"degree": N}
//! DIR/model-rank-00-of-NN.bpk   rank 0's shard: each parameter named as in the whole model,
//! ...                           split parameters holding the rank's slice (see
//! DIR/model-rank-NN-of-NN.bpk   `parallel::placement`), replicated ones whole
//! DIR/tokenizer.json            optional
//! ```
//!
//! When the degree exceeds `num_kv_heads`, each KV head is held by `degree / num_kv_heads`
//! consecutive ranks ([`crate::parallel::kv_copies`]) and every rank file holds what its rank
//! holds: its head's columns of `k_proj` and `v_proj` (and their biases), so the holders of one
//! head write the same values. Loading takes each head from its first holder and checks that
//! the other holders agree bit for bit; the joined model is the ordinary one.
//!
//! A model cut into pipeline stages (and possibly split by tensor-parallel rank inside each)
//! is one file per stage and rank:
//!
//! ```text
//! DIR/config.json                               the whole model's configuration
//! DIR/pipeline_parallel.json                    {"stages": 2, "tensor_parallel": 2,
//!                                                "stage_layers": [[0, 1, 2], [3, 4]]}
//! DIR/model-stage-00-of-02-rank-00-of-02.bpk    stage 0, rank 0: `embed_tokens`, layers 0-2
//! DIR/model-stage-00-of-02-rank-01-of-02.bpk    stage 0, rank 1
//! DIR/model-stage-01-of-02-rank-00-of-02.bpk    stage 1, rank 0: layers 3-4, `norm`, `lm_head`
//! DIR/model-stage-01-of-02-rank-01-of-02.bpk    stage 1, rank 1
//! ```
//!
//! A stage's files hold its real layers under their names in the whole model (`layers.3.…`,
//! not the stage's slots; padding slots are not written) and the shared tensors the stage uses:
//! the embedding in the first stage, the final norm and the LM head in the last (a tied
//! embedding in both, identical). Inside a stage, tensors are split by rank as above.
//!
//! A training run writes each shard straight from the replica that holds it ([`read_ranks`],
//! [`read_stages`]); `hlat convert` splits a whole model on the host ([`save_split`],
//! [`save_stages`]); loading joins the shards on the host ([`read_joined`]), so a checkpoint of
//! any layout opens as the whole model and resumes under any layout. Splitting and joining copy
//! bytes, so split → join is bit-exact.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Tensor, TensorData};
use burn_store::{BurnpackWriter, ModuleSnapshot, TensorSnapshot};
use burn_trainium::collective::{self, CollectiveBackend};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::checkpoint::{CheckpointError, NATIVE_CONFIG_FILE, read_burnpack};
use crate::config::HlatConfig;
use crate::hf;
use crate::model::Hlat;
use crate::parallel::{ParamPath, Placement, check_degree, kv_copies, placement_with};
use crate::pipeline::PipelineParallel;
use crate::staging::Staging;

/// The file that marks a tensor-parallel checkpoint and gives its degree.
pub const TENSOR_PARALLEL_FILE: &str = "tensor_parallel.json";

/// The file that marks a checkpoint cut into pipeline stages and lists each stage's layers.
pub const PIPELINE_PARALLEL_FILE: &str = "pipeline_parallel.json";

/// What [`TENSOR_PARALLEL_FILE`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLayout {
    /// The tensor-parallel degree: how many rank files there are.
    pub degree: usize,
}

/// What [`PIPELINE_PARALLEL_FILE`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLayout {
    /// Pipeline stages.
    pub stages: usize,
    /// The tensor-parallel degree inside each stage: how many rank files each stage has.
    pub tensor_parallel: usize,
    /// The model layers each stage holds, in stage order (every layer in exactly one stage).
    pub stage_layers: Vec<Vec<usize>>,
}

impl StageLayout {
    /// The layout of `stage_layers` split `tensor_parallel` ways.
    pub fn new(stage_layers: Vec<Vec<usize>>, tensor_parallel: usize) -> Self {
        Self {
            stages: stage_layers.len(),
            tensor_parallel,
            stage_layers,
        }
    }

    /// The layout of the stages of `pipeline`, each split `tensor_parallel` ways.
    pub fn of_pipeline(pipeline: &PipelineParallel, tensor_parallel: usize) -> Self {
        Self::new(
            (0..pipeline.stages())
                .map(|stage| pipeline.stage_layers(stage))
                .collect(),
            tensor_parallel,
        )
    }

    /// Checks the layout against the whole model's configuration: at least one stage, each
    /// listed, a tensor-parallel degree that divides the model, every layer in exactly one stage.
    pub fn check(&self, config: &HlatConfig) -> Result<(), String> {
        if self.stages == 0 {
            return Err("`stages` must be at least 1".into());
        }
        if self.stage_layers.len() != self.stages {
            return Err(format!(
                "`stage_layers` lists {} stages, `stages` says {}",
                self.stage_layers.len(),
                self.stages
            ));
        }
        check_degree(config, self.tensor_parallel)?;
        let mut seen = vec![None; config.num_layers];
        for (stage, layers) in self.stage_layers.iter().enumerate() {
            for &layer in layers {
                match seen.get_mut(layer) {
                    None => {
                        return Err(format!(
                            "stage {stage} lists layer {layer}; the model has {} layers",
                            config.num_layers
                        ));
                    }
                    Some(Some(first)) => {
                        return Err(format!(
                            "layer {layer} is listed in stages {first} and {stage}"
                        ));
                    }
                    Some(slot) => *slot = Some(stage),
                }
            }
        }
        if let Some(layer) = seen.iter().position(Option::is_none) {
            return Err(format!("no stage lists layer {layer}"));
        }
        Ok(())
    }

    /// The stages whose files hold the tensor `name` of the whole model: a layer's its stage,
    /// the embedding the first (and the last when tied to the head), the rest (final norm, LM
    /// head) the last.
    fn holders(&self, name: &str, tied: bool) -> Vec<usize> {
        let last = self.stages - 1;
        if let Some(layer) = layer_of(name) {
            return self
                .stage_layers
                .iter()
                .position(|layers| layers.contains(&layer))
                .into_iter()
                .collect();
        }
        if name.split('.').next() == Some("embed_tokens") {
            if tied && last > 0 {
                vec![0, last]
            } else {
                vec![0]
            }
        } else {
            vec![last]
        }
    }
}

/// The weights file of rank `rank` of `degree`.
pub fn rank_file(rank: usize, degree: usize) -> String {
    format!("model-rank-{rank:02}-of-{degree:02}.bpk")
}

/// The weights file of tensor-parallel rank `rank` of `degree` in pipeline stage `stage` of
/// `stages`.
pub fn stage_file(stage: usize, stages: usize, rank: usize, degree: usize) -> String {
    format!("model-stage-{stage:02}-of-{stages:02}-rank-{rank:02}-of-{degree:02}.bpk")
}

/// Whether `dir` holds a sharded checkpoint (by tensor-parallel rank, pipeline stage or both).
pub fn is_sharded(dir: &Path) -> bool {
    dir.join(TENSOR_PARALLEL_FILE).is_file() || is_pipelined(dir)
}

/// Whether `dir` holds a checkpoint cut into pipeline stages.
pub fn is_pipelined(dir: &Path) -> bool {
    dir.join(PIPELINE_PARALLEL_FILE).is_file()
}

/// The layer index of a whole model's tensor name (`layers.7.mlp.up_proj.weight`: 7).
fn layer_of(name: &str) -> Option<usize> {
    let mut parts = name.split('.');
    match (parts.next(), parts.next()) {
        (Some("layers"), Some(index)) => index.parse().ok(),
        _ => None,
    }
}

/// `snapshot`'s data cut for the `degree` tensor-parallel ranks (in rank order), as
/// `parallel::placement` places it when each KV head is held by `copies` ranks.
fn split_for_ranks(
    snapshot: &TensorSnapshot,
    degree: usize,
    copies: usize,
    dir: &Path,
) -> Result<Vec<TensorData>, CheckpointError> {
    let path = snapshot_path(snapshot);
    let data = snapshot
        .to_data()
        .map_err(|error| shard_error(dir, format!("`{}`: {error}", path.join("."))))?;
    Ok(match placement_with(&path, copies) {
        Placement::Split(dim) => split_data(&data, dim, degree),
        // Rank `r` holds head `r / copies`.
        Placement::ReplicatedHeads { dim, copies } => split_data(&data, dim, degree / copies)
            .into_iter()
            .flat_map(|head| vec![head; copies])
            .collect(),
        Placement::Replicated => vec![data; degree],
    })
}

/// Saves a whole model as a checkpoint of `degree` rank shards, split on the host.
pub fn save_split<B: burn::tensor::backend::Backend>(
    model: &Hlat<B>,
    degree: usize,
    tokenizer: Option<&Tokenizer>,
    dir: &Path,
) -> Result<(), CheckpointError> {
    check_degree(model.config(), degree).map_err(|reason| shard_error(dir, reason))?;
    let copies = kv_copies(model.config().num_kv_heads, degree);
    let mut ranks: Vec<Vec<TensorSnapshot>> = vec![Vec::new(); degree];
    for snapshot in model.collect(None, None, false) {
        let parts = split_for_ranks(&snapshot, degree, copies, dir)?;
        for (rank, part) in parts.into_iter().enumerate() {
            ranks[rank].push(rank_snapshot(&snapshot, part));
        }
    }
    RankShards::tensor_parallel(ranks).write(model.config(), tokenizer, dir)
}

/// Saves a whole model as a checkpoint cut into the pipeline stages `layout` gives (each split
/// by tensor-parallel rank), on the host.
pub fn save_stages<B: burn::tensor::backend::Backend>(
    model: &Hlat<B>,
    layout: StageLayout,
    tokenizer: Option<&Tokenizer>,
    dir: &Path,
) -> Result<(), CheckpointError> {
    let config = model.config();
    layout
        .check(config)
        .map_err(|reason| shard_error(dir, reason))?;
    let degree = layout.tensor_parallel;
    let copies = kv_copies(config.num_kv_heads, degree);
    let mut files: Vec<Vec<TensorSnapshot>> = vec![Vec::new(); layout.stages * degree];
    for snapshot in model.collect(None, None, false) {
        let parts = split_for_ranks(&snapshot, degree, copies, dir)?;
        for stage in layout.holders(&snapshot.full_path(), config.tie_word_embeddings) {
            for (rank, part) in parts.iter().enumerate() {
                files[stage * degree + rank].push(rank_snapshot(&snapshot, part.clone()));
            }
        }
    }
    RankShards {
        layout: FolderLayout::Pipeline(layout),
        files,
    }
    .write(config, tokenizer, dir)
}

/// How the files of a sharded checkpoint are laid out.
enum FolderLayout {
    /// One file per tensor-parallel rank.
    Tensor(ShardLayout),
    /// One file per pipeline stage × tensor-parallel rank.
    Pipeline(StageLayout),
}

/// The shards of a model, read from its replicas or cut on the host, ready to be written.
pub struct RankShards {
    layout: FolderLayout,
    /// One per file: rank `r`'s (tensor parallel), or stage `s` rank `r`'s at `s × degree + r`.
    files: Vec<Vec<TensorSnapshot>>,
}

impl RankShards {
    fn tensor_parallel(ranks: Vec<Vec<TensorSnapshot>>) -> Self {
        Self {
            layout: FolderLayout::Tensor(ShardLayout {
                degree: ranks.len(),
            }),
            files: ranks,
        }
    }
}

/// Reads a tensor-parallel model (split by `Hlat::shard` over the first `degree` replicas of its
/// device, among others) as rank shards for the checkpoint folder `dir` (named in errors): rank
/// `r`'s shard holds replica `r`'s values, read from the replica without gathering them into one
/// tensor. Only this process's replicas are read, nothing moves between processes: on a device
/// spanning the processes of a job, the process holding replicas `0..degree` (rank 0, as
/// tensor-parallel groups stay inside a process) reads alone.
pub fn read_ranks<B: CollectiveBackend>(
    model: &Hlat<B>,
    degree: usize,
    dir: &Path,
) -> Result<RankShards, CheckpointError> {
    let mut reader = ReplicaReader::new(Plan::Tensor { degree }, degree);
    model.visit(&mut reader);
    match reader.failure {
        Some(reason) => Err(shard_error(dir, reason)),
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
pub fn read_stages<B: CollectiveBackend>(
    model: &Hlat<B>,
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
        Some(reason) => Err(shard_error(dir, reason)),
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

impl RankShards {
    /// Writes the shards as a checkpoint of the whole model `whole` into `dir` (through a
    /// temporary folder: `dir` appears complete or not at all).
    pub fn write(
        self,
        whole: &HlatConfig,
        tokenizer: Option<&Tokenizer>,
        dir: &Path,
    ) -> Result<(), CheckpointError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Io { path, source }
        };
        let (layout_file, layout, names) = match &self.layout {
            FolderLayout::Tensor(layout) => (
                TENSOR_PARALLEL_FILE,
                serde_json::to_string_pretty(layout),
                (0..layout.degree)
                    .map(|rank| rank_file(rank, layout.degree))
                    .collect::<Vec<_>>(),
            ),
            FolderLayout::Pipeline(layout) => (
                PIPELINE_PARALLEL_FILE,
                serde_json::to_string_pretty(layout),
                (0..layout.stages)
                    .flat_map(|stage| {
                        (0..layout.tensor_parallel).map(move |rank| {
                            stage_file(stage, layout.stages, rank, layout.tensor_parallel)
                        })
                    })
                    .collect(),
            ),
        };
        let staging = Staging::new(dir).map_err(io(dir))?;
        whole.save(&staging.path().join(NATIVE_CONFIG_FILE))?;
        let layout_path = staging.path().join(layout_file);
        let layout = layout.expect("the shard layout serializes");
        std::fs::write(&layout_path, layout).map_err(io(&layout_path))?;
        for (name, snapshots) in names.iter().zip(self.files) {
            let path = staging.path().join(name);
            BurnpackWriter::new(snapshots)
                .write_to_file(&path)
                .map_err(|error| shard_error(&path, error.to_string()))?;
        }
        if let Some(tokenizer) = tokenizer {
            hf::save_tokenizer(tokenizer, staging.path())?;
        }
        staging.commit(true).map_err(io(dir))
    }
}

/// A rank file read: its path and its tensors by name.
type ShardFile = (PathBuf, BTreeMap<String, TensorSnapshot>);

/// The whole model's tensors of a sharded checkpoint (by tensor-parallel rank, pipeline stage or
/// both), joined on the host, by parameter path. Replicated parameters must agree on every rank,
/// the copies of a KV head on every rank holding it, a tied embedding in the first and last
/// stages; each stage's files must hold exactly its layers and shared tensors.
pub fn read_joined(dir: &Path) -> Result<BTreeMap<String, TensorSnapshot>, CheckpointError> {
    if is_pipelined(dir) {
        return read_stages_joined(dir);
    }
    let layout_path = dir.join(TENSOR_PARALLEL_FILE);
    let layout: ShardLayout = read_layout(&layout_path)?;
    if layout.degree == 0 {
        return Err(shard_error(
            &layout_path,
            "`degree` must be at least 1".into(),
        ));
    }
    let config = HlatConfig::load(&dir.join(NATIVE_CONFIG_FILE))?;
    let copies = kv_copies(config.num_kv_heads, layout.degree);
    let files = (0..layout.degree)
        .map(|rank| {
            read_shard(
                dir,
                &rank_file(rank, layout.degree),
                format!("the checkpoint has {} ranks", layout.degree),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    join_ranks(dir, copies, &files)
}

/// [`read_joined`] of a checkpoint cut into pipeline stages.
fn read_stages_joined(dir: &Path) -> Result<BTreeMap<String, TensorSnapshot>, CheckpointError> {
    let layout_path = dir.join(PIPELINE_PARALLEL_FILE);
    let layout: StageLayout = read_layout(&layout_path)?;
    let config = HlatConfig::load(&dir.join(NATIVE_CONFIG_FILE))?;
    layout
        .check(&config)
        .map_err(|reason| shard_error(&layout_path, reason))?;
    let degree = layout.tensor_parallel;
    let copies = kv_copies(config.num_kv_heads, degree);
    let tied = config.tie_word_embeddings;
    let mut whole: BTreeMap<String, TensorSnapshot> = BTreeMap::new();
    // Where each tensor of `whole` came from, and the parameter names of the first layer seen
    // (every layer has the same).
    let mut sources: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut layer_names: Option<(usize, BTreeSet<String>)> = None;
    for (stage, layers) in layout.stage_layers.iter().enumerate() {
        let files = (0..degree)
            .map(|rank| {
                read_shard(
                    dir,
                    &stage_file(stage, layout.stages, rank, degree),
                    format!(
                        "the checkpoint has {} stages of {degree} ranks",
                        layout.stages
                    ),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let joined = join_ranks(dir, copies, &files)?;
        let file = &files[0].0;
        // This stage's tensors: its layers' and the shared ones it holds, nothing else.
        let mut held: BTreeMap<usize, BTreeSet<String>> = layers
            .iter()
            .map(|&layer| (layer, BTreeSet::new()))
            .collect();
        for name in joined.keys() {
            if !layout.holders(name, tied).contains(&stage) {
                return Err(shard_error(
                    file,
                    format!(
                        "holds `{name}`, which stage {stage} does not hold (its layers are \
                         {layers:?}; the embedding belongs to the first stage, the final norm \
                         and the head to the last)"
                    ),
                ));
            }
            if let Some(layer) = layer_of(name) {
                let rest = name.splitn(3, '.').nth(2).unwrap_or_default();
                held.entry(layer).or_default().insert(rest.to_string());
            }
        }
        for (layer, names) in &held {
            if names.is_empty() {
                return Err(shard_error(
                    file,
                    format!("has no tensor of layer {layer}, which stage {stage} holds"),
                ));
            }
            let (first, expected) = layer_names.get_or_insert_with(|| (*layer, names.clone()));
            if let Some(name) = expected.difference(names).next() {
                return Err(shard_error(
                    file,
                    format!("has no tensor `layers.{layer}.{name}` (layer {first} has one)"),
                ));
            }
            if let Some(name) = names.difference(expected).next() {
                return Err(shard_error(
                    file,
                    format!("has a tensor `layers.{layer}.{name}` that layer {first} lacks"),
                ));
            }
        }
        let mut shared = vec!["embed_tokens.weight", "norm.weight"];
        if !tied {
            shared.push("lm_head.weight");
        }
        for name in shared {
            if layout.holders(name, tied).contains(&stage) && !joined.contains_key(name) {
                return Err(shard_error(
                    file,
                    format!("has no tensor `{name}` (stage {stage} holds it)"),
                ));
            }
        }
        for (name, snapshot) in joined {
            if let Some(earlier) = sources.get(&name) {
                // A tied embedding, in the first and the last stage: the same bytes.
                let data = |snapshot: &TensorSnapshot, path: &Path| {
                    snapshot
                        .to_data()
                        .map_err(|error| shard_error(path, format!("`{name}`: {error}")))
                };
                if data(&snapshot, file)? != data(&whole[&name], earlier)? {
                    return Err(shard_error(
                        file,
                        format!("`{name}` differs from the copy in {}", earlier.display()),
                    ));
                }
                continue;
            }
            sources.insert(name.clone(), file.clone());
            whole.insert(name, snapshot);
        }
    }
    Ok(whole)
}

/// Reads the layout file `path`.
fn read_layout<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, CheckpointError> {
    let text = std::fs::read_to_string(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|error| shard_error(path, error.to_string()))
}

/// Reads the shard `name` of `dir`; a missing one is an error naming it and saying `why` it
/// should be there.
fn read_shard(dir: &Path, name: &str, why: String) -> Result<ShardFile, CheckpointError> {
    let path = dir.join(name);
    if !path.is_file() {
        return Err(shard_error(&path, format!("missing: {why}")));
    }
    let snapshots = read_burnpack(&path)?;
    Ok((path, snapshots))
}

/// The tensors of the tensor-parallel rank files `ranks` (in rank order) joined, by name.
fn join_ranks(
    dir: &Path,
    copies: usize,
    ranks: &[ShardFile],
) -> Result<BTreeMap<String, TensorSnapshot>, CheckpointError> {
    let (first_path, first) = &ranks[0];
    let mut joined = BTreeMap::new();
    for (name, snapshot) in first {
        let path: Vec<String> = name.split('.').map(str::to_string).collect();
        let mut parts = Vec::with_capacity(ranks.len());
        for (rank_path, snapshots) in ranks {
            let part = snapshots.get(name).ok_or_else(|| {
                shard_error(
                    rank_path,
                    format!("has no tensor `{name}` ({} has it)", first_path.display()),
                )
            })?;
            let data = part
                .to_data()
                .map_err(|error| shard_error(rank_path, format!("`{name}`: {error}")))?;
            parts.push(data);
        }
        let data = match placement_with(&path, copies) {
            Placement::Split(dim) => join_data(&parts, dim)
                .map_err(|reason| shard_error(dir, format!("`{name}`: {reason}")))?,
            Placement::ReplicatedHeads { dim, copies } => {
                // Rank `r` holds head `r / copies`, as its first holder `r - r % copies` does.
                if let Some(rank) = (0..parts.len()).find(|&r| parts[r] != parts[r - r % copies]) {
                    return Err(shard_error(
                        &ranks[rank].0,
                        format!(
                            "`{name}`: its copy of KV head {} differs from rank {}'s",
                            rank / copies,
                            rank - rank % copies
                        ),
                    ));
                }
                let heads: Vec<TensorData> = parts.into_iter().step_by(copies).collect();
                join_data(&heads, dim)
                    .map_err(|reason| shard_error(dir, format!("`{name}`: {reason}")))?
            }
            Placement::Replicated => {
                if let Some(rank) = parts.iter().position(|part| part != &parts[0]) {
                    return Err(shard_error(
                        &ranks[rank].0,
                        format!("replicated tensor `{name}` differs from rank 0's"),
                    ));
                }
                parts.swap_remove(0)
            }
        };
        joined.insert(name.clone(), rank_snapshot(snapshot, data));
    }
    for (rank_path, snapshots) in &ranks[1..] {
        if let Some(name) = snapshots.keys().find(|name| !first.contains_key(*name)) {
            return Err(shard_error(
                rank_path,
                format!("has a tensor `{name}` that {} lacks", first_path.display()),
            ));
        }
    }
    Ok(joined)
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
    files: Vec<Vec<TensorSnapshot>>,
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

impl<B: CollectiveBackend> ModuleVisitor<B> for ReplicaReader {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.enter(name);
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.exit();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
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
            let snapshot = TensorSnapshot::from_data(data, names, Vec::new(), param.id);
            self.files[file].push(snapshot);
        }
    }
}

/// The parameter path of a snapshot (`layers.0.mlp.up_proj.weight` as its names).
fn snapshot_path(snapshot: &TensorSnapshot) -> Vec<String> {
    snapshot
        .full_path()
        .split('.')
        .map(str::to_string)
        .collect()
}

/// A snapshot with the path and id of `like` holding `data`.
fn rank_snapshot(like: &TensorSnapshot, data: TensorData) -> TensorSnapshot {
    TensorSnapshot::from_data(
        data,
        snapshot_path(like),
        like.container_stack.clone().unwrap_or_default(),
        like.tensor_id.unwrap_or_default(),
    )
}

/// `data` cut into `degree` equal contiguous slices along `dim` (the caller checked that the
/// dimension divides).
fn split_data(data: &TensorData, dim: usize, degree: usize) -> Vec<TensorData> {
    let shape = data.shape.to_vec();
    let element = data.dtype.size();
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product::<usize>() * element;
    let slice = shape[dim] / degree * inner;
    let bytes = data.as_bytes();
    (0..degree)
        .map(|rank| {
            let mut part = Vec::with_capacity(outer * slice);
            for row in 0..outer {
                let start = row * shape[dim] * inner + rank * slice;
                part.extend_from_slice(&bytes[start..start + slice]);
            }
            let mut part_shape = shape.clone();
            part_shape[dim] /= degree;
            TensorData::from_bytes_vec(part, part_shape, data.dtype)
        })
        .collect()
}

/// The slices `parts` put back together along `dim`.
fn join_data(parts: &[TensorData], dim: usize) -> Result<TensorData, String> {
    let first = &parts[0];
    let shape = first.shape.to_vec();
    if dim >= shape.len() {
        return Err(format!(
            "has {} dimensions, not a dimension {dim}",
            shape.len()
        ));
    }
    if let Some(part) = parts
        .iter()
        .find(|part| part.shape != first.shape || part.dtype != first.dtype)
    {
        return Err(format!(
            "rank slices differ: {:?} {:?} and {:?} {:?}",
            shape,
            first.dtype,
            part.shape.to_vec(),
            part.dtype
        ));
    }
    let element = first.dtype.size();
    let outer: usize = shape[..dim].iter().product();
    let slice = shape[dim..].iter().product::<usize>() * element;
    let mut bytes = Vec::with_capacity(slice * outer * parts.len());
    for row in 0..outer {
        for part in parts {
            bytes.extend_from_slice(&part.as_bytes()[row * slice..(row + 1) * slice]);
        }
    }
    let mut whole = shape;
    whole[dim] *= parts.len();
    Ok(TensorData::from_bytes_vec(bytes, whole, first.dtype))
}

fn shard_error(path: &Path, message: String) -> CheckpointError {
    CheckpointError::Burnpack {
        path: path.to_path_buf(),
        message,
    }
}
