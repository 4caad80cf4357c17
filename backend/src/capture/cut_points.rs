//! Where a segment is cut when another thread reads its tensors: the cut points a training loop
//! teaches the capture.
//!
//! Burn's `Learner` reads each step's outputs and loss on its metrics thread while the training
//! thread already captures the next step. Running the whole waiting segment for such a read would
//! cut the step stream wherever the training thread happens to be — a new program nearly every
//! time. Instead the read runs only the waiting operations up to the one that produced the tensor
//! (a point of the stream that does not depend on timing), and that operation's
//! [signature](operation_signature) is learned. Every waiting and later operation with a learned
//! signature marks a cut: whenever the segment runs (a read, the size cap, a sync) it runs as the
//! pieces between the marks. Where a stream is cut then depends only on the order of the reads,
//! never on their timing, so each step runs as the same programs in every epoch and every run.

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

/// The structure of one operation as a number: its kind, and the shapes and types of its inputs
/// and outputs (not its tensor ids or scalar operands).
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
        tensor.shape.hash(&mut hasher);
        tensor.dtype.hash(&mut hasher);
    }
    hasher.finish()
}

/// The cut points learned on one device: [signatures](signature) of operations a
/// segment is cut after. Learning only adds (a step's outputs and its loss each teach one).
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
    /// where a read from another thread needed the segment cut.
    pub fn learn(&mut self, signature: u64, operation: &OperationIr) {
        if self.signatures.insert(signature) {
            log::debug!(
                "learned a cut point after {}",
                crate::lower::operation_name(operation)
            );
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

    #[test]
    fn a_learned_point_cuts_after_operations_like_it() {
        let mut points = CutPoints::default();
        let operation = exp(tensor(1, ReadOnly), 2);
        let learned = signature(structure(&operation), 0);
        assert!(!points.cuts_after(learned));
        points.learn(learned, &operation);
        assert!(points.cuts_after(signature(structure(&exp(tensor(5, ReadOnly), 6)), 0)));
    }
}
