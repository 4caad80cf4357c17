//! Checks run before an operation that would make a `burn-flex` kernel panic: an index outside
//! its dimension (a token id outside the vocabulary, for an embedding), an integer divided by
//! zero. A panic inside a kernel poisons the runner's tensor store for good; an error from these
//! checks fails the segment and leaves the host device usable.
//!
//! The rule for out-of-range indices on every executor: they are errors on `host` (checked
//! here); compiled programs (`xla`, `neuron`) cannot stop mid-program and follow XLA's
//! semantics (gathers clamp, scatters drop), so callers check indices that come from data, such
//! as token ids, on the host before the program (see `hlat`'s vocabulary checks).

use super::Runner;
use burn_backend::TensorData;
use burn_ir::{
    BaseOperationIr, ModuleOperationIr, NumericOperationIr, OperationIr, ScalarIr, TensorIr,
};

use super::{failure, read, readable};
use crate::BackendError;
use crate::lower::empty_extremum_axis;

/// Checks `operation`'s index and divisor inputs on every replica's runner.
pub(super) fn check_operation(
    runners: &mut [Runner],
    operation: &OperationIr,
) -> Result<(), BackendError> {
    if let Some((name, tensor, dim, indices)) = indexed(operation) {
        for runner in runners.iter_mut() {
            check_indices(name, tensor, dim, &read(runner, &readable(indices))?)?;
        }
        return Ok(());
    }
    if let Some(error) = empty_extremum(operation) {
        return Err(error);
    }
    match operation {
        OperationIr::NumericInt(_, numeric) => match numeric {
            NumericOperationIr::Div(binary) | NumericOperationIr::Rem(binary) => {
                for runner in runners.iter_mut() {
                    let divisor = read(runner, &readable(&binary.rhs))?;
                    if divisor.iter::<i64>().any(|value| value == 0) {
                        return Err(division_by_zero(numeric));
                    }
                }
                Ok(())
            }
            NumericOperationIr::DivScalar(scalar) | NumericOperationIr::RemScalar(scalar) => {
                if scalar_is_zero(&scalar.rhs) {
                    return Err(division_by_zero(numeric));
                }
                Ok(())
            }
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

/// An error for an extremum (a maximum, a minimum or their position) over an axis that holds
/// no elements, which burn-flex's kernels panic on; the `xla` lowering refuses it the same way.
fn empty_extremum(operation: &OperationIr) -> Option<BackendError> {
    let (OperationIr::NumericFloat(_, numeric) | OperationIr::NumericInt(_, numeric)) = operation
    else {
        return None;
    };
    // The axes reduced: every one (`None`) or one.
    let (shape, axis): (&[usize], Option<usize>) = match numeric {
        NumericOperationIr::Max(op)
        | NumericOperationIr::Min(op)
        | NumericOperationIr::MaxAbs(op) => (&op.input.shape, None),
        NumericOperationIr::MaxDim(op)
        | NumericOperationIr::MinDim(op)
        | NumericOperationIr::MaxAbsDim(op)
        | NumericOperationIr::ArgMax(op)
        | NumericOperationIr::ArgMin(op) => (&op.input.shape, Some(op.axis)),
        NumericOperationIr::MaxDimWithIndices(op) | NumericOperationIr::MinDimWithIndices(op) => {
            (&op.tensor.shape, Some(op.dim))
        }
        _ => return None,
    };
    if shape.iter().all(|&size| size > 0) {
        return None;
    }
    let axes: Vec<usize> = match axis {
        Some(axis) => vec![axis],
        None => (0..shape.len()).collect(),
    };
    empty_extremum_axis(VariantName(numeric), shape, &axes).map(failure)
}

/// Debug-formats as the variant name of a numeric operation (`MaxDim`, `ArgMin`, ...).
struct VariantName<'a>(&'a NumericOperationIr);

impl std::fmt::Debug for VariantName<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let debug = format!("{:?}", self.0);
        formatter.write_str(&debug[..debug.find('(').unwrap_or(debug.len())])
    }
}

/// The operation's name, indexed tensor, dimension and indices, for the operations that index.
fn indexed(operation: &OperationIr) -> Option<(&'static str, &TensorIr, usize, &TensorIr)> {
    let base = match operation {
        OperationIr::BaseFloat(base) | OperationIr::BaseInt(base) | OperationIr::BaseBool(base) => {
            base
        }
        OperationIr::Module(ModuleOperationIr::Embedding(op)) => {
            return Some(("Embedding", &op.weights, 0, &op.indices));
        }
        _ => return None,
    };
    match base {
        BaseOperationIr::Select(op) => Some(("Select", &op.tensor, op.dim, &op.indices)),
        BaseOperationIr::SelectAssign(op) => {
            Some(("SelectAssign", &op.tensor, op.dim, &op.indices))
        }
        BaseOperationIr::Gather(op) => Some(("Gather", &op.tensor, op.dim, &op.indices)),
        BaseOperationIr::Scatter(op) => Some(("Scatter", &op.tensor, op.dim, &op.indices)),
        _ => None,
    }
}

/// Every index within `0..size` of `tensor`'s dimension `dim`.
fn check_indices(
    name: &str,
    tensor: &TensorIr,
    dim: usize,
    indices: &TensorData,
) -> Result<(), BackendError> {
    let size = tensor.shape[dim] as i64;
    match indices
        .iter::<i64>()
        .find(|index| !(0..size).contains(index))
    {
        Some(index) => Err(failure(format!(
            "{name} index {index} is outside dimension {dim} of size {size} (tensor of shape {:?})",
            tensor.shape.as_slice()
        ))),
        None => Ok(()),
    }
}

fn scalar_is_zero(scalar: &ScalarIr) -> bool {
    match scalar {
        ScalarIr::Int(value) => *value == 0,
        ScalarIr::UInt(value) => *value == 0,
        ScalarIr::Float(value) => *value == 0.0,
        ScalarIr::Bool(value) => !value,
    }
}

fn division_by_zero(operation: &NumericOperationIr) -> BackendError {
    let name = match operation {
        NumericOperationIr::Rem(_) | NumericOperationIr::RemScalar(_) => "remainder",
        _ => "division",
    };
    failure(format!("integer {name} by zero"))
}
