//! The run folder's metric logs (`train/epoch-N/*.log`, `valid/epoch-N/*.log`): Burn's file
//! metric logger, kept open across HLAT's validations inside an epoch.
//!
//! Burn 0.22's `FileMetricLogger` closes every log when a split ends and reopens a log truncated
//! at its next write. That suits Burn's own strategies, which validate once after each epoch's
//! training, but HLAT validates inside an epoch (`--eval-every`) and after its last step, and each
//! validation would empty `train/epoch-N/Loss.log` of the steps before it. This logger tells
//! Burn's logger only of the end of a training split; an epoch's validation logs gather all its
//! validations, one line per batch, in order.

use std::path::Path;

use burn::train::logger::{FileMetricLogger, MetricLogger};
use burn::train::metric::store::{EpochSummary, MetricsUpdate, Split};
use burn::train::metric::{MetricDefinition, NumericEntry};

/// Burn's file metric logger writing under a run folder, its logs kept open until the end of
/// the epoch's training split.
pub struct RunFolderLogger {
    files: FileMetricLogger,
}

impl RunFolderLogger {
    /// Logs under `directory` (the run folder), as Burn's default logger does.
    pub fn new(directory: impl AsRef<Path>) -> Self {
        Self {
            files: FileMetricLogger::new(directory),
        }
    }
}

impl MetricLogger for RunFolderLogger {
    fn log(&mut self, update: MetricsUpdate, epoch: usize, split: &Split) {
        self.files.log(update, epoch, split);
    }

    fn read_numeric(
        &mut self,
        name: &str,
        epoch: usize,
        split: &Split,
    ) -> Result<Vec<NumericEntry>, String> {
        self.files.read_numeric(name, epoch, split)
    }

    fn log_metric_definition(&mut self, definition: MetricDefinition) {
        self.files.log_metric_definition(definition);
    }

    fn log_epoch_summary(&mut self, summary: EpochSummary) {
        // Only the end of the training split closes the logs: a validation's end would reopen
        // the training logs truncated.
        if matches!(summary.split, Split::Train) {
            self.files.log_epoch_summary(summary);
        }
    }
}
