//! [`ProgressRenderer`]: a one-line progress bar for Burn's learner where its terminal dashboard
//! cannot draw (output not a terminal, or the `dashboard` feature off).

use std::collections::{BTreeMap, HashMap};

use burn::train::LearnerSummary;
use burn::train::metric::{MetricDefinition, MetricId};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar over a run's optimizer steps, with the latest value of each numeric metric
/// (training, and validation once measured).
pub struct ProgressRenderer {
    bar: ProgressBar,
    first_step: u64,
    names: HashMap<MetricId, String>,
    train: BTreeMap<String, f64>,
    valid: BTreeMap<String, f64>,
}

impl ProgressRenderer {
    /// A bar from step `first_step` to `last_step`; hidden when `visible` is false (indicatif
    /// also hides it when standard error is not a terminal).
    pub fn new(first_step: u64, last_step: u64, visible: bool) -> Self {
        let bar = if visible {
            ProgressBar::new(last_step)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta}] {msg}")
                .expect("the progress template is valid"),
        );
        bar.set_position(first_step);
        Self {
            bar,
            first_step,
            names: HashMap::new(),
            train: BTreeMap::new(),
            valid: BTreeMap::new(),
        }
    }

    /// Records the value of a numeric metric under its registered name.
    fn record(&self, values: &mut BTreeMap<String, f64>, state: MetricState) {
        if let MetricState::Numeric(entry, value) = state
            && let Some(name) = self.names.get(&entry.metric_id)
        {
            values.insert(name.clone(), value.current());
        }
    }

    fn message(&self) -> String {
        let format = |prefix: &str, values: &BTreeMap<String, f64>| {
            values
                .iter()
                .map(|(name, value)| format!("{prefix}{name} {value:.4}"))
                .collect::<Vec<_>>()
        };
        let mut parts = format("", &self.train);
        parts.extend(format("valid ", &self.valid));
        parts.join(" · ")
    }
}

impl MetricsRendererTraining for ProgressRenderer {
    fn update_train(&mut self, state: MetricState) {
        let mut values = std::mem::take(&mut self.train);
        self.record(&mut values, state);
        self.train = values;
    }

    fn update_valid(&mut self, state: MetricState) {
        let mut values = std::mem::take(&mut self.valid);
        self.record(&mut values, state);
        self.valid = values;
    }

    fn render_train(&mut self, item: TrainingProgress, _indicators: Vec<ProgressType>) {
        if let Some(iteration) = item.iteration {
            self.bar.set_position(self.first_step + iteration as u64);
        }
        self.bar.set_message(self.message());
    }

    fn render_valid(&mut self, _item: TrainingProgress, _indicators: Vec<ProgressType>) {
        self.bar.set_message(self.message());
    }

    fn on_train_end(
        &mut self,
        summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        self.bar.finish();
        if let Some(summary) = summary {
            println!("{summary}");
        }
        Ok(())
    }
}

impl MetricsRendererEvaluation for ProgressRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}

    fn render_test(&mut self, _item: EvaluationProgress, _indicators: Vec<ProgressType>) {}
}

impl MetricsRenderer for ProgressRenderer {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names.insert(definition.metric_id, definition.name);
    }
}
