//! Collectives under autodiff, with the backward rules of tensor and sequence parallelism
//! (Megatron-LM, NeuronX Distributed): the gradient of an all-reduce is the identity (its result
//! is used identically by every replica), of an all-gather a reduce-scatter, of a reduce-scatter
//! or a split an all-gather, and [`CollectiveBackend::copy_to_group`] all-reduces its gradient.

use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn_backend::tensor::{FloatTensor, IntTensor};
use burn_backend::{
    AutodiffBackend, ExecutionError, TensorData, TensorMetadata, get_device_settings,
};

use super::{Collective, CollectiveBackend, ReduceOp, ReplicaGroups};

/// How the gradient of one collective's output becomes the gradient of its input.
#[derive(Debug, Clone)]
enum GradientRule<B: CollectiveBackend> {
    /// Passed through.
    Identity,
    /// Multiplied by a constant (the mean's `1 / group size`).
    Scale(f64),
    /// Passed through another collective.
    Collective(Collective),
    /// Kept where the input equals the maximum (the arg-max replicas), zero elsewhere.
    WhereMaximum {
        input: FloatTensor<B>,
        output: FloatTensor<B>,
    },
}

/// The backward step of a collective: applies its [`GradientRule`].
#[derive(Debug)]
struct CollectiveBackward;

impl<B: CollectiveBackend> Backward<B, 1> for CollectiveBackward {
    type State = GradientRule<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        unary::<B, _>(ops.parents, ops.node, grads, |grad| match ops.state {
            GradientRule::Identity => grad,
            GradientRule::Scale(factor) => B::float_mul_scalar(grad, factor.into()),
            GradientRule::Collective(collective) => B::collective(collective, vec![grad]).remove(0),
            GradientRule::WhereMaximum { input, output } => {
                let device = B::float_device(&grad);
                let zeros = B::float_zeros(grad.shape(), &device, grad.dtype().into());
                let bool_dtype = get_device_settings::<B>(&device).bool_dtype;
                let maximum = B::float_equal(input, output, bool_dtype);
                B::float_mask_where(zeros, maximum, grad)
            }
        });
    }
}

/// The rule for the gradient of `collective` applied to `input` with result `output`.
fn gradient_rule<B: CollectiveBackend>(
    collective: &Collective,
    input: &FloatTensor<B>,
    output: &FloatTensor<B>,
) -> GradientRule<B> {
    match collective {
        Collective::AllReduce { op, groups } => match op {
            ReduceOp::Sum => GradientRule::Identity,
            ReduceOp::Mean => GradientRule::Scale(1.0 / groups.group_size() as f64),
            ReduceOp::Max => GradientRule::WhereMaximum {
                input: input.clone(),
                output: output.clone(),
            },
        },
        Collective::AllGather { dim, groups } => {
            GradientRule::Collective(Collective::ReduceScatter {
                dim: *dim,
                groups: groups.clone(),
            })
        }
        Collective::ReduceScatter { dim, groups } | Collective::Split { dim, groups } => {
            GradientRule::Collective(Collective::AllGather {
                dim: *dim,
                groups: groups.clone(),
            })
        }
        Collective::Permute { pairs } => GradientRule::Collective(Collective::Permute {
            pairs: pairs.reversed(),
        }),
        Collective::Barrier => GradientRule::Identity,
    }
}

/// Tracks `output`, computed from `input` by an operation whose gradient follows `rule`.
fn track<B: CollectiveBackend, C: CheckpointStrategy>(
    input: FloatTensor<Autodiff<B, C>>,
    output: FloatTensor<B>,
    rule: impl FnOnce(&FloatTensor<B>, &FloatTensor<B>) -> GradientRule<B>,
) -> FloatTensor<Autodiff<B, C>> {
    match CollectiveBackward
        .prepare::<C>([input.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let state = rule(&input.primitive, &output);
            prep.finish(state, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

impl<B: CollectiveBackend, C: CheckpointStrategy> CollectiveBackend for Autodiff<B, C> {
    fn replica_count(device: &Self::Device) -> usize {
        B::replica_count(device)
    }

    fn float_from_replicas(data: Vec<TensorData>, device: &Self::Device) -> FloatTensor<Self> {
        Self::from_inner(B::float_from_replicas(data, device))
    }

    fn int_from_replicas(data: Vec<TensorData>, device: &Self::Device) -> IntTensor<Self> {
        B::int_from_replicas(data, device)
    }

    fn float_into_replicas(tensor: FloatTensor<Self>) -> Result<Vec<TensorData>, ExecutionError> {
        B::float_into_replicas(tensor.primitive)
    }

    fn float_into_local_replicas(
        tensor: FloatTensor<Self>,
        count: usize,
    ) -> Result<(usize, Vec<TensorData>), ExecutionError> {
        B::float_into_local_replicas(tensor.primitive, count)
    }

    fn collective(
        collective: Collective,
        tensors: Vec<FloatTensor<Self>>,
    ) -> Vec<FloatTensor<Self>> {
        let inner = tensors
            .iter()
            .map(|tensor| tensor.primitive.clone())
            .collect();
        let outputs = B::collective(collective.clone(), inner);
        tensors
            .into_iter()
            .zip(outputs)
            .map(|(input, output)| {
                track::<B, C>(input, output, |input, output| {
                    gradient_rule(&collective, input, output)
                })
            })
            .collect()
    }

    fn copy_to_group(tensor: FloatTensor<Self>, groups: &ReplicaGroups) -> FloatTensor<Self> {
        let output = tensor.primitive.clone();
        track::<B, C>(tensor, output, |_, _| {
            GradientRule::Collective(Collective::AllReduce {
                op: ReduceOp::Sum,
                groups: groups.clone(),
            })
        })
    }
}
