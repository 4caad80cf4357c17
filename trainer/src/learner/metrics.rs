//! Metrics of Burn's learner for language models: the loss weighted by target tokens, so an
//! epoch's value is the mean next-token cross-entropy over all its tokens.

use std::sync::Arc;

use burn::tensor::TensorReadError;
use burn::train::metric::state::{FormatOptions, NumericMetricState};
use burn::train::metric::{
    Adaptor, Metric, MetricAttributes, MetricMetadata, MetricName, Numeric, NumericAttributes,
    NumericEntry, SerializedEntry,
};

use crate::language_model::LmOutput;

impl Adaptor<LmOutput> for LmOutput {
    fn adapt(&self) -> LmOutput {
        self.clone()
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
            state: NumericMetricState::default(),
        }
    }
}

impl Default for TokenLossMetric {
    fn default() -> Self {
        Self::new()
    }
}

impl Metric for TokenLossMetric {
    type Input = LmOutput;

    fn update(
        &mut self,
        item: &LmOutput,
        _metadata: &MetricMetadata,
    ) -> Result<SerializedEntry, TensorReadError> {
        let item = item.clone().read()?;
        self.state.update(item.loss, item.tokens);
        Ok(self
            .state
            .compute_update(FormatOptions::new(self.name()).precision(4)))
    }

    fn compute(&mut self) -> Result<SerializedEntry, TensorReadError> {
        Ok(self
            .state
            .compute_final(FormatOptions::new(self.name()).precision(4)))
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
    fn value(&self) -> Option<NumericEntry> {
        Some(self.state.current_value())
    }

    fn running_value(&self) -> Option<NumericEntry> {
        Some(self.state.running_value())
    }

    fn final_value(&self) -> NumericEntry {
        self.state.final_value()
    }
}
