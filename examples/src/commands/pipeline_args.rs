//! The pipeline-parallel flags `hlat pretrain`, `hlat compile`, `hlat info` and `hlat bench
//! train` share.

use clap::Args;
use hlat::pipeline::PipelineSchedule;
use hlat_train::config::TrainConfig;

/// How the decoder layers are cut into pipeline stages.
#[derive(Args, Debug, Clone, Default)]
pub struct PipelineArgs {
    /// Pipeline-parallel degree: the decoder layers cut into N stages, each on its own replicas
    /// (embedding on the first, final norm and LM head on the last); with --dp and --tp the
    /// device has dp × tp × pp replicas. Micro-batches are the gradient-accumulation ones.
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub pp: Option<usize>,
    /// Layers of each stage, in order (of each virtual stage with --virtual-stages), e.g.
    /// `--pp-layers 9,10,10,11`; evenly cut by default.
    #[arg(long, value_name = "L,L,...", value_delimiter = ',')]
    pub pp_layers: Option<Vec<usize>>,
    /// Pipeline schedule: 1f1b (default) or interleaved (with --virtual-stages).
    #[arg(long, value_name = "SCHEDULE")]
    pub pp_schedule: Option<PipelineSchedule>,
    /// Chunks of layers per stage under the interleaved schedule (taken round-robin: stage s
    /// holds virtual stages s, p + s, ...).
    #[arg(long, value_name = "V", value_parser = super::ranges::at_least_one::<usize>())]
    pub virtual_stages: Option<usize>,
}

impl PipelineArgs {
    /// Sets the pipeline fields of `config` that the flags give.
    pub fn apply(&self, config: &mut TrainConfig) {
        if let Some(stages) = self.pp {
            config.pipeline_parallel = stages;
        }
        if let Some(layers) = &self.pp_layers {
            config.pipeline_layers = Some(layers.clone());
        }
        if let Some(schedule) = self.pp_schedule {
            config.pipeline_schedule = schedule;
        }
        if let Some(virtual_stages) = self.virtual_stages {
            config.virtual_stages = virtual_stages;
        }
    }
}
