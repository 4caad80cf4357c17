//! Mixture-of-experts feed-forward layers (Mixtral, Qwen2-MoE, Qwen3-MoE): [`MoeConfig`], the
//! router's top-k choice and [`SparseMoe`], computed dropless with static shapes.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::activation::{sigmoid, softmax};
use burn::tensor::{Bool, DType, Device, IndexingUpdateOp, Int, Tensor};
use serde::{Deserialize, Serialize};

use crate::config::HlatConfig;
use crate::expert_parallel::ExpertParallel;
use crate::linear::projection;
use crate::mlp::Mlp;
use crate::parallel::Exchange;

/// The mixture of experts of a decoder's sparse layers, as transformers' Mixtral, Qwen2-MoE and
/// Qwen3-MoE configurations state it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    /// Experts of each sparse layer (`num_local_experts`, `num_experts`).
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub experts_per_token: usize,
    /// Inner width of one expert's SwiGLU network (`moe_intermediate_size`; Mixtral's
    /// `intermediate_size`).
    pub expert_ffn_size: usize,
    /// Whether the chosen experts' probabilities are divided by their sum (`norm_topk_prob`;
    /// Mixtral always does).
    pub normalize_top_k: bool,
    /// Inner width of the expert every token also goes through, scaled by a sigmoid gate
    /// (Qwen2-MoE's `shared_expert_intermediate_size`); `None`: no shared expert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_ffn_size: Option<usize>,
    /// Every `sparse_step`-th layer is sparse (`decoder_sparse_step`: layer `i` when
    /// `(i + 1) % sparse_step == 0`), the others dense.
    #[serde(default = "one")]
    pub sparse_step: usize,
    /// Layers that stay dense whatever `sparse_step` says (`mlp_only_layers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dense_layers: Vec<usize>,
    /// Weight of the load-balancing loss added to the training loss (`router_aux_loss_coef`).
    pub router_aux_loss_coef: f64,
}

fn one() -> usize {
    1
}

impl MoeConfig {
    /// A mixture routed as Mixtral routes (the chosen experts' probabilities renormalised), in
    /// every layer, without a shared expert: `experts` experts of inner width `expert_ffn`,
    /// `per_token` of them per token, the load-balancing loss weighted by
    /// `router_aux_loss_coef`.
    pub fn routed(
        experts: usize,
        per_token: usize,
        expert_ffn: usize,
        router_aux_loss_coef: f64,
    ) -> Self {
        Self {
            num_experts: experts,
            experts_per_token: per_token,
            expert_ffn_size: expert_ffn,
            normalize_top_k: true,
            shared_expert_ffn_size: None,
            sparse_step: 1,
            dense_layers: Vec::new(),
            router_aux_loss_coef,
        }
    }

    /// Whether decoder layer `layer` is a mixture (transformers' rule: not in `dense_layers`, and
    /// `(layer + 1) % sparse_step == 0`).
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.dense_layers.contains(&layer) && (layer + 1).is_multiple_of(self.sparse_step.max(1))
    }

    /// Checks the sizes: `Err((field, value, reason))` names the first field a model cannot be
    /// built with.
    pub(crate) fn check(&self, num_layers: usize) -> Result<(), (&'static str, String, String)> {
        let invalid = |field: &'static str, value: usize, reason: String| {
            Err((field, value.to_string(), reason))
        };
        if self.num_experts == 0 {
            return invalid("num_experts", 0, "must be at least 1".into());
        }
        if self.experts_per_token == 0 || self.experts_per_token > self.num_experts {
            return invalid(
                "experts_per_token",
                self.experts_per_token,
                format!("must be between 1 and num_experts ({})", self.num_experts),
            );
        }
        if self.expert_ffn_size == 0 {
            return invalid("expert_ffn_size", 0, "must be at least 1".into());
        }
        if self.shared_expert_ffn_size == Some(0) {
            return invalid("shared_expert_ffn_size", 0, "must be at least 1".into());
        }
        if self.sparse_step == 0 {
            return invalid("sparse_step", 0, "must be at least 1".into());
        }
        if let Some(&layer) = self.dense_layers.iter().find(|&&layer| layer >= num_layers) {
            return invalid(
                "dense_layers",
                layer,
                format!("is not a layer of the model's {num_layers}"),
            );
        }
        if !(self.router_aux_loss_coef.is_finite() && self.router_aux_loss_coef >= 0.0) {
            return Err((
                "router_aux_loss_coef",
                self.router_aux_loss_coef.to_string(),
                "must be a finite number, zero or more".into(),
            ));
        }
        Ok(())
    }
}

/// A sparse feed-forward layer: a router (`hidden -> experts`, no bias) picks each token's
/// `experts_per_token` experts by softmax probability; the token's output is the chosen experts'
/// SwiGLU outputs weighted by those probabilities (renormalised when the family says so), plus a
/// shared expert scaled by `sigmoid(shared_expert_gate(x))` where the family has one (Qwen2-MoE).
///
/// Computed dropless with static shapes: every expert runs on every token and the weights of the
/// experts a token did not choose are zero, so the program is the same whatever the routing
/// (`experts / experts_per_token` times the FLOPs of routed computation).
#[derive(Module, Debug)]
pub struct SparseMoe {
    /// The router `hidden -> num_experts` (transformers' `gate`).
    pub router: Linear,
    /// The experts, each a SwiGLU network of width `expert_ffn_size`.
    pub experts: Vec<Mlp>,
    /// The expert every token goes through (Qwen2-MoE's `shared_expert`).
    pub shared_expert: Option<Mlp>,
    /// The shared expert's gate `hidden -> 1` (Qwen2-MoE's `shared_expert_gate`).
    pub shared_expert_gate: Option<Linear>,
    /// Experts each token is routed to.
    pub experts_per_token: usize,
    /// Whether the chosen probabilities are renormalised to sum to one.
    #[module(skip)]
    pub normalize_top_k: bool,
    /// Tokens each expert takes, as a multiple of its even share (`tokens · k / experts`); the
    /// assignments past it are dropped as GShard drops them. `None`: dropless.
    #[module(skip)]
    pub capacity_factor: Option<f64>,
    /// The groups this layer's experts are split over ([`SparseMoe::split_experts`]): `experts`
    /// holds this rank's. `None`: every expert is here.
    #[module(skip)]
    pub expert_parallel: Option<ExpertParallel>,
}

impl SparseMoe {
    /// A freshly initialised mixture of `moe`'s sizes.
    pub fn new(config: &HlatConfig, moe: &MoeConfig, device: &Device) -> Self {
        let hidden = config.hidden_size;
        Self {
            router: projection(config, hidden, moe.num_experts, false, device),
            experts: (0..moe.num_experts)
                .map(|_| Mlp::with_width(config, moe.expert_ffn_size, device))
                .collect(),
            shared_expert: moe
                .shared_expert_ffn_size
                .map(|width| Mlp::with_width(config, width, device)),
            shared_expert_gate: moe
                .shared_expert_ffn_size
                .map(|_| projection(config, hidden, 1, false, device)),
            experts_per_token: moe.experts_per_token,
            normalize_top_k: moe.normalize_top_k,
            capacity_factor: None,
            expert_parallel: None,
        }
    }

    /// Each expert's capacity for `tokens` tokens under `capacity_factor`: `ceil(factor · tokens
    /// · k / experts)`, at least 1 and at most `tokens`.
    pub fn capacity(&self, tokens: usize, capacity_factor: f64) -> usize {
        let share = tokens as f64 * self.experts_per_token as f64 / self.num_experts() as f64;
        ((capacity_factor * share).ceil() as usize).clamp(1, tokens)
    }

    /// Applies the mixture to `[batch, seq, hidden]`; returns the output and the router's logits
    /// `[batch · seq, num_experts]` (what the load-balancing loss is computed from).
    pub fn forward(&self, x: Tensor<3>, exchange: &dyn Exchange) -> (Tensor<3>, Tensor<2>) {
        let [batch, seq, hidden] = x.dims();
        let tokens = x.clone().reshape([batch * seq, hidden]);
        let logits = self.router.forward(tokens.clone());
        let probabilities = softmax(logits.clone(), 1);
        let picks = top_k_picks(probabilities.clone(), self.experts_per_token);
        let weights = routing_weights_of(probabilities, &picks, self.normalize_top_k);
        // The experts' partial products under tensor parallelism, weighted and summed over the
        // group once (Megatron's MoE layer does the same).
        let mut partial = match (self.capacity_factor, &self.expert_parallel) {
            (None, None) => self.dropless(x.clone(), weights, exchange),
            (None, Some(parallel)) => {
                self.dropless_expert_parallel(x.clone(), weights, parallel, exchange)
            }
            (Some(factor), parallel) => {
                let capacity = self.capacity(batch * seq, factor);
                let tokens = tokens.clone();
                let output = match parallel {
                    None => self.with_capacity(tokens, weights, &picks, capacity, exchange),
                    Some(parallel) => self.with_capacity_expert_parallel(
                        tokens, weights, &picks, capacity, parallel, exchange,
                    ),
                };
                output.reshape([batch, seq, hidden])
            }
        };
        if let (Some(shared), Some(gate)) = (&self.shared_expert, &self.shared_expert_gate) {
            let scale = sigmoid(gate.forward(tokens)).reshape([batch, seq, 1]);
            partial = partial + shared.partial(x, exchange) * scale;
        }
        (exchange.exit(partial), logits)
    }
}

impl SparseMoe {
    /// The experts of the whole mixture (those of every rank under expert parallelism).
    pub fn num_experts(&self) -> usize {
        self.experts.len()
            * self
                .expert_parallel
                .as_ref()
                .map_or(1, ExpertParallel::degree)
    }

    /// Every expert on every token `x` `[batch, seq, hidden]`, weighted by `weights`
    /// `[tokens, experts]` (zero where a token did not choose the expert): under tensor
    /// parallelism, this rank's partial product ([`Mlp::partial`]).
    pub fn dropless(&self, x: Tensor<3>, weights: Tensor<2>, exchange: &dyn Exchange) -> Tensor<3> {
        let [batch, seq, _] = x.dims();
        let mut output: Option<Tensor<3>> = None;
        for (index, expert) in self.experts.iter().enumerate() {
            let weight = weights.clone().narrow(1, index, 1).reshape([batch, seq, 1]);
            let contribution = expert.partial(x.clone(), exchange) * weight;
            output = Some(match output {
                Some(sum) => sum + contribution,
                None => contribution,
            });
        }
        output.expect("a mixture has at least one expert")
    }

    /// Each expert on at most `capacity` of the `tokens` `[tokens, hidden]` routed to it, as
    /// GShard dispatches them: an expert's slots go first to the tokens that chose it first, in
    /// token order, then to those that chose it second, and so on; an assignment past the
    /// capacity is dropped (the token keeps its other experts, and its residual). The tokens are
    /// gathered into `[capacity, hidden]` per expert and the weighted outputs added back at
    /// their rows: static shapes, `capacity / tokens` of the dropless expert FLOPs. Under tensor
    /// parallelism, this rank's partial product.
    pub fn with_capacity(
        &self,
        tokens: Tensor<2>,
        weights: Tensor<2>,
        picks: &[Tensor<2, Bool>],
        capacity: usize,
        exchange: &dyn Exchange,
    ) -> Tensor<2> {
        let [count, hidden] = tokens.dims();
        let device = tokens.device();
        let (slots, kept) = dispatch_slots(picks, capacity);
        let weights = weights.mask_fill(kept.clone().bool_not(), 0.0);
        // Row `count` of the padded tokens is zeros: the empty slots read it, and what they add
        // back lands there, outside the output.
        let padded = Tensor::cat(vec![tokens, Tensor::zeros([1, hidden], &device)], 0);
        let padded_weights = Tensor::cat(
            vec![weights, Tensor::zeros([1, self.experts.len()], &device)],
            0,
        );
        let mut output = padded.zeros_like();
        for (index, expert) in self.experts.iter().enumerate() {
            let rows = slots.clone().narrow(0, index, 1).reshape([capacity]);
            let gathered = padded.clone().select(0, rows.clone());
            let outputs = expert
                .partial(gathered.reshape([1, capacity, hidden]), exchange)
                .reshape([capacity, hidden]);
            let weight = padded_weights
                .clone()
                .select(0, rows.clone())
                .narrow(1, index, 1);
            output = output.select_assign(0, rows, outputs * weight, IndexingUpdateOp::Add);
        }
        output.narrow(0, 0, count)
    }
}

/// Where each expert's slots come from: `[experts, capacity]` token rows (`tokens` for an empty
/// slot), and which assignments `[tokens, experts]` fit. `picks` are the router's rounds (the
/// first choices, then the second, ...); slots are filled round by round in token order.
pub fn dispatch_slots(
    picks: &[Tensor<2, Bool>],
    capacity: usize,
) -> (Tensor<2, Int>, Tensor<2, Bool>) {
    let [count, experts] = picks[0].dims();
    let device = picks[0].device();
    let mut taken: Tensor<2> = Tensor::zeros([1, experts], &device);
    let mut kept: Option<Tensor<2, Bool>> = None;
    let mut slot: Tensor<2> = Tensor::zeros([count, experts], &device);
    for pick in picks {
        let chosen = pick.clone().float().cast(DType::F32);
        // The slot of each assignment of this round: the expert's slots taken by earlier rounds
        // plus the earlier tokens of this round.
        let position = chosen.clone().cumsum(0) - 1.0 + taken.clone();
        let fits = pick
            .clone()
            .bool_and(position.clone().lower_elem(capacity as f64));
        slot = slot + position * chosen.clone();
        taken = taken + chosen.sum_dim(0);
        kept = Some(match kept {
            Some(kept) => kept.bool_or(fits),
            None => fits,
        });
    }
    let kept = kept.expect("a token is routed to at least one expert");
    // Kept assignments write their token's row at their slot; the rest go to a spare column
    // `capacity`, cut off below. Every slot starts at `count` (the padding row).
    let rows = Tensor::<1, Int>::arange(0..count as i64, &device)
        .reshape([count, 1])
        .expand([count, experts]);
    let columns = slot
        .int()
        .mask_fill(kept.clone().bool_not(), capacity as i64)
        .transpose();
    let values = (rows - count as i64)
        .mask_fill(kept.clone().bool_not(), 0)
        .transpose();
    let slots = Tensor::<2, Int>::full([experts, capacity + 1], count as i64, &device)
        .scatter(1, columns, values, IndexingUpdateOp::Add)
        .narrow(1, 0, capacity);
    (slots, kept)
}

/// The routing weights `[tokens, experts]` of softmax `probabilities`: each row keeps its `k`
/// largest probabilities (divided by their sum when `normalize`) and is zero elsewhere. Ties go
/// to the lower expert index.
pub fn routing_weights(probabilities: Tensor<2>, k: usize, normalize: bool) -> Tensor<2> {
    let picks = top_k_picks(probabilities.clone(), k);
    routing_weights_of(probabilities, &picks, normalize)
}

/// [`routing_weights`] of the router's rounds `picks` ([`top_k_picks`]).
fn routing_weights_of(
    probabilities: Tensor<2>,
    picks: &[Tensor<2, Bool>],
    normalize: bool,
) -> Tensor<2> {
    let chosen = picks
        .iter()
        .cloned()
        .reduce(|chosen, pick| chosen.bool_or(pick))
        .expect("a token is routed to at least one expert");
    let kept = probabilities.mask_fill(chosen.bool_not(), 0.0);
    if normalize {
        let sum = kept.clone().sum_dim(1);
        kept / sum
    } else {
        kept
    }
}

/// Which `k` entries of each row of `probabilities` (values in `[0, 1]`) are its largest, as a
/// mask ([`top_k_picks`] together).
pub fn top_k_mask(probabilities: Tensor<2>, k: usize) -> Tensor<2, Bool> {
    top_k_picks(probabilities, k)
        .into_iter()
        .reduce(|chosen, pick| chosen.bool_or(pick))
        .expect("a token is routed to at least one expert")
}

/// The `k` rounds of a row's first maximum, each taken out before the next: round `r` marks each
/// row's `r`-th largest entry of `probabilities` (values in `[0, 1]`; ties to the lower index).
/// Static shapes, argmax and comparisons only, so every device runs it in one program.
pub fn top_k_picks(probabilities: Tensor<2>, k: usize) -> Vec<Tensor<2, Bool>> {
    let [tokens, experts] = probabilities.dims();
    let device = probabilities.device();
    let columns = Tensor::<1, Int>::arange(0..experts as i64, &device)
        .reshape([1, experts])
        .expand([tokens, experts]);
    let mut remaining = probabilities;
    (0..k)
        .map(|_| {
            let best = remaining.clone().argmax(1).expand([tokens, experts]);
            let pick = columns.clone().equal(best);
            // Below every probability: a taken entry is never the maximum again.
            remaining = remaining.clone().mask_fill(pick.clone(), -1.0);
            pick
        })
        .collect()
}

/// The load-balancing loss of a step's routers, as transformers' `load_balancing_loss_func`
/// computes it without an attention mask (Switch Transformer, eqs. 4–6): over every router's
/// rows together, the fraction of top-`k` choices each expert received times its mean routing
/// probability, summed over the experts and multiplied by their number. Only the probabilities
/// take gradients (the choices are counts). `None` when there is no router.
pub fn load_balancing_loss(router_logits: &[Tensor<2>], k: usize) -> Option<Tensor<1>> {
    let (choices, probabilities, rows) = router_statistics(router_logits, k)?;
    Some(balance_of(choices, probabilities, rows))
}

/// Over routers' `logits` (`[rows, experts]` each), the top-`k` choices each expert received
/// (f32 counts, without graph), its summed routing probabilities (f32, with graph), both
/// `[experts]`, and the rows routed; each router's softmax computed once. `None` without any
/// router.
pub fn router_statistics(
    router_logits: &[Tensor<2>],
    k: usize,
) -> Option<(Tensor<1>, Tensor<1>, usize)> {
    let mut rows = 0;
    let mut totals: Option<(Tensor<1>, Tensor<1>)> = None;
    for logits in router_logits {
        rows += logits.dims()[0];
        let probability = softmax(logits.clone().cast(DType::F32), 1);
        let chosen = top_k_mask(probability.clone().detach(), k)
            .float()
            .cast(DType::F32)
            .sum_dim(0)
            .reshape([-1]);
        let summed = probability.sum_dim(0).reshape([-1]);
        totals = Some(match totals {
            Some((choices, probabilities)) => (choices + chosen, probabilities + summed),
            None => (chosen, summed),
        });
    }
    totals.map(|(choices, probabilities)| (choices, probabilities, rows))
}

/// The summed routing probabilities of each expert over a router's `logits` `[rows, experts]`,
/// in f32 `[experts]` (with graph).
pub fn router_probabilities(logits: Tensor<2>) -> Tensor<1> {
    softmax(logits.cast(DType::F32), 1).sum_dim(0).reshape([-1])
}

/// The part of the load-balancing loss that `router_logits` (some of a step's routers) add to
/// it, given the choices `[experts]` of all the step's routers and their rows: the loss is
/// linear in the probabilities once the choices are counted, so the parts of disjoint sets of
/// routers (the layers of pipeline stages) add up to [`load_balancing_loss`]. `None` when
/// `router_logits` is empty.
pub fn load_balancing_part(
    router_logits: &[Tensor<2>],
    choices: Tensor<1>,
    rows: usize,
) -> Option<Tensor<1>> {
    let probabilities = router_logits
        .iter()
        .map(|logits| router_probabilities(logits.clone()))
        .reduce(|total, part| total + part)?;
    Some(balance_of(choices, probabilities, rows))
}

/// The load-balancing loss of the experts' choices and summed probabilities `[experts]` over
/// `rows` routed rows: `E · Σ_e (choices_e / rows) · (probabilities_e / rows)`.
pub fn balance_of(choices: Tensor<1>, probabilities: Tensor<1>, rows: usize) -> Tensor<1> {
    let [experts] = probabilities.dims();
    let rows = rows as f64;
    (choices.div_scalar(rows) * probabilities.div_scalar(rows))
        .sum()
        .mul_scalar(experts as f64)
}

#[cfg(test)]
mod tests {
    use burn::tensor::TensorData;

    use super::*;
    use crate::parallel::Unsharded;

    fn matrix(values: Vec<f32>, rows: usize) -> Tensor<2> {
        let columns = values.len() / rows;
        Tensor::from_data(TensorData::new(values, [rows, columns]), &Device::flex())
    }

    fn values(tensor: Tensor<2>) -> Vec<f32> {
        tensor.into_data().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn routing_keeps_the_k_largest_and_breaks_ties_towards_the_lower_expert() {
        let probabilities = matrix(vec![0.1, 0.4, 0.2, 0.3, 0.25, 0.25, 0.25, 0.25], 2);
        let kept = values(routing_weights(probabilities.clone(), 2, false));
        assert_eq!(kept, vec![0.0, 0.4, 0.0, 0.3, 0.25, 0.25, 0.0, 0.0]);
        let normalized = values(routing_weights(probabilities, 2, true));
        let expected = [0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7, 0.5, 0.5, 0.0, 0.0];
        for (found, expected) in normalized.iter().zip(expected) {
            assert!((found - expected).abs() < 1e-6, "{normalized:?}");
        }
    }

    #[test]
    fn sparse_layers_follow_transformers_rule() {
        let moe = MoeConfig {
            num_experts: 4,
            experts_per_token: 2,
            expert_ffn_size: 8,
            normalize_top_k: false,
            shared_expert_ffn_size: None,
            sparse_step: 2,
            dense_layers: vec![3],
            router_aux_loss_coef: 0.01,
        };
        let sparse: Vec<usize> = (0..6).filter(|&layer| moe.is_sparse(layer)).collect();
        assert_eq!(sparse, vec![1, 5]);
        assert_eq!(moe.check(6), Ok(()));
        let too_many = MoeConfig {
            experts_per_token: 5,
            ..moe.clone()
        };
        assert_eq!(too_many.check(6).unwrap_err().0, "experts_per_token");
        assert_eq!(moe.check(3).unwrap_err().0, "dense_layers");
    }

    /// The capacity path equals the dropless one with the dropped assignments' weights zeroed,
    /// where which assignments are dropped is worked out here by GShard's rule (slots filled
    /// round by round, in token order, up to the capacity), and equals it outright when nothing
    /// is dropped. Its gradients reach the router and the experts.
    #[test]
    fn the_capacity_factor_drops_as_gshard_does() {
        let device = Device::flex().autodiff();
        let config = HlatConfig {
            init_std: 0.5,
            ..HlatConfig::preset("hlat-test").unwrap()
        };
        let moe = MoeConfig::routed(4, 2, 8, 0.0);
        let mut layer = SparseMoe::new(&config, &moe, &device);
        let (count, hidden) = (10, config.hidden_size);
        let values: Vec<f32> = (0..count * hidden)
            .map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * 1.5)
            .collect();
        let x = Tensor::<3>::from_data(TensorData::new(values, [1, count, hidden]), &device);
        let tokens = x.clone().reshape([count, hidden]);
        let probabilities = softmax(layer.router.forward(tokens.clone()), 1);
        let picks = top_k_picks(probabilities.clone(), 2);
        let weights = routing_weights_of(probabilities, &picks, true);
        let read = |tensor: Tensor<2>| tensor.into_data().try_to_vec::<f32>().unwrap();
        let dropless = read(
            layer
                .dropless(x.clone(), weights.clone(), &Unsharded)
                .reshape([count, hidden]),
        );

        // Nothing dropped: the same output.
        layer.capacity_factor = Some(4.0);
        assert_eq!(layer.capacity(count, 4.0), count);
        let (whole, _) = layer.forward(x.clone(), &Unsharded);
        for (a, b) in read(whole.reshape([count, hidden])).iter().zip(&dropless) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }

        // Capacity 3 of an even share of 5: GShard's rule by hand.
        let capacity = layer.capacity(count, 0.5);
        assert_eq!(capacity, 3);
        let rounds: Vec<Vec<bool>> = picks
            .iter()
            .map(|pick| pick.clone().into_data().iter::<bool>().collect())
            .collect();
        let mut taken = [0usize; 4];
        let mut kept = vec![false; count * 4];
        for round in &rounds {
            for token in 0..count {
                for expert in 0..4 {
                    if round[token * 4 + expert] {
                        kept[token * 4 + expert] = taken[expert] < capacity;
                        taken[expert] += 1;
                    }
                }
            }
        }
        assert!(
            taken.iter().any(|&routed| routed > capacity),
            "{taken:?}: nothing dropped"
        );
        let kept = Tensor::<2, Bool>::from_data(TensorData::new(kept, [count, 4]), &device);
        let expected = read(
            layer
                .dropless(
                    x.clone(),
                    weights.clone().mask_fill(kept.bool_not(), 0.0),
                    &Unsharded,
                )
                .reshape([count, hidden]),
        );
        let output = layer.with_capacity(tokens, weights, &picks, capacity, &Unsharded);
        let found = read(output.clone());
        for (index, (a, b)) in found.iter().zip(&expected).enumerate() {
            assert!((a - b).abs() < 1e-5, "element {index}: {a} vs {b}");
        }
        let gradients = output.sum().backward();
        assert!(layer.router.weight.grad(&gradients).is_some());
        assert!(layer.experts[0].gate_proj.weight.grad(&gradients).is_some());
    }

    /// Uniform logits: every probability is 1/E and each row chooses k experts, so the loss is
    /// `E · Σ_e (count_e / rows) · (1 / E) = k`, whatever the rows and layers.
    #[test]
    fn the_load_balancing_loss_of_uniform_routers_is_k() {
        let layers = [matrix(vec![0.0; 3 * 4], 3), matrix(vec![1.5; 5 * 4], 5)];
        let loss = load_balancing_loss(&layers, 2).unwrap();
        let loss = loss.into_data().try_to_vec::<f32>().unwrap()[0];
        assert!((loss - 2.0).abs() < 1e-6, "{loss}");
        assert!(load_balancing_loss(&[], 2).is_none());
    }

    /// One row routed to experts 0 and 1 of 3 with probabilities p: the loss is
    /// `3 · (p0 + p1) / 1`.
    #[test]
    fn the_load_balancing_loss_follows_the_closed_form() {
        let logits = [1.0f32, 0.5, -1.0];
        let total: f32 = logits.iter().map(|x| x.exp()).sum();
        let p: Vec<f32> = logits.iter().map(|x| x.exp() / total).collect();
        let loss = load_balancing_loss(&[matrix(logits.to_vec(), 1)], 2).unwrap();
        let loss = loss.into_data().try_to_vec::<f32>().unwrap()[0];
        let expected = 3.0 * (p[0] + p[1]);
        assert!((loss - expected).abs() < 1e-6, "{loss} vs {expected}");
    }
}
