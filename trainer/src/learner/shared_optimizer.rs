//! [`SharedOptimizer`]: an optimizer whose state the code that handed it to a `Learner` can
//! still read.
//!
//! burn-train 0.21's `Learner` keeps its optimizer private and offers its state only to Burn's own
//! per-epoch checkpointer. A run that checkpoints every N steps in its own layout (optimizer state
//! resharded across parallel layouts, next to the data sampler's position) keeps a clone of this
//! handle and reads the state through it.

use std::sync::{Arc, Mutex, MutexGuard};

use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, MultiGradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;

/// An optimizer shared between a `Learner` and the code that built it: clones are handles to
/// one optimizer and one state.
pub struct SharedOptimizer<O> {
    inner: Arc<Mutex<O>>,
}

impl<O> Clone for SharedOptimizer<O> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<O> SharedOptimizer<O> {
    /// Shares `optimizer`.
    pub fn new(optimizer: O) -> Self {
        Self {
            inner: Arc::new(Mutex::new(optimizer)),
        }
    }

    /// The optimizer, locked for the caller.
    pub fn lock(&self) -> MutexGuard<'_, O> {
        // A panic while the lock was held leaves a state that is still a valid optimizer state.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<M, B, O> Optimizer<M, B> for SharedOptimizer<O>
where
    M: AutodiffModule<B>,
    B: AutodiffBackend,
    O: Optimizer<M, B>,
{
    type Record = O::Record;

    fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        self.lock().step(lr, module, grads)
    }

    fn step_multi(&mut self, lr: f64, module: M, grads: MultiGradientsParams) -> M {
        self.lock().step_multi(lr, module, grads)
    }

    fn to_record(&self) -> Self::Record {
        self.lock().to_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        {
            let mut optimizer = self.lock();
            *optimizer = optimizer.clone().load_record(record);
        }
        self
    }
}
