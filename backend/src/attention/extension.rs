//! The fused attention as a Burn 0.22 backend extension: how it reaches the server of a
//! Trainium device as two custom operations, and how Burn's autodiff takes its gradient.
//!
//! On Burn's remote backend the forward pass is the custom operation [`FORWARD`] (output and the
//! log-sum-exp statistics of each query row) and the backward pass [`BACKWARD`] (the gradients of
//! the query, keys, values and sinks from the output's, recomputing the probabilities from the
//! statistics): one operation each in the captured step, which every executor computes its own
//! way (`host` by blocks on Flex, `xla` as blocked HLO or a vendor's kernel).

use burn::backend::{Backend, Remote, backend_extension};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_backend::tensor::FloatTensor;
use burn_backend::{AutodiffBackend, DType, TensorMetadata};
use burn_ir::{CustomOpIr, TensorIr, TensorStatus};
use burn_remote::CustomOpClient;
use burn_router::RouterClient;

use super::options::{AttentionShape, FusedAttentionError, FusedAttentionOptions};

/// The custom operation of the forward pass: inputs `[query, key, value]` (and `sinks` when
/// given), outputs `[output, statistics]`, the options in its scalars
/// ([`FusedAttentionOptions::to_scalars`]). The statistics are the f32 log-sum-exp of each
/// query row's scaled, capped and masked scores (the sink included) `[b, h, q]`.
pub const FORWARD: &str = "burn_trainium.attention";

/// The custom operation of the backward pass: inputs `[query, key, value, (sinks,) output,
/// statistics, output gradient]`, outputs the gradients `[query, key, value, (sinks)]`.
pub const BACKWARD: &str = "burn_trainium.attention_backward";

/// Whether `custom` is one of the fused attention's operations.
pub fn is_fused_attention(custom: &CustomOpIr) -> bool {
    custom.id == FORWARD || custom.id == BACKWARD
}

/// How many inputs and outputs the fused attention's operation `custom` must have, judged by
/// whether it carries sinks (`None` when it is not one).
pub fn fused_attention_arity(custom: &CustomOpIr) -> Option<(usize, usize)> {
    let with_sinks = |inputs_without: usize| custom.inputs.len() == inputs_without + 1;
    match custom.id.as_str() {
        FORWARD if with_sinks(3) => Some((4, 2)),
        FORWARD => Some((3, 2)),
        BACKWARD if with_sinks(6) => Some((7, 4)),
        BACKWARD => Some((6, 3)),
        _ => None,
    }
}

/// What one of the fused attention's operations asks for, read from its IR and checked: the
/// executors' (`host`'s and the lowering's) one reading of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedAttentionCall {
    /// The options, from its scalars.
    pub options: FusedAttentionOptions,
    /// The dimensions, from its inputs.
    pub shape: AttentionShape,
    /// Whether it carries sinks (its fourth input).
    pub sinks: bool,
}

impl FusedAttentionCall {
    /// The call `custom` makes, or why it is not a well-formed fused attention.
    pub fn of(custom: &CustomOpIr) -> Result<Self, FusedAttentionError> {
        let Some((inputs, outputs)) = fused_attention_arity(custom) else {
            return Err(FusedAttentionError(format!(
                "`{}` is no attention",
                custom.id
            )));
        };
        if (custom.inputs.len(), custom.outputs.len()) != (inputs, outputs) {
            return Err(FusedAttentionError(format!(
                "`{}` takes {inputs} inputs and {outputs} outputs, got {} and {}",
                custom.id,
                custom.inputs.len(),
                custom.outputs.len()
            )));
        }
        let sinks = matches!((inputs, outputs), (4, 2) | (7, 4));
        let options = FusedAttentionOptions::from_scalars(&custom.scalars)?;
        let dims = |index: usize| custom.inputs[index].shape.to_vec();
        let sink_dims = sinks.then(|| dims(3));
        let shape =
            AttentionShape::of(&dims(0), &dims(1), &dims(2), sink_dims.as_deref(), &options)?;
        Ok(Self {
            options,
            shape,
            sinks,
        })
    }
}

/// The fused attention as an extension of Burn's backends: implemented for Burn's remote
/// backend (the Trainium server computes it) and for autodiff over it. Each method gives the
/// attention's output `[b, h, q, dv]` (the query's dtype) and the f32 log-sum-exp statistics
/// `[b, h, q]` of its rows.
#[backend_extension(Remote, Autodiff)]
pub trait AttentionExtension: Backend {
    /// The attention without sinks.
    fn fused_attention_forward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        options: FusedAttentionOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The attention with one learned logit per head `sinks [h]` in each row's denominator.
    fn fused_attention_forward_with_sinks(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        sinks: FloatTensor<Self>,
        options: FusedAttentionOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// The fused attention's backward pass on the backend that computes it (Burn's remote backend),
/// which autodiff calls; no tensor of a model's reaches it through Burn's dispatch.
pub trait AttentionBackward: Backend {
    /// The gradients of the query, key, value (and sinks) from the output's, with the forward
    /// pass's output and statistics.
    #[allow(clippy::too_many_arguments)]
    fn fused_attention_backward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        sinks: Option<FloatTensor<Self>>,
        output: FloatTensor<Self>,
        statistics: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: FusedAttentionOptions,
    ) -> Gradients4<Self>;
}

/// A fused attention's output and statistics.
type ForwardOutputs<B> = (FloatTensor<B>, FloatTensor<B>);

/// The gradients of a fused attention's query, key, value and (when it has them) sinks.
pub type Gradients4<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    Option<FloatTensor<B>>,
);

/// The shape of an attention on the remote backend's tensors, checked against `options`.
fn shape_of(
    query: &FloatTensor<Remote>,
    key: &FloatTensor<Remote>,
    value: &FloatTensor<Remote>,
    sinks: Option<&FloatTensor<Remote>>,
    options: &FusedAttentionOptions,
) -> AttentionShape {
    let sinks = sinks.map(|sinks| sinks.shape().to_vec());
    AttentionShape::of(
        &query.shape(),
        &key.shape(),
        &value.shape(),
        sinks.as_deref(),
        options,
    )
    .unwrap_or_else(|error| panic!("{error}"))
}

/// Runs the server's custom operation `id` on `inputs`, giving outputs of the given shapes and
/// dtypes.
fn remote_operation(
    id: &str,
    inputs: Vec<FloatTensor<Remote>>,
    outputs: &[(Vec<usize>, DType)],
    options: &FusedAttentionOptions,
) -> Vec<FloatTensor<Remote>> {
    let client = inputs[0].client.clone();
    let outputs = outputs
        .iter()
        .map(|(shape, dtype)| TensorIr {
            id: client.create_empty_handle(),
            shape: shape.clone().into(),
            status: TensorStatus::NotInit,
            dtype: *dtype,
        })
        .collect();
    let ir = CustomOpIr {
        id: id.to_string(),
        inputs: inputs.into_iter().map(|input| input.into_ir()).collect(),
        outputs,
        scalars: options.to_scalars(),
    };
    CustomOpClient::new(&client.device()).register(ir)
}

/// The forward custom operation on `inputs` (query, key, value and maybe sinks).
fn remote_forward(
    inputs: Vec<FloatTensor<Remote>>,
    options: FusedAttentionOptions,
) -> (FloatTensor<Remote>, FloatTensor<Remote>) {
    let shape = shape_of(&inputs[0], &inputs[1], &inputs[2], inputs.get(3), &options);
    let outputs = [
        (shape.output().to_vec(), inputs[0].dtype()),
        (shape.statistics().to_vec(), DType::F32),
    ];
    let mut results = remote_operation(FORWARD, inputs, &outputs, &options).into_iter();
    let output = results.next().expect("the attention's output");
    let statistics = results.next().expect("the attention's statistics");
    (output, statistics)
}

impl AttentionExtension for Remote {
    fn fused_attention_forward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        options: FusedAttentionOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        remote_forward(vec![query, key, value], options)
    }

    fn fused_attention_forward_with_sinks(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        sinks: FloatTensor<Self>,
        options: FusedAttentionOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        remote_forward(vec![query, key, value, sinks], options)
    }
}

impl AttentionBackward for Remote {
    fn fused_attention_backward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        sinks: Option<FloatTensor<Self>>,
        output: FloatTensor<Self>,
        statistics: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: FusedAttentionOptions,
    ) -> Gradients4<Self> {
        let like = |tensor: &FloatTensor<Self>| (tensor.shape().to_vec(), tensor.dtype());
        let mut outputs = vec![like(&query), like(&key), like(&value)];
        outputs.extend(sinks.as_ref().map(like));
        let with_sinks = sinks.is_some();
        let mut inputs = vec![query, key, value];
        inputs.extend(sinks);
        inputs.extend([output, statistics, output_grad]);
        let mut grads = remote_operation(BACKWARD, inputs, &outputs, &options).into_iter();
        let mut next = || grads.next().expect("a gradient of the attention");
        let (query, key, value) = (next(), next(), next());
        let sinks = with_sinks.then(next);
        (query, key, value, sinks)
    }
}

/// What the backward pass of a fused attention keeps from its forward pass.
#[derive(Debug, Clone)]
struct Saved<B: Backend> {
    query: FloatTensor<B>,
    key: FloatTensor<B>,
    value: FloatTensor<B>,
    sinks: Option<FloatTensor<B>>,
    output: FloatTensor<B>,
    statistics: FloatTensor<B>,
    options: FusedAttentionOptions,
}

/// The backward step of a fused attention over `N` inputs (3, or 4 with sinks).
#[derive(Debug)]
struct FusedAttentionBackward<const N: usize>;

impl<B: AttentionBackward, const N: usize> Backward<B, N> for FusedAttentionBackward<N> {
    type State = Saved<B>;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let output_grad = grads.consume::<B>(&ops.node);
        let Saved {
            query,
            key,
            value,
            sinks,
            output,
            statistics,
            options,
        } = ops.state;
        let (query, key, value, sinks) = B::fused_attention_backward(
            query,
            key,
            value,
            sinks,
            output,
            statistics,
            output_grad,
            options,
        );
        let computed = [Some(query), Some(key), Some(value), sinks];
        for (parent, grad) in ops.parents.into_iter().zip(computed) {
            if let (Some(parent), Some(grad)) = (parent, grad) {
                grads.register::<B>(parent.id, grad);
            }
        }
    }
}

/// Tracks `output`, computed from `inputs` (query, key, value and maybe sinks) by the fused
/// attention whose backward pass needs `saved`.
fn track<B: AttentionBackward, C: CheckpointStrategy, const N: usize>(
    inputs: [&FloatTensor<Autodiff<B, C>>; N],
    output: FloatTensor<B>,
    saved: impl FnOnce() -> Saved<B>,
) -> FloatTensor<Autodiff<B, C>> {
    match FusedAttentionBackward::<N>
        .prepare::<C>(inputs.map(|input| input.node()))
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(saved(), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// The forward pass over autodiff tensors: `inner` computes it on the inner backend's, the
/// output is tracked with what the backward pass needs.
fn autodiff_forward<B: AttentionBackward, C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    options: FusedAttentionOptions,
    inner: impl FnOnce(Vec<FloatTensor<B>>) -> (FloatTensor<B>, FloatTensor<B>),
) -> ForwardOutputs<Autodiff<B, C>> {
    let primitives: Vec<FloatTensor<B>> = inputs
        .iter()
        .map(|input| input.primitive().clone())
        .collect();
    let (output, statistics) = inner(primitives.clone());
    let saved = || {
        let mut primitives = primitives.into_iter();
        let mut next = || primitives.next().expect("an attention input");
        Saved {
            query: next(),
            key: next(),
            value: next(),
            sinks: primitives.next(),
            output: output.clone(),
            statistics: statistics.clone(),
            options,
        }
    };
    let tracked = track::<B, C, N>(inputs.each_ref(), output.clone(), saved);
    (
        tracked,
        <Autodiff<B, C> as AutodiffBackend>::from_inner(statistics),
    )
}

impl<B: AttentionExtension + AttentionBackward, C: CheckpointStrategy> AttentionExtension
    for Autodiff<B, C>
{
    fn fused_attention_forward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        options: FusedAttentionOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        autodiff_forward::<B, C, 3>([query, key, value], options, |inner| {
            let [query, key, value] = take(inner);
            B::fused_attention_forward(query, key, value, options)
        })
    }

    fn fused_attention_forward_with_sinks(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        sinks: FloatTensor<Self>,
        options: FusedAttentionOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        autodiff_forward::<B, C, 4>([query, key, value, sinks], options, |inner| {
            let [query, key, value, sinks] = take(inner);
            B::fused_attention_forward_with_sinks(query, key, value, sinks, options)
        })
    }
}

impl<B: AttentionBackward, C: CheckpointStrategy> AttentionBackward for Autodiff<B, C> {
    fn fused_attention_backward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        sinks: Option<FloatTensor<Self>>,
        output: FloatTensor<Self>,
        statistics: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: FusedAttentionOptions,
    ) -> Gradients4<Self> {
        let inner = <Self as AutodiffBackend>::inner;
        let (query, key, value, sinks) = B::fused_attention_backward(
            inner(query),
            inner(key),
            inner(value),
            sinks.map(inner),
            inner(output),
            inner(statistics),
            inner(output_grad),
            options,
        );
        let outer = <Self as AutodiffBackend>::from_inner;
        (outer(query), outer(key), outer(value), sinks.map(outer))
    }
}

/// The `N` tensors of `tensors`.
fn take<T, const N: usize>(tensors: Vec<T>) -> [T; N] {
    let count = tensors.len();
    tensors
        .try_into()
        .unwrap_or_else(|_| panic!("{N} tensors were expected, not {count}"))
}
