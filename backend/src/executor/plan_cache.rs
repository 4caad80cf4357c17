//! Segments seen before, recognised by their fingerprint, so that a repeated segment (the next
//! training step, the next decoded token) skips lowering: its programs are the ones lowered the
//! first time, given this segment's tensors and scalar values.
//!
//! A lowering hoists a scalar operand as the operation holds it, or computes a value from the
//! operation's structure (which the fingerprint covers). So each hoisted scalar is traced back to
//! the one operand of its operation with that value, or kept as a constant when no operand has
//! it. Operands the programs do not hoist (baked into the module, or unused) must keep their
//! values: a segment that changes one is lowered again. A plan whose scalars cannot be traced
//! unambiguously (two operands of one operation with the hoisted value) is not kept.

use std::collections::HashMap;
use std::sync::Arc;

use burn_ir::{OperationIr, ScalarIr, TensorIr};

use crate::capture::{Fingerprint, FingerprintedSegment};
use crate::lower::{LoweredProgram, Step, scalar_data};

/// How many plans an executor keeps (least recently used evicted).
pub(crate) const PLAN_CACHE_CAPACITY: usize = 64;

/// Where a hoisted scalar of a reused program comes from.
#[derive(Debug, Clone, Copy)]
enum ScalarSource {
    /// Operand `position` of operation `operation`.
    Operand { operation: usize, position: usize },
    /// A value the lowering computed from the operation's structure.
    Constant(ScalarIr),
}

/// A tensor of a reused program: its number in the fingerprint and its template.
#[derive(Debug, Clone)]
struct TensorSlot {
    number: usize,
    template: TensorIr,
}

/// A lowered program of a plan, with what changes from one segment to the next.
#[derive(Debug)]
struct ProgramTemplate {
    program: LoweredProgram,
    inputs: Vec<TensorSlot>,
    outputs: Vec<TensorSlot>,
    released: Vec<usize>,
    scalars: Vec<Vec<ScalarSource>>,
}

/// A step of a plan.
#[derive(Debug)]
enum PlanStep {
    Program(Box<ProgramTemplate>),
    /// The operation at this index runs without a lowering.
    Fallback(usize),
}

/// The steps of a segment, ready for the next segment with the same fingerprint.
#[derive(Debug)]
struct Plan {
    steps: Vec<PlanStep>,
    /// Operands the programs do not hoist: `(operation, position, value)`.
    fixed_operands: Vec<(usize, usize, ScalarIr)>,
    last_use: u64,
}

/// The plans of one executor.
#[derive(Default)]
pub(crate) struct PlanCache {
    plans: HashMap<Fingerprint, Plan>,
    clock: u64,
}

impl PlanCache {
    /// The steps of `segment` (fingerprinted as `fingerprinted`) from a plan kept for its
    /// fingerprint, or `None` when there is none or an operand the plan's programs fixed has
    /// another value.
    pub fn steps(
        &mut self,
        fingerprinted: &FingerprintedSegment,
        operations: &[OperationIr],
    ) -> Option<Vec<Step>> {
        self.clock += 1;
        let plan = self.plans.get_mut(&fingerprinted.fingerprint)?;
        let operand = |operation: usize, position: usize| {
            fingerprinted
                .scalars
                .get(operation)
                .and_then(|scalars| scalars.get(position))
                .copied()
        };
        let unchanged = plan
            .fixed_operands
            .iter()
            .all(|&(operation, position, value)| {
                operand(operation, position).is_some_and(|current| same_scalar(current, value))
            });
        if !unchanged {
            return None;
        }
        plan.last_use = self.clock;
        let tensor = |slot: &TensorSlot| TensorIr {
            id: fingerprinted.tensor_ids[slot.number],
            ..slot.template.clone()
        };
        let mut steps = Vec::with_capacity(plan.steps.len());
        for step in &plan.steps {
            steps.push(match step {
                PlanStep::Fallback(index) => Step::Fallback(Box::new(operations[*index].clone())),
                PlanStep::Program(template) => {
                    // Only what depends on the segment is built anew; the module is shared.
                    let lowered = &template.program;
                    let mut hoisted = lowered.hoisted.clone();
                    let mut scalars = Vec::with_capacity(hoisted.len());
                    for ((pack, sources), data) in hoisted
                        .iter_mut()
                        .zip(&template.scalars)
                        .zip(&lowered.scalars)
                    {
                        for (source, entry) in sources.iter().zip(pack.iter_mut()) {
                            entry.value = match *source {
                                ScalarSource::Operand {
                                    operation,
                                    position,
                                } => operand(operation, position)?,
                                ScalarSource::Constant(value) => value,
                            };
                        }
                        let values: Vec<ScalarIr> = pack.iter().map(|entry| entry.value).collect();
                        scalars.push(scalar_data(&values, data.dtype()));
                    }
                    Step::Program(Box::new(LoweredProgram {
                        module: Arc::clone(&lowered.module),
                        bytes: Arc::clone(&lowered.bytes),
                        key: lowered.key,
                        inputs: template.inputs.iter().map(tensor).collect(),
                        scalars,
                        hoisted,
                        operations: lowered.operations.clone(),
                        outputs: template.outputs.iter().map(tensor).collect(),
                        replica_index: lowered.replica_index,
                        random_draws: lowered.random_draws,
                        released: template
                            .released
                            .iter()
                            .map(|&number| fingerprinted.tensor_ids[number])
                            .collect(),
                        collectives: lowered.collectives,
                        collective_bytes: lowered.collective_bytes,
                    }))
                }
            });
        }
        Some(steps)
    }

    /// Keeps the plan of `steps`, lowered from the segment fingerprinted as `fingerprinted`,
    /// unless its scalars cannot be traced to their operands. Returns whether it was kept.
    pub fn insert(&mut self, fingerprinted: &FingerprintedSegment, steps: &[Step]) -> bool {
        let Some(plan) = Plan::of(fingerprinted, steps, self.clock) else {
            return false;
        };
        if self.plans.len() >= PLAN_CACHE_CAPACITY
            && let Some(oldest) = self
                .plans
                .iter()
                .min_by_key(|(_, plan)| plan.last_use)
                .map(|(fingerprint, _)| fingerprint.clone())
        {
            self.plans.remove(&oldest);
        }
        self.plans.insert(fingerprinted.fingerprint.clone(), plan);
        true
    }
}

/// Whether two scalars are the same value of the same kind (floats bit for bit).
fn same_scalar(a: ScalarIr, b: ScalarIr) -> bool {
    match (a, b) {
        (ScalarIr::Float(a), ScalarIr::Float(b)) => a.to_bits() == b.to_bits(),
        (a, b) => a == b,
    }
}

impl Plan {
    fn of(fingerprinted: &FingerprintedSegment, steps: &[Step], clock: u64) -> Option<Plan> {
        let numbers: HashMap<_, usize> = fingerprinted
            .tensor_ids
            .iter()
            .enumerate()
            .map(|(number, id)| (*id, number))
            .collect();
        let slot = |tensor: &TensorIr| {
            Some(TensorSlot {
                number: *numbers.get(&tensor.id)?,
                template: tensor.clone(),
            })
        };
        // Which operands some program hoists.
        let mut claimed: Vec<Vec<bool>> = fingerprinted
            .scalars
            .iter()
            .map(|scalars| vec![false; scalars.len()])
            .collect();
        let mut plan_steps = Vec::with_capacity(steps.len());
        // The index of the first operation of the next step.
        let mut next = 0;
        for step in steps {
            plan_steps.push(match step {
                Step::Fallback(_) => {
                    next += 1;
                    PlanStep::Fallback(next - 1)
                }
                Step::Program(program) => {
                    next = program.operations.end;
                    let mut scalars = Vec::with_capacity(program.hoisted.len());
                    for pack in &program.hoisted {
                        let mut sources = Vec::with_capacity(pack.len());
                        for hoisted in pack {
                            let operands = fingerprinted.scalars.get(hoisted.operation)?;
                            let mut matching = operands
                                .iter()
                                .enumerate()
                                .filter(|(_, operand)| same_scalar(**operand, hoisted.value))
                                .map(|(position, _)| position);
                            sources.push(match (matching.next(), matching.next()) {
                                (None, _) => ScalarSource::Constant(hoisted.value),
                                (Some(position), None) => {
                                    let taken = &mut claimed[hoisted.operation][position];
                                    if *taken {
                                        return None;
                                    }
                                    *taken = true;
                                    ScalarSource::Operand {
                                        operation: hoisted.operation,
                                        position,
                                    }
                                }
                                // Two operands with the hoisted value: which one it was is
                                // unknown.
                                (Some(_), Some(_)) => return None,
                            });
                        }
                        scalars.push(sources);
                    }
                    PlanStep::Program(Box::new(ProgramTemplate {
                        inputs: program.inputs.iter().map(slot).collect::<Option<_>>()?,
                        outputs: program.outputs.iter().map(slot).collect::<Option<_>>()?,
                        released: program
                            .released
                            .iter()
                            .map(|id| numbers.get(id).copied())
                            .collect::<Option<_>>()?,
                        scalars,
                        // Module and bytes are shared, not copied.
                        program: (**program).clone(),
                    }))
                }
            });
        }
        let fixed_operands =
            claimed
                .iter()
                .enumerate()
                .flat_map(|(operation, taken)| {
                    taken.iter().enumerate().filter(|(_, taken)| !**taken).map(
                        move |(position, _)| {
                            (
                                operation,
                                position,
                                fingerprinted.scalars[operation][position],
                            )
                        },
                    )
                })
                .collect();
        Some(Plan {
            steps: plan_steps,
            fixed_operands,
            last_use: clock,
        })
    }
}
