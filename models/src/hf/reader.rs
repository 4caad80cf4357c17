//! Memory-mapped safetensors weights of a Hugging Face folder, single file or sharded.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::SafeTensors;
use safetensors::tensor::TensorInfo;
use serde::Deserialize;

use super::error::HfError;

/// The single-file weights name.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of sharded weights.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One memory-mapped safetensors file.
struct Shard {
    path: PathBuf,
    map: Mmap,
    /// Offset of the data section (after the 8-byte length and the header).
    data_start: usize,
}

/// Where a tensor lives: its shard and its header entry.
pub struct Located {
    shard: usize,
    /// The header entry (dtype, shape, offsets in the data section).
    pub info: TensorInfo,
}

/// The weights of a folder, opened without reading tensor data.
pub struct Weights {
    /// The file that lists the tensors: the weights file or the index.
    pub listing: PathBuf,
    shards: Vec<Shard>,
    /// Every tensor by name.
    pub tensors: BTreeMap<String, Located>,
}

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

impl Weights {
    /// Opens `DIR/model.safetensors`, or the shards listed by `DIR/model.safetensors.index.json`,
    /// checking every header and file length.
    pub fn open(dir: &Path) -> Result<Weights, HfError> {
        let single = dir.join(WEIGHTS_FILE);
        if single.is_file() {
            let (shard, header) = Shard::open(single.clone())?;
            let tensors = header
                .into_iter()
                .map(|(name, info)| (name, Located { shard: 0, info }))
                .collect();
            return Ok(Weights {
                listing: single,
                shards: vec![shard],
                tensors,
            });
        }
        let index_path = dir.join(INDEX_FILE);
        if !index_path.is_file() {
            return Err(HfError::NoWeights {
                dir: dir.to_path_buf(),
            });
        }
        let text = std::fs::read_to_string(&index_path).map_err(HfError::io(&index_path))?;
        let index: Index = serde_json::from_str(&text).map_err(|source| HfError::Json {
            path: index_path.clone(),
            source,
        })?;
        let mut files: Vec<&String> = index.weight_map.values().collect();
        files.sort();
        files.dedup();
        let mut shards = Vec::with_capacity(files.len());
        let mut tensors = BTreeMap::new();
        for (number, file) in files.into_iter().enumerate() {
            let (shard, header) = Shard::open(dir.join(file))?;
            for (name, info) in header {
                match index.weight_map.get(&name) {
                    Some(listed) if listed == file => {
                        tensors.insert(
                            name,
                            Located {
                                shard: number,
                                info,
                            },
                        );
                    }
                    _ => {
                        return Err(HfError::UnexpectedTensor {
                            file: shard.path.clone(),
                            tensor: name,
                        });
                    }
                }
            }
            shards.push(shard);
        }
        if let Some((name, file)) = index
            .weight_map
            .iter()
            .find(|(name, _)| !tensors.contains_key(*name))
        {
            return Err(HfError::MissingTensor {
                file: dir.join(file),
                tensor: name.clone(),
            });
        }
        Ok(Weights {
            listing: index_path,
            shards,
            tensors,
        })
    }

    /// The file holding tensor `name` (the listing when it is absent).
    pub fn file_of(&self, name: &str) -> &Path {
        self.tensors
            .get(name)
            .map_or(&self.listing, |located| &self.shards[located.shard].path)
    }

    /// The raw little-endian bytes of tensor `name`, which must be listed.
    pub fn bytes(&self, name: &str) -> &[u8] {
        let located = &self.tensors[name];
        let shard = &self.shards[located.shard];
        let (start, end) = located.info.data_offsets;
        &shard.map[shard.data_start + start..shard.data_start + end]
    }
}

impl Shard {
    /// Maps `path` and reads its header, which safetensors checks against the file length (a
    /// truncated file is an error).
    fn open(path: PathBuf) -> Result<(Shard, Vec<(String, TensorInfo)>), HfError> {
        let file = File::open(&path).map_err(HfError::io(&path))?;
        // SAFETY: the map is read-only; a checkpoint must not be modified while it is imported
        // (as for every reader of memory-mapped weights).
        let map = unsafe { Mmap::map(&file) }.map_err(HfError::io(&path))?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&map[..]).map_err(|error| HfError::CorruptSafetensors {
                file: path.clone(),
                reason: error.to_string(),
            })?;
        let tensors = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, info.clone()))
            .collect();
        let shard = Shard {
            path,
            map,
            data_start: 8 + header_len,
        };
        Ok((shard, tensors))
    }
}
