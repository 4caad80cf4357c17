//! Model merging (`hlat merge`), as mergekit 0.1.5 merges: every method of mergekit but `ram`
//! and `ramplus_tl` over Hugging Face checkpoints of one architecture, configured in mergekit's
//! YAML layout (`models` or `slices` that stack or drop layers), parameters resolved per tensor
//! as mergekit resolves them. docs/merge.md lists the methods, options and known differences.
//!
//! The merge goes tensor by tensor: each input's weights are memory-mapped, and one tensor of
//! every input is decoded (to f32, rounded to `dtype` when given), combined (in f64) and written
//! before the next, so memory stays near one tensor per input. The output is a Hugging Face
//! folder (`config.json` of the base model, else of the first model, with the written dtype and
//! the output's layer count, `generation_config.json` and tokenizer files copied from it, one
//! `model.safetensors`), written under a temporary name and renamed when complete.

mod arcee_fusion;
mod combine;
mod config;
mod interpolation;
mod method;
mod model_stock;
mod nearswap;
mod plan;
mod sce;
mod setting;
mod sparsify;
mod task_arithmetic;

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde_json::Value;

pub use combine::{combine, tensor_seed};
pub use config::{MergeConfig, ModelEntry, Settings, Slice, SliceSource, TokenizerSource};
pub use interpolation::{VectorAxis, karcher, linear, multislerp, nuslerp, slerp};
pub use method::{
    BasePolicy, InputContract, MergeMethod, ParameterDefault, ParameterKind, ParameterScope,
    ParameterSpec, Sparsification, TaskArithmeticOptions,
};
pub use plan::{ModelTensors, Parameters, Plan, PlannedInput, PlannedTensor, plan};
pub use setting::{Scalar, evaluate};
pub use sparsify::{SparsifyOptions, sparsify};
pub use task_arithmetic::{TaskArithmetic, TaskVector, stream_seed, task_arithmetic};

use crate::HlatConfig;
use crate::file_error::FileError;
use crate::hf::{
    CONFIG_FILE, HfError, WEIGHTS_FILE, WeightDtype, Weights, decode, encode, read_hf_config,
    write_json, write_safetensors_with,
};
use crate::staging::Staging;
use burn::tensor::TensorData;

/// What can go wrong in a merge. Each names the file, and the model, tensor or field.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// Reading or writing a file failed, or the merge configuration is invalid or asks for
    /// something unsupported.
    #[error(transparent)]
    File(#[from] FileError),
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
    /// A model's architecture is one mergekit does not merge, so neither does `hlat merge`.
    #[error("{}: mergekit has no definition of {architecture} ({reason}); hlat merges what mergekit merges", model.display())]
    UnsupportedArchitecture {
        /// The model folder.
        model: PathBuf,
        /// transformers' class of the model.
        architecture: &'static str,
        /// Why it cannot be merged as mergekit would.
        reason: &'static str,
    },
    /// A model lacks a tensor another source of the same output tensor has.
    #[error("{}: tensor `{tensor}` is {}", model.display(), if *missing { "missing" } else { "not in the other models" })]
    Tensor {
        /// The model folder.
        model: PathBuf,
        /// The tensor.
        tensor: String,
        /// Whether the model lacks it (otherwise only this model has it).
        missing: bool,
    },
    /// A tensor's shape differs between the sources of one output tensor.
    #[error(
        "{}: tensor `{tensor}` has shape {found:?}, but {} has {expected:?}",
        model.display(), reference.display()
    )]
    Shape {
        /// The model folder.
        model: PathBuf,
        /// The tensor.
        tensor: String,
        /// The first source's shape.
        expected: Vec<usize>,
        /// This model's.
        found: Vec<usize>,
        /// The first source.
        reference: PathBuf,
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
    /// Layers of the output.
    pub layers: usize,
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
    folder: String,
    config: HlatConfig,
    json: Value,
    weights: Weights,
}

/// Merges the models of `config` into the new folder `out`. Model folders are read relative to
/// the working directory, as mergekit reads them (see [`MergeConfig::with_models_in`]). Nothing
/// is left at `out` unless the merge succeeds, and an existing `out` is an error.
pub fn merge(config: &MergeConfig, out: &Path) -> Result<MergeSummary, MergeError> {
    if out.exists() {
        return Err(MergeError::OutputExists {
            path: out.to_path_buf(),
        });
    }
    let inputs = config
        .folders()
        .into_iter()
        .map(|folder| {
            let path = PathBuf::from(&folder);
            let model_config = read_hf_config(&path)?;
            let config_path = path.join(CONFIG_FILE);
            let text = FileError::read_to_string(&config_path)?;
            let json = serde_json::from_str(&text).map_err(|source| HfError::Json {
                path: config_path,
                source,
            })?;
            let weights = Weights::open(&path)?;
            Ok(Input {
                folder,
                config: model_config,
                json,
                weights,
            })
        })
        .collect::<Result<Vec<_>, MergeError>>()?;
    check_architectures(&inputs)?;
    let models: Vec<ModelTensors> = inputs
        .iter()
        .map(|input| ModelTensors {
            folder: input.folder.clone(),
            layers: input.config.num_layers,
            shapes: input
                .weights
                .tensors
                .iter()
                .map(|(name, located)| (name.clone(), located.info.shape.clone()))
                .collect(),
        })
        .collect();
    let plan = plan(config, &models)?;
    let donor = inputs
        .iter()
        .find(|input| input.folder == config.donor())
        .expect("the donor is one of the folders");
    let input_dtype = |model: usize, tensor: &str| {
        let located = &inputs[model].weights.tensors[tensor];
        WeightDtype::from_safetensors(located.info.dtype).ok_or_else(|| {
            MergeError::Hf(HfError::UnsupportedDtype {
                file: inputs[model].weights.file_of(tensor).to_path_buf(),
                tensor: tensor.to_string(),
                dtype: format!("{:?}", located.info.dtype),
            })
        })
    };
    let first = &plan.tensors[0].inputs[0];
    let dtype = match config.out_dtype.or(config.dtype) {
        Some(dtype) => dtype,
        None => input_dtype(first.model, &first.tensor)?,
    };
    let names: Vec<(String, Vec<usize>)> = plan
        .tensors
        .iter()
        .map(|tensor| (tensor.name.clone(), tensor.shape.clone()))
        .collect();

    let staging = Staging::new(out).map_err(FileError::io(out))?;
    let weights_path = staging.path().join(WEIGHTS_FILE);
    write_safetensors_with(&weights_path, &names, dtype, |index| {
        let tensor = &plan.tensors[index];
        // The inputs are merged in `dtype`, else in the first input's type; the result is
        // rounded to that type before it is written in `out_dtype`, as mergekit does.
        let working = match config.dtype {
            Some(dtype) => dtype,
            None => input_dtype(tensor.inputs[0].model, &tensor.inputs[0].tensor)?,
        };
        let values = tensor
            .inputs
            .iter()
            .map(|input| {
                let dtype = input_dtype(input.model, &input.tensor)?;
                let bytes = inputs[input.model].weights.bytes(&input.tensor);
                let data = decode(bytes, dtype, &tensor.shape, false);
                let values = data
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .expect("converted to f32");
                Ok(round(values.into_iter().map(f64::from), working))
            })
            .collect::<Result<Vec<_>, MergeError>>()?;
        let merged = combine(config.method, tensor, &values, working).map_err(|message| {
            FileError::invalid(&config.path, format!("tensor `{}`: {message}", tensor.name))
        })?;
        let merged = round(merged.into_iter(), working);
        Ok::<_, MergeError>(encode(TensorData::new(merged, tensor.shape.clone()), dtype, false).0)
    })?;

    let mut json = donor.json.clone();
    if let Some(object) = json.as_object_mut() {
        object.insert("torch_dtype".into(), dtype.torch_name().into());
        if object.contains_key("dtype") {
            object.insert("dtype".into(), dtype.torch_name().into());
        }
        object.insert("num_hidden_layers".into(), plan.layers.len().into());
        if object.get("layer_types").is_some_and(Value::is_array) {
            // Each output layer keeps the type (full or sliding attention) of its source layer.
            let types: Vec<Value> = plan
                .layers
                .iter()
                .map(|&(model, layer)| inputs[model].json["layer_types"][layer].clone())
                .collect();
            object.insert("layer_types".into(), types.into());
        }
    }
    write_json(&staging.path().join(CONFIG_FILE), &json)?;
    let donor_folder = Path::new(&donor.folder);
    for file in COPIED_FILES {
        let source = donor_folder.join(file);
        if source.is_file() {
            std::fs::copy(&source, staging.path().join(file)).map_err(FileError::io(&source))?;
        }
    }
    staging.commit(false).map_err(FileError::io(out))?;
    log::info!(
        "merged {} tensors ({} layers) into {}",
        names.len(),
        plan.layers.len(),
        out.display()
    );
    Ok(MergeSummary {
        tensors: names.len(),
        layers: plan.layers.len(),
        dtype,
        models: inputs
            .into_iter()
            .map(|input| input.folder.into())
            .collect(),
    })
}

/// `values` rounded to `dtype` (as a tensor of that type holds them), as f32.
fn round(values: impl Iterator<Item = f64>, dtype: WeightDtype) -> Vec<f32> {
    match dtype {
        WeightDtype::F32 => values.map(|v| v as f32).collect(),
        WeightDtype::BF16 => values.map(|v| bf16::from_f64(v).to_f32()).collect(),
        WeightDtype::F16 => values.map(|v| f16::from_f64(v).to_f32()).collect(),
    }
}

/// Checks that every input has the first one's sizes (the layer count may differ: slices pick
/// layers).
fn check_architectures(inputs: &[Input]) -> Result<(), MergeError> {
    let reference = &inputs[0];
    for input in inputs {
        if input.config.family == crate::ModelFamily::Qwen2Moe {
            return Err(MergeError::UnsupportedArchitecture {
                model: input.folder.clone().into(),
                architecture: input.config.family.architecture(),
                reason: "its architectures cover Mixtral and Qwen3-MoE, not Qwen2-MoE's shared \
                         expert",
            });
        }
    }
    let sizes = |model: &HlatConfig| {
        let moe = model.moe.as_ref();
        [
            ("vocab_size", model.vocab_size),
            ("hidden_size", model.hidden_size),
            ("num_attention_heads", model.num_heads),
            ("num_key_value_heads", model.num_kv_heads),
            ("intermediate_size", model.ffn_size),
            ("num_experts", moe.map_or(0, |moe| moe.num_experts)),
            (
                "moe_intermediate_size",
                moe.map_or(0, |moe| moe.expert_ffn_size),
            ),
        ]
    };
    for input in &inputs[1..] {
        for ((field, expected), (_, found)) in sizes(&reference.config)
            .into_iter()
            .zip(sizes(&input.config))
        {
            if expected != found {
                return Err(MergeError::Architecture {
                    reference: reference.folder.clone().into(),
                    other: input.folder.clone().into(),
                    field,
                    expected,
                    found,
                });
            }
        }
    }
    Ok(())
}

/// What the merge methods' tests read from `fixtures/mergekit/`.
#[cfg(test)]
pub(crate) mod fixture_cases {
    use serde_json::Value;

    use crate::hf::WeightDtype;

    /// The cases of `fixtures/mergekit/NAME` (a JSON list).
    pub fn cases(name: &str) -> Vec<Value> {
        let path = format!("{}/../fixtures/mergekit/{name}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// The case's merge dtype (`dtype`: torch's name).
    pub fn dtype(case: &Value) -> WeightDtype {
        match case["dtype"].as_str().unwrap() {
            "float32" => WeightDtype::F32,
            "bfloat16" => WeightDtype::BF16,
            other => panic!("dtype {other}"),
        }
    }

    /// The case's list `key`, each entry read by `read`.
    pub fn list<T>(case: &Value, key: &str, read: impl Fn(&Value) -> Option<T>) -> Vec<T> {
        case[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|value| read(value).unwrap())
            .collect()
    }
}
