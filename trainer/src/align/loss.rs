//! The preference losses as TRL computes them, from the log-probabilities of each example's
//! chosen and rejected completions: DPO's sigmoid loss (Rafailov et al. 2023, TRL's
//! `DPOTrainer`, `loss_type="sigmoid"`, with label smoothing) against a frozen reference, and
//! ORPO's odds-ratio term on top of the chosen completions' negative log-likelihood (Hong et al.
//! 2024, TRL's `ORPOTrainer`), with the rewards, margins and accuracy TRL logs.

use burn::tensor::Tensor;
use burn::tensor::activation::log_sigmoid;
use serde::{Deserialize, Serialize};

/// The per-example values of a batch of preference pairs, `[pairs]` each.
#[derive(Debug, Clone)]
pub struct PairLogProbs {
    /// The policy's log-probability of each chosen completion (DPO: summed over its tokens;
    /// ORPO: averaged over them).
    pub chosen: Tensor<1>,
    /// The same of each rejected completion.
    pub rejected: Tensor<1>,
}

/// A preference loss and what TRL logs beside it, each `[1]` (means over the pairs).
#[derive(Debug, Clone)]
pub struct PreferenceLoss {
    /// The loss the step minimises.
    pub loss: Tensor<1>,
    /// `rewards/chosen`.
    pub rewards_chosen: Tensor<1>,
    /// `rewards/rejected`.
    pub rewards_rejected: Tensor<1>,
    /// `rewards/margins`: the mean of the chosen rewards minus the rejected ones.
    pub margins: Tensor<1>,
    /// `rewards/accuracies`: the fraction of pairs whose chosen reward is the larger.
    pub accuracy: Tensor<1>,
}

/// What TRL logs beside a preference loss, read back: means over a step's pairs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PreferenceMetrics {
    /// `rewards/chosen`.
    pub rewards_chosen: f64,
    /// `rewards/rejected`.
    pub rewards_rejected: f64,
    /// `rewards/margins`.
    pub margins: f64,
    /// `rewards/accuracies`.
    pub accuracy: f64,
}

impl PreferenceMetrics {
    /// How many values [`PreferenceLoss::metrics`] holds.
    pub const COUNT: usize = 4;

    /// The metrics from the values of [`PreferenceLoss::metrics`] (or their mean over
    /// micro-batches).
    ///
    /// # Panics
    /// When `values` are not [`PreferenceMetrics::COUNT`].
    pub fn from_values(values: &[f64]) -> Self {
        let [rewards_chosen, rewards_rejected, margins, accuracy] = values else {
            panic!("{} preference metrics, not {}", Self::COUNT, values.len());
        };
        Self {
            rewards_chosen: *rewards_chosen,
            rewards_rejected: *rewards_rejected,
            margins: *margins,
            accuracy: *accuracy,
        }
    }
}

impl PreferenceLoss {
    /// The metrics beside the loss as one tensor `[4]`, without gradient: rewards of the chosen
    /// and of the rejected completions, margins, accuracy ([`PreferenceMetrics::from_values`]
    /// reads it back).
    pub fn metrics(&self) -> Tensor<1> {
        Tensor::cat(
            vec![
                self.rewards_chosen.clone(),
                self.rewards_rejected.clone(),
                self.margins.clone(),
                self.accuracy.clone(),
            ],
            0,
        )
        .detach()
    }
}

/// TRL's DPO loss types this crate computes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "type")]
pub enum DpoLoss {
    /// `−logσ(β·h)`: TRL's default. TRL 1.16 ignores `label_smoothing` with it.
    Sigmoid,
    /// Conservative DPO (cDPO, Mitchell 2023): the sigmoid loss with labels smoothed by `ε`,
    /// `−(1 − ε)·logσ(β·h) − ε·logσ(−β·h)`, as TRL's sigmoid loss computed it in earlier
    /// releases (TRL 1.16 applies this smoothing to its `aot` losses only).
    Conservative {
        /// `ε`, in (0, 0.5).
        label_smoothing: f64,
    },
    /// The robust loss of Chowdhury et al. 2024 for noisy preferences, with the chance
    /// `label_smoothing` (`ε`, below 0.5) that a pair's labels are flipped:
    /// `(−(1 − ε)·logσ(β·h) + ε·logσ(−β·h)) / (1 − 2ε)`.
    Robust {
        /// `ε`.
        label_smoothing: f64,
    },
}

/// DPO's loss of `policy` against `reference` log-probabilities (summed over each completion's
/// tokens): with `h = (π_c − ref_c) − (π_r − ref_r)`, the mean over pairs of `kind`'s loss of
/// `β·h`; the rewards are `β·(π − ref)`, without gradient.
pub fn dpo(
    policy: PairLogProbs,
    reference: PairLogProbs,
    beta: f64,
    kind: DpoLoss,
) -> PreferenceLoss {
    let logits = (policy.chosen.clone() - reference.chosen.clone())
        - (policy.rejected.clone() - reference.rejected.clone());
    let scaled = logits.mul_scalar(beta);
    let losses = match kind {
        DpoLoss::Sigmoid => log_sigmoid(scaled).neg(),
        DpoLoss::Conservative { label_smoothing } => {
            log_sigmoid(scaled.clone()).mul_scalar(-(1.0 - label_smoothing))
                - log_sigmoid(scaled.neg()).mul_scalar(label_smoothing)
        }
        DpoLoss::Robust { label_smoothing } => (log_sigmoid(scaled.clone())
            .mul_scalar(-(1.0 - label_smoothing))
            + log_sigmoid(scaled.neg()).mul_scalar(label_smoothing))
        .div_scalar(1.0 - 2.0 * label_smoothing),
    };
    let rewards =
        |policy: Tensor<1>, reference: Tensor<1>| (policy - reference).detach().mul_scalar(beta);
    let chosen = rewards(policy.chosen, reference.chosen);
    let rejected = rewards(policy.rejected, reference.rejected);
    with_rewards(losses.mean(), chosen, rejected)
}

/// ORPO's loss: `nll` (the chosen completions' negative log-likelihood, the SFT loss) minus `β`
/// times the mean log-sigmoid of the log odds ratio of the chosen and rejected completions'
/// average log-probabilities `p`: `log(p_c / (1 − p_c)) − log(p_r / (1 − p_r))` in log space.
/// The rewards are `β·p`, without gradient. Returns the loss and the mean log odds ratio
/// (`log_odds_ratio` in TRL's log is the mean log-sigmoid, `log_odds_chosen` this mean).
pub fn orpo(policy: PairLogProbs, nll: Tensor<1>, beta: f64) -> (PreferenceLoss, Tensor<1>) {
    let log_odds = (policy.chosen.clone() - policy.rejected.clone())
        - (log1m_exp(policy.chosen.clone()) - log1m_exp(policy.rejected.clone()));
    let ratio = log_sigmoid(log_odds.clone());
    let loss = nll - ratio.mean().mul_scalar(beta);
    let chosen = policy.chosen.detach().mul_scalar(beta);
    let rejected = policy.rejected.detach().mul_scalar(beta);
    (
        with_rewards(loss, chosen, rejected),
        log_odds.detach().mean(),
    )
}

/// `log(1 − exp(x))` for `x < 0` (a log-probability), with TRL's two branches: `log1p(−exp(x))`
/// below `−ln 2`, and above it `log(1 − exp(x))` directly (TRL's `log(−expm1(x))`; Burn has no
/// `expm1`, which only matters for `x` within about 1e-4 of 0, a completion of probability
/// near 1).
fn log1m_exp(x: Tensor<1>) -> Tensor<1> {
    let far = x.clone().exp().neg().log1p();
    let near = x.clone().exp().sub_scalar(1.0).neg().log();
    near.mask_where(x.lower_elem(-std::f64::consts::LN_2), far)
}

/// `loss` with TRL's reward metrics of per-pair rewards `[pairs]`.
fn with_rewards(loss: Tensor<1>, chosen: Tensor<1>, rejected: Tensor<1>) -> PreferenceLoss {
    let margins = (chosen.clone() - rejected.clone()).mean();
    let accuracy = chosen.clone().greater(rejected.clone()).float().mean();
    PreferenceLoss {
        loss,
        rewards_chosen: chosen.mean(),
        rewards_rejected: rejected.mean(),
        margins,
        accuracy,
    }
}
