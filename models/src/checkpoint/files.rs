//! The files of a native checkpoint folder: whole (`config.json` + `model.bpk`) or sharded (a
//! layout file and one burnpack file per tensor-parallel rank, or per pipeline stage × rank).

use std::path::Path;

/// The configuration file of a native checkpoint.
pub const NATIVE_CONFIG_FILE: &str = "config.json";
/// The weights file of a native checkpoint.
pub const NATIVE_WEIGHTS_FILE: &str = "model.bpk";

/// The file that marks a tensor-parallel checkpoint and gives its degree.
pub const TENSOR_PARALLEL_FILE: &str = "tensor_parallel.json";

/// The file that marks a checkpoint cut into pipeline stages and lists each stage's layers.
pub const PIPELINE_PARALLEL_FILE: &str = "pipeline_parallel.json";

/// The weights file of rank `rank` of `degree`.
pub fn rank_file(rank: usize, degree: usize) -> String {
    format!("model-rank-{rank:02}-of-{degree:02}.bpk")
}

/// The weights file of tensor-parallel rank `rank` of `degree` in pipeline stage `stage` of
/// `stages`.
pub fn stage_file(stage: usize, stages: usize, rank: usize, degree: usize) -> String {
    format!("model-stage-{stage:02}-of-{stages:02}-rank-{rank:02}-of-{degree:02}.bpk")
}

/// Whether `dir` holds a sharded checkpoint (by tensor-parallel rank, pipeline stage or both).
pub fn is_sharded(dir: &Path) -> bool {
    dir.join(TENSOR_PARALLEL_FILE).is_file() || is_pipelined(dir)
}

/// Whether `dir` holds a checkpoint cut into pipeline stages.
pub fn is_pipelined(dir: &Path) -> bool {
    dir.join(PIPELINE_PARALLEL_FILE).is_file()
}
