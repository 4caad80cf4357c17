//! Writing a sharded checkpoint: [`RankShards`], the shards of a model ready to be written, cut
//! from a whole model on the host ([`save_split`], [`save_stages`]) or read from the replicas
//! of a split one (`super::replicas`).

use std::path::Path;

use burn_store::ModuleSnapshot;
use burn_store::burn_pack::{Tensor as PackTensor, Writer};
use tokenizers::Tokenizer;

use super::layout::{ShardLayout, StageLayout};
use super::slices::{rank_snapshot, split_for_ranks};
use crate::checkpoint::error::CheckpointError;
use crate::checkpoint::files::{
    NATIVE_CONFIG_FILE, PIPELINE_PARALLEL_FILE, TENSOR_PARALLEL_FILE, rank_file, stage_file,
};
use crate::config::HlatConfig;
use crate::hf;
use crate::model::Hlat;
use crate::parallel::{check_degree, kv_copies};
use crate::staging::Staging;

/// Saves a whole model as a checkpoint of `degree` rank shards, split on the host.
pub fn save_split(
    model: &Hlat,
    degree: usize,
    tokenizer: Option<&Tokenizer>,
    dir: &Path,
) -> Result<(), CheckpointError> {
    check_degree(model.config(), degree)
        .map_err(|reason| CheckpointError::burnpack(dir, reason))?;
    let copies = kv_copies(model.config().num_kv_heads, degree);
    let mut ranks: Vec<Vec<PackTensor>> = vec![Vec::new(); degree];
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
pub fn save_stages(
    model: &Hlat,
    layout: StageLayout,
    tokenizer: Option<&Tokenizer>,
    dir: &Path,
) -> Result<(), CheckpointError> {
    let config = model.config();
    layout
        .check(config)
        .map_err(|reason| CheckpointError::burnpack(dir, reason))?;
    let degree = layout.tensor_parallel;
    let copies = kv_copies(config.num_kv_heads, degree);
    let mut files: Vec<Vec<PackTensor>> = vec![Vec::new(); layout.stages * degree];
    for snapshot in model.collect(None, None, false) {
        let parts = split_for_ranks(&snapshot, degree, copies, dir)?;
        for stage in layout.holders(&snapshot.name, config.tie_word_embeddings) {
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
pub(super) enum FolderLayout {
    /// One file per tensor-parallel rank.
    Tensor(ShardLayout),
    /// One file per pipeline stage × tensor-parallel rank.
    Pipeline(StageLayout),
}

/// The shards of a model, read from its replicas or cut on the host, ready to be written.
pub struct RankShards {
    pub(super) layout: FolderLayout,
    /// One per file: rank `r`'s (tensor parallel), or stage `s` rank `r`'s at `s × degree + r`.
    pub(super) files: Vec<Vec<PackTensor>>,
}

impl RankShards {
    pub(super) fn tensor_parallel(ranks: Vec<Vec<PackTensor>>) -> Self {
        Self {
            layout: FolderLayout::Tensor(ShardLayout {
                degree: ranks.len(),
            }),
            files: ranks,
        }
    }
}

impl RankShards {
    /// Bytes of host memory the shards hold.
    pub fn bytes(&self) -> u64 {
        self.files
            .iter()
            .flatten()
            .map(|tensor| tensor.byte_len() as u64)
            .sum()
    }

    /// Writes the shards as a checkpoint of the whole model `whole` into `dir` (through a
    /// temporary folder: `dir` appears complete or not at all).
    pub fn write(
        self,
        whole: &HlatConfig,
        tokenizer: Option<&Tokenizer>,
        dir: &Path,
    ) -> Result<(), CheckpointError> {
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
        let staging = Staging::new(dir).map_err(CheckpointError::io(dir))?;
        whole.save(&staging.path().join(NATIVE_CONFIG_FILE))?;
        let layout_path = staging.path().join(layout_file);
        let layout = layout.expect("the shard layout serializes");
        std::fs::write(&layout_path, layout).map_err(CheckpointError::io(&layout_path))?;
        for (name, snapshots) in names.iter().zip(self.files) {
            let path = staging.path().join(name);
            Writer::new(snapshots)
                .write_to_file(&path)
                .map_err(|error| CheckpointError::burnpack(&path, error.to_string()))?;
        }
        if let Some(tokenizer) = tokenizer {
            hf::save_tokenizer(tokenizer, staging.path())?;
        }
        staging.commit(true).map_err(CheckpointError::io(dir))
    }
}
