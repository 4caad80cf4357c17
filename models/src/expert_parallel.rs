//! Expert parallelism of a mixture, as NeuronX Distributed and Megatron-LM lay it out: the
//! experts of each sparse layer are split over the ranks of an expert-parallel group (rank `k`
//! of `n` holds experts `k·E/n .. (k+1)·E/n`), each rank routes its own tokens, and the tokens
//! travel to the experts that hold them and back inside the program:
//!
//! - **dropless** (exact, every expert sees every token of the group): the group's tokens are
//!   gathered on every rank, an all-to-all brings each rank the routing weights of its experts,
//!   each rank applies its experts, and the partial outputs are reduce-scattered back to the
//!   ranks that own the tokens;
//! - **under a capacity factor**: each rank dispatches its tokens into `[experts, capacity,
//!   hidden]` slots as GShard does (its own tokens are GShard's group), an all-to-all sends each
//!   rank the slots of its experts, and a second all-to-all brings the outputs home.
//!
//! The gradient of an expert's weights is then the sum over the whole group's tokens; the
//! router, replicated, gets the gradient of its own rank's tokens, as under data parallelism.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Bool, Int, Tensor};
use burn_trainium::collective::{self, ReplicaGroups};

use crate::lora::{GateUpLora, Lora};
use crate::mlp::Mlp;
use crate::moe::{SparseMoe, dispatch_slots};
use crate::parallel::Exchange;

/// The expert-parallel groups a mixture's experts are split over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertParallel {
    /// The ranks that hold one whole set of experts between them, in expert order.
    pub groups: ReplicaGroups,
}

impl ExpertParallel {
    /// The expert-parallel degree: the ranks the experts are split over.
    pub fn degree(&self) -> usize {
        self.groups.group_size()
    }

    /// Checks that `num_experts` experts split evenly over the degree.
    pub fn check(&self, num_experts: usize) -> Result<(), String> {
        let degree = self.degree();
        if degree == 0 || !num_experts.is_multiple_of(degree) {
            return Err(format!(
                "num_experts = {num_experts} does not divide by the expert-parallel degree \
                 {degree}"
            ));
        }
        Ok(())
    }
}

impl SparseMoe {
    /// Keeps this rank's experts of a mixture whose replicas are identical: slot `i` of rank `k`
    /// holds expert `k·E/n + i`. Split for training as it is: each kept parameter is a leaf that
    /// requires a gradient as the parameter did. The router and the shared expert stay whole.
    ///
    /// # Panics
    /// When the experts do not divide by the degree ([`ExpertParallel::check`]).
    pub fn split_experts(mut self, parallel: &ExpertParallel) -> Self {
        if let Err(reason) = parallel.check(self.experts.len()) {
            panic!("{reason}");
        }
        let local = self.experts.len() / parallel.degree();
        let mut experts: Vec<Option<Mlp>> = self.experts.into_iter().map(Some).collect();
        self.experts = (0..local)
            .map(|slot| {
                let candidates = (0..parallel.degree())
                    .map(|rank| experts[rank * local + slot].take().expect("taken once"))
                    .collect();
                pick_expert(candidates, &parallel.groups)
            })
            .collect();
        self.expert_parallel = Some(parallel.clone());
        self
    }

    /// The whole set of experts on every rank again (the inverse of [`SparseMoe::split_experts`]):
    /// what a checkpoint writes. The experts of slot `i` keep its parameter ids on rank 0's
    /// expert and take fresh ids on the others.
    pub fn join_experts(mut self) -> Self {
        let Some(parallel) = self.expert_parallel.take() else {
            return self;
        };
        let degree = parallel.degree();
        let local = self.experts.len();
        let mut joined: Vec<Option<Mlp>> = (0..local * degree).map(|_| None).collect();
        for (slot, expert) in self.experts.into_iter().enumerate() {
            for (rank, whole) in gather_expert(expert, &parallel.groups, degree)
                .into_iter()
                .enumerate()
            {
                joined[rank * local + slot] = Some(whole);
            }
        }
        self.experts = joined
            .into_iter()
            .map(|expert| expert.expect("every slot of every rank"))
            .collect();
        self
    }

    /// The dropless mixture of this rank's experts over the tokens `x` `[batch, seq, hidden]`
    /// of every rank of the group, weighted by `weights` `[tokens, experts]` (this rank's
    /// tokens, every expert).
    pub(crate) fn dropless_expert_parallel(
        &self,
        x: Tensor<3>,
        weights: Tensor<2>,
        parallel: &ExpertParallel,
        exchange: &dyn Exchange,
    ) -> Tensor<3> {
        let groups = &parallel.groups;
        let everyone = collective::all_gather(x, 0, groups);
        // This rank's experts' weights for the tokens of every rank: block `k` of each rank's
        // weights (the columns of rank `k`'s experts) goes to rank `k`. (A gather then a split
        // would count the weights' gradient once per rank.)
        let [tokens, _] = weights.dims();
        let (degree, local) = (parallel.degree(), self.experts.len());
        let blocks = weights
            .reshape([tokens, degree, local])
            .swap_dims(0, 1)
            .reshape([degree * tokens, local]);
        let weights = collective::all_to_all(blocks, 0, groups);
        let partial = self.dropless(everyone, weights, exchange);
        collective::reduce_scatter(partial, 0, groups)
    }

    /// [`SparseMoe::with_capacity`] with this rank's experts: `tokens` `[tokens, hidden]` and
    /// `weights` `[tokens, experts]` are this rank's, `picks` its router's rounds.
    pub(crate) fn with_capacity_expert_parallel(
        &self,
        tokens: Tensor<2>,
        weights: Tensor<2>,
        picks: &[Tensor<2, Bool>],
        capacity: usize,
        parallel: &ExpertParallel,
        exchange: &dyn Exchange,
    ) -> Tensor<2> {
        let [count, hidden] = tokens.dims();
        let device = tokens.device();
        let (degree, local) = (parallel.degree(), self.experts.len());
        let experts = degree * local;
        let (slots, kept) = dispatch_slots(picks, capacity);
        let weights = weights.mask_fill(kept.bool_not(), 0.0);
        // Row `count` is zeros: the empty slots read it and what they add back lands there.
        let padded = Tensor::cat(vec![tokens, Tensor::zeros([1, hidden], &device)], 0);
        let padded_weights = Tensor::cat(vec![weights, Tensor::zeros([1, experts], &device)], 0);
        let dispatched = padded
            .clone()
            .select(0, slots.clone().reshape([experts * capacity]))
            .reshape([experts, capacity, hidden]);
        // Block `k` of what arrives is rank `k`'s slots of this rank's experts.
        let arrived = collective::all_to_all(dispatched, 0, &parallel.groups)
            .reshape([degree, local, capacity, hidden]);
        let outputs = self
            .experts
            .iter()
            .enumerate()
            .map(|(slot, expert)| {
                let inputs =
                    arrived
                        .clone()
                        .narrow(1, slot, 1)
                        .reshape([1, degree * capacity, hidden]);
                expert
                    .partial(inputs, exchange)
                    .reshape([degree, 1, capacity, hidden])
            })
            .collect();
        // Block `k` goes back to rank `k`; what comes back is every expert's output on this
        // rank's slots, in expert order.
        let returned = collective::all_to_all(
            Tensor::cat(outputs, 1).reshape([experts, capacity, hidden]),
            0,
            &parallel.groups,
        );
        let mut output = padded.zeros_like();
        for expert in 0..experts {
            let rows: Tensor<1, Int> = slots.clone().narrow(0, expert, 1).reshape([capacity]);
            let weight = padded_weights
                .clone()
                .select(0, rows.clone())
                .narrow(1, expert, 1);
            let outputs = returned
                .clone()
                .narrow(0, expert, 1)
                .reshape([capacity, hidden]);
            output = output.select_assign(
                0,
                rows,
                outputs * weight,
                burn::tensor::IndexingUpdateOp::Add,
            );
        }
        output.narrow(0, 0, count)
    }
}

/// The expert of this rank's position in its group among `candidates` (one per rank, in group
/// order), parameter by parameter.
fn pick_expert(candidates: Vec<Mlp>, groups: &ReplicaGroups) -> Mlp {
    let mut candidates = candidates.into_iter();
    let first = candidates.next().expect("a group has a member");
    let others: Vec<Mlp> = candidates.collect();
    let linears = |pick: fn(&Mlp) -> &Linear| -> Vec<Linear> {
        others.iter().map(|other| pick(other).clone()).collect()
    };
    let (gates, ups, downs) = (
        linears(|mlp| &mlp.gate_proj),
        linears(|mlp| &mlp.up_proj),
        linears(|mlp| &mlp.down_proj),
    );
    // Every expert of a model carries the same adapters (`Hlat::with_lora`).
    let values =
        |pick: &dyn Fn(&Mlp) -> Tensor<2>| -> Vec<Tensor<2>> { others.iter().map(pick).collect() };
    let gate_up_lora = first.gate_up_lora.map(|lora| {
        let of = |mlp: &Mlp| {
            mlp.gate_up_lora
                .clone()
                .expect("the same adapters on every expert")
        };
        GateUpLora {
            lora_a: pick_param(lora.lora_a, values(&|mlp| of(mlp).lora_a.val()), groups),
            lora_b_gate: pick_param(
                lora.lora_b_gate,
                values(&|mlp| of(mlp).lora_b_gate.val()),
                groups,
            ),
            lora_b_up: pick_param(
                lora.lora_b_up,
                values(&|mlp| of(mlp).lora_b_up.val()),
                groups,
            ),
            ..lora
        }
    });
    let down_lora = first.down_lora.map(|lora| {
        let of = |mlp: &Mlp| {
            mlp.down_lora
                .clone()
                .expect("the same adapters on every expert")
        };
        Lora {
            lora_a: pick_param(lora.lora_a, values(&|mlp| of(mlp).lora_a.val()), groups),
            lora_b: pick_param(lora.lora_b, values(&|mlp| of(mlp).lora_b.val()), groups),
            ..lora
        }
    });
    Mlp {
        gate_proj: pick_linear(first.gate_proj, gates, groups),
        up_proj: pick_linear(first.up_proj, ups, groups),
        down_proj: pick_linear(first.down_proj, downs, groups),
        gate_up_lora,
        down_lora,
        ..first
    }
}

/// `first`'s parameters (ids kept) with this rank's value among `first` and `others`.
fn pick_linear(first: Linear, others: Vec<Linear>, groups: &ReplicaGroups) -> Linear {
    let weights = others.iter().map(|other| other.weight.val()).collect();
    let biases: Option<Vec<Tensor<1>>> = others
        .iter()
        .map(|other| other.bias.as_ref().map(Param::val))
        .collect();
    Linear {
        weight: pick_param(first.weight, weights, groups),
        bias: first
            .bias
            .zip(biases)
            .map(|(bias, others)| pick_param(bias, others, groups)),
    }
}

/// `param` (id kept, a new leaf requiring a gradient when it did) holding the value of this
/// rank's position among `param`'s value and `others`.
fn pick_param<const D: usize>(
    param: Param<Tensor<D>>,
    others: Vec<Tensor<D>>,
    groups: &ReplicaGroups,
) -> Param<Tensor<D>> {
    let require_grad = param.val().is_require_grad();
    let (id, tensor, mapper) = param.consume();
    let mut values = vec![tensor];
    values.extend(others);
    let picked = collective::split(Tensor::cat(values, 0), 0, groups);
    Param::from_mapped_value(id, picked.detach().set_require_grad(require_grad), mapper)
}

/// The `degree` experts whose slot `expert` holds on the ranks of its group, on every rank.
fn gather_expert(expert: Mlp, groups: &ReplicaGroups, degree: usize) -> Vec<Mlp> {
    let gate = gather_linear(expert.gate_proj.clone(), groups, degree);
    let up = gather_linear(expert.up_proj.clone(), groups, degree);
    let down = gather_linear(expert.down_proj.clone(), groups, degree);
    let gate_up_lora: Vec<Option<GateUpLora>> = match expert.gate_up_lora {
        Some(lora) => {
            let a = gather_param(lora.lora_a, groups, degree);
            let b_gate = gather_param(lora.lora_b_gate, groups, degree);
            let b_up = gather_param(lora.lora_b_up, groups, degree);
            a.into_iter()
                .zip(b_gate)
                .zip(b_up)
                .map(|((lora_a, lora_b_gate), lora_b_up)| {
                    Some(GateUpLora {
                        lora_a,
                        lora_b_gate,
                        lora_b_up,
                        scaling: lora.scaling,
                    })
                })
                .collect()
        }
        None => vec![None; degree],
    };
    let down_lora: Vec<Option<Lora>> = match expert.down_lora {
        Some(lora) => {
            let a = gather_param(lora.lora_a, groups, degree);
            let b = gather_param(lora.lora_b, groups, degree);
            a.into_iter()
                .zip(b)
                .map(|(lora_a, lora_b)| {
                    Some(Lora {
                        lora_a,
                        lora_b,
                        dropout: lora.dropout.clone(),
                        scaling: lora.scaling,
                    })
                })
                .collect()
        }
        None => vec![None; degree],
    };
    gate.into_iter()
        .zip(up)
        .zip(down)
        .zip(gate_up_lora.into_iter().zip(down_lora))
        .map(
            |(((gate_proj, up_proj), down_proj), (gate_up_lora, down_lora))| Mlp {
                gate_proj,
                up_proj,
                down_proj,
                gate_lora: None,
                up_lora: None,
                down_lora,
                gate_up_lora,
            },
        )
        .collect()
}

/// The `degree` values of `linear` on the ranks of its group, as linears (the first keeps the
/// parameter ids).
fn gather_linear(linear: Linear, groups: &ReplicaGroups, degree: usize) -> Vec<Linear> {
    let weights = gather_param(linear.weight, groups, degree);
    let biases = match linear.bias {
        Some(bias) => gather_param(bias, groups, degree)
            .into_iter()
            .map(Some)
            .collect(),
        None => vec![None; degree],
    };
    weights
        .into_iter()
        .zip(biases)
        .map(|(weight, bias)| Linear { weight, bias })
        .collect()
}

/// `param`'s value on each rank of its group, in group order, as parameters (the first keeps
/// its id).
fn gather_param<const D: usize>(
    param: Param<Tensor<D>>,
    groups: &ReplicaGroups,
    degree: usize,
) -> Vec<Param<Tensor<D>>> {
    let require_grad = param.val().is_require_grad();
    let (id, tensor, mapper) = param.consume();
    let rows = tensor.dims()[0];
    let gathered = collective::all_gather(tensor, 0, groups).detach();
    (0..degree)
        .map(|rank| {
            let value = gathered
                .clone()
                .narrow(0, rank * rows, rows)
                .set_require_grad(require_grad);
            match rank {
                0 => Param::from_mapped_value(id, value, mapper.clone()),
                _ => Param::initialized(burn::module::ParamId::new(), value),
            }
        })
        .collect()
}

impl crate::Hlat {
    /// Splits the experts of every sparse layer over `parallel`'s groups
    /// ([`SparseMoe::split_experts`]); a dense model is unchanged.
    pub fn split_experts(mut self, parallel: &ExpertParallel) -> Self {
        for layer in &mut self.layers {
            layer.moe = layer.moe.take().map(|moe| moe.split_experts(parallel));
        }
        self
    }

    /// Every sparse layer's whole set of experts on every rank again
    /// ([`SparseMoe::join_experts`]).
    pub fn join_experts(mut self) -> Self {
        for layer in &mut self.layers {
            layer.moe = layer.moe.take().map(SparseMoe::join_experts);
        }
        self
    }

    /// The groups the experts are split over, when they are.
    pub fn expert_parallel(&self) -> Option<&ExpertParallel> {
        self.layers
            .iter()
            .find_map(|layer| layer.moe.as_ref()?.expert_parallel.as_ref())
    }
}

/// Where a parameter path (`layers.3.moe.experts.5.gate_proj.weight`, as
/// [`crate::parallel::ParamPath`] names it) names an expert: the index of the expert's number in
/// `names`, and the number. `None` for every other parameter (the router, a shared expert).
pub fn expert_of(names: &[String]) -> Option<(usize, usize)> {
    names
        .windows(3)
        .position(|window| window[0] == "moe" && window[1] == "experts")
        .and_then(|at| Some((at + 2, names[at + 2].parse().ok()?)))
}
