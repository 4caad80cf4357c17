//! Which outputs of a program take over the buffers of the inputs they update in place.
//!
//! An optimizer step reads a parameter, its gradient and its moments and writes a new parameter
//! and new moments, every one of the same shape. Offered the released inputs as anonymous
//! donors, XLA pairs outputs with donors of the same size in order, so the new first moment of
//! one parameter can land in another parameter's gradient buffer while that gradient is still to
//! be read: the compiler then copies whole buffers to keep the values apart (220 MiB per step of
//! bench-tiny's AdamW update). Burn marks the last use of every tensor (`ReadWrite`), which is
//! where an eager backend reuses the buffer; following those marks from a released input to an
//! output pairs each output with the input it replaces. An input released in the program whose
//! reads were not marked as its last (another handle still held it then, as Burn's `Learner`
//! holds the old model while the optimizer computes the new one) is consumed by its last read
//! in the program: nothing reads it after.

use std::collections::HashMap;

use burn_ir::{OperationIr, TensorId, TensorIr, TensorStatus};

/// Pairs `(output, input)` of positions in `outputs` and `inputs`: the output is computed from
/// the input through operations that each consume (last use) a tensor of the output's shape and
/// type, starting from an input whose life ends in the program (`released`). Each input and each
/// output appears at most once.
pub(crate) fn in_place_outputs(
    operations: &[OperationIr],
    inputs: &[TensorIr],
    outputs: &[TensorIr],
    released: &[TensorId],
) -> Vec<(usize, usize)> {
    // The input whose buffer each tensor could reuse, moved along each last use.
    let mut origin: HashMap<TensorId, usize> = inputs
        .iter()
        .enumerate()
        .filter(|(_, input)| released.contains(&input.id))
        .map(|(position, input)| (input.id, position))
        .collect();
    // The last operation reading each released input.
    let mut last_read: HashMap<TensorId, usize> = HashMap::new();
    for (index, operation) in operations.iter().enumerate() {
        if matches!(operation, OperationIr::Drop(_)) {
            continue;
        }
        for input in operation.inputs() {
            if origin.contains_key(&input.id) {
                last_read.insert(input.id, index);
            }
        }
    }
    for (index, operation) in operations.iter().enumerate() {
        if matches!(operation, OperationIr::Drop(_)) {
            continue;
        }
        let consumed: Vec<&TensorIr> = operation
            .inputs()
            .filter(|input| {
                input.status == TensorStatus::ReadWrite || last_read.get(&input.id) == Some(&index)
            })
            .collect();
        for output in operation.outputs() {
            let taken = consumed.iter().find_map(|input| {
                let same_buffer = input.shape == output.shape && input.dtype == output.dtype;
                same_buffer.then(|| origin.remove(&input.id)).flatten()
            });
            if let Some(position) = taken {
                origin.insert(output.id, position);
            }
        }
    }
    outputs
        .iter()
        .enumerate()
        .filter_map(|(position, output)| Some((position, *origin.get(&output.id)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::Segment;
    use crate::lower::{Donation, LowerOptions, lower_segment_with};
    use crate::test_operations::{add, halve, tensor};

    /// Adam's update of one parameter: inputs moment (1), gradient (2), second moment (3),
    /// parameter (4); outputs new moment (10), new second moment (13), new parameter (14).
    #[test]
    fn each_updated_state_takes_the_buffer_of_the_state_it_replaces() {
        use TensorStatus::{ReadOnly, ReadWrite};
        let operations = [
            halve(tensor(1, ReadWrite), 5),
            halve(tensor(2, ReadOnly), 6),
            add(tensor(5, ReadWrite), tensor(6, ReadWrite), 10),
            halve(tensor(3, ReadWrite), 7),
            halve(tensor(2, ReadWrite), 8),
            add(tensor(7, ReadWrite), tensor(8, ReadWrite), 13),
            add(tensor(10, ReadOnly), tensor(13, ReadOnly), 11),
            add(tensor(4, ReadWrite), tensor(11, ReadWrite), 14),
        ];
        let inputs: Vec<TensorIr> = (1..=4).map(|id| tensor(id, ReadOnly)).collect();
        let outputs: Vec<TensorIr> = [10, 13, 14]
            .into_iter()
            .map(|id| tensor(id, ReadOnly))
            .collect();
        let released: Vec<TensorId> = (1..=4).map(TensorId::new).collect();
        assert_eq!(
            in_place_outputs(&operations, &inputs, &outputs, &released),
            vec![(0, 0), (1, 2), (2, 3)],
            "the gradient (input 1) is read twice and replaced by nothing"
        );
        // An input that lives on after the program lends its buffer to nothing.
        assert_eq!(
            in_place_outputs(&operations, &inputs, &outputs, &released[1..]),
            vec![(1, 2), (2, 3)]
        );
        // The parameter read while another handle held it, then dropped in the program: its
        // last read consumes it all the same.
        let mut held = operations.clone();
        held[7] = add(tensor(4, ReadOnly), tensor(11, ReadWrite), 14);
        assert_eq!(
            in_place_outputs(&held, &inputs, &outputs, &released),
            vec![(0, 0), (1, 2), (2, 3)]
        );
        assert_eq!(
            in_place_outputs(&held, &inputs, &outputs, &released[..3]),
            vec![(0, 0), (1, 2)]
        );
    }

    /// The lowered module carries the pairs as `input_output_alias` entries (output tuple index,
    /// parameter number) and no buffer donors; with `Donation::Donors` the reverse.
    #[test]
    fn the_module_aliases_each_pair_or_offers_donors() {
        use TensorStatus::{ReadOnly, ReadWrite};
        let mut segment = Segment::default();
        // 1 lives on; 2 is replaced by 4 through 3; 5 is a new output of 1's.
        segment.push(halve(tensor(2, ReadWrite), 3));
        segment.push(add(tensor(3, ReadWrite), tensor(1, ReadOnly), 4));
        segment.push(halve(tensor(1, ReadOnly), 5));
        let boundary = segment.boundary();
        let lower = |donation| {
            let options = LowerOptions {
                donation,
                ..LowerOptions::default()
            };
            lower_segment_with(segment.operations(), &boundary, &options)
                .unwrap()
                .module
        };
        let in_place = lower(Donation::InPlace);
        let entries = &in_place.input_output_alias.as_ref().unwrap().entries;
        let pairs: Vec<(Vec<i64>, i64)> = entries
            .iter()
            .map(|entry| (entry.output_shape_index.clone(), entry.parameter_number))
            .collect();
        // Inputs in order of first use: 2 (parameter 0), then 1; outputs 4, then 5.
        assert_eq!(pairs, vec![(vec![0], 0)]);
        assert!(
            entries
                .iter()
                .all(|entry| entry.kind == crate::hlo::MAY_ALIAS)
        );
        assert_eq!(in_place.buffer_donor, None);

        let donors = lower(Donation::Donors);
        assert_eq!(donors.input_output_alias, None);
        let numbers: Vec<i64> = donors
            .buffer_donor
            .as_ref()
            .unwrap()
            .entries
            .iter()
            .map(|entry| entry.parameter_number)
            .collect();
        assert_eq!(numbers, vec![0]);
    }
}
