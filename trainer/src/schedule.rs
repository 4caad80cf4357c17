//! The learning-rate schedule: linear warmup, then cosine decay to a floor.

use serde::{Deserialize, Serialize};

/// Linear warmup from 0 to `peak` over `warmup_steps`, then cosine decay to `peak * min_ratio`
/// over `decay_steps`, constant afterwards. Steps count from 1 (the first optimizer step uses
/// `peak / warmup_steps`), so the schedule is a pure function of the step and resumes exactly.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WarmupCosine {
    /// Peak learning rate, reached at the end of warmup.
    pub peak: f64,
    /// Warmup length in steps.
    pub warmup_steps: u64,
    /// Cosine length in steps, counted from the end of warmup.
    pub decay_steps: u64,
    /// Final learning rate as a fraction of the peak.
    pub min_ratio: f64,
}

impl WarmupCosine {
    /// A constant learning rate `lr`: no warmup, no decay.
    pub fn constant(lr: f64) -> Self {
        Self {
            peak: lr,
            warmup_steps: 0,
            decay_steps: 0,
            min_ratio: 1.0,
        }
    }

    /// The learning rate of optimizer step `step` (1-based).
    pub fn lr(&self, step: u64) -> f64 {
        if step <= self.warmup_steps {
            return self.peak * step as f64 / self.warmup_steps as f64;
        }
        let floor = self.peak * self.min_ratio;
        let since_warmup = step - self.warmup_steps;
        if self.decay_steps == 0 || since_warmup >= self.decay_steps {
            return floor;
        }
        let progress = since_warmup as f64 / self.decay_steps as f64;
        floor + (self.peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

impl std::fmt::Display for WarmupCosine {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "warmup {} steps to {:e}, cosine over {} steps to {:e} (ends at step {})",
            self.warmup_steps,
            self.peak,
            self.decay_steps,
            self.peak * self.min_ratio,
            self.warmup_steps + self.decay_steps
        )
    }
}

/// [`WarmupCosine`] as burn-train's learning-rate scheduler: each call of `step` is one optimizer
/// step (the scheduler of HLAT's [`crate::learner::HlatStrategy`], which steps it once per
/// optimizer step, not per micro-batch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupCosineScheduler {
    /// The schedule.
    pub schedule: WarmupCosine,
    /// Optimizer steps taken so far.
    pub step: u64,
}

impl WarmupCosineScheduler {
    /// The scheduler before its first step.
    pub fn new(schedule: WarmupCosine) -> Self {
        Self { schedule, step: 0 }
    }
}

/// The key of the step counter in the scheduler's record.
const STEP_KEY: &str = "step";

impl burn::lr_scheduler::LrScheduler for WarmupCosineScheduler {
    fn step(&mut self) -> f64 {
        self.step += 1;
        self.schedule.lr(self.step)
    }

    fn to_record(&self) -> burn::lr_scheduler::LrSchedulerRecord {
        burn::lr_scheduler::LrSchedulerRecord::new().with_scalar(STEP_KEY, self.step)
    }

    /// # Panics
    /// When the record holds no step counter (it is not this scheduler's).
    fn load_record(&mut self, record: burn::lr_scheduler::LrSchedulerRecord) {
        self.step = record
            .scalar::<u64>(STEP_KEY)
            .expect("the record of a WarmupCosineScheduler holds its step");
    }
}
