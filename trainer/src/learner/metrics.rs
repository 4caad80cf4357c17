//! Metrics of Burn's learner for language models: the loss weighted by target tokens, so an
//! epoch's value is the mean next-token cross-entropy over all its tokens.

use std::sync::Arc;

use burn::train::metric::state::{FormatOptions, NumericMetricState};
use burn::train::metric::{
    Adaptor, Metric, MetricAttributes, MetricMetadata, MetricName, Numeric, NumericAttributes,
    NumericEntry, SerializedEntry,
};

use crate::language_model::LmOutputSync;

impl Adaptor<LmOutputSync> for LmOutputSync {
    fn adapt(&self) -> LmOutputSync {
        *self
    }
}

/// Mean next-token cross-entropy, each batch weighted by its target tokens.
#[derive(Clone)]
pub struct TokenLossMetric {
    name: MetricName,
    state: NumericMetricState,
}

impl TokenLossMetric {
    /// The metric, named `Loss` as Burn's own loss metric.
    pub fn new() -> Self {
        Self {
            name: Arc::new("Loss".to_string()),
            state: NumericMetricState::new(),
        }
    }
}

impl Default for TokenLossMetric {
    fn default() -> Self {
        Self::new()
    }
}

impl Metric for TokenLossMetric {
    type Input = LmOutputSync;

    fn update(&mut self, item: &LmOutputSync, _metadata: &MetricMetadata) -> SerializedEntry {
        self.state.update(
            item.loss,
            item.tokens,
            FormatOptions::new(self.name()).precision(4),
        )
    }

    fn clear(&mut self) {
        self.state.reset()
    }

    fn name(&self) -> MetricName {
        self.name.clone()
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes {
            unit: None,
            higher_is_better: false,
        }
        .into()
    }
}

impl Numeric for TokenLossMetric {
    fn value(&self) -> NumericEntry {
        self.state.current_value()
    }

    fn running_value(&self) -> NumericEntry {
        self.state.running_value()
    }
}
