//! The gradients of one optimizer step as HLAT's recipe makes them: the micro-batches'
//! gradients summed, combined over the replicas of a parallel layout, measured (loss and global
//! norm, one read back) and clipped, ready for the optimizer.
//!
//! [`step_gradients`] is the first half of every optimizer step, which
//! [`crate::learner::OptimizerStep`] completes on a Burn `Learner` (counting the step, skipping a
//! non-finite one, updating the model). The model side stays Burn's: [`TrainStep::step`]
//! computes each micro-batch's gradients.

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{ElementConversion, Tensor};
use burn::train::TrainStep;

use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};

use crate::align::PreferenceMetrics;
use crate::clip::{clip_coefficient, grad_sum_of_squares, scale_grads};
use crate::error::TrainError;
use crate::language_model::{LanguageModel, LmBatch};
use crate::parallel::{
    ParallelLayout, average_gradients, move_expert_gradients, move_stage_gradients,
    reduce_replicated_gradients, scatter_gradients,
};

/// Moves the gradients of the parameters a rank holds as its own from one set to another.
type MoveOwn = fn(&LanguageModel, &mut GradientsParams, &mut GradientsParams);

/// The summed squares of `grads` when some parameters are each rank's own: the first of `owners`
/// moves those of a pipeline stage's layers or an expert-parallel rank's experts, whose squares
/// add up over its groups (those of the next owners, within them, over theirs first); the
/// others' count once.
fn square_sum_with_own(
    model: &LanguageModel,
    grads: &mut GradientsParams,
    tensor_groups: Option<&ReplicaGroups>,
    owners: &[(MoveOwn, &ReplicaGroups)],
) -> Option<Tensor<1>> {
    let Some(((own, groups), inner)) = owners.split_first() else {
        return grad_sum_of_squares(model, grads, tensor_groups);
    };
    let mut owned = GradientsParams::new();
    own(model, grads, &mut owned);
    let shared = grad_sum_of_squares(model, grads, tensor_groups);
    let local = square_sum_with_own(model, &mut owned, tensor_groups, inner)
        .map(|local| collective::all_reduce(local, ReduceOp::Sum, groups));
    own(model, &mut owned, grads);
    match (shared, local) {
        (Some(shared), Some(local)) => Some(shared + local),
        (one, other) => one.or(other),
    }
}

/// One optimizer step's gradients as HLAT's recipe makes them, ready for the optimizer.
pub struct StepGradients {
    /// The micro-batches' gradients, averaged over them and over the data-parallel replicas
    /// (under ZeRO-1: this replica's slice), scaled by the global-norm clipping factor.
    pub grads: GradientsParams,
    /// Mean loss over the micro-batches and replicas, before the update.
    pub loss: f64,
    /// Global L2 norm of the averaged gradient, before clipping.
    pub grad_norm: f64,
    /// Target tokens in the step (over every data-parallel replica).
    pub tokens: usize,
    /// A mixture of experts' mean load-balancing loss (unweighted; `loss` holds it weighted).
    pub load_balancing_loss: Option<f64>,
    /// A preference loss's metrics (`crate::align`), means over the micro-batches and replicas.
    pub preference: Option<PreferenceMetrics>,
}

impl StepGradients {
    /// Whether the loss and the gradient norm are finite (else the update must be skipped).
    pub fn is_finite(&self) -> bool {
        self.loss.is_finite() && self.grad_norm.is_finite()
    }
}

/// What [`accumulate`] sums over an optimizer step's micro-batches.
struct Accumulated {
    grads: GradientsParams,
    loss: Tensor<1>,
    /// A mixture's load-balancing losses.
    balance: Option<Tensor<1>>,
    /// A preference loss's metrics.
    preference: Option<Tensor<1>>,
    tokens: usize,
}

/// The gradients of `micro_batches` run one after the other through `model`'s `TrainStep`,
/// summed, with the sum of their losses (and of a mixture's load-balancing losses, or of a
/// preference loss's metrics) and their target tokens.
fn accumulate(model: &LanguageModel, micro_batches: Vec<LmBatch>) -> Accumulated {
    let mut accumulator = GradientsAccumulator::new();
    let mut loss_sum: Option<Tensor<1>> = None;
    let mut balance_sum: Option<Tensor<1>> = None;
    let mut preference_sum: Option<Tensor<1>> = None;
    let mut tokens = 0;
    let add = |sum: Option<Tensor<1>>, value: Tensor<1>| match sum {
        Some(sum) => sum + value,
        None => value,
    };
    for batch in micro_batches {
        let output = model.step(batch);
        accumulator.accumulate(model, output.grads);
        tokens += output.item.tokens;
        loss_sum = Some(add(loss_sum, output.item.loss.inner()));
        if let Some(balance) = output.item.load_balancing {
            balance_sum = Some(add(balance_sum, balance.inner()));
        }
        if let Some(metrics) = output.item.preference {
            preference_sum = Some(add(preference_sum, metrics.inner()));
        }
    }
    Accumulated {
        grads: accumulator.grads(),
        loss: loss_sum.expect("at least one micro-batch"),
        balance: balance_sum,
        preference: preference_sum,
        tokens,
    }
}

/// The forward and backward passes of `micro_batches` on `model`, their gradients combined over
/// the replicas as `layout` says (sequence-parallel norm gains summed over the tensor group,
/// data-parallel mean by bucketed all-reduce or, under ZeRO-1, reduce-scatter; under fully
/// sharded data parallelism the backward pass reduce-scatters them), measured with one
/// read back (loss and global norm) and clipped to `clip_grad_norm` (0: off). A failed read
/// (the device's error) is [`TrainError::Device`].
///
/// # Panics
/// When `micro_batches` is empty, or the model is not on an autodiff device
/// (`Device::autodiff`).
pub fn step_gradients(
    model: &LanguageModel,
    micro_batches: Vec<LmBatch>,
    layout: &ParallelLayout,
    clip_grad_norm: f64,
) -> Result<StepGradients, TrainError> {
    assert!(!micro_batches.is_empty(), "an optimizer step needs a batch");
    let count = micro_batches.len();
    let Accumulated {
        mut grads,
        loss: mut loss_sum,
        balance: mut balance_sum,
        preference: mut preference_sum,
        mut tokens,
    } = match &model.pipeline {
        Some(pipeline) => {
            let (step, tokens) = model.pipeline_step(pipeline, micro_batches);
            Accumulated {
                grads: step.gradients,
                loss: step.objective.inner(),
                balance: step.load_balancing.map(Tensor::inner),
                preference: None,
                tokens,
            }
        }
        None => accumulate(model, micro_batches),
    };
    if layout.tensor > 1 {
        let groups = layout.tensor_groups();
        reduce_replicated_gradients(model, &mut grads, &groups, layout.sequence_parallel);
    }
    let zero1 = layout.zero1();
    if layout.data > 1 {
        let groups = layout.data_groups();
        match &zero1 {
            _ if layout.expert > 1 => {
                crate::parallel::reduce_gradients_with_experts(model, &mut grads, layout)
            }
            // The backward pass already left each rank its slice of the sum.
            _ if layout.fsdp => scale_grads(model, &mut grads, 1.0 / layout.data as f64),
            Some(zero1) => scatter_gradients(model, &mut grads, zero1),
            None => average_gradients(model, &mut grads, &groups),
        }
        loss_sum = collective::all_reduce(loss_sum, ReduceOp::Mean, &groups);
        let mean = |sum: Tensor<1>| collective::all_reduce(sum, ReduceOp::Mean, &groups);
        balance_sum = balance_sum.map(mean);
        preference_sum = preference_sum.map(mean);
        tokens *= layout.data;
    }
    let tensor_groups = (layout.tensor > 1).then(|| layout.tensor_groups());
    let tensor_groups = tensor_groups.as_ref();
    // Each stage's layers are its own, and each expert-parallel rank's experts (under ZeRO-1
    // every slice adds up over the data-parallel group, below).
    let expert_groups = layout.expert_groups();
    let mut owners: Vec<(MoveOwn, &ReplicaGroups)> = Vec::new();
    if let Some(pipeline) = &model.pipeline {
        owners.push((move_stage_gradients, &pipeline.groups));
    }
    if layout.expert > 1 && zero1.is_none() {
        owners.push((move_expert_gradients, &expert_groups));
    }
    let squares = square_sum_with_own(model, &mut grads, tensor_groups, &owners);
    let mut squares = squares.unwrap_or_else(|| loss_sum.zeros_like());
    if let Some(zero1) = &zero1 {
        // Each data-parallel rank holds a slice of every gradient, or its own experts' slices:
        // the norm stays global.
        squares = collective::all_reduce(squares, ReduceOp::Sum, &zero1.groups);
    }
    // One read back per step: the summed loss, the summed squared gradient, a mixture's
    // summed load-balancing loss and a preference loss's summed metrics.
    let balanced = balance_sum.is_some();
    let preferred = preference_sum.is_some();
    let values = Tensor::cat(
        std::iter::once(loss_sum)
            .chain(std::iter::once(squares))
            .chain(balance_sum)
            .chain(preference_sum)
            .collect(),
        0,
    )
    .try_into_data()?;
    let values: Vec<f64> = values.iter::<f32>().map(|value| value.elem()).collect();
    let loss = values[0] / count as f64;
    let grad_norm = values[1].sqrt() / count as f64;
    // The rest are sums over the micro-batches.
    let mut extra = values[2..].iter().map(|sum| sum / count as f64);
    let load_balancing_loss = balanced.then(|| extra.next().expect("read with the loss"));
    let preference = preferred.then(|| PreferenceMetrics::from_values(&extra.collect::<Vec<_>>()));
    if loss.is_finite() && grad_norm.is_finite() {
        let factor = clip_coefficient(grad_norm, clip_grad_norm) / count as f64;
        scale_grads(model, &mut grads, factor);
    }
    Ok(StepGradients {
        grads,
        loss,
        grad_norm,
        tokens,
        load_balancing_loss,
        preference,
    })
}
