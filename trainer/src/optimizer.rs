//! AdamW with torch's update, per-parameter-kind weight decay and bf16 stochastic rounding.
//!
//! Burn's `AdamW` computes the same update as `torch.optim.AdamW` (decoupled decay
//! `p *= 1 - lr * wd` before the step, bias-corrected moments, ε added to `√v̂`), but it applies
//! one weight decay to every parameter, keeps its state in the parameter's dtype and writes the
//! result back with round-to-nearest. HLAT needs the norm gains optionally left out of the decay
//! and bf16 parameters updated from f32 arithmetic with stochastic rounding, hence this optimizer.
//! It plugs into Burn through `SimpleOptimizer` / `OptimizerAdaptor`, so it is a regular
//! `burn::optim::Optimizer` that `TrainStep::optimize` drives.

use burn::module::AutodiffModule;
use burn::optim::SimpleOptimizer;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::record::Record;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor};

use burn_trainium::collective::CollectiveBackend;

use crate::config::TrainConfig;
use crate::parallel::Zero1;
use crate::rounding::stochastic_round_bf16;

/// Hyper-parameters of [`HlatAdamW`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWSettings {
    /// β1.
    pub beta1: f64,
    /// β2.
    pub beta2: f64,
    /// ε, added to the bias-corrected `√v`.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Leaves one-dimensional parameters (RMSNorm gains and biases, as Megatron and Hugging
    /// Face trainers do) out of the weight decay.
    pub exclude_norms_from_weight_decay: bool,
}

impl AdamWSettings {
    /// The optimizer settings of a training configuration.
    pub fn from_config(config: &TrainConfig) -> Self {
        Self {
            beta1: config.beta1,
            beta2: config.beta2,
            eps: config.eps,
            weight_decay: config.weight_decay,
            exclude_norms_from_weight_decay: config.exclude_norms_from_weight_decay,
        }
    }
}

/// AdamW as `torch.optim.AdamW`, with f32 state whatever the parameter dtype, optionally
/// partitioned over the data-parallel ranks (ZeRO-1).
#[derive(Debug, Clone)]
pub struct HlatAdamW {
    settings: AdamWSettings,
    zero1: Option<Zero1>,
}

/// The optimizer as Burn's learner components see it.
pub type HlatOptimizer<M, B> = OptimizerAdaptor<HlatAdamW, M, B>;

/// Per-parameter state: f32 first and second moments and the number of updates (under ZeRO-1,
/// of this rank's slice of the parameter).
#[derive(Record, Clone)]
pub struct AdamWState<B: Backend, const D: usize> {
    /// First moment (f32).
    pub moment1: Tensor<B, D>,
    /// Second moment (f32).
    pub moment2: Tensor<B, D>,
    /// Updates applied so far.
    pub time: usize,
}

impl HlatAdamW {
    /// An optimizer with these settings.
    pub fn new(settings: AdamWSettings) -> Self {
        Self {
            settings,
            zero1: None,
        }
    }

    /// The same optimizer with its state partitioned over data-parallel ranks: each step then
    /// receives this rank's slice of every gradient (see `parallel::scatter_gradients`),
    /// updates its slice of the parameter and all-gathers the whole parameter.
    pub fn with_zero1(self, zero1: Option<Zero1>) -> Self {
        Self { zero1, ..self }
    }

    /// Wraps the optimizer for a module type, as Burn's `AdamWConfig::init` does.
    pub fn init<B, M>(self) -> HlatOptimizer<M, B>
    where
        B: AutodiffBackend<InnerBackend: CollectiveBackend>,
        M: AutodiffModule<B>,
    {
        OptimizerAdaptor::from(self)
    }
}

impl<B: CollectiveBackend> SimpleOptimizer<B> for HlatAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let AdamWSettings {
            beta1,
            beta2,
            eps,
            weight_decay,
            exclude_norms_from_weight_decay,
        } = self.settings;
        let param_dtype = tensor.dtype();
        let param_shape = tensor.shape();
        let param = match &self.zero1 {
            Some(zero1) => zero1.slice(tensor),
            None => tensor,
        };
        let param = param.cast(DType::F32);
        let grad = grad.cast(DType::F32);

        let (moment1, moment2, time) = match state {
            Some(state) => (
                state.moment1.mul_scalar(beta1) + grad.clone().mul_scalar(1.0 - beta1),
                state.moment2.mul_scalar(beta2) + grad.square().mul_scalar(1.0 - beta2),
                state.time + 1,
            ),
            None => (
                grad.clone().mul_scalar(1.0 - beta1),
                grad.square().mul_scalar(1.0 - beta2),
                1,
            ),
        };

        let decay = if exclude_norms_from_weight_decay && D == 1 {
            0.0
        } else {
            weight_decay
        };
        let bias_correction1 = 1.0 - beta1.powi(time as i32);
        let bias_correction2 = 1.0 - beta2.powi(time as i32);
        let denominator = moment2
            .clone()
            .sqrt()
            .div_scalar(bias_correction2.sqrt())
            .add_scalar(eps);
        let updated = param.mul_scalar(1.0 - lr * decay)
            - moment1
                .clone()
                .div(denominator)
                .mul_scalar(lr / bias_correction1);

        let updated = match param_dtype {
            DType::BF16 => stochastic_round_bf16(updated),
            DType::F32 => updated,
            other => updated.cast(other),
        };
        let updated = match &self.zero1 {
            Some(zero1) => zero1.gather(updated, param_shape),
            None => updated,
        };
        let state = AdamWState {
            moment1,
            moment2,
            time,
        };
        (updated, Some(state))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        AdamWState {
            moment1: state.moment1.to_device(device),
            moment2: state.moment2.to_device(device),
            time: state.time,
        }
    }
}
