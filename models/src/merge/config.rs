//! A merge configuration in mergekit's YAML layout: `merge_method`, `base_model`, `models` (each
//! with `parameters` such as `weight` and `density`), global `parameters`, `dtype`; `slices` only
//! when every source spans all layers (then they list the models).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::MergeError;
use super::yaml;

/// How tensors are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeMethod {
    /// `Σ wᵢ θᵢ / Σ wᵢ` (`normalize`, default true).
    Linear,
    /// Spherical interpolation from the base model (`t` = 0) to the other model (`t` = 1).
    Slerp,
    /// `base + Σ wᵢ (θᵢ − base)` (divided by `Σ wᵢ` with `normalize`, default false).
    TaskArithmetic,
    /// Task arithmetic over the `density` largest-magnitude differences of each model, with the
    /// signs elected per element (`normalize` default true).
    Ties,
    /// TIES with each difference kept at random with probability `density` and rescaled.
    DareTies,
    /// Task arithmetic with each difference kept at random with probability `density` and
    /// rescaled.
    DareLinear,
}

/// One model of the merge.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Its Hugging Face folder.
    pub model: String,
    /// Its parameters (`weight`, `density`, ...).
    #[serde(default)]
    pub parameters: BTreeMap<String, Value>,
}

/// A source of a slice (mergekit's layer-range layout).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SliceSource {
    model: String,
    layer_range: [usize; 2],
    #[serde(default)]
    parameters: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Slice {
    sources: Vec<SliceSource>,
}

/// The file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    merge_method: MergeMethod,
    base_model: Option<String>,
    #[serde(default)]
    models: Vec<ModelEntry>,
    #[serde(default)]
    slices: Vec<Slice>,
    #[serde(default)]
    parameters: BTreeMap<String, Value>,
    dtype: Option<String>,
}

/// A merge configuration, read and checked.
#[derive(Debug, Clone)]
pub struct MergeConfig {
    /// The file it was read from (for messages).
    pub path: PathBuf,
    /// How tensors are combined.
    pub method: MergeMethod,
    /// The base model (task vectors are taken against it; SLERP's `t` = 0 end).
    pub base_model: Option<String>,
    /// Every model, the base included where the file lists it.
    pub models: Vec<ModelEntry>,
    /// Parameters for every tensor (`t`, `normalize`, `weight`, ...).
    pub parameters: BTreeMap<String, Value>,
    /// The element type written (`float32`, `bfloat16`, `float16`), when given.
    pub dtype: Option<String>,
    /// Layer ranges of `slices`, checked against the models' layer count when they are opened.
    pub slice_ranges: Vec<(String, [usize; 2])>,
}

impl MergeConfig {
    /// Reads a configuration file.
    pub fn from_file(path: &Path) -> Result<Self, MergeError> {
        let text = std::fs::read_to_string(path).map_err(|source| MergeError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text, path)
    }

    /// Reads the text of a configuration file (`path` names it in messages).
    pub fn from_yaml(text: &str, path: &Path) -> Result<Self, MergeError> {
        let invalid = |message: String| MergeError::Config {
            path: path.to_path_buf(),
            message,
        };
        let value = yaml::parse(text).map_err(|error| invalid(error.to_string()))?;
        let raw: RawConfig =
            serde_json::from_value(value).map_err(|error| invalid(error.to_string()))?;
        let mut models = raw.models;
        let mut slice_ranges = Vec::new();
        if !raw.slices.is_empty() {
            if !models.is_empty() {
                return Err(invalid("give `models` or `slices`, not both".into()));
            }
            if raw.slices.len() != 1 {
                return Err(invalid(
                    "only one slice spanning every layer is supported (no layer stacking)".into(),
                ));
            }
            for source in &raw.slices[0].sources {
                slice_ranges.push((source.model.clone(), source.layer_range));
                models.push(ModelEntry {
                    model: source.model.clone(),
                    parameters: source.parameters.clone(),
                });
            }
        }
        if models.is_empty() {
            return Err(invalid("no models to merge (`models` is empty)".into()));
        }
        let config = MergeConfig {
            path: path.to_path_buf(),
            method: raw.merge_method,
            base_model: raw.base_model,
            models,
            parameters: raw.parameters,
            dtype: raw.dtype,
            slice_ranges,
        };
        config.check().map_err(invalid)?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        // `int8_mask` only saves memory in mergekit: accepted, with nothing to do here.
        const KNOWN: &[&str] = &[
            "weight",
            "density",
            "t",
            "normalize",
            "rescale",
            "int8_mask",
        ];
        let named =
            self.parameters
                .keys()
                .map(|key| (key, None))
                .chain(self.models.iter().flat_map(|entry| {
                    entry
                        .parameters
                        .keys()
                        .map(move |key| (key, Some(&entry.model)))
                }));
        for (key, model) in named {
            if !KNOWN.contains(&key.as_str()) {
                let place = model.map_or(String::new(), |model| format!(" of `{model}`"));
                return Err(format!(
                    "unsupported parameter `{key}`{place} (supported: {})",
                    KNOWN.join(", ")
                ));
            }
        }
        let needs_base = !matches!(self.method, MergeMethod::Linear);
        match &self.base_model {
            None if needs_base => {
                return Err(format!("{:?} needs `base_model`", self.method));
            }
            Some(base) if self.method == MergeMethod::Slerp => {
                let others = self.models.iter().filter(|m| &m.model != base).count();
                if others != 1 || self.models.len() > 2 {
                    return Err(format!(
                        "slerp merges `base_model` with exactly one other model, found {} models",
                        self.models.len()
                    ));
                }
            }
            _ => {}
        }
        if self.method == MergeMethod::Slerp && !self.parameters.contains_key("t") {
            return Err("slerp needs the parameter `t`".into());
        }
        if self.method != MergeMethod::Slerp {
            for entry in self.models_without_base() {
                if !entry.parameters.contains_key("weight")
                    && !self.parameters.contains_key("weight")
                    && self.method != MergeMethod::Linear
                {
                    return Err(format!("model `{}` has no `weight`", entry.model));
                }
            }
        }
        Ok(())
    }

    /// The models that are not the base model, in order.
    pub fn models_without_base(&self) -> impl Iterator<Item = &ModelEntry> {
        self.models
            .iter()
            .filter(move |entry| Some(&entry.model) != self.base_model.as_ref())
    }

    /// Every folder the merge reads: the base first (when there is one), then the others.
    pub fn folders(&self) -> Vec<String> {
        let mut folders: Vec<String> = self.base_model.iter().cloned().collect();
        for entry in &self.models {
            if !folders.contains(&entry.model) {
                folders.push(entry.model.clone());
            }
        }
        folders
    }

    /// Parameter `name` for `tensor` of model `entry` (or a global one when `entry` is `None`):
    /// the model's own value, else the global one, else `default`. `layer` places the tensor
    /// among `layers` layers for gradients (see [`evaluate`]).
    pub fn parameter(
        &self,
        name: &str,
        entry: Option<&ModelEntry>,
        tensor: &TensorPlace<'_>,
        default: Option<f64>,
    ) -> Result<f64, MergeError> {
        let value = entry
            .and_then(|entry| entry.parameters.get(name))
            .or_else(|| self.parameters.get(name));
        match value {
            Some(value) => evaluate(value, tensor).map_err(|message| MergeError::Config {
                path: self.path.clone(),
                message: format!("parameter `{name}`: {message}"),
            }),
            None => default.ok_or_else(|| MergeError::Config {
                path: self.path.clone(),
                message: format!(
                    "parameter `{name}` is missing{}",
                    entry.map_or(String::new(), |entry| format!(" for `{}`", entry.model))
                ),
            }),
        }
    }

    /// A boolean parameter (`normalize`, `rescale`), global only.
    pub fn flag(&self, name: &str, default: bool) -> Result<bool, MergeError> {
        match self.parameters.get(name) {
            None => Ok(default),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(other) => Err(MergeError::Config {
                path: self.path.clone(),
                message: format!("parameter `{name}` must be true or false, found {other}"),
            }),
        }
    }
}

/// Where a tensor sits, for parameters that vary with it.
#[derive(Debug, Clone, Copy)]
pub struct TensorPlace<'a> {
    /// Its Hugging Face name.
    pub name: &'a str,
    /// Its layer, for tensors inside one.
    pub layer: Option<usize>,
    /// The model's layer count.
    pub layers: usize,
    /// Whether it comes after the layers (the final norm and the output head).
    pub after_layers: bool,
}

impl<'a> TensorPlace<'a> {
    /// The place of tensor `name` in a model of `layers` layers.
    pub fn of(name: &'a str, layers: usize) -> Self {
        let layer = name
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|index| index.parse().ok());
        TensorPlace {
            name,
            layer,
            layers,
            after_layers: layer.is_none() && !name.contains("embed_tokens"),
        }
    }

    /// Where a gradient is read for this tensor, from 0 (first layer, embeddings) to 1 (last
    /// layer, final norm and head).
    fn fraction(&self) -> f64 {
        match self.layer {
            Some(layer) if self.layers > 1 => layer as f64 / (self.layers - 1) as f64,
            Some(_) => 0.0,
            None if self.after_layers => 1.0,
            None => 0.0,
        }
    }
}

/// A parameter's value for one tensor: a number; a gradient (a list of numbers spread evenly
/// from the first layer to the last, interpolated linearly between them; embeddings take the
/// first value, the final norm and head the last); or a list of `{filter, value}` entries whose
/// first `filter` found in the tensor's name (an entry without one matches every tensor) gives
/// the value.
pub fn evaluate(value: &Value, tensor: &TensorPlace<'_>) -> Result<f64, String> {
    match value {
        Value::Number(number) => number
            .as_f64()
            .ok_or_else(|| format!("{number} is not a number")),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            let points: Vec<f64> = items.iter().filter_map(Value::as_f64).collect();
            match points.len() {
                0 => Err("an empty gradient".into()),
                1 => Ok(points[0]),
                count => {
                    let position = tensor.fraction() * (count - 1) as f64;
                    let below = (position.floor() as usize).min(count - 2);
                    let within = position - below as f64;
                    Ok(points[below] * (1.0 - within) + points[below + 1] * within)
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                let Value::Object(entry) = item else {
                    return Err(format!(
                        "expected `{{filter, value}}` entries, found {item}"
                    ));
                };
                if let Some(unknown) = entry.keys().find(|key| *key != "filter" && *key != "value")
                {
                    return Err(format!("unknown key `{unknown}` in a filtered value"));
                }
                let matches = match entry.get("filter") {
                    None | Some(Value::Null) => true,
                    Some(Value::String(filter)) => tensor.name.contains(filter.as_str()),
                    Some(other) => return Err(format!("a filter must be text, found {other}")),
                };
                if matches {
                    let value = entry
                        .get("value")
                        .ok_or_else(|| "a filtered entry without `value`".to_string())?;
                    return evaluate(value, tensor);
                }
            }
            Err(format!("no entry matches tensor `{}`", tensor.name))
        }
        other => Err(format!(
            "expected a number, a list of numbers or filtered values, found {other}"
        )),
    }
}
