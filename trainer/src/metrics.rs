//! Per-step metrics, appended to `OUT/metrics.jsonl`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::TrainError;

/// The metrics log file in a run's output folder.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// One line of `metrics.jsonl`: one optimizer step. Non-finite values are written as `null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimizer step (1-based).
    pub step: u64,
    /// Mean training loss of the step (a mixture of experts' objective: the cross-entropy plus
    /// its weighted load-balancing loss).
    pub loss: f64,
    /// A mixture of experts' load-balancing loss, unweighted (transformers' `aux_loss`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancing_loss: Option<f64>,
    /// A preference run's mean reward of the chosen completions (TRL's `rewards/chosen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewards_chosen: Option<f64>,
    /// A preference run's mean reward of the rejected completions (`rewards/rejected`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewards_rejected: Option<f64>,
    /// A preference run's mean margin, chosen minus rejected reward (`rewards/margins`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewards_margins: Option<f64>,
    /// A preference run's fraction of pairs whose chosen reward is the larger
    /// (`rewards/accuracies`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewards_accuracies: Option<f64>,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Target tokens trained on in this step.
    pub tokens: usize,
    /// Target tokens trained on since the start of the run.
    pub tokens_seen: u64,
    /// Training throughput of this step.
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation against the configured peak, when one is configured.
    pub mfu: Option<f64>,
    /// Compiled programs so far (Trainium backend only).
    pub compiles: Option<u64>,
    /// Seconds spent compiling so far (Trainium backend only).
    pub compile_seconds: Option<f64>,
    /// Seconds since the run started, data and model preparation included: the first record's
    /// is the time to the first step.
    pub elapsed_seconds: f64,
    /// The update was skipped for a non-finite loss or gradient.
    pub skipped: bool,
    /// Validation loss, on the steps where it was measured.
    pub val_loss: Option<f64>,
    /// Validation perplexity, on the steps where it was measured.
    pub val_perplexity: Option<f64>,
    /// Validation perplexity of each data source of a mixture, by name, on the steps where
    /// validation was measured (continual pretraining watches the general data beside the
    /// domain's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_perplexity_by_source: Option<BTreeMap<String, f64>>,
    /// Seconds the step loop was held by the checkpoint taken after this step: waiting for the
    /// previous background write, copying the state into host memory, and writing it unless it
    /// is written in the background.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_seconds: Option<f64>,
}

/// Appends [`StepMetrics`] to `metrics.jsonl`.
pub struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
}

impl MetricsLog {
    /// Opens the log of the run in `out` for appending. Lines of steps after `resumed_step`
    /// (written by an interrupted run after its last checkpoint) are dropped first, so the log
    /// holds each step once.
    pub fn open(out: &Path, resumed_step: u64) -> Result<Self, TrainError> {
        let path = out.join(METRICS_FILE);
        let io = |source| TrainError::Io {
            path: path.clone(),
            source,
        };
        if path.exists() {
            let text = std::fs::read_to_string(&path).map_err(io)?;
            let kept: String = text
                .lines()
                .filter(|line| {
                    serde_json::from_str::<StepMetrics>(line)
                        .is_ok_and(|metrics| metrics.step <= resumed_step)
                })
                .flat_map(|line| [line, "\n"])
                .collect();
            hlat::checkpoint::run_folder::write_atomic(&path, kept.as_bytes())?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io)?;
        Ok(Self { path, file })
    }

    /// Appends one step.
    pub fn append(&mut self, metrics: &StepMetrics) -> Result<(), TrainError> {
        let mut line = serde_json::to_string(metrics).expect("metrics serialize");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(|source| TrainError::Io {
                path: self.path.clone(),
                source,
            })
    }
}
