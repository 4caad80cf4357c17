//! Activation checkpointing: the loss and gradients of HLAT with activations recomputed in the
//! backward pass instead of kept, as NeuronX Distributed's `activation_checkpoint_config` does.
//!
//! The step is cut into stages, each a function from a few `[.., .., ..]` tensors to a few
//! others. The forward pass runs the stages in order; a *kept* stage records its graph (its
//! inputs as fresh leaves), a *recomputed* stage runs without one, so nothing inside it stays
//! alive. The backward pass walks the stages in reverse: a recomputed stage runs again from its
//! inputs with a graph, behind an optimization barrier (so a compiler cannot merge the second run
//! back into the first and keep its activations after all), and each stage backpropagates the
//! gradients of its outputs to its inputs and to the parameters it used.
//!
//! - [`ActivationCheckpointing::Full`]: one recomputed stage per layer; only the layers' inputs
//!   are kept.
//! - [`ActivationCheckpointing::Selective`]: per layer, the attention core (scores, softmax,
//!   weighted values) and a dense MLP's activation are recomputed; the projections' outputs are
//!   kept (Korthikanti et al. 2022), and so is a mixture of experts' feed-forward network.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Gradients, Int, Tensor, s};
use burn_trainium::collective;
use serde::{Deserialize, Serialize};

use crate::attention::{Attention, Context};
use crate::block::DecoderLayer;
use crate::fully_sharded::FullySharded;
use burn_trainium::attention::is_fused_on;

use crate::blocked_attention::{ATTENTION_BLOCK, attends_by_block};
use crate::mlp::Mlp;
use crate::model::{Hlat, loss_from_logits};
use crate::moe::load_balancing_loss;
use crate::parallel::Exchange;
use crate::rotary::RotaryTables;

/// What the backward pass recomputes instead of keeping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivationCheckpointing {
    /// Every activation the backward pass needs is kept.
    #[default]
    None,
    /// Each layer keeps only its input and is run again in the backward pass.
    Full,
    /// The attention core (scores, softmax, weighted values) and a dense MLP's activation are
    /// recomputed; the projections' outputs (and a mixture's feed-forward network) are kept.
    Selective,
}

impl FromStr for ActivationCheckpointing {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "none" => Ok(Self::None),
            "full" => Ok(Self::Full),
            "selective" => Ok(Self::Selective),
            other => Err(format!(
                "unknown activation checkpointing `{other}` (expected none, full or selective)"
            )),
        }
    }
}

impl fmt::Display for ActivationCheckpointing {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Self::None => "none",
            Self::Full => "full",
            Self::Selective => "selective",
        })
    }
}

/// A stage's computation: its layer's weights (with or without gradients) and the stage's inputs.
type Run<'a> = Box<dyn Fn(&DecoderLayer, Vec<Tensor<3>>) -> Vec<Tensor<3>> + 'a>;

/// A kept stage's input leaves and its outputs, with their graph.
struct Recorded {
    leaves: Vec<Tensor<3>>,
    outputs: Vec<Tensor<3>>,
}

/// One stage of the step, as the forward pass left it.
enum Stage<'a> {
    /// Its graph, kept for the backward pass, of layer `layer`; `routes`: its last output is a
    /// router's logits; `weights`: under fully sharded data parallelism, the layer gathered whole
    /// (as leaves) that it ran on.
    Kept {
        recorded: Recorded,
        routes: bool,
        layer: usize,
        weights: Option<Box<DecoderLayer>>,
    },
    /// What runs it again: its computation and the values that entered it (without graph), of
    /// layer `layer`; `routes`: its last output is a router's logits; `weighted`: it uses the
    /// layer's weights.
    Recomputed {
        run: Run<'a>,
        inputs: Vec<Tensor<3>>,
        routes: bool,
        layer: usize,
        weighted: bool,
    },
    /// The attention core of layer `layer` over a long sequence: the values that entered it
    /// (`[x, queries, keys, values]`, without graph); run again one block of queries at a time.
    AttentionByBlock {
        layer: usize,
        inputs: Vec<Tensor<3>>,
    },
}

/// A stage of a layer: its computation, how the backward pass gets its graph, whether its last
/// output is the logits `[1, tokens, experts]` of a mixture's router (which go to the
/// load-balancing loss, not to the next stage), and whether it uses the layer's weights (the
/// attention core and the activation do not: they need nothing gathered).
struct Planned<'a> {
    run: Run<'a>,
    treatment: Treatment,
    routes: bool,
    weighted: bool,
}

/// How the backward pass gets the graph of a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Treatment {
    /// Recorded in the forward pass.
    Kept,
    /// Run again, whole.
    Recomputed,
    /// The attention core `[x, queries, keys, values] -> [x, attention]`, run again one block of
    /// queries at a time ([`attention_backward_by_block`]).
    AttentionByBlock,
}

/// What [`Hlat::loss_and_gradients`] computes for a batch (and `Hlat::pipeline_loss_and_gradients`
/// for micro-batches, as sums over them): values without graph, and the gradients.
pub struct ObjectiveGradients {
    /// The training objective ([`Hlat::objective_with`]'s): the mean next-token loss, plus a
    /// mixture's weighted load-balancing loss (summed over micro-batches in a pipeline).
    pub objective: Tensor<1>,
    /// A mixture's load-balancing loss (`None` for a dense model).
    pub load_balancing: Option<Tensor<1>>,
    /// The gradients of every parameter.
    pub gradients: GradientsParams,
}

/// The objective [`Hlat::head_objective_and_gradients`] computes from the logits.
pub struct HeadObjective<F> {
    /// Whether a mixture's weighted load-balancing loss joins the objective.
    pub load_balancing: bool,
    /// The objective of the logits `[batch, seq, vocab / degree]`, `[1]`.
    pub of_logits: F,
}

impl Hlat {
    /// The training objective of a batch (as [`Hlat::objective_with`]) and the gradients of
    /// every parameter, with the activations of `checkpointing` recomputed in the backward
    /// pass. The values are returned without their graph: the gradients are already computed.
    ///
    /// A mixture's routers feed the load-balancing loss, which joins every layer's choices:
    /// their logits leave each stage beside its output, the loss is computed from all of them
    /// once the forward pass is done, and its gradient with respect to each layer's logits
    /// enters that layer's stage in the backward pass.
    ///
    /// The parameters must be leaves of the autodiff graph (a model cast to another dtype for
    /// mixed precision is not: cast inside the stages instead).
    ///
    /// # Panics
    /// When the model is not on an autodiff device (`Device::autodiff`).
    pub fn loss_and_gradients(
        &self,
        input_ids: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        ignore_id: Option<u32>,
        exchange: &dyn Exchange,
        checkpointing: ActivationCheckpointing,
        sharded: Option<&FullySharded>,
    ) -> ObjectiveGradients {
        self.head_objective_and_gradients(
            input_ids,
            exchange,
            (checkpointing, sharded),
            HeadObjective {
                load_balancing: true,
                of_logits: |logits| loss_from_logits(logits, targets, ignore_id, exchange),
            },
        )
    }

    /// [`Hlat::loss_and_gradients`] of another objective of the logits `[batch, seq, vocab /
    /// degree]` (`head`: a preference loss of the log-probabilities of each target, say), with
    /// or without a mixture's load-balancing loss. Under fully sharded data parallelism
    /// (`sharded`: the model holds slices) each part is gathered whole just before it runs and
    /// its gradients are left as slices ([`crate::fully_sharded`]).
    ///
    /// # Panics
    /// When the model is not on an autodiff device (`Device::autodiff`).
    pub fn head_objective_and_gradients(
        &self,
        input_ids: Tensor<2, Int>,
        exchange: &dyn Exchange,
        (checkpointing, sharded): (ActivationCheckpointing, Option<&FullySharded>),
        head: HeadObjective<impl FnOnce(Tensor<3>) -> Tensor<1>>,
    ) -> ObjectiveGradients {
        let [_, seq] = input_ids.dims();
        let rotary = self.rotary(0, seq, &input_ids.device());
        let mut gradients = GradientsParams::new();

        // Forward: the embedding keeps its graph (under fully sharded data parallelism it lets
        // its gathered weights go, and runs again for the backward pass), then the stages.
        let embedded = self
            .outer_weights(sharded, OuterPart::Embedding)
            .embed(input_ids.clone(), exchange);
        let input = embedded.clone().detach();
        let embedded = sharded.is_none().then_some(embedded);
        let layers = 0..self.layers.len();
        let mut staged = StagedLayers::forward(
            self,
            layers,
            input,
            (&rotary, seq),
            exchange,
            (checkpointing, sharded),
        );
        let balancing = match head.load_balancing {
            true => staged.load_balancing(self, exchange),
            false => None,
        };

        // The head and the loss, then backward through the stages in reverse.
        let head_weights = self.outer_weights(sharded, OuterPart::Head);
        let last = staged.output.clone().require_grad();
        let loss = (head.of_logits)(head_weights.head(last.clone(), exchange));
        let mut grads = loss.backward();
        let head_input = vec![last.grad_remove(&mut grads)];
        let upstream = into_slices(&head_weights, sharded, &mut gradients, |into| {
            collect(&*head_weights, &mut grads, into, head_input)
        });
        drop(head_weights);
        let upstream = staged.backward(self, self, upstream, &mut gradients);
        match embedded {
            Some(embedded) => {
                backpropagate(self, vec![embedded], upstream, &[], &mut gradients);
            }
            None => {
                let weights = self.outer_weights(sharded, OuterPart::Embedding);
                let embedded = weights.embed(input_ids, exchange);
                into_slices(&weights, sharded, &mut gradients, |into| {
                    backpropagate(&*weights, vec![embedded], upstream, &[], into)
                });
            }
        }
        let loss = loss.detach();
        let (objective, load_balancing) = match balancing {
            Some((balance, coefficient)) => (
                loss + balance.clone().mul_scalar(coefficient),
                Some(balance),
            ),
            None => (loss, None),
        };
        ObjectiveGradients {
            objective,
            load_balancing,
            gradients,
        }
    }
}

/// The parts of the model outside its layers that one pass of the step uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OuterPart {
    /// The token embedding.
    Embedding,
    /// The final norm and the head (the embedding when they are tied).
    Head,
}

impl Hlat {
    /// The model as a pass over `part` uses it: itself, or under fully sharded data parallelism
    /// a copy without layers whose `part` is gathered whole as leaves (the rest stays in slices).
    pub(crate) fn outer_weights(
        &self,
        sharded: Option<&FullySharded>,
        part: OuterPart,
    ) -> Cow<'_, Hlat> {
        let Some(sharded) = sharded else {
            return Cow::Borrowed(self);
        };
        let mut view = self.clone().with_layers(Vec::new());
        match (part, view.lm_head.take()) {
            (OuterPart::Embedding, lm_head) | (OuterPart::Head, lm_head @ None) => {
                view.embed_tokens = sharded.gather_leaves(view.embed_tokens);
                view.lm_head = lm_head;
            }
            (OuterPart::Head, Some(lm_head)) => {
                view.lm_head = Some(sharded.gather_leaves(lm_head));
            }
        }
        if part == OuterPart::Head {
            view.norm = sharded.gather_leaves(view.norm);
        }
        Cow::Owned(view)
    }
}

/// Runs `pass`, which adds the gradients of `model`'s parameters to the set it is given: to
/// `gradients` itself, or under fully sharded data parallelism (`sharded`: `model`'s parameters
/// gathered whole) to a set of whole gradients that then joins `gradients` as this rank's slices
/// of their sums.
pub(crate) fn into_slices<T>(
    model: &Hlat,
    sharded: Option<&FullySharded>,
    gradients: &mut GradientsParams,
    pass: impl FnOnce(&mut GradientsParams) -> T,
) -> T {
    let Some(sharded) = sharded else {
        return pass(gradients);
    };
    let mut whole = GradientsParams::new();
    let result = pass(&mut whole);
    sharded.scatter_into(model, whole, gradients);
    result
}

/// Layers run forward through the stages activation checkpointing asks for, as the backward pass
/// needs them: the output (without graph) and each stage's graph or what runs it again.
pub(crate) struct StagedLayers<'a> {
    /// The last layer's output, without graph.
    pub output: Tensor<3>,
    stages: Vec<Stage<'a>>,
    /// The logits `[tokens, experts]` of each mixture layer's router, in order, without graph.
    router_logits: Vec<Tensor<2>>,
    /// The gradient of the objective with respect to each of `router_logits`, once
    /// [`StagedLayers::load_balancing`] has computed them.
    router_gradients: Vec<Tensor<2>>,
    /// Under fully sharded data parallelism, how the model's slices gather into whole layers.
    sharded: Option<&'a FullySharded>,
}

impl<'a> StagedLayers<'a> {
    /// Runs `layers` of `model` from `input` (without graph) over a sequence of `seq`
    /// positions: kept stages record their graph, recomputed ones run without gradients. Under
    /// fully sharded data parallelism (`sharded`) each layer's weights are gathered whole for its
    /// stages, and kept with the kept ones.
    pub fn forward(
        model: &Hlat,
        layers: std::ops::Range<usize>,
        input: Tensor<3>,
        (rotary, seq): (&'a RotaryTables, usize),
        exchange: &'a dyn Exchange,
        (checkpointing, sharded): (ActivationCheckpointing, Option<&'a FullySharded>),
    ) -> Self {
        // A Trainium device attends in one fused operation, whose backward pass already keeps no
        // scores: no stage of its own for the attention core.
        let by_block = attends_by_block(seq) && !is_fused_on(&input.device());
        let without_gradients = model.clone().no_grad();
        let mut carry = vec![input];
        let mut stages = Vec::new();
        let mut router_logits = Vec::new();
        for index in layers {
            let mixture = model.layers[index].moe.is_some();
            // The layer gathered whole once for its stages: as leaves for the kept ones, without
            // graph for the others.
            let gathered = sharded.map(|sharded| {
                let leaves = sharded.gather_leaves(model.layers[index].clone());
                (leaves.clone().no_grad(), leaves)
            });
            for planned in layer_stages(rotary, exchange, checkpointing, by_block, mixture) {
                let Planned {
                    run,
                    treatment,
                    routes,
                    weighted,
                } = planned;
                let gathered = gathered.as_ref().filter(|_| weighted);
                let plain = gathered.map_or(&without_gradients.layers[index], |(plain, _)| plain);
                let inputs = carry;
                let (mut outputs, stage) = match treatment {
                    Treatment::Kept => {
                        let leaves: Vec<_> = inputs.into_iter().map(Tensor::require_grad).collect();
                        let weights = gathered.map(|(_, leaves)| Box::new(leaves.clone()));
                        let layer = weights.as_deref().unwrap_or(&model.layers[index]);
                        let outputs = run(layer, leaves.clone());
                        let recorded = Recorded {
                            leaves,
                            outputs: outputs.clone(),
                        };
                        let stage = Stage::Kept {
                            recorded,
                            routes,
                            layer: index,
                            weights,
                        };
                        (outputs, stage)
                    }
                    Treatment::Recomputed => {
                        let outputs = run(plain, inputs.clone());
                        (
                            outputs,
                            Stage::Recomputed {
                                run,
                                inputs,
                                routes,
                                layer: index,
                                weighted,
                            },
                        )
                    }
                    Treatment::AttentionByBlock => {
                        let outputs = run(plain, inputs.clone());
                        let stage = Stage::AttentionByBlock {
                            layer: index,
                            inputs,
                        };
                        (outputs, stage)
                    }
                };
                if routes {
                    let logits = outputs.pop().expect("a routing stage's logits").detach();
                    let [_, tokens, experts] = logits.dims();
                    router_logits.push(logits.reshape([tokens, experts]));
                }
                carry = outputs.into_iter().map(Tensor::detach).collect();
                stages.push(stage);
            }
        }
        Self {
            output: carry.remove(0),
            stages,
            router_logits,
            router_gradients: Vec::new(),
            sharded,
        }
    }

    /// The load-balancing loss of the routers run forward (`None` for a dense model) and its
    /// weight in the objective, `router_aux_loss_coef`. The gradient of the weighted loss with
    /// respect to each router's logits is kept for [`StagedLayers::backward`]: under tensor
    /// parallelism each rank passes on its share, as [`Hlat::objective_with`] does.
    pub fn load_balancing(
        &mut self,
        model: &Hlat,
        exchange: &dyn Exchange,
    ) -> Option<(Tensor<1>, f64)> {
        let moe = model.config().moe.as_ref()?;
        let weight = moe.router_aux_loss_coef / exchange.degree() as f64;
        let k = moe.experts_per_token;
        let balance = self.weigh_routers(|logits| load_balancing_loss(logits, k), weight)?;
        Some((balance, moe.router_aux_loss_coef))
    }

    /// `part`, a function of the logits of the routers run forward (in order), and its value
    /// without graph (`None` when `part` gives none); the gradient of `weight · part` with
    /// respect to each router's logits is kept for [`StagedLayers::backward`].
    pub fn weigh_routers(
        &mut self,
        part: impl FnOnce(&[Tensor<2>]) -> Option<Tensor<1>>,
        weight: f64,
    ) -> Option<Tensor<1>> {
        let leaves: Vec<Tensor<2>> = self
            .router_logits
            .iter()
            .map(|logits| logits.clone().require_grad())
            .collect();
        let value = part(&leaves)?;
        let mut grads = value.clone().mul_scalar(weight).backward();
        self.router_gradients = leaves
            .iter()
            .map(|leaf| {
                leaf.grad_remove(&mut grads)
                    .unwrap_or_else(|| leaf.clone().inner().zeros_like())
            })
            .collect();
        Some(value.detach())
    }

    /// Backpropagates `upstream` (the gradient of the output) through the stages in reverse,
    /// running recomputed stages again on `model`: the gradients of `leaves`' parameters (the
    /// leaf model `model` is computed from: itself, or the model whose parameters `model`'s are
    /// selected from) are added to `gradients`; returns the gradient of the input. Under fully
    /// sharded data parallelism a recomputed layer is gathered again, and each layer's whole
    /// gradients are reduce-scattered into slices once its stages are done.
    pub fn backward(
        self,
        model: &Hlat,
        leaves: &Hlat,
        mut upstream: Vec<Option<Tensor<3>>>,
        gradients: &mut GradientsParams,
    ) -> Vec<Option<Tensor<3>>> {
        let sharded = self.sharded;
        let mut router_gradients = self.router_gradients;
        // Under fully sharded data parallelism: the layer being backpropagated, its whole
        // gradients, and its weights gathered again for its recomputed stages.
        let mut open: Option<OpenLayer> = None;
        for stage in self.stages.into_iter().rev() {
            if let Some(sharded) = sharded {
                let layer = stage.layer();
                if open.as_ref().is_some_and(|open| open.layer != layer) {
                    let done = open.take().expect("checked");
                    sharded.scatter_into(&model.layers[done.layer], done.whole, gradients);
                }
                open.get_or_insert_with(|| OpenLayer {
                    layer,
                    whole: GradientsParams::new(),
                    weights: None,
                });
            }
            let routes = matches!(
                stage,
                Stage::Kept { routes: true, .. } | Stage::Recomputed { routes: true, .. }
            );
            if routes {
                // The load-balancing loss's gradient of this stage's router logits (none when
                // the loss was not computed: the logits then feed nothing).
                let gradient = router_gradients.pop().map(|gradient| {
                    let [tokens, experts] = gradient.dims();
                    gradient.reshape([1, tokens, experts])
                });
                upstream.push(gradient);
            }
            let (stage_leaves, outputs, weights) = match stage {
                Stage::Kept {
                    recorded, weights, ..
                } => (recorded.leaves, recorded.outputs, weights),
                Stage::Recomputed {
                    run,
                    inputs,
                    layer,
                    weighted,
                    ..
                } => {
                    // A layer gathered again passes its slices through the stage's barrier: a
                    // compiler cannot gather it before the stage's gradients exist.
                    let gathering = match (sharded, open.as_mut()) {
                        (Some(sharded), Some(open)) if weighted && open.weights.is_none() => {
                            Some((sharded, open))
                        }
                        _ => None,
                    };
                    let slices = gathering.as_ref().map_or_else(Vec::new, |(sharded, _)| {
                        sharded.slices_of(&model.layers[layer])
                    });
                    let (stage_leaves, fenced, slices) = fence(inputs, upstream, slices);
                    upstream = fenced;
                    if let Some((sharded, open)) = gathering {
                        let slices = slices.into_iter().map(Tensor::autodiff).collect();
                        let layer = model.layers[layer].clone();
                        open.weights = Some(sharded.gather_leaves_from(layer, slices));
                    }
                    let weights = match open.as_ref() {
                        Some(open) if weighted => open.weights.clone().map(Box::new),
                        _ => None,
                    };
                    let outputs = run(
                        weights.as_deref().unwrap_or(&model.layers[layer]),
                        stage_leaves.clone(),
                    );
                    (stage_leaves, outputs, weights)
                }
                Stage::AttentionByBlock { layer, inputs } => {
                    let attention = &model.layers[layer].self_attn;
                    upstream = attention_backward_by_block(attention, inputs, upstream);
                    continue;
                }
            };
            upstream = match (weights, open.as_mut()) {
                (Some(weights), Some(open)) => {
                    backpropagate(&*weights, outputs, upstream, &stage_leaves, &mut open.whole)
                }
                _ => backpropagate(leaves, outputs, upstream, &stage_leaves, gradients),
            };
        }
        if let (Some(sharded), Some(done)) = (sharded, open) {
            sharded.scatter_into(&model.layers[done.layer], done.whole, gradients);
        }
        upstream
    }
}

/// The layer a fully sharded backward pass is in: its whole gradients so far, and its weights
/// gathered again once a recomputed stage needs them.
struct OpenLayer {
    layer: usize,
    whole: GradientsParams,
    weights: Option<DecoderLayer>,
}

impl Stage<'_> {
    /// The layer the stage belongs to.
    fn layer(&self) -> usize {
        match self {
            Stage::Kept { layer, .. }
            | Stage::Recomputed { layer, .. }
            | Stage::AttentionByBlock { layer, .. } => *layer,
        }
    }
}

/// The stages of a layer and how the backward pass gets the graph of each. With `by_block` (a
/// long sequence, see [`attends_by_block`], on a device without the fused attention) the
/// attention core is a stage of its own, run again by blocks of queries whatever
/// `checkpointing` says, so no stage keeps `[seq × seq]` scores. The feed-forward network of a `mixture` of experts is one stage
/// (kept under selective checkpointing: its experts' activations are kept), whose router logits
/// leave it beside its output.
fn layer_stages<'a>(
    rotary: &'a RotaryTables,
    exchange: &'a dyn Exchange,
    checkpointing: ActivationCheckpointing,
    by_block: bool,
    mixture: bool,
) -> Vec<Planned<'a>> {
    let attend_treatment = if by_block {
        Treatment::AttentionByBlock
    } else {
        Treatment::Recomputed
    };
    let whole_treatment = if checkpointing == ActivationCheckpointing::Full {
        Treatment::Recomputed
    } else {
        Treatment::Kept
    };
    let plan = |run, treatment| Planned {
        run,
        treatment,
        routes: false,
        weighted: true,
    };
    let unweighted = |run, treatment| Planned {
        run,
        treatment,
        routes: false,
        weighted: false,
    };
    let routing = |run, treatment| Planned {
        run,
        treatment,
        routes: true,
        weighted: true,
    };
    match checkpointing {
        ActivationCheckpointing::None | ActivationCheckpointing::Full if !by_block => {
            let whole: Run<'a> = Box::new(move |layer, inputs| {
                let x = inputs.into_iter().next().expect("a layer input");
                let (output, router_logits) =
                    layer.forward_routed(x, rotary, Context::Full, exchange);
                let mut outputs = vec![output];
                outputs.extend(router_logits.map(|logits| logits.unsqueeze::<3>()));
                outputs
            });
            vec![Planned {
                run: whole,
                treatment: whole_treatment,
                routes: mixture,
                weighted: true,
            }]
        }
        ActivationCheckpointing::None | ActivationCheckpointing::Full => {
            let rest = if mixture {
                routing(mixture_stage(exchange), whole_treatment)
            } else {
                let rest = chain(vec![
                    mix_stage(exchange),
                    activate_stage(),
                    down_stage(exchange),
                ]);
                plan(rest, whole_treatment)
            };
            vec![
                plan(project_stage(rotary, exchange), whole_treatment),
                unweighted(attend_stage(), attend_treatment),
                rest,
            ]
        }
        ActivationCheckpointing::Selective => {
            let mut stages = vec![
                plan(project_stage(rotary, exchange), Treatment::Kept),
                unweighted(attend_stage(), attend_treatment),
            ];
            if mixture {
                stages.push(routing(mixture_stage(exchange), Treatment::Kept));
            } else {
                stages.extend([
                    plan(mix_stage(exchange), Treatment::Kept),
                    unweighted(activate_stage(), Treatment::Recomputed),
                    plan(down_stage(exchange), Treatment::Kept),
                ]);
            }
            stages
        }
    }
}

/// `[x] -> [x, queries, keys, values]` of a layer (heads flattened, see [`flatten`]).
fn project_stage<'a>(rotary: &'a RotaryTables, exchange: &'a dyn Exchange) -> Run<'a> {
    Box::new(move |layer, inputs| {
        let x = inputs.into_iter().next().expect("a layer input");
        let (queries, keys, values) = layer.attention_inputs(x.clone(), rotary, exchange);
        vec![x, flatten(queries), flatten(keys), flatten(values)]
    })
}

/// `[x, queries, keys, values] -> [x, attention]`: the attention core of a layer (which uses
/// none of its weights).
fn attend_stage<'a>() -> Run<'a> {
    Box::new(move |layer, inputs| {
        let attention = &layer.self_attn;
        let [x, queries, keys, values] = take(inputs);
        let output = attention.attend(
            unflatten(queries, attention.num_heads),
            unflatten(keys, attention.num_kv_heads),
            unflatten(values, attention.num_kv_heads),
            Context::Full,
        );
        vec![x, output]
    })
}

/// `[x, attention] -> [h, gate, up]`: the output projection and residual of a layer, then the
/// MLP's input projections.
fn mix_stage<'a>(exchange: &'a dyn Exchange) -> Run<'a> {
    Box::new(move |layer, inputs| {
        let [x, output] = take(inputs);
        let (h, normed) = layer.after_attention(x, output, exchange);
        let (gate, up) = layer
            .dense_mlp()
            .expect("a dense layer's stage")
            .gate_up(normed);
        vec![h, gate, up]
    })
}

/// `[h, gate, up] -> [h, activation]`: SwiGLU.
fn activate_stage<'a>() -> Run<'a> {
    Box::new(move |_, inputs| {
        let [h, gate, up] = take(inputs);
        vec![h, Mlp::activate(gate, up)]
    })
}

/// `[h, activation] -> [layer output]`: the MLP's output projection and residual of a layer.
fn down_stage<'a>(exchange: &'a dyn Exchange) -> Run<'a> {
    Box::new(move |layer, inputs| {
        let [h, activation] = take(inputs);
        let mlp = layer.dense_mlp().expect("a dense layer's stage");
        vec![h + mlp.down(activation, exchange)]
    })
}

/// `[x, attention] -> [layer output, router logits]`: the output projection and residual of a
/// layer, then its mixture of experts and residual; the router's logits as `[1, tokens,
/// experts]`.
fn mixture_stage<'a>(exchange: &'a dyn Exchange) -> Run<'a> {
    Box::new(move |layer, inputs| {
        let [x, output] = take(inputs);
        let (h, normed) = layer.after_attention(x, output, exchange);
        let (transformed, router_logits) = layer.feed_forward(normed, exchange);
        let logits = router_logits.expect("a mixture layer routes its tokens");
        vec![h + transformed, logits.unsqueeze::<3>()]
    })
}

/// One stage running `runs` in order, each on the outputs of the one before.
fn chain<'a>(runs: Vec<Run<'a>>) -> Run<'a> {
    Box::new(move |layer, inputs| runs.iter().fold(inputs, |carry, run| run(layer, carry)))
}

/// The gradients of the attention core's inputs `[x, queries, keys, values]` from those of its
/// outputs `[x, attention]` (`upstream`), the core run again one block of [`ATTENTION_BLOCK`]
/// queries at a time over the keys up to the block's last query: the live scores are
/// `[block × seq]`, not `[seq × seq]`. `x` passes through. Each block's leaves leave one
/// optimization barrier together with the key and value gradients summed so far, so a compiler
/// runs the blocks one after the other instead of all at once.
fn attention_backward_by_block(
    attention: &Attention,
    inputs: Vec<Tensor<3>>,
    upstream: Vec<Option<Tensor<3>>>,
) -> Vec<Option<Tensor<3>>> {
    let [_, queries, keys, values] = take(inputs);
    let mut upstream = upstream.into_iter();
    let x_grad = upstream.next().flatten();
    let Some(output_grad) = upstream.next().flatten() else {
        return vec![x_grad, None, None, None];
    };
    let seq = queries.dims()[1];
    let mut key_grad = keys.clone().inner().zeros_like();
    let mut value_grad = values.clone().inner().zeros_like();
    let mut query_grads = Vec::with_capacity(seq.div_ceil(ATTENTION_BLOCK));
    for first in (0..seq).step_by(ATTENTION_BLOCK) {
        let end = (first + ATTENTION_BLOCK).min(seq);
        let block_inputs = vec![
            queries.clone().slice(s![.., first..end, ..]),
            keys.clone().slice(s![.., 0..end, ..]),
            values.clone().slice(s![.., 0..end, ..]),
        ];
        let carried = vec![
            Some(output_grad.clone().slice(s![.., first..end, ..])),
            Some(key_grad),
            Some(value_grad),
        ];
        let (leaves, fenced, _) = fence(block_inputs, carried, Vec::new());
        let [block_output_grad, key_total, value_total] = take_present(fenced);
        let [query_leaf, key_leaf, value_leaf] = take(leaves);
        let output = attention.attend_rows(
            unflatten(query_leaf.clone(), attention.num_heads),
            unflatten(key_leaf.clone(), attention.num_kv_heads),
            unflatten(value_leaf.clone(), attention.num_kv_heads),
            first,
        );
        let mut grads = (output * block_output_grad).sum().backward();
        let gradient = |leaf: &Tensor<3>, grads: &mut Gradients| {
            leaf.grad_remove(grads)
                .unwrap_or_else(|| leaf.clone().inner().zeros_like())
        };
        query_grads.push(gradient(&query_leaf, &mut grads));
        let add_prefix = |total: Tensor<3>, part: Tensor<3>| {
            let prefix = total.clone().slice(s![.., 0..end, ..]) + part;
            total.slice_assign(s![.., 0..end, ..], prefix)
        };
        key_grad = add_prefix(key_total, gradient(&key_leaf, &mut grads));
        value_grad = add_prefix(value_total, gradient(&value_leaf, &mut grads));
    }
    vec![
        x_grad,
        Some(Tensor::cat(query_grads, 1)),
        Some(key_grad),
        Some(value_grad),
    ]
}

/// A recomputed stage's `inputs` as fresh leaves and its `upstream` gradients, passed together
/// through one optimization barrier: the compiler can neither merge the recomputation with the
/// forward pass (its inputs are the barrier's outputs) nor schedule it before the gradients of
/// the stage exist (so the recomputed activations live only while they are used).
/// `also` (values without graph, such as a layer's slices under fully sharded data parallelism)
/// pass the same barrier and come back, on the inner backend.
#[allow(clippy::type_complexity)]
fn fence(
    inputs: Vec<Tensor<3>>,
    upstream: Vec<Option<Tensor<3>>>,
    also: Vec<Tensor<3>>,
) -> (Vec<Tensor<3>>, Vec<Option<Tensor<3>>>, Vec<Tensor<3>>) {
    let count = inputs.len();
    // The leaves join the inputs' graph: autodiff with their gradient-checkpointing strategy
    // (tensors of two strategies do not combine).
    let strategy = inputs
        .first()
        .and_then(Tensor::gradient_checkpointing_strategy);
    let present: Vec<bool> = upstream.iter().map(Option::is_some).collect();
    let values = inputs
        .into_iter()
        .map(|x| x.inner())
        .chain(upstream.into_iter().flatten())
        .chain(also.into_iter().map(|x| x.inner()))
        .collect();
    let mut fenced = collective::optimization_barrier(values).into_iter();
    let leaves = fenced
        .by_ref()
        .take(count)
        .map(|x| {
            let x = x.autodiff();
            match strategy {
                Some(strategy) => x.with_gradient_checkpointing_strategy(strategy),
                None => x,
            }
            .require_grad()
        })
        .collect();
    let gradients = present
        .into_iter()
        .map(|present| if present { fenced.next() } else { None })
        .collect();
    (leaves, gradients, fenced.collect())
}

/// Backpropagates the gradients `upstream` of `outputs` (a graph from `leaves` and `model`'s
/// parameters): adds the parameters' gradients to `gradients` and returns the leaves'.
///
/// The leaves' gradients leave through one optimization barrier together with the parameters'
/// gradients, so the next stage back cannot start before this stage's parameter gradients are
/// computed: a compiler would otherwise be free to postpone every weight gradient to the end of
/// the step and keep each stage's activations alive until then.
pub(crate) fn backpropagate<M: Module>(
    model: &M,
    outputs: Vec<Tensor<3>>,
    upstream: Vec<Option<Tensor<3>>>,
    leaves: &[Tensor<3>],
    gradients: &mut GradientsParams,
) -> Vec<Option<Tensor<3>>> {
    // The sum of each output times its (constant) gradient has exactly those gradients.
    let surrogate = outputs
        .into_iter()
        .zip(upstream)
        .filter_map(|(output, grad)| grad.map(|grad| (output * grad).sum()))
        .reduce(|total, part| total + part);
    // Nothing to propagate when no output depends on a trained parameter (the frozen embedding
    // under LoRA, say).
    let Some(surrogate) = surrogate.filter(Tensor::is_tracked) else {
        return leaves.iter().map(|_| None).collect();
    };
    let mut grads = surrogate.backward();
    let inputs = leaves
        .iter()
        .map(|leaf| leaf.grad_remove(&mut grads))
        .collect();
    collect(model, &mut grads, gradients, inputs)
}

/// Moves the gradients of `model`'s parameters from one backward pass into `gradients`, adding
/// them to those already there, and returns `inputs`, fenced together with them.
pub(crate) fn collect<M: Module>(
    model: &M,
    grads: &mut Gradients,
    gradients: &mut GradientsParams,
    inputs: Vec<Option<Tensor<3>>>,
) -> Vec<Option<Tensor<3>>> {
    /// Takes each parameter's gradient out, flattened to `[1, 1, n]`, in visiting order.
    struct Take {
        part: GradientsParams,
        ids: Vec<ParamId>,
        taken: Vec<Tensor<3>>,
    }
    impl ModuleVisitor for Take {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(grad) = self.part.remove::<D>(param.id) {
                let elements = grad.shape().num_elements();
                self.ids.push(param.id);
                self.taken.push(grad.reshape([1, 1, elements]));
            }
        }
    }
    /// Adds the fenced gradients, in their parameters' shapes, to the totals.
    struct Add<'a> {
        ids: std::iter::Peekable<std::vec::IntoIter<ParamId>>,
        fenced: std::vec::IntoIter<Tensor<3>>,
        total: &'a mut GradientsParams,
    }
    impl ModuleVisitor for Add<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if self.ids.next_if_eq(&param.id).is_none() {
                return;
            }
            let part: Tensor<D> = self
                .fenced
                .next()
                .expect("one fenced gradient per taken one")
                .reshape(param.shape());
            let sum = match self.total.remove::<D>(param.id) {
                Some(total) => total + part,
                None => part,
            };
            self.total.register(param.id, sum);
        }
    }

    let mut take = Take {
        part: GradientsParams::from_module(grads, model),
        ids: Vec::new(),
        taken: Vec::new(),
    };
    model.visit(&mut take);
    let present: Vec<bool> = inputs.iter().map(Option::is_some).collect();
    let count = take.taken.len();
    let mut fenced = collective::optimization_barrier(
        take.taken
            .into_iter()
            .chain(inputs.into_iter().flatten())
            .collect(),
    );
    let mut fenced_inputs = fenced.split_off(count).into_iter();
    model.visit(&mut Add {
        ids: take.ids.into_iter().peekable(),
        fenced: fenced.into_iter(),
        total: gradients,
    });
    present
        .into_iter()
        .map(|present| if present { fenced_inputs.next() } else { None })
        .collect()
}

/// `[batch, heads, seq, head_dim]` as `[batch · heads, seq, head_dim]`.
fn flatten(t: Tensor<4>) -> Tensor<3> {
    let [batch, heads, seq, head_dim] = t.dims();
    t.reshape([batch * heads, seq, head_dim])
}

/// The inverse of [`flatten`] for `heads` heads.
fn unflatten(t: Tensor<3>, heads: usize) -> Tensor<4> {
    let [rows, seq, head_dim] = t.dims();
    t.reshape([rows / heads, heads, seq, head_dim])
}

/// The `N` tensors of a stage's inputs.
fn take<T, const N: usize>(inputs: Vec<T>) -> [T; N] {
    inputs
        .try_into()
        .unwrap_or_else(|inputs: Vec<_>| panic!("a stage of {N} inputs got {}", inputs.len()))
}

/// The `N` gradients of `gradients`, every one present.
fn take_present<T, const N: usize>(gradients: Vec<Option<T>>) -> [T; N] {
    take(
        gradients
            .into_iter()
            .map(|gradient| gradient.expect("a gradient passed in present"))
            .collect(),
    )
}
