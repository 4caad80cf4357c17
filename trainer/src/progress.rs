//! How far a run has come ([`TrainingProgress`], which checkpoints carry) and what each optimizer
//! step did ([`StepReport`]).

use serde::{Deserialize, Serialize};

use crate::align::PreferenceMetrics;
use crate::error::TrainError;
use crate::step_gradients::StepGradients;

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The step number (1-based).
    pub step: u64,
    /// Mean loss over the step's micro-batches, before the update.
    pub loss: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// Global L2 norm of the averaged gradient, before clipping.
    pub grad_norm: f64,
    /// Target tokens in the step (over every data-parallel replica).
    pub tokens: usize,
    /// The update was skipped because the loss or the gradient was not finite.
    pub skipped: bool,
    /// A mixture of experts' mean load-balancing loss (unweighted; `loss` holds it weighted).
    pub load_balancing_loss: Option<f64>,
    /// A preference loss's rewards, margins and accuracy (`crate::align`), means over the step.
    pub preference: Option<PreferenceMetrics>,
}

/// Counters that a checkpoint carries besides the model and the optimizer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainingProgress {
    /// Optimizer steps done (skipped ones included).
    pub step: u64,
    /// Target tokens consumed.
    pub tokens_seen: u64,
    /// Steps skipped for a non-finite loss or gradient since the start of the run.
    pub skipped_steps: u64,
    /// Skipped steps in a row up to now.
    pub consecutive_skips: u32,
}

impl TrainingProgress {
    /// Counts optimizer step `step` (learning rate `lr`) whose gradients are `update`: its
    /// tokens, and whether it is skipped for a non-finite loss or gradient. Returns the step's
    /// report, or [`TrainError::NonFinite`] at the `max_consecutive_skips`-th skip in a row.
    pub fn record(
        &mut self,
        step: u64,
        lr: f64,
        update: &StepGradients,
        max_consecutive_skips: u32,
    ) -> Result<StepReport, TrainError> {
        let StepGradients {
            loss,
            grad_norm,
            tokens,
            load_balancing_loss,
            preference,
            ..
        } = *update;
        self.step = step;
        self.tokens_seen += tokens as u64;
        let finite = update.is_finite();
        if finite {
            self.consecutive_skips = 0;
        } else {
            self.skipped_steps += 1;
            self.consecutive_skips += 1;
            log::warn!("step {step}: loss {loss}, gradient norm {grad_norm}; update skipped");
            if self.consecutive_skips >= max_consecutive_skips {
                return Err(TrainError::NonFinite {
                    step,
                    count: self.consecutive_skips,
                    loss,
                    grad_norm,
                });
            }
        }
        Ok(StepReport {
            step,
            loss,
            lr,
            grad_norm,
            tokens,
            skipped: !finite,
            load_balancing_loss,
            preference,
        })
    }
}
