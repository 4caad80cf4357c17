//! Tensor and sequence parallelism of HLAT, in the layout of Megatron-LM and NeuronX Distributed.
//!
//! With a tensor-parallel degree `t`, each rank of a tensor-parallel group holds `1/t` of every
//! large weight: the query, key, value, gate and up projections and the LM head are
//! column-parallel (their output features, hence attention heads and vocabulary, are split), the
//! output and down projections are row-parallel (their input features are split), and the token
//! embedding is vocabulary-parallel. Activations cross between the replicated and the split world
//! through an [`Exchange`]: [`Exchange::enter`] before a column-parallel layer and
//! [`Exchange::exit`] after a row-parallel one. With sequence parallelism the norms and residuals
//! work on a slice of the sequence, `enter` gathers the sequence and `exit` reduce-scatters it.
//!
//! At degree 1 ([`Unsharded`]) nothing is split and the model is today's, parameter names and all.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Bool, Device, Int, Tensor};
use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};

use crate::model::Hlat;

/// How the layers of one model replica exchange activations with the other ranks of their
/// tensor-parallel group.
pub trait Exchange {
    /// The tensor-parallel degree (1: nothing is split).
    fn degree(&self) -> usize;

    /// Activations `[batch, seq, hidden]` entering a column-parallel layer: the full input on
    /// every rank (gathered along the sequence under sequence parallelism).
    fn enter(&self, x: Tensor<3>) -> Tensor<3>;

    /// Partial results `[batch, seq, hidden]` leaving a row-parallel layer: their sum over the
    /// group (scattered along the sequence under sequence parallelism).
    fn exit(&self, y: Tensor<3>) -> Tensor<3>;

    /// The elementwise sum over the group (the vocabulary-parallel loss).
    fn sum(&self, x: Tensor<2>) -> Tensor<2>;

    /// The elementwise maximum over the group (the vocabulary-parallel loss).
    fn max(&self, x: Tensor<2>) -> Tensor<2>;

    /// The first token id of this rank's slice of a `vocab`-token vocabulary, as a float `[1]`
    /// (exact below 2^24).
    fn vocab_start(&self, vocab: usize, device: &Device) -> Tensor<1>;
}

/// `ids` (of a `local_vocab × degree`-token vocabulary) relative to the first id of this rank's
/// slice, with the mask of the ids outside the slice, which are set to 0.
pub fn local_ids<const D: usize>(
    exchange: &(impl Exchange + ?Sized),
    ids: Tensor<D, Int>,
    local_vocab: usize,
) -> (Tensor<D, Int>, Tensor<D, Bool>) {
    let start = exchange.vocab_start(local_vocab * exchange.degree(), &ids.device());
    let local = (ids.float() - start.unsqueeze::<D>()).int();
    let outside = local
        .clone()
        .lower_elem(0)
        .bool_or(local.clone().greater_equal_elem(local_vocab as i64));
    (local.mask_fill(outside.clone(), 0), outside)
}

/// Degree 1: every exchange is the identity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unsharded;

impl Exchange for Unsharded {
    fn degree(&self) -> usize {
        1
    }

    fn enter(&self, x: Tensor<3>) -> Tensor<3> {
        x
    }

    fn exit(&self, y: Tensor<3>) -> Tensor<3> {
        y
    }

    fn sum(&self, x: Tensor<2>) -> Tensor<2> {
        x
    }

    fn max(&self, x: Tensor<2>) -> Tensor<2> {
        x
    }

    fn vocab_start(&self, _vocab: usize, device: &Device) -> Tensor<1> {
        Tensor::zeros([1], device)
    }
}

/// Tensor parallelism over replica groups of a replicated device, optionally with sequence
/// parallelism.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorParallel {
    /// The tensor-parallel groups (each one model replica's ranks).
    pub groups: ReplicaGroups,
    /// Norms and residuals on slices of the sequence.
    pub sequence_parallel: bool,
}

impl Exchange for TensorParallel {
    fn degree(&self) -> usize {
        self.groups.group_size()
    }

    fn enter(&self, x: Tensor<3>) -> Tensor<3> {
        if self.sequence_parallel {
            collective::all_gather(x, 1, &self.groups)
        } else {
            collective::copy_to_group(x, &self.groups)
        }
    }

    fn exit(&self, y: Tensor<3>) -> Tensor<3> {
        if self.sequence_parallel {
            collective::reduce_scatter(y, 1, &self.groups)
        } else {
            collective::all_reduce(y, ReduceOp::Sum, &self.groups)
        }
    }

    fn sum(&self, x: Tensor<2>) -> Tensor<2> {
        collective::all_reduce(x, ReduceOp::Sum, &self.groups)
    }

    fn max(&self, x: Tensor<2>) -> Tensor<2> {
        collective::all_reduce(x, ReduceOp::Max, &self.groups)
    }

    fn vocab_start(&self, vocab: usize, device: &Device) -> Tensor<1> {
        // Each rank keeps its slice of the ids 0..vocab.
        let ids = Tensor::<1, Int>::arange(0..vocab as i64, device).float();
        collective::split(ids, 0, &self.groups).narrow(0, 0, 1)
    }
}

/// How a parameter is split across a tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Split along this dimension (Burn's `Linear` weight is `[input, output]`).
    Split(usize),
    /// A key or value projection (weight or bias) split by KV head along this dimension, each
    /// head held by `copies` consecutive ranks: when the tensor-parallel degree exceeds
    /// `num_kv_heads` (see [`kv_copies`]), rank `r` holds KV head `r / copies`.
    ReplicatedHeads {
        /// The dimension of the heads.
        dim: usize,
        /// How many consecutive ranks hold each head (at least 2).
        copies: usize,
    },
    /// The same on every rank (the norm gains).
    Replicated,
}

/// The placement of the parameter at `path` (its module names from the model down, the
/// parameter's field last: `layers.3.self_attn.q_proj.weight`) when the KV heads are split, not
/// replicated (the tensor-parallel degree divides `num_kv_heads`; else see [`placement_with`]).
/// A column-parallel layer's bias is split with its output features; a row-parallel layer's is
/// whole on every rank (added once, after the sum: see [`crate::linear::row_parallel`]), as are
/// the norms. A LoRA adapter ([`crate::lora`]) is split as its projection: `B` by output
/// features after a column-parallel one (`A` whole), `A` by input features before a
/// row-parallel one (`B` whole).
pub fn placement(path: &[String]) -> Placement {
    let parameter = path.last().map(String::as_str);
    let module = path.iter().rev().nth(1).map(String::as_str);
    let bias = parameter == Some("bias");
    match (module, parameter) {
        (Some("q_lora" | "k_lora" | "v_lora" | "gate_lora" | "up_lora"), Some("lora_b"))
        | (Some("gate_up_lora"), Some("lora_b_gate" | "lora_b_up")) => {
            return Placement::Split(1);
        }
        (Some("o_lora" | "down_lora"), Some("lora_a")) => return Placement::Split(0),
        _ => {}
    }
    match module {
        Some("embed_tokens") => Placement::Split(0),
        Some("q_proj" | "k_proj" | "v_proj" | "gate_proj" | "up_proj" | "lm_head") => {
            Placement::Split(if bias { 0 } else { 1 })
        }
        Some("o_proj" | "down_proj") if !bias => Placement::Split(0),
        _ => Placement::Replicated,
    }
}

/// The placement of the parameter at `path` in a model whose KV heads are each held by
/// `kv_copies` ranks ([`kv_copies`]; 1: split as [`placement`] says).
pub fn placement_with(path: &[String], kv_copies: usize) -> Placement {
    match placement(path) {
        Placement::Split(dim) if kv_copies > 1 && is_kv_projection(path) => {
            Placement::ReplicatedHeads {
                dim,
                copies: kv_copies,
            }
        }
        placement => placement,
    }
}

/// Whether `path` is a parameter of the key or value projection.
fn is_kv_projection(path: &[String]) -> bool {
    let module = path.iter().rev().nth(1).map(String::as_str);
    matches!(module, Some("k_proj" | "v_proj" | "k_lora" | "v_lora"))
}

/// How many ranks of a tensor-parallel group of `degree` hold each of `num_kv_heads` KV heads:
/// 1 while the degree divides the heads (each rank holds `num_kv_heads / degree` of them),
/// `degree / num_kv_heads` above them (each rank holds one, as NeuronX Distributed and
/// Megatron-LM replicate them). [`check_degree`] says which degrees are possible.
pub fn kv_copies(num_kv_heads: usize, degree: usize) -> usize {
    if degree > num_kv_heads && num_kv_heads > 0 {
        degree / num_kv_heads
    } else {
        1
    }
}

/// The groups over which KV heads held by `copies` consecutive ranks are split and joined: in
/// each tensor-parallel group `[g0, g1, …]`, the ranks `copies` apart `[g_t, g_(t+c), …]` for `t`
/// in `0..copies`, so that rank `r` of the group is at position `r / copies` of its own (it
/// holds that head), and every head appears once in each.
pub fn kv_head_groups(tensor_groups: &ReplicaGroups, copies: usize) -> ReplicaGroups {
    let groups = tensor_groups
        .groups()
        .iter()
        .flat_map(|group| {
            (0..copies)
                .map(move |first| group.iter().skip(first).step_by(copies).copied().collect())
        })
        .collect();
    ReplicaGroups::new(groups).expect("strided parts of equal groups are equal groups")
}

/// The groups of `copies` consecutive ranks of each tensor-parallel group that hold the same KV
/// head (over which its gradient is summed).
pub fn kv_copy_groups(tensor_groups: &ReplicaGroups, copies: usize) -> ReplicaGroups {
    let groups = tensor_groups
        .groups()
        .iter()
        .flat_map(|group| group.chunks(copies).map(<[usize]>::to_vec))
        .collect();
    ReplicaGroups::new(groups).expect("consecutive parts of equal groups are equal groups")
}

/// This rank's part of a whole parameter placed as `placement` over `tensor_groups`.
pub fn split_parameter<const D: usize>(
    tensor: Tensor<D>,
    placement: Placement,
    tensor_groups: &ReplicaGroups,
) -> Tensor<D> {
    match placement {
        Placement::Split(dim) => collective::split(tensor, dim, tensor_groups),
        Placement::ReplicatedHeads { dim, copies } => {
            collective::split(tensor, dim, &kv_head_groups(tensor_groups, copies))
        }
        Placement::Replicated => tensor,
    }
}

/// The whole parameter from the ranks' parts placed as `placement` over `tensor_groups` (the
/// inverse of [`split_parameter`]), on every rank.
pub fn join_parameter<const D: usize>(
    tensor: Tensor<D>,
    placement: Placement,
    tensor_groups: &ReplicaGroups,
) -> Tensor<D> {
    match placement {
        Placement::Split(dim) => collective::all_gather(tensor, dim, tensor_groups),
        Placement::ReplicatedHeads { dim, copies } => {
            collective::all_gather(tensor, dim, &kv_head_groups(tensor_groups, copies))
        }
        Placement::Replicated => tensor,
    }
}

/// Whether each tensor-parallel rank gets only its part of the gradient of the parameter at
/// `path`, which is [`Placement::Replicated`], so that the parts must be summed over the group:
/// the per-head query/key norms always (each rank norms its own heads), the other whole
/// parameters under sequence parallelism (each rank sees its slice of the sequence). (The KV
/// heads of [`Placement::ReplicatedHeads`] have partial gradients too, summed over their copies
/// only: see [`kv_copy_groups`].) The whole factor of a LoRA adapter always has a partial
/// gradient: each rank's use of it meets only its slice of the output features (`A` of a
/// column-parallel projection) or of the input features (`B` of a row-parallel one).
pub fn partial_gradient(path: &[String], sequence_parallel: bool) -> bool {
    let module = path.iter().rev().nth(1).map(String::as_str);
    let parameter = path.last().map(String::as_str);
    let adapter = matches!(parameter, Some("lora_a" | "lora_b"));
    // A mixture's router and shared-expert gate weigh the experts' partial products, summed
    // over the group once after the weighting: each rank's gradient is a part.
    let weighs_partials = matches!(module, Some("router" | "shared_expert_gate"));
    placement(path) == Placement::Replicated
        && (sequence_parallel
            || adapter
            || weighs_partials
            || matches!(module, Some("q_norm" | "k_norm")))
}

/// The module path a visitor or mapper is at.
#[derive(Debug, Clone)]
pub struct ParamPath {
    names: Vec<String>,
    kv_copies: usize,
}

impl Default for ParamPath {
    fn default() -> Self {
        Self::with_kv_copies(1)
    }
}

impl ParamPath {
    /// At the model's root, in a model whose KV heads are each held by `kv_copies` ranks
    /// ([`kv_copies`]; `default()`: 1, the heads are split).
    pub fn with_kv_copies(kv_copies: usize) -> Self {
        Self {
            names: Vec::new(),
            kv_copies: kv_copies.max(1),
        }
    }

    /// Entering the module or parameter `name`.
    pub fn enter(&mut self, name: &str) {
        self.names.push(name.to_string());
    }

    /// Leaving it.
    pub fn exit(&mut self) {
        self.names.pop();
    }

    /// The names from the model down.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Where the current parameter lives across a tensor-parallel group.
    pub fn placement(&self) -> Placement {
        placement_with(&self.names, self.kv_copies)
    }

    /// Whether the current parameter's gradient is partial on each rank ([`partial_gradient`]).
    pub fn partial_gradient(&self, sequence_parallel: bool) -> bool {
        partial_gradient(&self.names, sequence_parallel)
    }
}

/// A visitor of a module's float parameters that is told each one's path: the bookkeeping of
/// Burn's `ModuleVisitor::enter_module` / `exit_module` done once, by [`visit_with_paths`].
pub trait PathVisitor {
    /// Visits the float parameter at `path`.
    fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>);
}

/// Runs `visitor` over every float parameter of `module`, with paths starting from `path`
/// (`ParamPath::default()`, or [`ParamPath::with_kv_copies`] where KV heads are replicated).
pub fn visit_with_paths<M: Module>(module: &M, path: ParamPath, visitor: &mut impl PathVisitor) {
    struct Paths<'a, V> {
        path: ParamPath,
        visitor: &'a mut V,
    }
    impl<V: PathVisitor> burn::module::ModuleVisitor for Paths<'_, V> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.enter(name);
        }

        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.exit();
        }

        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.visitor.visit_float(&self.path, param);
        }
    }
    module.visit(&mut Paths { path, visitor });
}

/// Which way [`Reshard`] moves the split parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Each rank keeps its slice (the model's replicas start identical).
    Split,
    /// Each rank gets the whole, joined from the ranks' slices.
    Join,
}

/// Splits or joins every split parameter of a model over tensor-parallel groups.
struct Reshard<'a> {
    groups: &'a ReplicaGroups,
    direction: Direction,
    path: ParamPath,
}

impl ModuleMapper for Reshard<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.enter(name);
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.exit();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let placement = self.path.placement();
        if placement == Placement::Replicated {
            return param;
        }
        // The same id, a new leaf of the autodiff graph that requires a gradient when `param`
        // did.
        let require_grad = param.val().is_require_grad();
        let (id, tensor, mapper) = param.consume();
        let value = match self.direction {
            Direction::Split => split_parameter(tensor, placement, self.groups),
            Direction::Join => join_parameter(tensor, placement, self.groups),
        };
        Param::from_mapped_value(id, value.detach().set_require_grad(require_grad), mapper)
    }
}

/// Checks that a configuration can be split `degree` ways: the heads, the FFN width and the
/// vocabulary (which a tied head shares with the embedding) must divide by it, and the KV heads
/// must either divide by it or divide it (then each is held by `degree / num_kv_heads`
/// consecutive ranks, see [`kv_copies`]).
pub fn check_degree(config: &crate::HlatConfig, degree: usize) -> Result<(), String> {
    let divides = |what: &str, count: usize| {
        if count.is_multiple_of(degree) {
            Ok(())
        } else {
            Err(format!(
                "{what} = {count} does not divide by the tensor-parallel degree {degree}"
            ))
        }
    };
    if degree == 0 {
        return Err("the tensor-parallel degree must be at least 1".into());
    }
    if let Some(moe) = config.moe.as_ref().filter(|_| degree > 1) {
        if config.mlp_bias {
            return Err(format!(
                "a mixture of experts with MLP biases ({}) is not split by tensor parallelism",
                config.family
            ));
        }
        divides("expert_ffn_size", moe.expert_ffn_size)?;
        if let Some(width) = moe.shared_expert_ffn_size {
            divides("shared_expert_ffn_size", width)?;
        }
    }
    divides("num_heads", config.num_heads)?;
    let kv = config.num_kv_heads;
    if !kv.is_multiple_of(degree) && !degree.is_multiple_of(kv) {
        return Err(format!(
            "num_kv_heads = {kv} neither divides by the tensor-parallel degree {degree} (each \
             rank holding num_kv_heads / {degree} KV heads) nor divides it (each KV head held by \
             {degree} / num_kv_heads ranks)"
        ));
    }
    divides("ffn_size", config.ffn_size)?;
    divides("vocab_size", config.vocab_size)
}

impl Hlat {
    /// Splits a model whose replicas are identical into its tensor-parallel shards: every rank
    /// keeps its slice of each split parameter, and attention counts its local heads. Split a
    /// model for training as it is (on an autodiff device): each shard becomes a leaf that
    /// requires a gradient as its parameter did, and keeps its parameter's configured training
    /// state (a module from `valid()` gets its gradients back with `train()`).
    ///
    /// # Panics
    /// When the configuration does not divide by the degree ([`check_degree`] says why).
    pub fn shard(self, parallel: &TensorParallel) -> Self {
        if let Err(reason) = check_degree(self.config(), parallel.groups.group_size()) {
            panic!("{reason}");
        }
        self.reshard(parallel, Direction::Split)
    }

    /// The whole model from its tensor-parallel shards (the inverse of [`Hlat::shard`]), on
    /// every rank.
    pub fn unshard(self, parallel: &TensorParallel) -> Self {
        self.reshard(parallel, Direction::Join)
    }

    /// Splits or joins the split parameters and sets the heads each rank attends with.
    fn reshard(self, parallel: &TensorParallel, direction: Direction) -> Self {
        let degree = parallel.groups.group_size();
        let (num_heads, num_kv_heads) = (self.config().num_heads, self.config().num_kv_heads);
        let copies = kv_copies(num_kv_heads, degree);
        let mut model = self.map(&mut Reshard {
            groups: &parallel.groups,
            direction,
            path: ParamPath::with_kv_copies(copies),
        });
        let (heads, kv_heads) = match direction {
            Direction::Split => (num_heads / degree, num_kv_heads * copies / degree),
            Direction::Join => (num_heads, num_kv_heads),
        };
        for layer in &mut model.layers {
            let attention = &mut layer.self_attn;
            (attention.num_heads, attention.num_kv_heads) = (heads, kv_heads);
        }
        model
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(text: &str) -> Vec<String> {
        text.split('.').map(str::to_string).collect()
    }

    #[test]
    fn placements_follow_megatron() {
        assert_eq!(placement(&path("embed_tokens.weight")), Placement::Split(0));
        assert_eq!(
            placement(&path("layers.3.self_attn.q_proj.weight")),
            Placement::Split(1)
        );
        assert_eq!(
            placement(&path("layers.3.self_attn.o_proj.weight")),
            Placement::Split(0)
        );
        assert_eq!(
            placement(&path("layers.0.mlp.down_proj.weight")),
            Placement::Split(0)
        );
        assert_eq!(
            placement(&path("layers.0.mlp.up_proj.weight")),
            Placement::Split(1)
        );
        assert_eq!(placement(&path("lm_head.weight")), Placement::Split(1));
        assert_eq!(
            placement(&path("layers.1.input_layernorm.weight")),
            Placement::Replicated
        );
        assert_eq!(placement(&path("norm.weight")), Placement::Replicated);
        assert_eq!(
            placement(&path("layers.0.self_attn.k_proj.bias")),
            Placement::Split(0)
        );
        assert_eq!(
            placement(&path("layers.0.self_attn.o_proj.bias")),
            Placement::Replicated
        );
        assert_eq!(
            placement(&path("layers.0.mlp.down_proj.bias")),
            Placement::Replicated
        );
        assert_eq!(
            placement(&path("layers.0.self_attn.q_norm.weight")),
            Placement::Replicated
        );
    }

    #[test]
    fn per_head_norms_have_partial_gradients_without_sequence_parallelism() {
        let q_norm = path("layers.0.self_attn.q_norm.weight");
        let norm = path("layers.0.input_layernorm.weight");
        let bias = path("layers.0.self_attn.o_proj.bias");
        assert!(partial_gradient(&q_norm, false) && partial_gradient(&q_norm, true));
        assert!(!partial_gradient(&norm, false) && partial_gradient(&norm, true));
        assert!(!partial_gradient(&bias, false) && partial_gradient(&bias, true));
        assert!(!partial_gradient(
            &path("layers.0.self_attn.q_proj.bias"),
            true
        ));
        // A mixture's router and shared-expert gate weigh partial products.
        assert!(partial_gradient(&path("layers.0.moe.router.weight"), false));
        assert!(partial_gradient(
            &path("layers.0.moe.shared_expert_gate.weight"),
            false
        ));
        assert_eq!(
            placement(&path("layers.0.moe.experts.3.down_proj.weight")),
            Placement::Split(0)
        );
    }

    #[test]
    fn kv_heads_are_replicated_above_their_count() {
        assert_eq!(kv_copies(8, 4), 1);
        assert_eq!(kv_copies(8, 8), 1);
        assert_eq!(kv_copies(8, 32), 4);
        assert_eq!(kv_copies(2, 4), 2);
        let k = path("layers.1.self_attn.k_proj.weight");
        let v_bias = path("layers.1.self_attn.v_proj.bias");
        let q = path("layers.1.self_attn.q_proj.weight");
        assert_eq!(placement_with(&k, 1), Placement::Split(1));
        assert_eq!(
            placement_with(&k, 4),
            Placement::ReplicatedHeads { dim: 1, copies: 4 }
        );
        assert_eq!(
            placement_with(&v_bias, 2),
            Placement::ReplicatedHeads { dim: 0, copies: 2 }
        );
        assert_eq!(placement_with(&q, 4), Placement::Split(1));
        let mut at = ParamPath::with_kv_copies(2);
        for name in &k {
            at.enter(name);
        }
        assert_eq!(
            at.placement(),
            Placement::ReplicatedHeads { dim: 1, copies: 2 }
        );
    }

    #[test]
    fn kv_groups_follow_the_tensor_parallel_groups() {
        // Replicas 4..8 of a dp 2 × tp 4 layout, 2 KV heads: ranks 4, 5 hold head 0, 6, 7 head 1.
        let tensor = ReplicaGroups::contiguous(8, 4).unwrap();
        assert_eq!(
            kv_head_groups(&tensor, 2).groups(),
            [vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
        );
        assert_eq!(
            kv_copy_groups(&tensor, 2).groups(),
            [vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
        // One KV head over tp 4: one group per rank to split over, one group of copies.
        let tensor = ReplicaGroups::all(4);
        assert_eq!(
            kv_head_groups(&tensor, 4).groups(),
            [vec![0], vec![1], vec![2], vec![3]]
        );
        assert_eq!(kv_copy_groups(&tensor, 4).groups(), [vec![0, 1, 2, 3]]);
    }

    #[test]
    fn degrees_above_the_kv_heads_must_be_multiples_of_them() {
        let config = crate::HlatConfig::preset("hlat-70b").unwrap();
        assert_eq!(check_degree(&config, 8), Ok(()));
        assert_eq!(check_degree(&config, 32), Ok(()));
        let llama = crate::HlatConfig::preset("llama-3.1-8b").unwrap();
        assert_eq!(check_degree(&llama, 16), Ok(()));
        // 64 heads over 128 ranks: fewer than one query head per rank.
        assert!(
            check_degree(&config, 128)
                .unwrap_err()
                .contains("num_heads = 64")
        );
        let odd = crate::HlatConfig {
            num_heads: 24,
            num_kv_heads: 6,
            ..config.clone()
        };
        let reason = check_degree(&odd, 4).unwrap_err();
        assert!(
            reason.contains("num_kv_heads = 6") && reason.contains("degree 4"),
            "{reason}"
        );
        let reason = check_degree(&odd, 12).unwrap_err();
        assert!(reason.contains("ffn_size"), "{reason}");
    }
}
