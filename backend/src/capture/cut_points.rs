//! Where a segment is cut when another stream (a client thread) computes from its tensors: the
//! cut points a training loop teaches the capture.
//!
//! Burn's `Learner` takes the mean of each step's loss on its metrics thread and reads it while
//! the training thread already captures the next step. Those operations wait aside (the
//! client's `side` segment); running them with the whole waiting segment would cut the step
//! stream wherever the training thread happens to be — a new program nearly every time.
//! Instead they run at the end of the waiting operations up to the one that produced what they
//! need (a point of the stream that does not depend on timing), and that operation's
//! [signature] is learned. Every waiting and later operation with a learned signature marks a
//! cut: whenever the segment runs (a read, the size cap, a sync) it runs as the pieces between
//! the marks. A read needing an operation just before a learned cut runs through that cut
//! ([`NEARBY_OPERATIONS`]): a step's outputs and its loss are read one after the other, and one
//! program serves both. Where a stream is cut then depends only on the order of the reads, never
//! on their timing, so each step runs as the same program in every epoch and every run.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::mem::discriminant;

use burn_ir::OperationIr;

/// The signature of an operation of [`structure`] `structure`, in the context of the operation
/// captured before it (`previous`, that one's structure), so that a small operation common in a
/// step (a subtraction of two logits-shaped tensors, say) names one place of the step rather
/// than every place it occurs.
pub fn signature(structure: u64, previous: u64) -> u64 {
    let mut hasher = DefaultHasher::new();
    structure.hash(&mut hasher);
    previous.hash(&mut hasher);
    hasher.finish()
}

/// The structure of one operation as a number: its kind, and the ranks and types of its inputs
/// and outputs (not their sizes, tensor ids or scalar operands: a partial last batch computes
/// its loss at the same place of the step).
pub fn structure(operation: &OperationIr) -> u64 {
    let mut hasher = DefaultHasher::new();
    discriminant(operation).hash(&mut hasher);
    match operation {
        OperationIr::BaseFloat(kind) | OperationIr::BaseInt(kind) | OperationIr::BaseBool(kind) => {
            discriminant(kind).hash(&mut hasher)
        }
        OperationIr::NumericFloat(dtype, kind) | OperationIr::NumericInt(dtype, kind) => {
            dtype.hash(&mut hasher);
            discriminant(kind).hash(&mut hasher);
        }
        OperationIr::Bool(kind) => discriminant(kind).hash(&mut hasher),
        OperationIr::Int(kind) => discriminant(kind).hash(&mut hasher),
        OperationIr::Float(dtype, kind) => {
            dtype.hash(&mut hasher);
            discriminant(kind).hash(&mut hasher);
        }
        OperationIr::Module(kind) => discriminant(kind).hash(&mut hasher),
        OperationIr::Custom(custom) => custom.id.hash(&mut hasher),
        _ => {}
    }
    for tensor in operation.inputs().chain(operation.outputs()) {
        tensor.shape.len().hash(&mut hasher);
        tensor.dtype.hash(&mut hasher);
    }
    hasher.finish()
}

/// How many computing operations after the one a read from another stream needs a learned cut
/// point may lie and still be where the read runs the segment through: a step's loss is
/// computed from its outputs in a few operations, so the read of the outputs (Burn's metrics
/// read them first) runs through the loss and one program serves both reads.
pub const NEARBY_OPERATIONS: usize = 64;

/// The cut points learned on one device: [signatures](signature) of operations a
/// segment is cut after. A step's loss teaches one; its outputs, read just before the loss
/// and a few operations earlier, teach one that the loss's then replaces, so that a step runs
/// as one program through its loss ([`NEARBY_OPERATIONS`]).
#[derive(Debug, Default)]
pub struct CutPoints {
    signatures: HashSet<u64>,
}

impl CutPoints {
    /// Whether a segment is cut right after an operation of signature `signature`.
    pub fn cuts_after(&self, signature: u64) -> bool {
        self.signatures.contains(&signature)
    }

    /// Learns a cut after operations of signature `signature` (`operation` is one, for the log),
    /// where a read from another stream needed the segment cut.
    pub fn learn(&mut self, signature: u64, operation: &OperationIr) {
        if self.signatures.insert(signature) {
            log::debug!(
                "learned a cut point after {}",
                crate::lower::operation_name(operation)
            );
        }
    }

    /// Forgets the cut after operations of signature `signature`: a cut learned just after it
    /// serves the reads it served.
    pub fn forget(&mut self, signature: u64) {
        if self.signatures.remove(&signature) {
            log::debug!("a cut point learned next to the last one replaced it");
        }
    }
}

#[cfg(test)]
mod tests {
    use burn_ir::TensorStatus::ReadOnly;

    use super::*;
    use crate::test_operations::{add, exp, tensor};

    #[test]
    fn signatures_ignore_tensor_ids_but_not_the_operation_or_its_context() {
        let (first, elsewhere) = (exp(tensor(1, ReadOnly), 2), exp(tensor(7, ReadOnly), 9));
        let other = add(tensor(1, ReadOnly), tensor(2, ReadOnly), 3);
        let alone = |operation| signature(structure(operation), 0);
        assert_eq!(alone(&first), alone(&elsewhere));
        assert_ne!(alone(&first), alone(&other));
        let after_add = signature(structure(&first), structure(&other));
        assert_ne!(alone(&first), after_add);
    }

    /// A step's last batch is often smaller: its loss is the same place of the step.
    #[test]
    fn signatures_ignore_sizes_but_not_ranks() {
        let shaped = |dims: &[usize]| {
            let mut operation = exp(tensor(1, ReadOnly), 2);
            if let OperationIr::Float(_, burn_ir::FloatOperationIr::Exp(unary)) = &mut operation {
                unary.input.shape = burn_backend::Shape::from(dims.to_vec());
                unary.out.shape = burn_backend::Shape::from(dims.to_vec());
            }
            structure(&operation)
        };
        assert_eq!(shaped(&[32, 10]), shaped(&[8, 10]));
        assert_ne!(shaped(&[32, 10]), shaped(&[320]));
    }

    #[test]
    fn a_learned_point_cuts_after_operations_like_it() {
        let mut points = CutPoints::default();
        let operation = exp(tensor(1, ReadOnly), 2);
        let learned = signature(structure(&operation), 0);
        assert!(!points.cuts_after(learned));
        points.learn(learned, &operation);
        assert!(points.cuts_after(signature(structure(&exp(tensor(5, ReadOnly), 6)), 0)));
        points.forget(learned);
        assert!(!points.cuts_after(learned));
    }
}
