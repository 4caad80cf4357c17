//! AdamW with torch's update, per-parameter-kind weight decay and bf16 stochastic rounding.
//!
//! Burn's `AdamW` computes the same update as `torch.optim.AdamW` (decoupled decay
//! `p *= 1 - lr * wd` before the step, bias-corrected moments, ε added to `√v̂`), but it applies
//! one weight decay to every parameter, keeps its state in the parameter's dtype and writes the
//! result back with round-to-nearest. HLAT needs the norm gains optionally left out of the decay
//! and bf16 parameters updated from f32 arithmetic with stochastic rounding, hence this optimizer.
//! It is a per-parameter `burn::optim::Optimizer` that Burn's `ModuleOptimizer` drives (the
//! optimizer of a burn-train `Learner`, see [`HlatAdamW::init`]); [`HlatOptimizer`] is the same
//! optimizer with its state held by the trainer, which checkpoints and reshards it
//! (`crate::checkpoint_state`, `crate::learner::SharedOptimizer`).

use std::collections::HashMap;

use burn::module::ParamId;
use burn::optim::{DynState, ModuleOptimizer, Optimizer, RecordState, StateSink, StateSource};
use burn::tensor::{DType, Device, Tensor};
use burn_store::burn_pack::Scalar;

use crate::config::TrainConfig;
use crate::parallel::{ParallelLayout, Zero1};
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
    /// ZeRO-1 of the replicated parameters.
    zero1: Option<Zero1>,
    /// ZeRO-1 of a mixture's experts split over expert-parallel ranks (see
    /// `ParallelLayout::zero1_of_experts`).
    zero1_of_experts: Option<Zero1>,
}

/// Per-parameter state: f32 first and second moments and the number of updates (under ZeRO-1,
/// of this rank's slice of the parameter).
#[derive(Clone)]
pub struct AdamWState<const D: usize> {
    /// First moment (f32).
    pub moment1: Tensor<D>,
    /// Second moment (f32).
    pub moment2: Tensor<D>,
    /// Updates applied so far.
    pub time: usize,
}

/// The entries of a state: `{prefix}.moment1`, `{prefix}.moment2` (tensors), `{prefix}.time`
/// (Burn's `#[derive(RecordState)]` names its own crates' paths, so it is written out here).
impl<const D: usize> RecordState for AdamWState<D> {
    fn state_flatten(&self, prefix: &str, out: &mut StateSink) {
        out.push_tensor(prefix, "moment1", self.moment1.clone().into_data());
        out.push_tensor(prefix, "moment2", self.moment2.clone().into_data());
        out.push_scalar(prefix, "time", Scalar::from(self.time));
    }

    fn state_unflatten(prefix: &str, src: &mut StateSource, device: &Device) -> Option<Self> {
        let moment1 = Tensor::from_data(src.take_tensor(prefix, "moment1")?, device);
        let moment2 = Tensor::from_data(src.take_tensor(prefix, "moment2")?, device);
        let time = usize::try_from(src.take_scalar(prefix, "time")?).ok()?;
        Some(Self {
            moment1,
            moment2,
            time,
        })
    }
}

/// The state of one parameter, whatever its rank (an [`AdamWState`] of that rank).
#[derive(Clone)]
pub struct StateRecord {
    state: DynState,
}

impl StateRecord {
    /// Wraps the state of a parameter of rank `D`.
    pub fn from_state<const D: usize>(state: AdamWState<D>) -> Self {
        Self {
            state: DynState::create(state, D),
        }
    }

    /// The state, of a parameter of rank `D`.
    ///
    /// # Panics
    /// When the state is of a parameter of another rank.
    pub fn into_state<const D: usize>(self) -> AdamWState<D> {
        assert_eq!(
            self.state.rank(),
            D,
            "the optimizer state of a rank-{} parameter read as rank {D}",
            self.state.rank()
        );
        self.state.downcast()
    }

    /// The rank of the parameter.
    pub fn rank(&self) -> usize {
        self.state.rank()
    }
}

/// The optimizer state of a module's parameters, by parameter id.
pub type OptimizerRecord = HashMap<ParamId, StateRecord>;

/// HLAT's AdamW over a whole module with its state held here, where the trainer reads, reshards
/// and checkpoints it (Burn's `ModuleOptimizer` keeps its state private); a `Learner` updates
/// through it by `crate::learner::SharedOptimizer`.
#[derive(Debug, Clone)]
pub struct HlatOptimizer {
    adamw: HlatAdamW,
    states: OptimizerRecord,
}

impl std::fmt::Debug for StateRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateRecord")
            .field("rank", &self.state.rank())
            .finish()
    }
}

impl HlatOptimizer {
    /// `adamw` without state (before the first step).
    pub fn new(adamw: HlatAdamW) -> Self {
        Self {
            adamw,
            states: HashMap::new(),
        }
    }

    /// The per-parameter optimizer.
    pub fn adamw(&self) -> &HlatAdamW {
        &self.adamw
    }

    /// Updates one parameter (`id`, on the gradient's device; a mixture's split expert when
    /// `expert`) and its state.
    pub(crate) fn step_param<const D: usize>(
        &mut self,
        (id, expert): (ParamId, bool),
        lr: f64,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        fallback: Option<AdamWState<D>>,
    ) -> (Tensor<D>, Option<AdamWState<D>>) {
        let device = grad.device();
        let state = self
            .states
            .remove(&id)
            .map(StateRecord::into_state::<D>)
            .or(fallback)
            .map(|state| HlatAdamW::to_device(state, &device));
        let (tensor, state) = self.adamw.update(lr, tensor, grad, state, expert);
        if let Some(state) = &state {
            self.states
                .insert(id, StateRecord::from_state(state.clone()));
        }
        (tensor, state)
    }

    /// Gives parameter `id` (a mixture's split expert when `expert`), of value `tensor`, the
    /// state [`HlatAdamW::initial_state`] unless it has one.
    pub(crate) fn ensure_state<const D: usize>(
        &mut self,
        (id, expert): (ParamId, bool),
        tensor: Tensor<D>,
    ) {
        if !self.states.contains_key(&id) {
            let state = self.adamw.initial_state(tensor, expert);
            self.states.insert(id, StateRecord::from_state(state));
        }
    }

    /// The state of every parameter updated so far.
    pub fn to_record(&self) -> OptimizerRecord {
        self.states.clone()
    }

    /// The optimizer with `record` as its state.
    pub fn load_record(self, record: OptimizerRecord) -> Self {
        Self {
            states: record,
            ..self
        }
    }
}

impl HlatAdamW {
    /// An optimizer with these settings.
    pub fn new(settings: AdamWSettings) -> Self {
        Self {
            settings,
            zero1: None,
            zero1_of_experts: None,
        }
    }

    /// The same optimizer with its state partitioned as `layout`'s ZeRO-1 says (nothing changes
    /// without it): each step then receives this rank's slice of every gradient (see
    /// `parallel::scatter_gradients`), updates its slice of the parameter and all-gathers the
    /// whole parameter; the slices of a mixture's split experts are over the replicas holding
    /// the same experts, those of the other parameters over the data-parallel group.
    ///
    /// Under fully sharded data parallelism the parameters are already this rank's slices: the
    /// optimizer updates them as they are (their state has the same slices' shapes).
    pub fn partitioned_for(self, layout: &ParallelLayout) -> Self {
        if layout.fsdp {
            return Self {
                zero1: None,
                zero1_of_experts: None,
                ..self
            };
        }
        // Experts that are not split are partitioned as every other parameter.
        let zero1_of_experts = if layout.expert > 1 {
            layout.zero1_of_experts()
        } else {
            layout.zero1()
        };
        Self {
            zero1: layout.zero1(),
            zero1_of_experts,
            ..self
        }
    }

    /// Wraps the optimizer for a whole module, as Burn's `AdamWConfig::init` does (its state is
    /// then Burn's: see [`HlatOptimizer`] for a state the trainer reads).
    ///
    /// # Panics
    /// When split experts are partitioned otherwise than the other parameters (expert
    /// parallelism under ZeRO-1): Burn's optimizer cannot tell them apart; bind each parameter
    /// to its kind with `SharedOptimizer::module_optimizer` instead.
    pub fn init(self) -> ModuleOptimizer {
        assert_eq!(
            self.zero1_of_experts, self.zero1,
            "split experts partitioned on their own need SharedOptimizer::module_optimizer"
        );
        ModuleOptimizer::from(self)
    }
}

impl HlatAdamW {
    /// How ZeRO-1 partitions the state of a parameter of this kind (a mixture's split expert
    /// when `expert`), if it does.
    fn zero1_for(&self, expert: bool) -> Option<&Zero1> {
        if expert {
            self.zero1_of_experts.as_ref()
        } else {
            self.zero1.as_ref()
        }
    }

    /// The state of parameter `tensor` (a mixture's split expert when `expert`) before its first
    /// update: f32 zero moments of its ZeRO-1 slice's shape and no update counted. The first
    /// update from it gives the same values as from no state (`0 · β + x` is `x`), and the
    /// first step then runs the program of every later step instead of one of its own.
    pub fn initial_state<const D: usize>(&self, tensor: Tensor<D>, expert: bool) -> AdamWState<D> {
        let zero1 = self.zero1_for(expert);
        let device = tensor.device();
        let shape = match zero1 {
            Some(zero1) => zero1.slice_dims(tensor.dims()),
            None => tensor.dims(),
        };
        // Two tensors: one tensor as both moments would be one input of the first step's program.
        let zeros = || Tensor::<D>::zeros(shape, &device).cast(DType::F32);
        AdamWState {
            moment1: zeros(),
            moment2: zeros(),
            time: 0,
        }
    }

    /// One update of `tensor` (a mixture's split expert when `expert`), its state sliced as
    /// ZeRO-1 partitions that kind of parameter.
    pub(crate) fn update<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<AdamWState<D>>,
        expert: bool,
    ) -> (Tensor<D>, Option<AdamWState<D>>) {
        let zero1 = self.zero1_for(expert);
        let AdamWSettings {
            beta1,
            beta2,
            eps,
            weight_decay,
            exclude_norms_from_weight_decay,
        } = self.settings;
        let param_dtype = tensor.dtype();
        let param_shape = tensor.shape();
        let param = match zero1 {
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
        let updated = match zero1 {
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
}

/// Burn's per-parameter optimizer, for a `ModuleOptimizer` that knows no parameter's kind: every
/// parameter is updated as a replicated one. A run whose experts are split and partitioned by
/// ZeRO-1 binds each parameter to its kind instead (`SharedOptimizer::module_optimizer`).
impl Optimizer for HlatAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        self.update(lr, tensor, grad, state, false)
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        AdamWState {
            moment1: state.moment1.to_device(device),
            moment2: state.moment2.to_device(device),
            time: state.time,
        }
    }
}
