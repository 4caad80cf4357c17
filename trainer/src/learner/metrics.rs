//! Metrics of Burn's learner for language models: the loss weighted by target tokens, so an
//! epoch's value is the mean next-token cross-entropy over all its tokens, and the rewards a
//! preference run's dashboard shows beside it.

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

/// One of the reward metrics TRL logs for a preference run (`crate::align`): each step's mean
/// over its pairs. A batch without preference metrics leaves it as it is.
#[derive(Clone)]
pub struct RewardMetric {
    name: MetricName,
    /// The value's index in `LmOutput::preference` (`PreferenceLoss::metrics`).
    index: usize,
    unit: Option<String>,
    state: NumericMetricState,
}

impl RewardMetric {
    /// The mean margin between the chosen and the rejected rewards.
    pub fn margins() -> Self {
        Self::new("Reward margin", 2, None)
    }

    /// The fraction of pairs whose chosen reward is the larger, in percent.
    pub fn accuracy() -> Self {
        Self::new("Reward accuracy", 3, Some("%".to_string()))
    }

    fn new(name: &str, index: usize, unit: Option<String>) -> Self {
        Self {
            name: Arc::new(name.to_string()),
            index,
            unit,
            state: NumericMetricState::default(),
        }
    }

    fn format(&self) -> FormatOptions {
        let format = FormatOptions::new(self.name()).precision(4);
        match &self.unit {
            Some(unit) => format.unit(unit),
            None => format,
        }
    }
}

impl Metric for RewardMetric {
    type Input = LmOutput;

    fn update(
        &mut self,
        item: &LmOutput,
        _metadata: &MetricMetadata,
    ) -> Result<SerializedEntry, TensorReadError> {
        if let Some(metrics) = &item.preference {
            let values = metrics.clone().try_into_data()?;
            let value: f64 = values.iter::<f64>().nth(self.index).unwrap_or(f64::NAN);
            let scale = if self.unit.is_some() { 100.0 } else { 1.0 };
            self.state.update(value * scale, 1);
        }
        Ok(self.state.compute_update(self.format()))
    }

    fn compute(&mut self) -> Result<SerializedEntry, TensorReadError> {
        Ok(self.state.compute_final(self.format()))
    }

    fn clear(&mut self) {
        self.state.reset()
    }

    fn name(&self) -> MetricName {
        self.name.clone()
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes {
            unit: self.unit.clone(),
            higher_is_better: true,
        }
        .into()
    }
}

impl Numeric for RewardMetric {
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
