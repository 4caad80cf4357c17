//! [`ProgressRenderer`]: a one-line progress bar for Burn's learner where its terminal dashboard
//! cannot draw (output not a terminal, or the `dashboard` feature off).

use std::collections::{BTreeMap, HashMap};

use burn::train::LearnerSummary;
use burn::train::logger::{EvaluationProgressLogger, TrainingProgressLogger};
use burn::train::metric::{MetricDefinition, MetricId};
use burn::train::renderer::{
    EvaluationName, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining,
};
use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar over a run's optimizer steps, with the latest value of each numeric metric
/// (training, and validation once measured). Each item of a training split is one optimizer
/// step (as [`super::HlatStrategy`] reports them).
pub struct ProgressRenderer {
    bar: ProgressBar,
    first_step: u64,
    /// Optimizer steps of this run so far.
    steps: u64,
    /// The open splits (`train`, `valid` inside it while validating), innermost last.
    splits: Vec<String>,
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
            steps: 0,
            splits: Vec::new(),
            names: HashMap::new(),
            train: BTreeMap::new(),
            valid: BTreeMap::new(),
        }
    }

    /// Records the value of a numeric metric under its registered name.
    fn record(&self, values: &mut BTreeMap<String, f64>, state: MetricState) {
        if let MetricState::Numeric(entry, Some(value)) = state
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

impl TrainingProgressLogger for ProgressRenderer {
    fn start(
        &mut self,
        _total_epochs: usize,
        _starting_epoch: usize,
        _total_items: Option<usize>,
        _label: Option<&str>,
    ) {
    }

    fn update_epoch(&mut self, _epoch: usize) {}

    fn start_split(&mut self, split: &str, _total_items: usize) {
        self.splits.push(split.to_string());
    }

    fn update_split(&mut self, _items_processed: usize) {
        if self.splits.last().is_some_and(|split| split == "train") {
            self.steps += 1;
            self.bar.set_position(self.first_step + self.steps);
        }
        self.bar.set_message(self.message());
    }

    fn end_split(&mut self) {
        self.splits.pop();
        self.bar.set_message(self.message());
    }

    fn end(&mut self) {}

    fn log_event_training(&mut self, _event: String) {}
}

impl EvaluationProgressLogger for ProgressRenderer {
    fn start_global_progress(&mut self, _total_tests: usize) {}

    fn start_test(&mut self, _name: &str, _total_items: usize) {}

    fn update_test_progress(&mut self, _items_processed: usize) {}

    fn end_test(&mut self) {}

    fn end_global_progress(&mut self) {}

    fn log_event_evaluation(&mut self, _event: String) {}
}

impl MetricsRendererEvaluation for ProgressRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
}

impl MetricsRenderer for ProgressRenderer {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names
            .insert(definition.metric_id, definition.name.to_string());
    }
}
