//! [`MetricRecorder`]: a silent renderer for burn-train's `Learner` that keeps every value its
//! numeric metrics report, so the benchmark can compare backends' losses item by item.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use burn::train::logger::{EvaluationProgressLogger, TrainingProgressLogger};
use burn::train::metric::{MetricDefinition, MetricId, NumericEntry};
use burn::train::renderer::{
    EvaluationName, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining,
};
use serde::{Deserialize, Serialize};

/// The values one metric reported, in order, for training and validation items.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricValues {
    /// One value per training item.
    pub train: Vec<f64>,
    /// One value per validation item.
    pub valid: Vec<f64>,
}

/// The values recorded, by metric name.
pub type Recorded = Arc<Mutex<HashMap<String, MetricValues>>>;

/// A renderer that draws nothing and records every numeric metric value.
#[derive(Default)]
pub struct MetricRecorder {
    names: HashMap<MetricId, String>,
    recorded: Recorded,
}

impl MetricRecorder {
    /// A recorder, and the handle its values can be read from once the training has ended.
    pub fn new() -> (Self, Recorded) {
        let recorder = Self::default();
        let recorded = recorder.recorded.clone();
        (recorder, recorded)
    }

    fn record(&self, state: MetricState, valid: bool) {
        // An epoch's `Final` value repeats its items' values aggregated: one value per item.
        let MetricState::Numeric(entry, Some(value)) = state else {
            return;
        };
        if matches!(value, NumericEntry::Final(_)) {
            return;
        }
        let Some(name) = self.names.get(&entry.metric_id) else {
            return;
        };
        let mut recorded = self
            .recorded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let values = recorded.entry(name.clone()).or_default();
        let split = if valid {
            &mut values.valid
        } else {
            &mut values.train
        };
        split.push(value.current());
    }
}

impl MetricsRendererTraining for MetricRecorder {
    fn update_train(&mut self, state: MetricState) {
        self.record(state, false);
    }

    fn update_valid(&mut self, state: MetricState) {
        self.record(state, true);
    }

    fn on_train_end(
        &mut self,
        _summary: Option<burn::train::LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        Ok(())
    }
}

impl MetricsRendererEvaluation for MetricRecorder {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
}

impl TrainingProgressLogger for MetricRecorder {
    fn start(
        &mut self,
        _total_epochs: usize,
        _starting_epoch: usize,
        _total_items: Option<usize>,
        _label: Option<&str>,
    ) {
    }

    fn update_epoch(&mut self, _epoch: usize) {}

    fn start_split(&mut self, _split: &str, _total_items: usize) {}

    fn update_split(&mut self, _items_processed: usize) {}

    fn end_split(&mut self) {}

    fn end(&mut self) {}

    fn log_event_training(&mut self, _event: String) {}
}

impl EvaluationProgressLogger for MetricRecorder {
    fn start_global_progress(&mut self, _total_tests: usize) {}

    fn start_test(&mut self, _name: &str, _total_items: usize) {}

    fn update_test_progress(&mut self, _items_processed: usize) {}

    fn end_test(&mut self) {}

    fn end_global_progress(&mut self) {}

    fn log_event_evaluation(&mut self, _event: String) {}
}

impl MetricsRenderer for MetricRecorder {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names
            .insert(definition.metric_id, definition.name.as_ref().clone());
    }
}
