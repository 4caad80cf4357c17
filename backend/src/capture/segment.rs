//! A segment: the operations captured between two executions, and its boundary.

use std::collections::{HashMap, HashSet};

use burn_ir::{OperationIr, TensorId, TensorIr, TensorStatus};

/// The operations captured on one device since its last execution, in capture order.
#[derive(Debug, Default, Clone)]
pub struct Segment {
    operations: Vec<OperationIr>,
    /// The [signature](super::cut_points::signature) of each operation (0 where none
    /// was given).
    signatures: Vec<u64>,
    /// How many of the operations compute something (all but `Drop`).
    computing: usize,
    /// The tensors the operations produce.
    produced: HashSet<TensorId>,
    /// The tensors the operations read.
    read: HashSet<TensorId>,
}

/// The elements `operation` produces, summed over its outputs.
pub fn computed_elements(operation: &OperationIr) -> u64 {
    operation
        .outputs()
        .map(|output| output.shape.num_elements() as u64)
        .sum()
}

/// What a segment exchanges with the tensors that live outside it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SegmentBoundary {
    /// Tensors the segment reads but did not produce, in order of first use.
    pub inputs: Vec<TensorIr>,
    /// Tensors the segment produced that are still alive at its end, in order of production.
    pub outputs: Vec<TensorIr>,
    /// Inputs whose last use is inside the segment (consumed or dropped): their buffers can be
    /// released, or donated, once the segment has run.
    pub released_inputs: Vec<TensorId>,
}

impl Segment {
    /// Appends one captured operation.
    pub fn push(&mut self, operation: OperationIr) {
        self.push_signed(operation, 0);
    }

    /// Appends one captured operation with its signature.
    pub fn push_signed(&mut self, operation: OperationIr, signature: u64) {
        self.signatures.push(signature);
        self.produced
            .extend(operation.outputs().map(|output| output.id));
        self.read.extend(operation.inputs().map(|input| input.id));
        if !matches!(operation, OperationIr::Drop(_)) {
            self.computing += 1;
        }
        self.operations.push(operation);
    }

    /// Whether the segment must run before `tensor` is read: one of its operations produces the
    /// tensor (it has no value yet), or reads it while this read is the tensor's last use (the
    /// read releases it).
    pub fn must_run_before_reading(&self, tensor: &TensorIr) -> bool {
        self.produced.contains(&tensor.id)
            || (tensor.status == TensorStatus::ReadWrite && self.read.contains(&tensor.id))
    }

    /// The index of the last operation that must run before `tensor` can be read (see
    /// [`must_run_before_reading`](Self::must_run_before_reading)), if any.
    pub fn last_needed_for_reading(&self, tensor: &TensorIr) -> Option<usize> {
        if !self.must_run_before_reading(tensor) {
            return None;
        }
        self.operations.iter().rposition(|operation| {
            operation.outputs().any(|output| output.id == tensor.id)
                || (tensor.status == TensorStatus::ReadWrite
                    && operation.inputs().any(|input| input.id == tensor.id))
        })
    }

    /// Whether an operation after `index` computes something (is not a drop).
    pub fn computes_after(&self, index: usize) -> bool {
        self.operations[index + 1..]
            .iter()
            .any(|operation| !matches!(operation, OperationIr::Drop(_)))
    }

    /// Whether an operation of the segment reads tensor `id`.
    pub fn reads(&self, id: &TensorId) -> bool {
        self.read.contains(id)
    }

    /// Whether an operation of the segment produces or reads tensor `id`.
    pub fn touches(&self, id: &TensorId) -> bool {
        self.produced.contains(id) || self.read.contains(id)
    }

    /// Leaves the operations up to `index` (included) in the segment and returns the ones after
    /// it as a segment of their own.
    pub fn split_after(&mut self, index: usize) -> Segment {
        let later = self.operations.split_off(index + 1);
        let later_signatures = self.signatures.split_off(index + 1);
        let earlier = std::mem::take(&mut self.operations);
        let earlier_signatures = std::mem::take(&mut self.signatures);
        *self = Segment::signed(earlier, earlier_signatures);
        Segment::signed(later, later_signatures)
    }

    /// Appends the operations of `other`, with their signatures.
    pub fn append(&mut self, other: Segment) {
        for (operation, signature) in other.operations.into_iter().zip(other.signatures) {
            self.push_signed(operation, signature);
        }
    }

    /// A segment of `operations` with their `signatures`.
    fn signed(operations: Vec<OperationIr>, signatures: Vec<u64>) -> Segment {
        let mut segment = Segment::default();
        for (operation, signature) in operations.into_iter().zip(signatures) {
            segment.push_signed(operation, signature);
        }
        segment
    }

    /// The signature of each operation, in capture order.
    pub fn signatures(&self) -> &[u64] {
        &self.signatures
    }

    /// A segment of `operations`, in order.
    pub fn from_operations(operations: Vec<OperationIr>) -> Segment {
        let mut segment = Segment::default();
        for operation in operations {
            segment.push(operation);
        }
        segment
    }

    /// The captured operations in capture order.
    pub fn operations(&self) -> &[OperationIr] {
        &self.operations
    }

    /// The captured operations in capture order, by value.
    pub fn into_operations(self) -> Vec<OperationIr> {
        self.operations
    }

    /// How many operations are waiting.
    pub fn len(&self) -> usize {
        self.operations.len()
    }

    /// How many waiting operations compute something: every one but `Drop`. The segment cap
    /// counts these, so where a long step is cut does not depend on when handles were dropped
    /// (the same step is cut at the same places, and its programs are reused).
    pub fn computing_len(&self) -> usize {
        self.computing
    }

    /// Whether no operation is waiting.
    pub fn is_empty(&self) -> bool {
        self.operations.is_empty()
    }

    /// Takes the waiting operations, leaving an empty segment behind.
    pub fn take(&mut self) -> Segment {
        std::mem::take(self)
    }

    /// Computes the inputs, live outputs and released inputs of the segment.
    ///
    /// A tensor's life ends at a `Drop` operation or at a use with the `ReadWrite` status (Burn's
    /// mark of a last use).
    pub fn boundary(&self) -> SegmentBoundary {
        let mut produced: HashMap<TensorId, TensorIr> = HashMap::new();
        let mut production_order = Vec::new();
        let mut seen_inputs = HashSet::new();
        let mut boundary = SegmentBoundary::default();
        let mut ended = HashSet::new();

        for operation in &self.operations {
            for input in operation.inputs() {
                if !produced.contains_key(&input.id) && seen_inputs.insert(input.id) {
                    boundary.inputs.push(TensorIr {
                        status: TensorStatus::ReadOnly,
                        ..input.clone()
                    });
                }
                let last_use = matches!(operation, OperationIr::Drop(_))
                    || input.status == TensorStatus::ReadWrite;
                if last_use {
                    ended.insert(input.id);
                }
            }
            for output in operation.outputs() {
                ended.remove(&output.id);
                if produced.insert(output.id, output.clone()).is_none() {
                    production_order.push(output.id);
                }
            }
        }

        boundary.outputs = production_order
            .into_iter()
            .filter(|id| !ended.contains(id))
            .map(|id| produced.remove(&id).expect("produced tensor is recorded"))
            .collect();
        boundary.released_inputs = boundary
            .inputs
            .iter()
            .map(|input| input.id)
            .filter(|id| ended.contains(id))
            .collect();
        boundary
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_operations::{add, exp, tensor};

    #[test]
    fn boundary_has_inputs_live_outputs_and_released_inputs() {
        use TensorStatus::{ReadOnly, ReadWrite};
        let mut segment = Segment::default();
        // 1 and 2 come from outside; 1 stays alive, 2 is consumed.
        segment.push(add(tensor(1, ReadOnly), tensor(2, ReadWrite), 3));
        // 3 is consumed by its last use; 4 is dropped; 5 stays alive.
        segment.push(exp(tensor(3, ReadWrite), 4));
        segment.push(exp(tensor(4, ReadOnly), 5));
        segment.push(OperationIr::Drop(tensor(4, ReadWrite)));

        let boundary = segment.boundary();
        let ids = |tensors: &[TensorIr]| tensors.iter().map(|t| t.id).collect::<Vec<_>>();
        assert_eq!(
            ids(&boundary.inputs),
            vec![TensorId::new(1), TensorId::new(2)]
        );
        assert_eq!(ids(&boundary.outputs), vec![TensorId::new(5)]);
        assert_eq!(boundary.released_inputs, vec![TensorId::new(2)]);
    }

    #[test]
    fn an_input_dropped_inside_the_segment_is_released() {
        let mut segment = Segment::default();
        segment.push(exp(tensor(7, TensorStatus::ReadOnly), 8));
        segment.push(OperationIr::Drop(tensor(7, TensorStatus::ReadWrite)));
        let boundary = segment.boundary();
        assert_eq!(boundary.released_inputs, vec![TensorId::new(7)]);
        assert_eq!(boundary.outputs.len(), 1);
    }

    #[test]
    fn a_read_waits_for_the_segment_only_when_the_tensor_depends_on_it() {
        use TensorStatus::{ReadOnly, ReadWrite};
        let mut segment = Segment::default();
        segment.push(exp(tensor(1, ReadOnly), 2));
        // Produced by the segment: no value yet.
        assert!(segment.must_run_before_reading(&tensor(2, ReadOnly)));
        // Read by the segment: a shared read can go first, a last use (which releases it) cannot.
        assert!(!segment.must_run_before_reading(&tensor(1, ReadOnly)));
        assert!(segment.must_run_before_reading(&tensor(1, ReadWrite)));
        // Untouched by the segment.
        assert!(!segment.must_run_before_reading(&tensor(3, ReadWrite)));
        segment.take();
        assert!(!segment.must_run_before_reading(&tensor(2, ReadOnly)));
    }

    #[test]
    fn a_read_needs_the_prefix_up_to_the_producer_or_the_last_reader() {
        use TensorStatus::{ReadOnly, ReadWrite};
        let mut segment = Segment::default();
        segment.push(exp(tensor(1, ReadOnly), 2));
        segment.push(exp(tensor(2, ReadOnly), 3));
        segment.push(exp(tensor(1, ReadOnly), 4));
        segment.push(exp(tensor(3, ReadOnly), 5));
        assert_eq!(
            segment.last_needed_for_reading(&tensor(3, ReadOnly)),
            Some(1)
        );
        // A last use of an input waits for every operation reading it.
        assert_eq!(
            segment.last_needed_for_reading(&tensor(1, ReadWrite)),
            Some(2)
        );
        assert_eq!(segment.last_needed_for_reading(&tensor(1, ReadOnly)), None);

        let later = segment.split_after(1);
        assert_eq!(segment.len(), 2);
        assert_eq!(later.len(), 2);
        assert!(segment.touches(&TensorId::new(3)) && !segment.touches(&TensorId::new(4)));
        assert!(later.touches(&TensorId::new(4)) && later.touches(&TensorId::new(3)));
        assert_eq!(later.computing_len(), 2);
    }
}
