//! [`SharedOptimizer`]: an optimizer whose state the code that handed it to a `Learner` can
//! still read.
//!
//! burn-train's `Learner` keeps its optimizer (a Burn `ModuleOptimizer`) private and offers its
//! state only to Burn's own per-epoch checkpointer, as host data. A run that checkpoints every N
//! steps in its own layout (optimizer state resharded across parallel layouts on the device,
//! next to the data sampler's position) keeps a clone of this handle and reads the state through
//! it: the `Learner`'s optimizer ([`SharedOptimizer::module_optimizer`]) updates each parameter
//! with HLAT's AdamW bound to that parameter, whose state lives in the shared [`HlatOptimizer`].

use std::sync::{Arc, Mutex, MutexGuard};

use burn::module::{Module, Param, ParamGroup, ParamId};
use burn::optim::{ModuleOptimizer, Optimizer};
use burn::tensor::{Device, Tensor};
use hlat::expert_parallel::expert_of;
use hlat::parallel::{ParamPath, PathVisitor, visit_with_paths};

use crate::optimizer::{AdamWState, HlatAdamW, HlatOptimizer};

/// An optimizer shared between a `Learner` and the code that built it: clones are handles to
/// one optimizer and one state.
#[derive(Clone)]
pub struct SharedOptimizer {
    inner: Arc<Mutex<HlatOptimizer>>,
}

impl SharedOptimizer {
    /// Shares `optimizer` (with its state, e.g. a checkpoint's).
    pub fn new(optimizer: HlatOptimizer) -> Self {
        Self {
            inner: Arc::new(Mutex::new(optimizer)),
        }
    }

    /// The optimizer, locked for the caller.
    pub fn lock(&self) -> MutexGuard<'_, HlatOptimizer> {
        // A panic while the lock was held leaves a state that is still a valid optimizer state.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The optimizer to hand to a `Learner` of `module`: each float parameter of `module` is
    /// updated by HLAT's AdamW with its state kept in this shared optimizer. A parameter that
    /// `module` did not have panics when updated (its state would escape the checkpoints).
    ///
    /// Each parameter is bound to its kind: a mixture's expert (`hlat::expert_parallel::expert_of`)
    /// or not, so that ZeRO-1 partitions the state of split experts over their own groups.
    pub fn module_optimizer<M: Module>(&self, module: &M) -> ModuleOptimizer {
        let mut ids = ParamIds(Vec::new());
        visit_with_paths(module, ParamPath::default(), &mut ids);
        ids.0.into_iter().fold(
            ModuleOptimizer::from(UnknownParameter {
                adamw: self.lock().adamw().clone(),
            }),
            |optimizer, (id, expert)| {
                optimizer.with_group(
                    ParamGroup::from_ids(vec![id]),
                    BoundAdamW {
                        id,
                        expert,
                        shared: self.clone(),
                    },
                    None,
                )
            },
        )
    }
}

impl SharedOptimizer {
    /// Gives every trained float parameter of `module` that has no state yet its state before
    /// the first update ([`HlatAdamW::initial_state`]); the caller syncs the device so that the
    /// moments exist before the first step, whose program is then every later step's.
    pub fn create_states<M: Module>(&self, module: &M) {
        struct Trained<'a>(&'a mut HlatOptimizer);
        impl PathVisitor for Trained<'_> {
            fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>) {
                let value = param.val();
                if value.is_require_grad() {
                    let expert = expert_of(path.names()).is_some();
                    self.0.ensure_state((param.id, expert), value);
                }
            }
        }
        let mut optimizer = self.lock();
        visit_with_paths(module, ParamPath::default(), &mut Trained(&mut optimizer));
    }
}

/// The ids of a module's float parameters, each with whether it is a mixture's expert.
struct ParamIds(Vec<(ParamId, bool)>);

impl PathVisitor for ParamIds {
    fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>) {
        self.0.push((param.id, expert_of(path.names()).is_some()));
    }
}

/// HLAT's AdamW for parameter `id` (a mixture's expert when `expert`), its state in the shared
/// optimizer.
#[derive(Clone)]
struct BoundAdamW {
    id: ParamId,
    expert: bool,
    shared: SharedOptimizer,
}

impl Optimizer for BoundAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        self.shared
            .lock()
            .step_param((self.id, self.expert), lr, tensor, grad, state)
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        <HlatAdamW as Optimizer>::to_device(state, device)
    }
}

/// The optimizer of the parameters [`SharedOptimizer::module_optimizer`] was not made for.
#[derive(Clone)]
struct UnknownParameter {
    adamw: HlatAdamW,
}

impl Optimizer for UnknownParameter {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        _lr: f64,
        tensor: Tensor<D>,
        _grad: Tensor<D>,
        _state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        panic!(
            "a parameter of shape {:?} is not one of the module the shared optimizer ({:?}) was \
             made for (SharedOptimizer::module_optimizer): its state would be missing from the \
             checkpoints",
            tensor.dims(),
            self.adamw
        )
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        <HlatAdamW as Optimizer>::to_device(state, device)
    }
}
