//! LoRA (Hu et al., arXiv 2106.09685) adapters as Burn modules, in PEFT's formulation: a frozen
//! projection `W` gains a trainable low-rank update, `y = x·W + (α / r) · dropout(x)·A·B`, with
//! `A` `[in, r]` initialised as PEFT initialises `lora_A` (Kaiming-uniform with `a = √5`, that
//! is uniform in `±1/√in`) and `B` `[r, out]` zero, so that a fresh adapter changes nothing.
//!
//! The adapters sit next to the projections they adapt ([`crate::Attention`]'s `q_lora`, …,
//! [`crate::Mlp`]'s `gate_lora`, …), so every forward pass of the model (cached generation,
//! recomputation, tensor parallelism, pipeline stages) applies them. [`Hlat::with_lora`]
//! freezes the base weights (they take no gradient, hence no optimizer state) and attaches fresh
//! adapters; [`Hlat::merge_lora`] folds them into the base weights as PEFT's `merge_and_unload`
//! does. PEFT's adapter folders are read and written by [`crate::hf::adapter`].
//!
//! Under tensor parallelism an adapter is split the way its projection is (see
//! [`crate::parallel::placement`]): for a column-parallel projection (q, k, v, gate, up) `A` is
//! whole on every rank and `B` split by output features; for a row-parallel one (o, down) `A` is
//! split by input features and `B` whole, and each rank's partial update joins the partial
//! product of the projection before their sum.

use std::fmt;
use std::str::FromStr;

use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear};
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::mlp::Mlp;
use crate::model::Hlat;

/// A projection of the decoder that an adapter can target, by PEFT's module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    /// `self_attn.q_proj`.
    Q,
    /// `self_attn.k_proj`.
    K,
    /// `self_attn.v_proj`.
    V,
    /// `self_attn.o_proj`.
    O,
    /// `mlp.gate_proj`.
    Gate,
    /// `mlp.up_proj`.
    Up,
    /// `mlp.down_proj`.
    Down,
}

impl LoraTarget {
    /// Every target, in the order of the layer.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
    ];

    /// The projection's module name (`q_proj`, …, `down_proj`), PEFT's `target_modules` entry.
    pub fn module_name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q_proj",
            LoraTarget::K => "k_proj",
            LoraTarget::V => "v_proj",
            LoraTarget::O => "o_proj",
            LoraTarget::Gate => "gate_proj",
            LoraTarget::Up => "up_proj",
            LoraTarget::Down => "down_proj",
        }
    }

    /// The short name of `--lora-targets` (`q`, …, `down`).
    pub fn short_name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q",
            LoraTarget::K => "k",
            LoraTarget::V => "v",
            LoraTarget::O => "o",
            LoraTarget::Gate => "gate",
            LoraTarget::Up => "up",
            LoraTarget::Down => "down",
        }
    }

    /// Whether the target is an MLP projection (gate, up or down); in a mixture of experts, it
    /// adapts every expert's.
    pub fn is_mlp(self) -> bool {
        matches!(self, LoraTarget::Gate | LoraTarget::Up | LoraTarget::Down)
    }

    /// The projection's path in a decoder layer (`self_attn.q_proj`, `mlp.up_proj`).
    pub fn layer_path(self) -> String {
        let block = match self {
            LoraTarget::Q | LoraTarget::K | LoraTarget::V | LoraTarget::O => "self_attn",
            LoraTarget::Gate | LoraTarget::Up | LoraTarget::Down => "mlp",
        };
        format!("{block}.{}", self.module_name())
    }
}

impl fmt::Display for LoraTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

impl FromStr for LoraTarget {
    type Err = String;

    /// A short name (`q`) or a module name (`q_proj`).
    fn from_str(text: &str) -> Result<Self, String> {
        LoraTarget::ALL
            .into_iter()
            .find(|target| text == target.short_name() || text == target.module_name())
            .ok_or_else(|| {
                format!(
                    "unknown LoRA target `{text}`: expected one of q, k, v, o, gate, up, down \
                     (or q_proj, …, down_proj)"
                )
            })
    }
}

/// The shape of the adapters of a model: PEFT's `r`, `lora_alpha`, `lora_dropout`,
/// `target_modules` (and `use_rslora`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// The rank `r` of every adapter.
    pub rank: usize,
    /// `lora_alpha`: the update is scaled by `alpha / rank` (`alpha / √rank` with `rslora`).
    pub alpha: f64,
    /// Dropout on the adapter's input while training (0: none).
    pub dropout: f64,
    /// The adapted projections of every layer.
    pub targets: Vec<LoraTarget>,
    /// Rank-stabilised scaling (PEFT's `use_rslora`).
    #[serde(default)]
    pub rslora: bool,
}

impl LoraConfig {
    /// Rank 8, alpha 16, no dropout, every projection.
    pub fn new(rank: usize, alpha: f64) -> Self {
        Self {
            rank,
            alpha,
            dropout: 0.0,
            targets: LoraTarget::ALL.to_vec(),
            rslora: false,
        }
    }

    /// The factor of the update: `alpha / rank`, or `alpha / √rank` with `rslora`.
    pub fn scaling(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// Checks the rank, the dropout probability and the targets.
    pub fn validate(&self) -> Result<(), String> {
        if self.rank == 0 {
            return Err("the LoRA rank must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!(
                "the LoRA dropout must be in [0, 1), got {}",
                self.dropout
            ));
        }
        if self.targets.is_empty() {
            return Err("LoRA needs at least one target projection".into());
        }
        Ok(())
    }

    /// The targets that adapt each layer's own projections: every one in a dense model, the
    /// attention's in a `mixture` of experts (whose MLP targets adapt its experts, as PEFT's
    /// `target_parameters` do; its dense layers and shared expert take none, as PEFT leaves
    /// them when it moves MLP targets to the experts).
    pub fn projection_targets(&self, mixture: bool) -> impl Iterator<Item = LoraTarget> + '_ {
        self.targets
            .iter()
            .copied()
            .filter(move |target| !(mixture && target.is_mlp()))
    }

    /// Whether a mixture's experts get an adapter of their fused gate and up projections
    /// (PEFT's `experts.gate_up_proj`): gate and up are targeted together.
    pub fn adapts_expert_gate_up(&self) -> bool {
        self.targets.contains(&LoraTarget::Gate) && self.targets.contains(&LoraTarget::Up)
    }

    /// Whether a mixture's experts get an adapter of their down projections (PEFT's
    /// `experts.down_proj`).
    pub fn adapts_expert_down(&self) -> bool {
        self.targets.contains(&LoraTarget::Down)
    }

    /// Checks that the adapters can be put on a mixture's experts as PEFT puts them: gate and up
    /// together (one adapter of the fused projection) and no dropout (PEFT refuses dropout on
    /// expert parameters, also when it loads an adapter).
    pub fn check_for_mixture(&self) -> Result<(), String> {
        let has = |target| self.targets.contains(&target);
        if has(LoraTarget::Gate) != has(LoraTarget::Up) {
            return Err(
                "an expert's gate and up projections are adapted together (PEFT's \
                        `experts.gate_up_proj`): target both gate and up, or neither"
                    .into(),
            );
        }
        if self.dropout != 0.0 && self.targets.iter().any(|target| target.is_mlp()) {
            return Err(format!(
                "PEFT takes no dropout on a mixture's experts (lora_dropout {}): use 0 or \
                 adapt the attention only",
                self.dropout
            ));
        }
        Ok(())
    }

    /// Parses `--lora-targets`: comma-separated short or module names.
    pub fn parse_targets(text: &str) -> Result<Vec<LoraTarget>, String> {
        let mut targets: Vec<LoraTarget> = text
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        targets.sort();
        targets.dedup();
        Ok(targets)
    }
}

/// One adapter: `scaling · dropout(x)·A·B` added to its projection's output.
#[derive(Module, Debug)]
pub struct Lora {
    /// `A` `[in, r]` (PEFT's `lora_A.weight` transposed).
    pub lora_a: Param<Tensor<2>>,
    /// `B` `[r, out]` (PEFT's `lora_B.weight` transposed).
    pub lora_b: Param<Tensor<2>>,
    /// Dropout on the input, while training.
    pub dropout: Dropout,
    /// `alpha / r` (see [`LoraConfig::scaling`]).
    #[module(skip)]
    pub scaling: f64,
}

impl Lora {
    /// A fresh adapter of a `[d_input, d_output]` projection, initialised as PEFT does: `A`
    /// uniform in `±1/√d_input` (from the device's seeded generator, see `Device::seed`), `B` zero.
    pub fn new(config: &LoraConfig, d_input: usize, d_output: usize, device: &Device) -> Self {
        let bound = 1.0 / (d_input as f64).sqrt();
        let lora_a = Initializer::Uniform {
            min: -bound,
            max: bound,
        }
        .init([d_input, config.rank], device);
        let lora_b = Initializer::Zeros.init([config.rank, d_output], device);
        Self {
            lora_a,
            lora_b,
            dropout: DropoutConfig::new(config.dropout).init(),
            scaling: config.scaling(),
        }
    }

    /// An adapter of given `A` `[in, r]` and `B` `[r, out]`, both trainable.
    pub fn from_tensors(a: Tensor<2>, b: Tensor<2>, config: &LoraConfig) -> Self {
        Self {
            lora_a: Param::from_tensor(a),
            lora_b: Param::from_tensor(b),
            dropout: DropoutConfig::new(config.dropout).init(),
            scaling: config.scaling(),
        }
    }

    /// The rank of the adapter.
    pub fn rank(&self) -> usize {
        self.lora_a.dims()[1]
    }

    /// The update `scaling · dropout(x)·A·B` of `x` `[batch, seq, in]`.
    pub fn delta(&self, x: Tensor<3>) -> Tensor<3> {
        let x = self.dropout.forward(x);
        let down = burn::tensor::module::linear(x, self.lora_a.val(), None);
        burn::tensor::module::linear(down, self.lora_b.val(), None) * self.scaling
    }

    /// The update of the projection's weight, `scaling · A·B` `[in, out]`.
    pub fn weight_delta(&self) -> Tensor<2> {
        self.lora_a.val().matmul(self.lora_b.val()) * self.scaling
    }
}

/// PEFT's adapter of an expert's fused gate and up projections (`target_parameters`
/// `experts.gate_up_proj`): one `A` for both, and a `B` whose first half of output features is
/// the gate's and the second the up projection's, so `gate += s·x·A·B_gate` and
/// `up += s·x·A·B_up`. Held in halves so that tensor parallelism splits each half as its
/// projection (by output features). PEFT puts no dropout on expert parameters.
#[derive(Module, Debug)]
pub struct GateUpLora {
    /// `A` `[in, r]`.
    pub lora_a: Param<Tensor<2>>,
    /// The gate's half of `B`, `[r, ffn]`.
    pub lora_b_gate: Param<Tensor<2>>,
    /// The up projection's half of `B`, `[r, ffn]`.
    pub lora_b_up: Param<Tensor<2>>,
    /// `alpha / r` (see [`LoraConfig::scaling`]).
    #[module(skip)]
    pub scaling: f64,
}

impl GateUpLora {
    /// A fresh adapter of projections `[d_input, ffn]`, initialised as PEFT does: `A` uniform in
    /// `±1/√d_input`, `B` zero.
    pub fn new(config: &LoraConfig, d_input: usize, ffn: usize, device: &Device) -> Self {
        let fresh = Lora::new(config, d_input, 2 * ffn, device);
        let zeros = || Initializer::Zeros.init([config.rank, ffn], device);
        Self {
            lora_a: fresh.lora_a,
            lora_b_gate: zeros(),
            lora_b_up: zeros(),
            scaling: config.scaling(),
        }
    }

    /// An adapter of given `A` `[in, r]` and halves of `B` `[r, ffn]`, all trainable.
    pub fn from_tensors(
        a: Tensor<2>,
        (gate, up): (Tensor<2>, Tensor<2>),
        config: &LoraConfig,
    ) -> Self {
        Self {
            lora_a: Param::from_tensor(a),
            lora_b_gate: Param::from_tensor(gate),
            lora_b_up: Param::from_tensor(up),
            scaling: config.scaling(),
        }
    }

    /// The updates of the gate and up projections of `x` `[batch, seq, in]`.
    pub fn deltas(&self, x: Tensor<3>) -> (Tensor<3>, Tensor<3>) {
        let down = burn::tensor::module::linear(x, self.lora_a.val(), None);
        let half = |b: &Param<Tensor<2>>| {
            burn::tensor::module::linear(down.clone(), b.val(), None) * self.scaling
        };
        (half(&self.lora_b_gate), half(&self.lora_b_up))
    }

    /// The updates of the gate and up weights, `s·A·B_gate` and `s·A·B_up` `[in, ffn]`.
    pub fn weight_deltas(&self) -> (Tensor<2>, Tensor<2>) {
        let a = self.lora_a.val();
        let delta = |b: &Param<Tensor<2>>| a.clone().matmul(b.val()) * self.scaling;
        (delta(&self.lora_b_gate), delta(&self.lora_b_up))
    }
}

/// `linear(x)`, plus the update of `lora` when there is one.
pub fn project(linear: &Linear, lora: Option<&Lora>, x: Tensor<3>) -> Tensor<3> {
    match lora {
        Some(lora) => linear.forward(x.clone()) + lora.delta(x),
        None => linear.forward(x),
    }
}

/// The adapters of one decoder layer: those of its own projections by target, and in a
/// mixture of experts each expert's, in order.
#[derive(Debug, Clone, Default)]
pub struct LayerAdapters {
    /// The adapters of the layer's projections (the attention's in a mixture).
    pub projections: Vec<(LoraTarget, Lora)>,
    /// Each expert's adapters (empty in a dense layer).
    pub experts: Vec<ExpertAdapters>,
}

/// The adapters of one expert of a mixture (PEFT's `experts.gate_up_proj` and
/// `experts.down_proj`, cut per expert).
#[derive(Debug, Clone, Default)]
pub struct ExpertAdapters {
    /// Of the fused gate and up projections.
    pub gate_up: Option<GateUpLora>,
    /// Of the down projection.
    pub down: Option<Lora>,
}

impl Hlat {
    /// The model with its weights frozen (no gradients, so no optimizer state) and fresh
    /// adapters on `config.targets` of every layer (PEFT's initialisation, see [`Lora::new`]);
    /// existing adapters are replaced. In a mixture of experts the MLP targets adapt every
    /// expert, as PEFT's `target_parameters` do (see [`LoraConfig::projection_targets`]): gate
    /// and up together ([`GateUpLora`], made only when both are targeted), down alone.
    pub fn with_lora(self, config: &LoraConfig, device: &Device) -> Self {
        let model_config = self.config().clone();
        let head_dim = model_config.head_dim();
        let hidden = model_config.hidden_size;
        let q_width = model_config.num_heads * head_dim;
        let kv_width = model_config.num_kv_heads * head_dim;
        let ffn = model_config.ffn_size;
        let mixture = model_config.moe.as_ref();
        let mut model = self.without_lora().no_grad();
        for layer in &mut model.layers {
            for target in config.projection_targets(mixture.is_some()) {
                let (d_input, d_output) = match target {
                    LoraTarget::Q => (hidden, q_width),
                    LoraTarget::K | LoraTarget::V => (hidden, kv_width),
                    LoraTarget::O => (q_width, hidden),
                    LoraTarget::Gate | LoraTarget::Up => (hidden, ffn),
                    LoraTarget::Down => (ffn, hidden),
                };
                if let Some(slot) = layer.lora_slot(target) {
                    *slot = Some(Lora::new(config, d_input, d_output, device));
                }
            }
            let Some(moe) = mixture else { continue };
            let expert_ffn = moe.expert_ffn_size;
            for expert in layer.experts_mut() {
                if config.adapts_expert_gate_up() {
                    expert.gate_up_lora = Some(GateUpLora::new(config, hidden, expert_ffn, device));
                }
                if config.adapts_expert_down() {
                    expert.down_lora = Some(Lora::new(config, expert_ffn, hidden, device));
                }
            }
        }
        model
    }

    /// The model with the weights frozen and `adapters` (one entry per layer) attached.
    ///
    /// # Panics
    /// When `adapters` does not have one entry per layer, or a layer's expert adapters are not
    /// one per expert.
    pub fn with_adapters(self, adapters: Vec<LayerAdapters>) -> Self {
        assert_eq!(
            adapters.len(),
            self.layers.len(),
            "one list of adapters per layer"
        );
        let mut model = self.without_lora().no_grad();
        for (layer, adapters) in model.layers.iter_mut().zip(adapters) {
            for (target, adapter) in adapters.projections {
                if let Some(slot) = layer.lora_slot(target) {
                    *slot = Some(adapter);
                }
            }
            if adapters.experts.is_empty() {
                continue;
            }
            let experts = layer.experts_mut();
            assert_eq!(
                adapters.experts.len(),
                experts.len(),
                "one entry per expert"
            );
            for (expert, adapters) in experts.iter_mut().zip(adapters.experts) {
                expert.gate_up_lora = adapters.gate_up;
                expert.down_lora = adapters.down;
            }
        }
        model
    }

    /// Whether any layer carries an adapter.
    pub fn has_lora(&self) -> bool {
        self.adapters().iter().any(|layer| {
            !layer.projections.is_empty()
                || layer
                    .experts
                    .iter()
                    .any(|expert| expert.gate_up.is_some() || expert.down.is_some())
        })
    }

    /// The model without its adapters (the base weights as they are, still frozen if they
    /// were).
    pub fn without_lora(mut self) -> Self {
        for layer in &mut self.layers {
            for target in LoraTarget::ALL {
                if let Some(slot) = layer.lora_slot(target) {
                    *slot = None;
                }
            }
            for expert in layer.experts_mut() {
                expert.gate_up_lora = None;
                expert.gate_lora = None;
                expert.up_lora = None;
                expert.down_lora = None;
            }
        }
        self
    }

    /// Clones of the adapters of every layer.
    pub fn adapters(&self) -> Vec<LayerAdapters> {
        self.layers
            .iter()
            .map(|layer| LayerAdapters {
                projections: LoraTarget::ALL
                    .into_iter()
                    .filter_map(|target| layer.lora(target).map(|lora| (target, lora.clone())))
                    .collect(),
                experts: layer
                    .experts()
                    .iter()
                    .map(|expert| ExpertAdapters {
                        gate_up: expert.gate_up_lora.clone(),
                        down: expert.down_lora.clone(),
                    })
                    .collect(),
            })
            .collect()
    }

    /// Folds every adapter into its projection's weight, `W + scaling·A·B`, and removes it: the
    /// model PEFT's `merge_and_unload` gives (the weights keep their dtype; the sum is computed
    /// in it).
    pub fn merge_lora(mut self) -> Self {
        for layer in &mut self.layers {
            for target in LoraTarget::ALL {
                let Some(lora) = layer.lora_slot(target).and_then(Option::take) else {
                    continue;
                };
                let linear = layer
                    .projection_mut(target)
                    .expect("an adapter's projection exists");
                fold_into(linear, lora.weight_delta());
            }
            for expert in layer.experts_mut() {
                if let Some(lora) = expert.gate_up_lora.take() {
                    let (gate, up) = lora.weight_deltas();
                    fold_into(&mut expert.gate_proj, gate);
                    fold_into(&mut expert.up_proj, up);
                }
                if let Some(lora) = expert.down_lora.take() {
                    fold_into(&mut expert.down_proj, lora.weight_delta());
                }
            }
        }
        self
    }
}

/// Adds `delta` `[in, out]` to `linear`'s weight, in the weight's dtype: the same id and
/// training state (`Param::map`), a new leaf.
fn fold_into(linear: &mut Linear, delta: Tensor<2>) {
    linear.weight = linear.weight.clone().map(|weight| {
        let delta = delta.cast(weight.dtype());
        let require_grad = weight.is_require_grad();
        (weight + delta).detach().set_require_grad(require_grad)
    });
}

impl crate::DecoderLayer {
    /// The experts of a mixture-of-experts layer (none in a dense layer).
    pub fn experts(&self) -> &[Mlp] {
        self.moe.as_ref().map_or(&[], |moe| moe.experts.as_slice())
    }

    /// [`Self::experts`], mutable.
    pub fn experts_mut(&mut self) -> &mut [Mlp] {
        self.moe
            .as_mut()
            .map_or(&mut [], |moe| moe.experts.as_mut_slice())
    }

    /// The adapter on `target`, if any.
    pub fn lora(&self, target: LoraTarget) -> Option<&Lora> {
        match target {
            LoraTarget::Q => self.self_attn.q_lora.as_ref(),
            LoraTarget::K => self.self_attn.k_lora.as_ref(),
            LoraTarget::V => self.self_attn.v_lora.as_ref(),
            LoraTarget::O => self.self_attn.o_lora.as_ref(),
            LoraTarget::Gate => self.mlp.as_ref()?.gate_lora.as_ref(),
            LoraTarget::Up => self.mlp.as_ref()?.up_lora.as_ref(),
            LoraTarget::Down => self.mlp.as_ref()?.down_lora.as_ref(),
        }
    }

    /// The slot of the adapter on `target`; `None` for an MLP target of a mixture-of-experts
    /// layer, which has no dense projections.
    pub fn lora_slot(&mut self, target: LoraTarget) -> Option<&mut Option<Lora>> {
        Some(match target {
            LoraTarget::Q => &mut self.self_attn.q_lora,
            LoraTarget::K => &mut self.self_attn.k_lora,
            LoraTarget::V => &mut self.self_attn.v_lora,
            LoraTarget::O => &mut self.self_attn.o_lora,
            LoraTarget::Gate => &mut self.mlp.as_mut()?.gate_lora,
            LoraTarget::Up => &mut self.mlp.as_mut()?.up_lora,
            LoraTarget::Down => &mut self.mlp.as_mut()?.down_lora,
        })
    }

    /// The projection `target` adapts (`None` as for [`Self::lora_slot`]).
    pub fn projection_mut(&mut self, target: LoraTarget) -> Option<&mut Linear> {
        Some(match target {
            LoraTarget::Q => &mut self.self_attn.q_proj,
            LoraTarget::K => &mut self.self_attn.k_proj,
            LoraTarget::V => &mut self.self_attn.v_proj,
            LoraTarget::O => &mut self.self_attn.o_proj,
            LoraTarget::Gate => &mut self.mlp.as_mut()?.gate_proj,
            LoraTarget::Up => &mut self.mlp.as_mut()?.up_proj,
            LoraTarget::Down => &mut self.mlp.as_mut()?.down_proj,
        })
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Int, TensorData};

    use super::*;
    use crate::HlatConfig;

    fn tiny() -> HlatConfig {
        HlatConfig::preset("hlat-test").unwrap()
    }

    #[test]
    fn targets_parse_short_and_module_names() {
        assert_eq!(
            LoraConfig::parse_targets("q,v_proj, down").unwrap(),
            vec![LoraTarget::Q, LoraTarget::V, LoraTarget::Down]
        );
        assert!(LoraConfig::parse_targets("q,w").is_err());
    }

    #[test]
    fn a_fresh_adapter_changes_nothing_and_a_merged_one_equals_the_adapted_model() {
        let device = Device::flex();
        let base = tiny().init(&device);
        let ids = Tensor::<2, Int>::from_data(
            TensorData::new((0..12).map(|i| (i * 7) % 50).collect::<Vec<i32>>(), [2, 6]),
            &device,
        );
        let expected = base.forward(ids.clone());
        let adapted = base.with_lora(&LoraConfig::new(4, 8.0), &device);
        assert!(adapted.has_lora());
        adapted
            .forward(ids.clone())
            .into_data()
            .assert_approx_eq::<f32>(&expected.into_data(), Default::default());

        // Non-zero B: the adapted model differs, and merging gives the same logits.
        let mut adapted = adapted;
        for layer in &mut adapted.layers {
            for target in LoraTarget::ALL {
                let lora = layer.lora_slot(target).unwrap().as_mut().unwrap();
                let dims = lora.lora_b.dims();
                lora.lora_b = Param::from_tensor(Tensor::random(
                    dims,
                    burn::tensor::Distribution::Uniform(-0.5, 0.5),
                    &device,
                ));
            }
        }
        let with_adapters = adapted.forward(ids.clone());
        let merged = adapted.merge_lora();
        assert!(!merged.has_lora());
        merged.forward(ids).into_data().assert_approx_eq::<f32>(
            &with_adapters.into_data(),
            burn::tensor::Tolerance::absolute(1e-5),
        );
    }

    #[test]
    fn base_weights_take_no_gradient() {
        let device = Device::flex().autodiff();
        let model = tiny()
            .init(&device)
            .with_lora(&LoraConfig::new(2, 4.0), &device);
        let ids =
            Tensor::<2, Int>::from_data(TensorData::new(vec![3i32, 5, 7, 9], [1, 4]), &device);
        let targets =
            Tensor::<2, Int>::from_data(TensorData::new(vec![5i32, 7, 9, 11], [1, 4]), &device);
        let grads = model.loss(ids, targets, None).backward();
        let grads = burn::optim::GradientsParams::from_grads(grads, &model);
        let layer = &model.layers[0];
        assert!(grads.get::<2>(layer.self_attn.q_proj.weight.id).is_none());
        assert!(grads.get::<2>(model.embed_tokens.weight.id).is_none());
        let lora = layer.lora(LoraTarget::Q).unwrap();
        // B is zero, so only B takes a non-zero gradient at the start; both take one.
        assert!(grads.get::<2>(lora.lora_a.id).is_some());
        assert!(grads.get::<2>(lora.lora_b.id).is_some());
        assert_eq!(grads.len(), 2 * 7 * model.layers.len());
    }
}
