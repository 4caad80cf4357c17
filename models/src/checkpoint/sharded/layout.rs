//! What the layout files of a sharded checkpoint hold: [`ShardLayout`] (tensor parallel) and
//! [`StageLayout`] (pipeline stages, each possibly tensor parallel).

use serde::{Deserialize, Serialize};

use crate::config::HlatConfig;
use crate::parallel::check_degree;
use crate::pipeline::PipelineParallel;

/// What [`TENSOR_PARALLEL_FILE`](crate::checkpoint::files::TENSOR_PARALLEL_FILE) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLayout {
    /// The tensor-parallel degree: how many rank files there are.
    pub degree: usize,
}

/// What [`PIPELINE_PARALLEL_FILE`](crate::checkpoint::files::PIPELINE_PARALLEL_FILE) holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLayout {
    /// Pipeline stages.
    pub stages: usize,
    /// The tensor-parallel degree inside each stage: how many rank files each stage has.
    pub tensor_parallel: usize,
    /// The model layers each stage holds, in stage order (every layer in exactly one stage).
    pub stage_layers: Vec<Vec<usize>>,
}

impl StageLayout {
    /// The layout of `stage_layers` split `tensor_parallel` ways.
    pub fn new(stage_layers: Vec<Vec<usize>>, tensor_parallel: usize) -> Self {
        Self {
            stages: stage_layers.len(),
            tensor_parallel,
            stage_layers,
        }
    }

    /// The layout of the stages of `pipeline`, each split `tensor_parallel` ways.
    pub fn of_pipeline(pipeline: &PipelineParallel, tensor_parallel: usize) -> Self {
        Self::new(
            (0..pipeline.stages())
                .map(|stage| pipeline.stage_layers(stage))
                .collect(),
            tensor_parallel,
        )
    }

    /// Checks the layout against the whole model's configuration: at least one stage, each
    /// listed, a tensor-parallel degree that divides the model, every layer in exactly one stage.
    pub fn check(&self, config: &HlatConfig) -> Result<(), String> {
        if self.stages == 0 {
            return Err("`stages` must be at least 1".into());
        }
        if self.stage_layers.len() != self.stages {
            return Err(format!(
                "`stage_layers` lists {} stages, `stages` says {}",
                self.stage_layers.len(),
                self.stages
            ));
        }
        check_degree(config, self.tensor_parallel)?;
        let mut seen = vec![None; config.num_layers];
        for (stage, layers) in self.stage_layers.iter().enumerate() {
            for &layer in layers {
                match seen.get_mut(layer) {
                    None => {
                        return Err(format!(
                            "stage {stage} lists layer {layer}; the model has {} layers",
                            config.num_layers
                        ));
                    }
                    Some(Some(first)) => {
                        return Err(format!(
                            "layer {layer} is listed in stages {first} and {stage}"
                        ));
                    }
                    Some(slot) => *slot = Some(stage),
                }
            }
        }
        if let Some(layer) = seen.iter().position(Option::is_none) {
            return Err(format!("no stage lists layer {layer}"));
        }
        Ok(())
    }

    /// The stages whose files hold the tensor `name` of the whole model: a layer's its stage,
    /// the embedding the first (and the last when tied to the head), the rest (final norm, LM
    /// head) the last.
    pub(super) fn holders(&self, name: &str, tied: bool) -> Vec<usize> {
        let last = self.stages - 1;
        if let Some(layer) = layer_of(name) {
            return self
                .stage_layers
                .iter()
                .position(|layers| layers.contains(&layer))
                .into_iter()
                .collect();
        }
        if name.split('.').next() == Some("embed_tokens") {
            if tied && last > 0 {
                vec![0, last]
            } else {
                vec![0]
            }
        } else {
            vec![last]
        }
    }
}

/// The layer index of a whole model's tensor name (`layers.7.mlp.up_proj.weight`: 7).
pub(super) fn layer_of(name: &str) -> Option<usize> {
    let mut parts = name.split('.');
    match (parts.next(), parts.next()) {
        (Some("layers"), Some(index)) => index.parse().ok(),
        _ => None,
    }
}
