//! The output tensors of a merge, as mergekit plans them: the tensors before the layers (the
//! embeddings), the layers of each slice in order (renumbered from 0), the tensors after them
//! (final norm, LM head); for each, its inputs and every parameter resolved.
//!
//! Parameters resolve from the most specific setting to the least: the source's own, the
//! slice's, the top level's, then the method's default. A gradient is read at `t`, the layer's
//! place in its slice (0 at its first layer, 1 at its last, 1 for a slice of one layer); the
//! tensors outside the layers read it at 0. Filters match the input's tensor name for the
//! parameters of each model, the output's name for the shared ones.

use std::collections::BTreeMap;

use super::MergeError;
use super::config::{MergeConfig, Settings, Slice};
use super::method::{ParameterDefault, ParameterScope, ParameterSpec};
use super::setting::{Scalar, evaluate};
use crate::file_error::FileError;

/// The LM head, absent from checkpoints with tied embeddings.
const LM_HEAD: &str = "lm_head.weight";
/// What a checkpoint without an LM head uses in its place.
const EMBEDDINGS: &str = "model.embed_tokens.weight";
const LAYER_PREFIX: &str = "model.layers.";

/// Resolved parameters by name (a parameter left unset, as `scale`, is absent).
pub type Parameters = BTreeMap<&'static str, Scalar>;

/// What the planner needs of one model: its layer count and its tensors' shapes.
#[derive(Debug, Clone)]
pub struct ModelTensors {
    /// Its folder, as the configuration names it.
    pub folder: String,
    /// `num_hidden_layers`.
    pub layers: usize,
    /// Every tensor's shape, by name.
    pub shapes: BTreeMap<String, Vec<usize>>,
}

/// One input of an output tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedInput {
    /// The model (an index into the models given to [`plan`]).
    pub model: usize,
    /// Its tensor read.
    pub tensor: String,
    /// Its parameters.
    pub parameters: Parameters,
}

/// One output tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTensor {
    /// Its name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its inputs, in the order of the slice's sources.
    pub inputs: Vec<PlannedInput>,
    /// Which input is the base model, if one is.
    pub base: Option<usize>,
    /// The shared parameters.
    pub shared: Parameters,
}

/// The whole output.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Every output tensor, in order.
    pub tensors: Vec<PlannedTensor>,
    /// For each output layer, the model and layer its first source reads.
    pub layers: Vec<(usize, usize)>,
}

/// The layer index of a tensor name, and the rest of the name after it.
fn layer_of(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix(LAYER_PREFIX)?;
    let (index, suffix) = rest.split_once('.')?;
    Some((index.parse().ok()?, suffix))
}

/// Plans the merge of `config` over `models` (every folder of [`MergeConfig::folders`]).
pub fn plan(config: &MergeConfig, models: &[ModelTensors]) -> Result<Plan, MergeError> {
    let planner = Planner { config, models };
    let mut tensors = Vec::new();
    let first = &config.slices[0];
    let last = &config.slices[config.slices.len() - 1];
    for name in planner.outer_names(first, |name| name.contains("embed_tokens"))? {
        tensors.push(planner.tensor(first, &name, |_| name.clone(), 0.0)?);
    }
    let mut layers = Vec::new();
    for (index, slice) in config.slices.iter().enumerate() {
        let ranges = planner.ranges(index, slice)?;
        let length = ranges[0][1] - ranges[0][0];
        for offset in 0..length {
            let t = if length > 1 {
                offset as f64 / (length - 1) as f64
            } else {
                1.0
            };
            let output = layers.len();
            let input_layer = |source: usize| ranges[source][0] + offset;
            let mut suffixes: Vec<&str> = Vec::new();
            for (source, entry) in slice.sources.iter().enumerate() {
                let model = &models[planner.model(&entry.model)];
                for name in model.shapes.keys() {
                    if let Some((layer, suffix)) = layer_of(name)
                        && layer == input_layer(source)
                        && !suffixes.contains(&suffix)
                    {
                        suffixes.push(suffix);
                    }
                }
            }
            suffixes.sort_unstable();
            for suffix in suffixes {
                let name = format!("{LAYER_PREFIX}{output}.{suffix}");
                let input_name =
                    |source: usize| format!("{LAYER_PREFIX}{}.{suffix}", input_layer(source));
                tensors.push(planner.tensor(slice, &name, input_name, t)?);
            }
            layers.push((planner.model(&slice.sources[0].model), input_layer(0)));
        }
    }
    for name in planner.outer_names(last, |name| !name.contains("embed_tokens"))? {
        tensors.push(planner.tensor(last, &name, |_| name.clone(), 0.0)?);
    }
    Ok(Plan { tensors, layers })
}

struct Planner<'a> {
    config: &'a MergeConfig,
    models: &'a [ModelTensors],
}

impl Planner<'_> {
    fn model(&self, folder: &str) -> usize {
        self.models
            .iter()
            .position(|model| model.folder == folder)
            .expect("every folder of the configuration is opened")
    }

    fn error(&self, message: String) -> MergeError {
        FileError::invalid(&self.config.path, message).into()
    }

    /// The layer range of each source of slice `index`, checked against its model.
    fn ranges(&self, index: usize, slice: &Slice) -> Result<Vec<[usize; 2]>, MergeError> {
        let ranges: Vec<[usize; 2]> = slice
            .sources
            .iter()
            .map(|source| {
                let layers = self.models[self.model(&source.model)].layers;
                let range = source.layer_range.unwrap_or([0, layers]);
                if range[1] > layers {
                    return Err(self.error(format!(
                        "slice {index}: layer range {range:?} of `{}` goes past its {layers} layers",
                        source.model
                    )));
                }
                Ok(range)
            })
            .collect::<Result<_, _>>()?;
        if ranges
            .iter()
            .any(|r| r[1] - r[0] != ranges[0][1] - ranges[0][0])
        {
            return Err(self.error(format!(
                "slice {index}: its models have different numbers of layers ({}); give `slices` \
                 with layer ranges of one length",
                ranges
                    .iter()
                    .zip(&slice.sources)
                    .map(|(r, s)| format!("`{}` {}", s.model, r[1] - r[0]))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(ranges)
    }

    /// The names outside the layers, of any source of `slice`, that `keep` selects. The LM head
    /// is written when one of them has it.
    fn outer_names(
        &self,
        slice: &Slice,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, MergeError> {
        let mut names: Vec<String> = Vec::new();
        for source in &slice.sources {
            for name in self.models[self.model(&source.model)].shapes.keys() {
                if layer_of(name).is_none() && keep(name) && !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// The output tensor `name` of `slice`, reading `input_name(source)` of each source.
    fn tensor(
        &self,
        slice: &Slice,
        name: &str,
        input_name: impl Fn(usize) -> String,
        t: f64,
    ) -> Result<PlannedTensor, MergeError> {
        let base_model = self.config.base_of(slice);
        let mut inputs = Vec::new();
        let mut shape: Option<(Vec<usize>, &str)> = None;
        let mut base = None;
        for (index, source) in slice.sources.iter().enumerate() {
            let model = self.model(&source.model);
            let shapes = &self.models[model].shapes;
            let mut tensor = input_name(index);
            if !shapes.contains_key(&tensor) && tensor == LM_HEAD {
                // Tied embeddings: the embeddings stand for the head, as in mergekit.
                tensor = EMBEDDINGS.to_string();
            }
            let Some(found) = shapes.get(&tensor) else {
                return Err(MergeError::Tensor {
                    model: source.model.clone().into(),
                    tensor,
                    missing: true,
                });
            };
            match &shape {
                None => shape = Some((found.clone(), &source.model)),
                Some((expected, first)) if expected != found => {
                    return Err(MergeError::Shape {
                        model: source.model.clone().into(),
                        tensor,
                        expected: expected.clone(),
                        found: found.clone(),
                        reference: first.to_string().into(),
                    });
                }
                Some(_) => {}
            }
            let is_base = base_model == Some(source.model.as_str());
            if is_base {
                base = Some(index);
            }
            let mut parameters = Parameters::new();
            for spec in self.config.method.parameters() {
                let applies = match spec.scope {
                    ParameterScope::Shared => false,
                    ParameterScope::Input => true,
                    ParameterScope::NonBase => !is_base,
                };
                if applies {
                    let scopes = [
                        &source.parameters,
                        &slice.parameters,
                        &self.config.parameters,
                    ];
                    let place = format!("`{}` of `{}`", tensor, source.model);
                    if let Some(value) = self.resolve(&spec, &scopes, &tensor, t, &place)? {
                        parameters.insert(spec.name, value);
                    }
                }
            }
            inputs.push(PlannedInput {
                model,
                tensor,
                parameters,
            });
        }
        let mut shared = Parameters::new();
        for spec in self.config.method.parameters() {
            if spec.scope == ParameterScope::Shared {
                let scopes = [&slice.parameters, &self.config.parameters];
                let place = format!("`{name}`");
                if let Some(value) = self.resolve(&spec, &scopes, name, t, &place)? {
                    shared.insert(spec.name, value);
                }
            }
        }
        Ok(PlannedTensor {
            name: name.to_string(),
            shape: shape.expect("a slice has sources").0,
            inputs,
            base,
            shared,
        })
    }

    /// The value of parameter `spec` for `tensor` from the first of `scopes` that sets it.
    fn resolve(
        &self,
        spec: &ParameterSpec,
        scopes: &[&Settings],
        tensor: &str,
        t: f64,
        place: &str,
    ) -> Result<Option<Scalar>, MergeError> {
        for settings in scopes {
            if let Some(setting) = settings.get(spec.name) {
                let value = evaluate(setting, spec.kind, tensor, t).map_err(|message| {
                    self.error(format!("parameter `{}` for {place}: {message}", spec.name))
                })?;
                if value.is_some() {
                    return Ok(value);
                }
            }
        }
        match spec.default {
            ParameterDefault::Required => Err(self.error(format!(
                "parameter `{}` is missing for {place} ({} needs it)",
                spec.name,
                self.config.method.name()
            ))),
            ParameterDefault::Unset => Ok(None),
            ParameterDefault::Number(number) => Ok(Some(Scalar::Number(number))),
            ParameterDefault::Flag(flag) => Ok(Some(Scalar::Flag(flag))),
        }
    }
}
