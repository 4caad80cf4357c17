//! A merge configuration in mergekit's YAML layout: `merge_method`, `base_model`, either
//! `models` (each with `parameters`) or `slices` (each with `sources` of a model and a
//! `layer_range`, optional `parameters` and `base_model`), top-level `parameters`, `dtype`,
//! `out_dtype` and `tokenizer_source`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::MergeError;
use super::method::{BasePolicy, MergeMethod};
use crate::file_error::FileError;
use crate::hf::WeightDtype;

/// Parameter settings by name, as written (see [`super::setting::evaluate`]).
pub type Settings = BTreeMap<String, Value>;

/// One model of the `models` layout.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Its Hugging Face folder.
    pub model: String,
    /// Its parameters (`weight`, `density`, ...).
    #[serde(default)]
    pub parameters: Settings,
}

/// One source of an output slice: a range of one model's layers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SliceSource {
    /// Its Hugging Face folder.
    pub model: String,
    /// Its layers `[first, end)`; `None` in the `models` layout, where it is every layer.
    pub layer_range: Option<[usize; 2]>,
    /// Its parameters, which take precedence over the slice's and the top level's.
    #[serde(default)]
    pub parameters: Settings,
}

/// One output slice: layers merged from its sources, one output layer per source layer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slice {
    /// The models and layer ranges merged.
    pub sources: Vec<SliceSource>,
    /// The base model of this slice, replacing the top-level one.
    pub base_model: Option<String>,
    /// Parameters of this slice, which take precedence over the top level's.
    #[serde(default)]
    pub parameters: Settings,
    /// mergekit accepts it and never reads it: refused.
    residual_weight: Option<Value>,
}

/// The tokenizer written beside the merged weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerSource {
    /// The base model's (`tokenizer_source: base`).
    Base,
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    merge_method: MergeMethod,
    base_model: Option<String>,
    models: Option<Vec<ModelEntry>>,
    slices: Option<Vec<Slice>>,
    #[serde(default)]
    parameters: Settings,
    dtype: Option<String>,
    out_dtype: Option<String>,
    tokenizer_source: Option<String>,
    // Accepted by mergekit, refused here with the reason.
    tokenizer: Option<Value>,
    chat_template: Option<Value>,
    modules: Option<Value>,
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
    /// The output slices; in the `models` layout, one slice whose sources have no layer range
    /// (every layer), the base model added when it is not listed (as mergekit adds it).
    pub slices: Vec<Slice>,
    /// Top-level parameters.
    pub parameters: Settings,
    /// The element type the inputs are converted to and merged in (`dtype`), when given.
    pub dtype: Option<WeightDtype>,
    /// The element type written (`out_dtype`), when given; else `dtype`, else the inputs'.
    pub out_dtype: Option<WeightDtype>,
    /// Where the tokenizer comes from, when given (otherwise it is copied from the model whose
    /// `config.json` is used, as mergekit copies it).
    pub tokenizer_source: Option<TokenizerSource>,
}

impl MergeConfig {
    /// Reads a configuration file.
    pub fn from_file(path: &Path) -> Result<Self, MergeError> {
        let text = FileError::read_to_string(path)?;
        Self::from_yaml(&text, path)
    }

    /// Reads the text of a configuration file (`path` names it in messages).
    pub fn from_yaml(text: &str, path: &Path) -> Result<Self, MergeError> {
        let invalid = |message: String| MergeError::from(FileError::invalid(path, message));
        // serde_norway's messages end with the line and column.
        let raw: RawConfig =
            serde_norway::from_str(text).map_err(|error| invalid(error.to_string()))?;
        let refused = [
            (
                "tokenizer",
                raw.tokenizer.is_some(),
                "a merged or extended vocabulary",
            ),
            (
                "chat_template",
                raw.chat_template.is_some(),
                "a chat template",
            ),
            ("modules", raw.modules.is_some(), "per-module merges"),
        ];
        if let Some((field, _, what)) = refused.iter().find(|(_, given, _)| *given) {
            return Err(invalid(format!(
                "`{field}` ({what}) is not supported by hlat merge"
            )));
        }
        let dtype = |field: &str, name: Option<String>| {
            name.map(|name| {
                name.parse::<WeightDtype>().map_err(|_| {
                    invalid(format!(
                        "`{field}`: unknown element type `{name}` (float32, bfloat16 or float16)"
                    ))
                })
            })
            .transpose()
        };
        let tokenizer_source = match raw.tokenizer_source.as_deref() {
            None => None,
            Some("base") => Some(TokenizerSource::Base),
            Some("union") => {
                return Err(invalid(
                    "`tokenizer_source: union` (a vocabulary merged from every model) is not \
                     supported: use `base`, or give none to copy the tokenizer of the model \
                     whose config.json is used"
                        .into(),
                ));
            }
            Some(model) => {
                return Err(invalid(format!(
                    "`tokenizer_source: {model}`: a tokenizer from a model folder is not \
                     supported: use `base`"
                )));
            }
        };
        let slices = match (raw.models, raw.slices) {
            (Some(models), None) if !models.is_empty() => {
                let mut sources: Vec<SliceSource> = models
                    .into_iter()
                    .map(|entry| SliceSource {
                        model: entry.model,
                        layer_range: None,
                        parameters: entry.parameters,
                    })
                    .collect();
                if let Some(base) = &raw.base_model
                    && !sources.iter().any(|source| &source.model == base)
                {
                    sources.push(SliceSource {
                        model: base.clone(),
                        layer_range: None,
                        parameters: Settings::new(),
                    });
                }
                vec![Slice {
                    sources,
                    base_model: None,
                    parameters: Settings::new(),
                    residual_weight: None,
                }]
            }
            (None, Some(slices)) if !slices.is_empty() => slices,
            _ => {
                return Err(invalid(
                    "give exactly one of `models` and `slices`, not empty".into(),
                ));
            }
        };
        if raw.tokenizer_source.is_some() && raw.base_model.is_none() {
            return Err(invalid(
                "`tokenizer_source: base` needs `base_model`".into(),
            ));
        }
        let config = MergeConfig {
            path: path.to_path_buf(),
            method: raw.merge_method,
            base_model: raw.base_model,
            slices,
            parameters: raw.parameters,
            dtype: dtype("dtype", raw.dtype)?,
            out_dtype: dtype("out_dtype", raw.out_dtype)?,
            tokenizer_source,
        };
        config.check().map_err(invalid)?;
        Ok(config)
    }

    /// Reads model folders relative to `dir` instead of the working directory (absolute paths
    /// are kept).
    pub fn with_models_in(mut self, dir: &Path) -> Self {
        let resolve = |model: &mut String| {
            if Path::new(model.as_str()).is_relative() {
                *model = dir.join(model.as_str()).to_string_lossy().into_owned();
            }
        };
        self.base_model.iter_mut().for_each(resolve);
        for slice in &mut self.slices {
            slice.base_model.iter_mut().for_each(resolve);
            slice
                .sources
                .iter_mut()
                .for_each(|source| resolve(&mut source.model));
        }
        self
    }

    /// The base model of `slice`: its own, else the top-level one.
    pub fn base_of<'a>(&'a self, slice: &'a Slice) -> Option<&'a str> {
        slice.base_model.as_deref().or(self.base_model.as_deref())
    }

    /// Every folder the merge reads, in order of first mention (the base first).
    pub fn folders(&self) -> Vec<String> {
        let mut folders: Vec<String> = self.base_model.iter().cloned().collect();
        for slice in &self.slices {
            for model in slice
                .base_model
                .iter()
                .chain(slice.sources.iter().map(|s| &s.model))
            {
                if !folders.contains(model) {
                    folders.push(model.clone());
                }
            }
        }
        folders
    }

    /// The model whose `config.json` (and tokenizer, unless `tokenizer_source` says otherwise)
    /// the output takes: the base model, else the first source of the first slice.
    pub fn donor(&self) -> &str {
        self.base_model
            .as_deref()
            .unwrap_or(&self.slices[0].sources[0].model)
    }

    /// Checks the parameters' names and each slice's inputs against the method.
    fn check(&self) -> Result<(), String> {
        let method = self.method.name();
        let known: Vec<&str> = self.method.parameters().iter().map(|p| p.name).collect();
        let check_names = |settings: &Settings, place: &str| match settings
            .keys()
            .find(|key| !known.contains(&key.as_str()))
        {
            Some(key) => Err(format!(
                "unknown parameter `{key}`{place}: {method} takes {}",
                if known.is_empty() {
                    "no parameters".to_string()
                } else {
                    known.join(", ")
                }
            )),
            None => Ok(()),
        };
        check_names(&self.parameters, "")?;
        for (index, slice) in self.slices.iter().enumerate() {
            if slice.residual_weight.is_some() {
                return Err(format!(
                    "slice {index}: `residual_weight` is not supported (mergekit ignores it)"
                ));
            }
            check_names(&slice.parameters, &format!(" of slice {index}"))?;
            for source in &slice.sources {
                check_names(&source.parameters, &format!(" of `{}`", source.model))?;
                if let Some([first, end]) = source.layer_range
                    && first >= end
                {
                    return Err(format!(
                        "slice {index}: `{}` has the empty layer range [{first}, {end}]",
                        source.model
                    ));
                }
            }
            let lengths: Vec<usize> = slice
                .sources
                .iter()
                .filter_map(|source| source.layer_range.map(|[first, end]| end - first))
                .collect();
            if lengths.iter().any(|length| *length != lengths[0]) {
                return Err(format!(
                    "slice {index}: its sources span different numbers of layers {lengths:?}; \
                     every source of a slice must span as many"
                ));
            }
            self.check_inputs(slice)
                .map_err(|message| format!("slice {index}: {message}"))?;
        }
        Ok(())
    }

    /// The method's rules on the inputs of a slice (mergekit's input contract).
    fn check_inputs(&self, slice: &Slice) -> Result<(), String> {
        let method = self.method.name();
        let contract = self.method.contract();
        let models: Vec<&str> = slice.sources.iter().map(|s| s.model.as_str()).collect();
        if let Some(duplicate) = models
            .iter()
            .enumerate()
            .find(|(i, model)| models[..*i].contains(model))
        {
            return Err(format!("`{}` is listed twice", duplicate.1));
        }
        let base = match contract.base {
            BasePolicy::Ignored => None,
            _ => self.base_of(slice),
        };
        let has_base = base.is_some_and(|base| models.contains(&base));
        if let Some(base) = base
            && !has_base
        {
            return Err(format!("the base model `{base}` is not among its sources"));
        }
        if contract.base == BasePolicy::Required && !has_base {
            return Err(format!("{method} needs `base_model`"));
        }
        let count = models.len();
        let bounds = |what: &str, count: usize, min: usize, max: Option<usize>| {
            if count < min || max.is_some_and(|max| count > max) {
                let expected = match max {
                    Some(max) if max == min => format!("exactly {min}"),
                    Some(max) => format!("{min} to {max}"),
                    None => format!("at least {min}"),
                };
                return Err(format!("{method} merges {expected} {what}, found {count}"));
            }
            Ok(())
        };
        bounds("models", count, contract.min_inputs, contract.max_inputs)?;
        if let Some((min, max)) = contract.non_base {
            bounds(
                "models besides the base",
                count - usize::from(has_base),
                min,
                max,
            )?;
        }
        Ok(())
    }
}
