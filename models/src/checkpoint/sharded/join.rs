//! Reading a sharded checkpoint as the whole model's tensors, joined on the host, with every
//! copy of a replicated tensor checked against the others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use burn_store::bridge;
use burn_store::burn_pack::Tensor as PackTensor;

use super::layout::{ShardLayout, StageLayout, layer_of};
use super::slices::{join_data, rank_snapshot};
use crate::checkpoint::burnpack::read_burnpack;
use crate::checkpoint::error::CheckpointError;
use crate::checkpoint::files::{
    NATIVE_CONFIG_FILE, PIPELINE_PARALLEL_FILE, TENSOR_PARALLEL_FILE, is_pipelined, rank_file,
    stage_file,
};
use crate::config::HlatConfig;
use crate::parallel::{Placement, kv_copies, placement_with};

/// A rank file read: its path and its tensors by name.
type ShardFile = (PathBuf, BTreeMap<String, PackTensor>);

/// The whole model's tensors of a sharded checkpoint (by tensor-parallel rank, pipeline stage or
/// both), joined on the host, by parameter path. Replicated parameters must agree on every rank,
/// the copies of a KV head on every rank holding it, a tied embedding in the first and last
/// stages; each stage's files must hold exactly its layers and shared tensors.
pub fn read_joined(dir: &Path) -> Result<BTreeMap<String, PackTensor>, CheckpointError> {
    if is_pipelined(dir) {
        return read_stages_joined(dir);
    }
    let layout_path = dir.join(TENSOR_PARALLEL_FILE);
    let layout: ShardLayout = read_layout(&layout_path)?;
    if layout.degree == 0 {
        return Err(CheckpointError::burnpack(
            &layout_path,
            "`degree` must be at least 1",
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
fn read_stages_joined(dir: &Path) -> Result<BTreeMap<String, PackTensor>, CheckpointError> {
    let layout_path = dir.join(PIPELINE_PARALLEL_FILE);
    let layout: StageLayout = read_layout(&layout_path)?;
    let config = HlatConfig::load(&dir.join(NATIVE_CONFIG_FILE))?;
    layout
        .check(&config)
        .map_err(|reason| CheckpointError::burnpack(&layout_path, reason))?;
    let degree = layout.tensor_parallel;
    let copies = kv_copies(config.num_kv_heads, degree);
    let tied = config.tie_word_embeddings;
    let mut whole: BTreeMap<String, PackTensor> = BTreeMap::new();
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
                return Err(CheckpointError::burnpack(
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
                return Err(CheckpointError::burnpack(
                    file,
                    format!("has no tensor of layer {layer}, which stage {stage} holds"),
                ));
            }
            let (first, expected) = layer_names.get_or_insert_with(|| (*layer, names.clone()));
            if let Some(name) = expected.difference(names).next() {
                return Err(CheckpointError::burnpack(
                    file,
                    format!("has no tensor `layers.{layer}.{name}` (layer {first} has one)"),
                ));
            }
            if let Some(name) = names.difference(expected).next() {
                return Err(CheckpointError::burnpack(
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
                return Err(CheckpointError::burnpack(
                    file,
                    format!("has no tensor `{name}` (stage {stage} holds it)"),
                ));
            }
        }
        for (name, snapshot) in joined {
            if let Some(earlier) = sources.get(&name) {
                // A tied embedding, in the first and the last stage: the same bytes.
                let data = |snapshot: &PackTensor, path: &Path| {
                    bridge::to_data(snapshot).map_err(|error| {
                        CheckpointError::burnpack(path, format!("`{name}`: {error}"))
                    })
                };
                if data(&snapshot, file)? != data(&whole[&name], earlier)? {
                    return Err(CheckpointError::burnpack(
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
    let text = std::fs::read_to_string(path).map_err(CheckpointError::io(path))?;
    serde_json::from_str(&text).map_err(|error| CheckpointError::burnpack(path, error.to_string()))
}

/// Reads the shard `name` of `dir`; a missing one is an error naming it and saying `why` it
/// should be there.
fn read_shard(dir: &Path, name: &str, why: String) -> Result<ShardFile, CheckpointError> {
    let path = dir.join(name);
    if !path.is_file() {
        return Err(CheckpointError::burnpack(&path, format!("missing: {why}")));
    }
    let snapshots = read_burnpack(&path)?;
    Ok((path, snapshots))
}

/// The tensors of the tensor-parallel rank files `ranks` (in rank order) joined, by name.
fn join_ranks(
    dir: &Path,
    copies: usize,
    ranks: &[ShardFile],
) -> Result<BTreeMap<String, PackTensor>, CheckpointError> {
    let (first_path, first) = &ranks[0];
    let mut joined = BTreeMap::new();
    for (name, snapshot) in first {
        let path: Vec<String> = name.split('.').map(str::to_string).collect();
        let mut parts = Vec::with_capacity(ranks.len());
        for (rank_path, snapshots) in ranks {
            let part = snapshots.get(name).ok_or_else(|| {
                CheckpointError::burnpack(
                    rank_path,
                    format!("has no tensor `{name}` ({} has it)", first_path.display()),
                )
            })?;
            let data = bridge::to_data(part).map_err(|error| {
                CheckpointError::burnpack(rank_path, format!("`{name}`: {error}"))
            })?;
            parts.push(data);
        }
        let data = match placement_with(&path, copies) {
            Placement::Split(dim) => join_data(&parts, dim)
                .map_err(|reason| CheckpointError::burnpack(dir, format!("`{name}`: {reason}")))?,
            Placement::ReplicatedHeads { dim, copies } => {
                // Rank `r` holds head `r / copies`, as its first holder `r - r % copies` does.
                if let Some(rank) = (0..parts.len()).find(|&r| parts[r] != parts[r - r % copies]) {
                    return Err(CheckpointError::burnpack(
                        &ranks[rank].0,
                        format!(
                            "`{name}`: its copy of KV head {} differs from rank {}'s",
                            rank / copies,
                            rank - rank % copies
                        ),
                    ));
                }
                let heads: Vec<TensorData> = parts.into_iter().step_by(copies).collect();
                join_data(&heads, dim).map_err(|reason| {
                    CheckpointError::burnpack(dir, format!("`{name}`: {reason}"))
                })?
            }
            Placement::Replicated => {
                if let Some(rank) = parts.iter().position(|part| part != &parts[0]) {
                    return Err(CheckpointError::burnpack(
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
            return Err(CheckpointError::burnpack(
                rank_path,
                format!("has a tensor `{name}` that {} lacks", first_path.display()),
            ));
        }
    }
    Ok(joined)
}
