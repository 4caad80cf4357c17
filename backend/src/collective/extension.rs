//! Collectives as a Burn 0.22 backend extension: how a collective on a `burn::tensor::Tensor`
//! reaches the server of a Trainium device, and its gradient.
//!
//! On Burn's remote backend (a device [`crate::device`] or `hlat serve` serves) a collective is a
//! custom operation ([`REMOTE_OPERATION`](super::operation::REMOTE_OPERATION)) that the server
//! hands to [`CollectiveBackend::collective`] of [`crate::Trainium`]; replica data travels the
//! same way ([`REPLICAS_IN`], [`REPLICAS_OUT`]). Under autodiff the backward rules of tensor and
//! sequence parallelism (Megatron-LM, NeuronX Distributed) apply: the gradient of an all-reduce
//! is the identity (its result is used identically by every replica), of an all-gather a
//! reduce-scatter, of a reduce-scatter or a split an all-gather, a permute's goes back along the
//! reversed pairs, and [`copy_to_group`](CollectiveExtension::copy_to_group_of) all-reduces its
//! gradient.

use burn::backend::{Backend, Remote, backend_extension};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn_backend::tensor::FloatTensor;
use burn_backend::{AutodiffBackend, Shape, TensorMetadata, get_device_settings};
use burn_ir::{CustomOpIr, ScalarIr, TensorIr, TensorStatus};
use burn_remote::CustomOpClient;
use burn_router::RouterClient;

use super::operation::REMOTE_OPERATION;
use super::{Collective, ReduceOp, ReplicaGroups};

/// The custom operation that makes a tensor of its output's shape whose replica `r` holds the
/// `r`-th of the equal pieces of its input (the replicas' data one after the other, flat).
pub const REPLICAS_IN: &str = "burn_trainium.replicas_in";

/// The custom operation that puts the replicas of its input one after the other in a flat
/// tensor, on every replica, so that one read returns them all. Its scalar says which: this
/// process's first `count` (`u64::MAX`: every replica of the device).
pub const REPLICAS_OUT: &str = "burn_trainium.replicas_out";

/// The custom operation that reports how the device's replicas are laid out: an integer tensor
/// `[total, this process's, index of this process's first]`.
pub const REPLICA_LAYOUT: &str = "burn_trainium.replica_layout";

/// Collectives over the replicas of a device, as an extension of Burn's backends: implemented for
/// Burn's remote backend (the Trainium server computes them) and for autodiff over it.
#[backend_extension(Remote, Autodiff)]
pub trait CollectiveExtension: Backend {
    /// Runs `collective` on `tensor`.
    fn collective_of(tensor: FloatTensor<Self>, collective: Collective) -> FloatTensor<Self>;

    /// `tensor` unchanged; under autodiff its gradient is all-reduced (summed) over `groups`.
    fn copy_to_group_of(tensor: FloatTensor<Self>, groups: ReplicaGroups) -> FloatTensor<Self>;

    /// The tensor of `shape` whose replica `r` holds the `r`-th piece of `flat` (the replicas'
    /// data one after the other).
    fn replicas_in(flat: FloatTensor<Self>, shape: Vec<usize>) -> FloatTensor<Self>;

    /// The replicas of `tensor` one after the other in a flat tensor: `rows` of them, every
    /// replica of the device when `local` is false, else this process's first `rows`.
    fn replicas_out(tensor: FloatTensor<Self>, rows: u64, local: bool) -> FloatTensor<Self>;
}

/// Runs the server's custom operation `id` on `input`, with `scalars`, giving one output of
/// `shape` in `input`'s dtype.
fn remote_unary(
    id: &str,
    input: FloatTensor<Remote>,
    shape: Shape,
    scalars: Vec<ScalarIr>,
) -> FloatTensor<Remote> {
    let client = input.client.clone();
    let output = TensorIr {
        id: client.create_empty_handle(),
        shape,
        status: TensorStatus::NotInit,
        dtype: input.dtype(),
    };
    let ir = CustomOpIr {
        id: id.to_string(),
        inputs: vec![input.into_ir()],
        outputs: vec![output],
        scalars,
    };
    CustomOpClient::new(&client.device()).register(ir).remove(0)
}

impl CollectiveExtension for Remote {
    fn collective_of(tensor: FloatTensor<Self>, collective: Collective) -> FloatTensor<Self> {
        let shape = collective
            .output_shape(&tensor.shape())
            .unwrap_or_else(|reason| panic!("{collective}: {reason}"));
        remote_unary(
            REMOTE_OPERATION,
            tensor,
            shape.into(),
            collective.to_scalars(),
        )
    }

    fn copy_to_group_of(tensor: FloatTensor<Self>, _groups: ReplicaGroups) -> FloatTensor<Self> {
        tensor
    }

    fn replicas_in(flat: FloatTensor<Self>, shape: Vec<usize>) -> FloatTensor<Self> {
        remote_unary(REPLICAS_IN, flat, shape.into(), Vec::new())
    }

    fn replicas_out(tensor: FloatTensor<Self>, rows: u64, local: bool) -> FloatTensor<Self> {
        let elements = rows as usize * tensor.shape().num_elements();
        let count = if local { rows } else { u64::MAX };
        remote_unary(
            REPLICAS_OUT,
            tensor,
            Shape::from([elements]),
            vec![ScalarIr::UInt(count)],
        )
    }
}

/// How the gradient of one collective's output becomes the gradient of its input.
#[derive(Debug, Clone)]
enum GradientRule<B: Backend> {
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

impl<B: CollectiveExtension> Backward<B, 1> for CollectiveBackward {
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
            GradientRule::Collective(collective) => B::collective_of(grad, collective),
            GradientRule::WhereMaximum { input, output } => {
                let device = grad.device();
                let zeros = B::float_zeros(grad.shape(), &device, grad.dtype().into());
                let bool_dtype = get_device_settings::<B>(&device).bool_dtype;
                let maximum = B::float_equal(input, output, bool_dtype);
                B::float_mask_where(zeros, maximum, grad)
            }
        });
    }
}

/// The rule for the gradient of `collective` applied to `input` with result `output`.
fn gradient_rule<B: Backend>(
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
        // Chunk `j` of member `i` lands as chunk `i` of member `j`: the same exchange undoes it.
        Collective::AllToAll { .. } => GradientRule::Collective(collective.clone()),
        Collective::Permute { pairs } => GradientRule::Collective(Collective::Permute {
            pairs: pairs.reversed(),
        }),
        Collective::Barrier => GradientRule::Identity,
    }
}

/// Tracks `output`, computed from `input` by an operation whose gradient follows `rule`.
fn track<B: CollectiveExtension, C: CheckpointStrategy>(
    input: FloatTensor<Autodiff<B, C>>,
    output: FloatTensor<B>,
    rule: impl FnOnce(&FloatTensor<B>, &FloatTensor<B>) -> GradientRule<B>,
) -> FloatTensor<Autodiff<B, C>> {
    match CollectiveBackward
        .prepare::<C>([input.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let state = rule(input.primitive(), &output);
            prep.finish(state, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

impl<B: CollectiveExtension, C: CheckpointStrategy> CollectiveExtension for Autodiff<B, C> {
    fn collective_of(tensor: FloatTensor<Self>, collective: Collective) -> FloatTensor<Self> {
        let output = B::collective_of(tensor.primitive().clone(), collective.clone());
        track::<B, C>(tensor, output, |input, output| {
            gradient_rule(&collective, input, output)
        })
    }

    fn copy_to_group_of(tensor: FloatTensor<Self>, groups: ReplicaGroups) -> FloatTensor<Self> {
        let output = tensor.primitive().clone();
        track::<B, C>(tensor, output, |_, _| {
            GradientRule::Collective(Collective::AllReduce {
                op: ReduceOp::Sum,
                groups,
            })
        })
    }

    fn replicas_in(flat: FloatTensor<Self>, shape: Vec<usize>) -> FloatTensor<Self> {
        <Self as AutodiffBackend>::from_inner(B::replicas_in(flat.into_primitive(), shape))
    }

    fn replicas_out(tensor: FloatTensor<Self>, rows: u64, local: bool) -> FloatTensor<Self> {
        <Self as AutodiffBackend>::from_inner(B::replicas_out(tensor.into_primitive(), rows, local))
    }
}
