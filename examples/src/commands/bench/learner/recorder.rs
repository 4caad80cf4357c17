//! [`MetricRecorder`]: a silent renderer for burn-train's `Learner` that keeps every value its
//! numeric metrics report, so the benchmark can compare backends' losses item by item.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use burn::train::metric::{MetricDefinition, MetricId};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
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
        let MetricState::Numeric(entry, value) = state else {
            return;
        };
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

    fn render_train(&mut self, _item: TrainingProgress, _indicators: Vec<ProgressType>) {}

    fn render_valid(&mut self, _item: TrainingProgress, _indicators: Vec<ProgressType>) {}

    fn on_train_end(
        &mut self,
        _summary: Option<burn::train::LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        Ok(())
    }
}

impl MetricsRendererEvaluation for MetricRecorder {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}

    fn render_test(&mut self, _item: EvaluationProgress, _indicators: Vec<ProgressType>) {}
}

impl MetricsRenderer for MetricRecorder {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names.insert(definition.metric_id, definition.name);
    }
}
