//! Model merging (`hlat merge`), as mergekit does it: linear, SLERP, task arithmetic, TIES and
//! DARE over Hugging Face checkpoints of one architecture, configured in mergekit's YAML layout.
//!
//! The merge goes tensor by tensor: each input's weights are memory-mapped, and one tensor of
//! every input is decoded (to f32), combined (in f64) and written before the next, so memory
//! stays near one tensor per input. The output is a Hugging Face folder (`config.json` of the base
//! model with the written dtype, `generation_config.json` and tokenizer files copied from it, one
//! `model.safetensors`), written under a temporary name and renamed when complete.

mod config;
mod methods;
mod yaml;

use std::path::{Path, PathBuf};

use burn::tensor::TensorData;

pub use config::{MergeConfig, MergeMethod, ModelEntry, TensorPlace, evaluate};
pub use methods::{Sparsification, TaskArithmetic, TaskVector, linear, slerp, task_arithmetic};
pub use yaml::{YamlError, parse as parse_yaml};

use crate::HlatConfig;
use crate::hf::{
    CONFIG_FILE, HfError, WEIGHTS_FILE, WeightDtype, Weights, decode, encode, read_hf_config,
    write_json, write_safetensors_with,
};
use crate::staging::Staging;

/// What can go wrong in a merge. Each names the file, and the model, tensor or field.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The merge configuration is invalid or asks for something unsupported.
    #[error("{}: {message}", path.display())]
    Config {
        /// The configuration file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A model folder could not be read.
    #[error(transparent)]
    Hf(#[from] HfError),
    /// Two models do not have the same architecture.
    #[error(
        "{} and {} differ in `{field}` ({expected} and {found}): models of one architecture only",
        reference.display(), other.display()
    )]
    Architecture {
        /// The first model.
        reference: PathBuf,
        /// The model that differs.
        other: PathBuf,
        /// The field of `config.json`.
        field: &'static str,
        /// The first model's value.
        expected: usize,
        /// The other's.
        found: usize,
    },
    /// A model lacks a tensor of the first model, or has one the first lacks.
    #[error("{}: tensor `{tensor}` is {}", model.display(), if *missing { "missing" } else { "not in the other models" })]
    Tensor {
        /// The model folder.
        model: PathBuf,
        /// The tensor.
        tensor: String,
        /// Whether the model lacks it (otherwise only this model has it).
        missing: bool,
    },
    /// A tensor's shape differs between models.
    #[error("{}: tensor `{tensor}` has shape {found:?}, the first model's has {expected:?}", model.display())]
    Shape {
        /// The model folder.
        model: PathBuf,
        /// The tensor.
        tensor: String,
        /// The first model's shape.
        expected: Vec<usize>,
        /// This model's.
        found: Vec<usize>,
    },
    /// The output folder exists already.
    #[error("{}: already exists (choose a new folder)", path.display())]
    OutputExists {
        /// The folder.
        path: PathBuf,
    },
}

/// What a merge wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeSummary {
    /// Tensors written.
    pub tensors: usize,
    /// Their element type.
    pub dtype: WeightDtype,
    /// The models read, base first.
    pub models: Vec<PathBuf>,
}

/// The files copied from the base model beside the merged weights, when it has them.
const COPIED_FILES: &[&str] = &[
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
];

/// One opened input model.
struct Input {
    folder: PathBuf,
    config: HlatConfig,
    weights: Weights,
}

/// Merges the models of `config` into the new folder `out`. Model folders are read relative to
/// the working directory, as mergekit reads them.
pub fn merge(config: &MergeConfig, out: &Path) -> Result<MergeSummary, MergeError> {
    if out.exists() {
        return Err(MergeError::OutputExists {
            path: out.to_path_buf(),
        });
    }
    let folders = config.folders();
    let inputs = folders
        .iter()
        .map(|folder| {
            let folder = PathBuf::from(folder);
            let model_config = read_hf_config(&folder)?;
            let weights = Weights::open(&folder)?;
            Ok(Input {
                folder,
                config: model_config,
                weights,
            })
        })
        .collect::<Result<Vec<_>, MergeError>>()?;
    check_inputs(config, &inputs)?;
    let reference = &inputs[0];
    let layers = reference.config.num_layers;

    let dtype = match &config.dtype {
        Some(name) => name
            .parse::<WeightDtype>()
            .map_err(|_| MergeError::Config {
                path: config.path.clone(),
                message: format!(
                    "`dtype`: unknown element type `{name}` (float32, bfloat16 or float16)"
                ),
            })?,
        None => {
            let first = reference.weights.tensors.values().next();
            first
                .and_then(|located| WeightDtype::from_safetensors(located.info.dtype))
                .unwrap_or(WeightDtype::F32)
        }
    };
    let names: Vec<(String, Vec<usize>)> = reference
        .weights
        .tensors
        .iter()
        .map(|(name, located)| (name.clone(), located.info.shape.clone()))
        .collect();

    let staging = Staging::new(out).map_err(|source| MergeError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let weights_path = staging.path().join(WEIGHTS_FILE);
    write_safetensors_with(&weights_path, &names, dtype, |index| {
        let (name, shape) = &names[index];
        let values = merge_tensor(config, &inputs, name, shape, layers)?;
        Ok::<_, MergeError>(encode(TensorData::new(values, shape.clone()), dtype, false).0)
    })?;

    let base_config = reference.folder.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&base_config).map_err(|source| MergeError::Io {
        path: base_config.clone(),
        source,
    })?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| HfError::Json {
            path: base_config.clone(),
            source,
        })?;
    if let Some(object) = json.as_object_mut() {
        object.insert("torch_dtype".into(), dtype.torch_name().into());
        if object.contains_key("dtype") {
            object.insert("dtype".into(), dtype.torch_name().into());
        }
    }
    write_json(&staging.path().join(CONFIG_FILE), &json)?;
    for file in COPIED_FILES {
        let source = reference.folder.join(file);
        if source.is_file() {
            std::fs::copy(&source, staging.path().join(file)).map_err(|error| MergeError::Io {
                path: source.clone(),
                source: error,
            })?;
        }
    }
    staging.commit(false).map_err(|source| MergeError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    log::info!("merged {} tensors into {}", names.len(), out.display());
    Ok(MergeSummary {
        tensors: names.len(),
        dtype,
        models: inputs.into_iter().map(|input| input.folder).collect(),
    })
}

/// Checks that every input has the first one's architecture, tensors and shapes, and that
/// slices span every layer.
fn check_inputs(config: &MergeConfig, inputs: &[Input]) -> Result<(), MergeError> {
    let reference = &inputs[0];
    let sizes = |model: &HlatConfig| {
        [
            ("vocab_size", model.vocab_size),
            ("hidden_size", model.hidden_size),
            ("num_hidden_layers", model.num_layers),
            ("num_attention_heads", model.num_heads),
            ("num_key_value_heads", model.num_kv_heads),
            ("intermediate_size", model.ffn_size),
        ]
    };
    for input in &inputs[1..] {
        for ((field, expected), (_, found)) in sizes(&reference.config)
            .into_iter()
            .zip(sizes(&input.config))
        {
            if expected != found {
                return Err(MergeError::Architecture {
                    reference: reference.folder.clone(),
                    other: input.folder.clone(),
                    field,
                    expected,
                    found,
                });
            }
        }
        for (name, located) in &reference.weights.tensors {
            let Some(other) = input.weights.tensors.get(name) else {
                return Err(MergeError::Tensor {
                    model: input.folder.clone(),
                    tensor: name.clone(),
                    missing: true,
                });
            };
            if other.info.shape != located.info.shape {
                return Err(MergeError::Shape {
                    model: input.folder.clone(),
                    tensor: name.clone(),
                    expected: located.info.shape.clone(),
                    found: other.info.shape.clone(),
                });
            }
        }
        if let Some(name) = input
            .weights
            .tensors
            .keys()
            .find(|name| !reference.weights.tensors.contains_key(*name))
        {
            return Err(MergeError::Tensor {
                model: input.folder.clone(),
                tensor: name.clone(),
                missing: false,
            });
        }
    }
    for (model, range) in &config.slice_ranges {
        if *range != [0, reference.config.num_layers] {
            return Err(MergeError::Config {
                path: config.path.clone(),
                message: format!(
                    "slice of `{model}` covers layers {range:?}: only slices of every layer \
                     [0, {}] are supported",
                    reference.config.num_layers
                ),
            });
        }
    }
    Ok(())
}

/// The values of tensor `name` of `input`, as f32.
fn values_of(input: &Input, name: &str, shape: &[usize]) -> Result<Vec<f32>, MergeError> {
    let located = &input.weights.tensors[name];
    let dtype = WeightDtype::from_safetensors(located.info.dtype).ok_or_else(|| {
        HfError::UnsupportedDtype {
            file: input.weights.file_of(name).to_path_buf(),
            tensor: name.to_string(),
            dtype: format!("{:?}", located.info.dtype),
        }
    })?;
    let data = decode(input.weights.bytes(name), dtype, shape, false);
    Ok(data
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("converted to f32"))
}

/// The merged values of one tensor.
fn merge_tensor(
    config: &MergeConfig,
    inputs: &[Input],
    name: &str,
    shape: &[usize],
    layers: usize,
) -> Result<Vec<f32>, MergeError> {
    let place = TensorPlace::of(name, layers);
    let input_of = |folder: &str| {
        inputs
            .iter()
            .find(|input| input.folder.as_path() == Path::new(folder))
            .expect("every model was opened")
    };
    match config.method {
        MergeMethod::Linear => {
            let values = config
                .models
                .iter()
                .map(|entry| values_of(input_of(&entry.model), name, shape))
                .collect::<Result<Vec<_>, _>>()?;
            let mut models = Vec::with_capacity(values.len());
            for (entry, values) in config.models.iter().zip(&values) {
                let weight = config.parameter("weight", Some(entry), &place, Some(1.0))?;
                models.push((values.as_slice(), weight));
            }
            Ok(linear(&models, config.flag("normalize", true)?))
        }
        MergeMethod::Slerp => {
            let base = config
                .base_model
                .as_deref()
                .expect("checked: slerp has a base");
            let other = config
                .models_without_base()
                .next()
                .expect("checked: slerp has a second model");
            let t = config.parameter("t", None, &place, None)?;
            Ok(slerp(
                t,
                &values_of(input_of(base), name, shape)?,
                &values_of(input_of(&other.model), name, shape)?,
            ))
        }
        method => {
            let base_name = config.base_model.as_deref().expect("checked: a base model");
            let base = values_of(input_of(base_name), name, shape)?;
            let entries: Vec<&ModelEntry> = config.models_without_base().collect();
            let values = entries
                .iter()
                .map(|entry| values_of(input_of(&entry.model), name, shape))
                .collect::<Result<Vec<_>, _>>()?;
            let mut vectors = Vec::with_capacity(entries.len());
            for (entry, values) in entries.iter().zip(&values) {
                vectors.push(TaskVector {
                    values,
                    weight: config.parameter("weight", Some(entry), &place, None)?,
                    density: config.parameter("density", Some(entry), &place, Some(1.0))?,
                });
            }
            let seed = tensor_seed(name);
            let (sparsification, sign_consensus, normalize, rescale) = match method {
                MergeMethod::TaskArithmetic => (Sparsification::None, false, false, false),
                MergeMethod::Ties => (Sparsification::Magnitude, true, true, false),
                MergeMethod::DareTies => (Sparsification::Random(seed), true, false, true),
                _ => (Sparsification::Random(seed), false, false, true),
            };
            let options = TaskArithmetic {
                sparsification,
                sign_consensus,
                normalize: config.flag("normalize", normalize)?,
                rescale: config.flag("rescale", rescale)?,
            };
            Ok(task_arithmetic(&base, &vectors, options))
        }
    }
}

/// A seed for DARE's random choices of one tensor: fixed by its name, so a merge is repeatable.
fn tensor_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
