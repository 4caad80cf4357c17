//! Metrics of Burn's learner for language models ([`OutputMetric`]): the loss weighted by target
//! tokens, so an epoch's value is the mean next-token cross-entropy over all its tokens
//! ([`TokenLossMetric`]), and the rewards a preference run's dashboard shows beside it
//! ([`RewardMetric`]).

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

/// What a metric reads from each batch's output.
pub trait OutputReading: Clone + Send + Sync + 'static {
    /// The batch's value and its weight in the running mean, or `None` when the batch has none.
    fn read(&self, item: &LmOutput) -> Result<Option<(f64, usize)>, TensorReadError>;
}

/// A numeric metric of Burn's learner over [`LmOutput`]s: the weighted mean of what `R` reads.
#[derive(Clone)]
pub struct OutputMetric<R> {
    name: MetricName,
    unit: Option<String>,
    higher_is_better: bool,
    reading: R,
    state: NumericMetricState,
}

impl<R: OutputReading> OutputMetric<R> {
    fn named(name: &str, unit: Option<&str>, higher_is_better: bool, reading: R) -> Self {
        Self {
            name: Arc::new(name.to_string()),
            unit: unit.map(str::to_string),
            higher_is_better,
            reading,
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

/// The batch's mean next-token cross-entropy, weighted by its target tokens.
#[derive(Debug, Clone, Copy)]
pub struct TokenLoss;

impl OutputReading for TokenLoss {
    fn read(&self, item: &LmOutput) -> Result<Option<(f64, usize)>, TensorReadError> {
        let item = item.clone().read()?;
        Ok(Some((item.loss, item.tokens)))
    }
}

/// Mean next-token cross-entropy, each batch weighted by its target tokens.
pub type TokenLossMetric = OutputMetric<TokenLoss>;

impl TokenLossMetric {
    /// The metric, named `Loss` as Burn's own loss metric.
    pub fn new() -> Self {
        Self::named("Loss", None, false, TokenLoss)
    }
}

impl Default for TokenLossMetric {
    fn default() -> Self {
        Self::new()
    }
}

/// One of the values of a preference run's `LmOutput::preference` (`PreferenceLoss::metrics`),
/// scaled; batches without them read nothing.
#[derive(Debug, Clone, Copy)]
pub struct Reward {
    index: usize,
    scale: f64,
}

impl OutputReading for Reward {
    fn read(&self, item: &LmOutput) -> Result<Option<(f64, usize)>, TensorReadError> {
        let Some(metrics) = &item.preference else {
            return Ok(None);
        };
        let values = metrics.clone().try_into_data()?;
        let value: f64 = values.iter::<f64>().nth(self.index).unwrap_or(f64::NAN);
        Ok(Some((value * self.scale, 1)))
    }
}

/// One of the reward metrics TRL logs for a preference run (`crate::align`): each step's mean
/// over its pairs.
pub type RewardMetric = OutputMetric<Reward>;

impl RewardMetric {
    /// The mean margin between the chosen and the rejected rewards.
    pub fn margins() -> Self {
        Self::named(
            "Reward margin",
            None,
            true,
            Reward {
                index: 2,
                scale: 1.0,
            },
        )
    }

    /// The fraction of pairs whose chosen reward is the larger, in percent.
    pub fn accuracy() -> Self {
        Self::named(
            "Reward accuracy",
            Some("%"),
            true,
            Reward {
                index: 3,
                scale: 100.0,
            },
        )
    }
}

impl<R: OutputReading> Metric for OutputMetric<R> {
    type Input = LmOutput;

    fn update(
        &mut self,
        item: &LmOutput,
        _metadata: &MetricMetadata,
    ) -> Result<SerializedEntry, TensorReadError> {
        if let Some((value, weight)) = self.reading.read(item)? {
            self.state.update(value, weight);
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
            higher_is_better: self.higher_is_better,
        }
        .into()
    }
}

impl<R: OutputReading> Numeric for OutputMetric<R> {
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
