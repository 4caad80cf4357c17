//! The pipeline schedule as one SPMD program runs it: ticks in lock step, at each of which every
//! stage runs at most one chunk forward and one chunk backward.
//!
//! Micro-batch `i` reaches virtual stage `k` (chunk `k / p` of stage `k % p`) forward at tick
//! `base(i) + k` and backward at tick `base(i) + 2pV - 2 - k`, with `base(i) = (i / p)·V·p + i % p`
//! (`base(i) = i` without virtual stages): activations move one stage per tick forward, gradients
//! one stage per tick back, and the last virtual stage runs its backward pass in the tick of its
//! forward pass, from the loss. Each stage does at most one forward and one backward per tick, and
//! keeps the input of each chunk it ran forward until that chunk's backward, in a ring of
//! `2pV - 1` slots indexed by the forward tick.

/// One chunk of work of one stage at one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    /// The micro-batch.
    pub micro_batch: usize,
    /// Which of the stage's chunks (0 without virtual stages).
    pub chunk: usize,
    /// The ring slot holding the chunk's input (written by the forward pass, read back by the
    /// backward pass).
    pub slot: usize,
}

/// What every stage does at one tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// Each stage's forward work, if any.
    pub forward: Vec<Option<Work>>,
    /// Each stage's backward work, if any.
    pub backward: Vec<Option<Work>>,
}

impl Tick {
    /// Whether some stage runs a chunk forward.
    pub fn has_forward(&self) -> bool {
        self.forward.iter().any(Option::is_some)
    }

    /// Whether some stage runs a chunk backward.
    pub fn has_backward(&self) -> bool {
        self.backward.iter().any(Option::is_some)
    }
}

/// Every tick of one optimizer step of `micro_batches` over `stages` stages of `virtual_stages`
/// chunks each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Pipeline stages `p`.
    pub stages: usize,
    /// Chunks per stage `V`.
    pub virtual_stages: usize,
    /// Micro-batches `m`.
    pub micro_batches: usize,
    /// The ticks, in order.
    pub ticks: Vec<Tick>,
}

impl Schedule {
    /// The schedule of `micro_batches` over `stages × virtual_stages` virtual stages.
    ///
    /// # Panics
    /// When a count is 0.
    pub fn new(stages: usize, virtual_stages: usize, micro_batches: usize) -> Self {
        assert!(
            stages > 0 && virtual_stages > 0 && micro_batches > 0,
            "a pipeline needs stages, chunks and micro-batches"
        );
        let (p, v) = (stages, virtual_stages);
        let last_virtual = p * v - 1;
        let slots = Self::ring_slots(p, v);
        let base = |i: usize| (i / p) * v * p + i % p;
        let count = base(micro_batches - 1) + 2 * last_virtual + 1;
        let mut ticks = vec![
            Tick {
                forward: vec![None; p],
                backward: vec![None; p],
            };
            count
        ];
        for micro_batch in 0..micro_batches {
            for virtual_stage in 0..=last_virtual {
                let forward = base(micro_batch) + virtual_stage;
                let backward = base(micro_batch) + 2 * last_virtual - virtual_stage;
                let stage = virtual_stage % p;
                let work = Work {
                    micro_batch,
                    chunk: virtual_stage / p,
                    slot: forward % slots,
                };
                for (tick, phase) in [(forward, true), (backward, false)] {
                    let entry = if phase {
                        &mut ticks[tick].forward[stage]
                    } else {
                        &mut ticks[tick].backward[stage]
                    };
                    assert!(
                        entry.is_none(),
                        "two chunks of stage {stage} at tick {tick}"
                    );
                    *entry = Some(work);
                }
            }
        }
        Self {
            stages,
            virtual_stages,
            micro_batches,
            ticks,
        }
    }

    /// The slots of each stage's ring of kept chunk inputs: `2pV - 1`, one more than the
    /// longest time a chunk input waits for its backward pass.
    pub fn ring_slots(stages: usize, virtual_stages: usize) -> usize {
        2 * stages * virtual_stages - 1
    }

    /// The micro-batch whose embedding stage 0 takes in the forward phase of `tick` (its first
    /// chunk's forward work), if any.
    pub fn embedding_forward(&self, tick: usize) -> Option<usize> {
        first_chunk(self.ticks[tick].forward[0])
    }

    /// The micro-batch whose embedding stage 0's backward phase of `tick` reaches, if any.
    pub fn embedding_backward(&self, tick: usize) -> Option<usize> {
        first_chunk(self.ticks[tick].backward[0])
    }

    /// The micro-batch whose loss the last stage's backward phase of `tick` starts from (its
    /// last chunk's backward work), if any.
    pub fn loss(&self, tick: usize) -> Option<usize> {
        self.ticks[tick].backward[self.stages - 1]
            .filter(|work| work.chunk + 1 == self.virtual_stages)
            .map(|work| work.micro_batch)
    }

    /// The share of the step a stage waits, for chunks of equal cost: `(p - 1) / (mV + p - 1)`
    /// (`(p - 1) / (m + p - 1)` without virtual stages). Each tick costs a chunk's forward pass
    /// where only forward work runs, its recomputation and backward pass where only backward work
    /// runs, and both in between; `p - 1` ticks of each kind are idle on every stage.
    pub fn bubble(&self) -> f64 {
        bubble_fraction(self.stages, self.virtual_stages, self.micro_batches)
    }
}

/// The bubble of [`Schedule::bubble`] without building the schedule.
pub fn bubble_fraction(stages: usize, virtual_stages: usize, micro_batches: usize) -> f64 {
    let idle = stages.saturating_sub(1) as f64;
    idle / ((micro_batches * virtual_stages) as f64 + idle)
}

fn first_chunk(work: Option<Work>) -> Option<usize> {
    work.filter(|work| work.chunk == 0)
        .map(|work| work.micro_batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays a schedule stage by stage and checks every dependency of a pipeline: a chunk's
    /// forward pass after the previous virtual stage's, its backward pass after the next one's
    /// (or in the tick of its own forward pass at the end), and its ring slot untouched between
    /// its forward and backward passes.
    fn check(schedule: &Schedule) {
        let (p, v, m) = (
            schedule.stages,
            schedule.virtual_stages,
            schedule.micro_batches,
        );
        let mut forward_at = vec![vec![None; p * v]; m];
        let mut backward_at = vec![vec![None; p * v]; m];
        for (tick, work) in schedule.ticks.iter().enumerate() {
            for stage in 0..p {
                if let Some(done) = work.forward[stage] {
                    forward_at[done.micro_batch][done.chunk * p + stage] = Some((tick, done.slot));
                }
                if let Some(done) = work.backward[stage] {
                    backward_at[done.micro_batch][done.chunk * p + stage] = Some((tick, done.slot));
                }
            }
        }
        for i in 0..m {
            for k in 0..p * v {
                let (forward, slot) = forward_at[i][k].expect("every chunk runs forward");
                let (backward, read) = backward_at[i][k].expect("every chunk runs backward");
                assert_eq!(slot, read, "micro-batch {i}, virtual stage {k}");
                if k > 0 {
                    assert_eq!(forward_at[i][k - 1].unwrap().0 + 1, forward);
                }
                if k + 1 < p * v {
                    assert_eq!(backward_at[i][k + 1].unwrap().0 + 1, backward);
                } else {
                    assert_eq!(forward, backward);
                }
                // Nobody on this stage writes the slot again before it is read back.
                let stage = k % p;
                for tick in forward + 1..=backward {
                    if let Some(other) = schedule.ticks[tick].forward[stage] {
                        assert_ne!(other.slot, slot, "slot overwritten at tick {tick}");
                    }
                }
            }
        }
    }

    #[test]
    fn schedules_keep_every_dependency_of_the_pipeline() {
        for (p, v, m) in [
            (1, 1, 3),
            (2, 1, 1),
            (2, 1, 4),
            (4, 1, 8),
            (2, 2, 4),
            (3, 2, 5),
        ] {
            check(&Schedule::new(p, v, m));
        }
    }

    #[test]
    fn one_forward_one_backward_fills_and_drains_in_p_minus_one_ticks() {
        let schedule = Schedule::new(4, 1, 8);
        let forward = schedule.ticks.iter().filter(|t| t.has_forward()).count();
        let backward = schedule.ticks.iter().filter(|t| t.has_backward()).count();
        // m + p - 1 ticks of each kind: the bubble of 1F1B.
        assert_eq!((forward, backward), (11, 11));
        assert_eq!(schedule.ticks.len(), 8 + 2 * 4 - 2);
        assert!((schedule.bubble() - 3.0 / 11.0).abs() < 1e-12);
        // The last stage starts backward in the tick of its first forward pass.
        assert_eq!(schedule.loss(3), Some(0));
        assert_eq!(schedule.embedding_backward(6), Some(0));
    }

    #[test]
    fn virtual_stages_shrink_the_bubble() {
        let schedule = Schedule::new(2, 2, 4);
        let forward = schedule.ticks.iter().filter(|t| t.has_forward()).count();
        assert_eq!(forward, 4 * 2 + 1);
        assert!((schedule.bubble() - 1.0 / 9.0).abs() < 1e-12);
        assert_eq!(bubble_fraction(8, 1, 8), 7.0 / 15.0);
    }
}
