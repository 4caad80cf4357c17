//! The `--data` argument: prepared shard folders and their mixing weights.
//!
//! Grammar: a comma-separated list of sources, each `[NAME=]FOLDER[:WEIGHT]`, e.g.
//! `domain=shards/a:0.99,general=shards/b:0.01`. A folder holds the train and validation shards
//! that `hlat data ingest` writes (token shards, or `train`/`val` Megatron datasets with
//! `--format megatron`); in place of a folder, a Megatron-LM / NeuronX Distributed indexed
//! dataset prefix (`data/corpus_text_document` for `corpus_text_document.bin` and `.idx`) is
//! read as it is, for training only (see `hlat_train::data::megatron`). Weights default to 1
//! and are normalized; names default to the folder and only label logs. A single source needs
//! neither.

use std::path::PathBuf;

use crate::error::TrainError;

/// One shard folder of a data mixture.
#[derive(Debug, Clone, PartialEq)]
pub struct DataSource {
    /// Label in logs.
    pub name: String,
    /// Folder of prepared shards, or a Megatron indexed dataset prefix.
    pub folder: PathBuf,
    /// Mixing weight (normalized over the sources).
    pub weight: f64,
}

/// Parses a `--data` value (see the module documentation).
pub fn parse_data_spec(spec: &str) -> Result<Vec<DataSource>, TrainError> {
    let invalid = |message: String| TrainError::InvalidConfig {
        field: "data",
        message,
    };
    let mut sources = Vec::new();
    for item in spec.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(invalid(format!("`{spec}` has an empty source")));
        }
        let (name, rest) = match item.split_once('=') {
            Some((name, rest)) => (Some(name.trim()), rest.trim()),
            None => (None, item),
        };
        let (folder, weight) = match rest.rsplit_once(':') {
            Some((folder, weight)) => {
                let weight: f64 = weight
                    .trim()
                    .parse()
                    .map_err(|_| invalid(format!("`{item}`: weight `{weight}` is not a number")))?;
                (folder.trim(), weight)
            }
            None => (rest, 1.0),
        };
        if folder.is_empty() {
            return Err(invalid(format!("`{item}` names no folder")));
        }
        if !(weight.is_finite() && weight > 0.0) {
            return Err(invalid(format!(
                "`{item}`: weight {weight} is not positive"
            )));
        }
        sources.push(DataSource {
            name: name.unwrap_or(folder).to_string(),
            folder: PathBuf::from(folder),
            weight,
        });
    }
    Ok(sources)
}
