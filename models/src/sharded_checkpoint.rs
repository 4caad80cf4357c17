//! Tensor-parallel checkpoints: one burnpack file per rank, as NeuronX Distributed saves them.
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
//! A training run writes each rank's shard straight from that rank's replica ([`read_ranks`]);
//! `hlat convert` splits a whole model on the host ([`save_split`]); loading joins the shards on
//! the host ([`read_joined`]), so a checkpoint of any degree opens as the whole model and resumes
//! under any layout. Splitting and joining copy bytes, so split → join is bit-exact.

use std::collections::BTreeMap;
use std::path::Path;

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
use crate::staging::Staging;

/// The file that marks a sharded checkpoint and gives its degree.
pub const TENSOR_PARALLEL_FILE: &str = "tensor_parallel.json";

/// What [`TENSOR_PARALLEL_FILE`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLayout {
    /// The tensor-parallel degree: how many rank files there are.
    pub degree: usize,
}

/// The weights file of rank `rank` of `degree`.
pub fn rank_file(rank: usize, degree: usize) -> String {
    format!("model-rank-{rank:02}-of-{degree:02}.bpk")
}

/// Whether `dir` holds a sharded checkpoint.
pub fn is_sharded(dir: &Path) -> bool {
    dir.join(TENSOR_PARALLEL_FILE).is_file()
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
        let path = snapshot_path(&snapshot);
        let data = snapshot
            .to_data()
            .map_err(|error| shard_error(dir, format!("`{}`: {error}", path.join("."))))?;
        let parts = match placement_with(&path, copies) {
            Placement::Split(dim) => split_data(&data, dim, degree),
            // Rank `r` holds head `r / copies`.
            Placement::ReplicatedHeads { dim, copies } => split_data(&data, dim, degree / copies)
                .into_iter()
                .flat_map(|head| vec![head; copies])
                .collect(),
            Placement::Replicated => vec![data; degree],
        };
        for (rank, part) in parts.into_iter().enumerate() {
            ranks[rank].push(rank_snapshot(&snapshot, part));
        }
    }
    write_ranks(model.config(), ranks, tokenizer, dir)
}

/// The rank shards of a tensor-parallel model, read from its replicas, ready to be written.
pub struct RankShards {
    ranks: Vec<Vec<TensorSnapshot>>,
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
    let mut reader = ReplicaReader {
        degree,
        path: ParamPath::default(),
        ranks: vec![Vec::new(); degree],
        failure: None,
    };
    model.visit(&mut reader);
    match reader.failure {
        Some(reason) => Err(shard_error(dir, reason)),
        None => Ok(RankShards {
            ranks: reader.ranks,
        }),
    }
}

impl RankShards {
    /// Writes the shards as a checkpoint of the whole model `whole` into `dir`.
    pub fn write(
        self,
        whole: &HlatConfig,
        tokenizer: Option<&Tokenizer>,
        dir: &Path,
    ) -> Result<(), CheckpointError> {
        write_ranks(whole, self.ranks, tokenizer, dir)
    }
}

/// The whole model's tensors of a sharded checkpoint, joined on the host, by parameter path.
/// Replicated parameters must agree on every rank, and the copies of a KV head on every rank
/// holding it.
pub fn read_joined(dir: &Path) -> Result<BTreeMap<String, TensorSnapshot>, CheckpointError> {
    let layout_path = dir.join(TENSOR_PARALLEL_FILE);
    let text = std::fs::read_to_string(&layout_path).map_err(|source| CheckpointError::Io {
        path: layout_path.clone(),
        source,
    })?;
    let layout: ShardLayout = serde_json::from_str(&text)
        .map_err(|error| shard_error(&layout_path, error.to_string()))?;
    if layout.degree == 0 {
        return Err(shard_error(
            &layout_path,
            "`degree` must be at least 1".into(),
        ));
    }
    let config = HlatConfig::load(&dir.join(NATIVE_CONFIG_FILE))?;
    let copies = kv_copies(config.num_kv_heads, layout.degree);
    let mut ranks = Vec::with_capacity(layout.degree);
    for rank in 0..layout.degree {
        let path = dir.join(rank_file(rank, layout.degree));
        if !path.is_file() {
            return Err(shard_error(
                &path,
                format!("missing: the checkpoint has {} ranks", layout.degree),
            ));
        }
        let snapshots = read_burnpack(&path)?;
        ranks.push((path, snapshots));
    }
    let (first_path, first) = &ranks[0];
    let mut joined = BTreeMap::new();
    for (name, snapshot) in first {
        let path: Vec<String> = name.split('.').map(str::to_string).collect();
        let mut parts = Vec::with_capacity(ranks.len());
        for (rank_path, snapshots) in &ranks {
            let part = snapshots.get(name).ok_or_else(|| {
                shard_error(rank_path, format!("has no tensor `{name}` (rank 0 has it)"))
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

/// Writes the configuration, the layout, one burnpack per rank and the tokenizer into `dir`
/// (through a temporary folder: `dir` appears complete or not at all).
fn write_ranks(
    config: &HlatConfig,
    ranks: Vec<Vec<TensorSnapshot>>,
    tokenizer: Option<&Tokenizer>,
    dir: &Path,
) -> Result<(), CheckpointError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { path, source }
    };
    let degree = ranks.len();
    let staging = Staging::new(dir).map_err(io(dir))?;
    config.save(&staging.path().join(NATIVE_CONFIG_FILE))?;
    let layout =
        serde_json::to_string_pretty(&ShardLayout { degree }).expect("the shard layout serializes");
    let layout_path = staging.path().join(TENSOR_PARALLEL_FILE);
    std::fs::write(&layout_path, layout).map_err(io(&layout_path))?;
    for (rank, snapshots) in ranks.into_iter().enumerate() {
        let path = staging.path().join(rank_file(rank, degree));
        BurnpackWriter::new(snapshots)
            .write_to_file(&path)
            .map_err(|error| shard_error(&path, error.to_string()))?;
    }
    if let Some(tokenizer) = tokenizer {
        hf::save_tokenizer(tokenizer, staging.path())?;
    }
    staging.commit(true).map_err(io(dir))
}

/// Reads each parameter's rank slices from the first `degree` replicas.
struct ReplicaReader {
    degree: usize,
    path: ParamPath,
    ranks: Vec<Vec<TensorSnapshot>>,
    failure: Option<String>,
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
        let (first, replicas) = match collective::into_local_replicas(param.val(), self.degree) {
            Ok(local) => local,
            Err(error) => {
                self.failure = Some(format!("reading `{name}`: {error}"));
                return;
            }
        };
        if first != 0 || replicas.len() < self.degree {
            self.failure = Some(format!(
                "`{name}`: this process holds replicas {first}..{} of its device, not the \
                 tensor-parallel ranks 0..{}",
                first + replicas.len(),
                self.degree
            ));
            return;
        }
        for (rank, data) in replicas.into_iter().take(self.degree).enumerate() {
            let snapshot =
                TensorSnapshot::from_data(data, self.path.names().to_vec(), Vec::new(), param.id);
            self.ranks[rank].push(snapshot);
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
