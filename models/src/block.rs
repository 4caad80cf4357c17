//! One pre-norm decoder block.

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use crate::attention::{Attention, Context};
use crate::config::HlatConfig;
use crate::mlp::Mlp;
use crate::moe::SparseMoe;
use crate::norm::RmsNorm;
use crate::parallel::Exchange;
use crate::rotary::RotaryTables;

/// `h = x + attn(norm(x)); out = h + mlp(norm(h))`.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    /// Causal self-attention.
    pub self_attn: Attention,
    /// SwiGLU feed-forward network (`None` in a mixture-of-experts layer).
    pub mlp: Option<Mlp>,
    /// Mixture of experts (`None` in a dense layer).
    pub moe: Option<SparseMoe>,
    /// Norm before attention.
    pub input_layernorm: RmsNorm,
    /// Norm before the feed-forward network.
    pub post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    /// A freshly initialised block, decoder layer `layer` of `config`.
    pub fn new(config: &HlatConfig, layer: usize, device: &Device) -> Self {
        let mixture = config.moe.as_ref().filter(|moe| moe.is_sparse(layer));
        Self {
            self_attn: Attention::new(config, layer, device),
            mlp: mixture.is_none().then(|| Mlp::new(config, device)),
            moe: mixture.map(|moe| SparseMoe::new(config, moe, device)),
            input_layernorm: RmsNorm::new(config.hidden_size, config.rms_norm_eps, device),
            post_attention_layernorm: RmsNorm::new(config.hidden_size, config.rms_norm_eps, device),
        }
    }

    /// Applies the block to `[batch, seq, hidden]` (a slice of the sequence under sequence
    /// parallelism); attention and the feed-forward network run between `exchange`'s `enter`
    /// and `exit` (their row-parallel output projections).
    pub fn forward(
        &self,
        x: Tensor<3>,
        rotary: &RotaryTables,
        context: Context<'_>,
        exchange: &dyn Exchange,
    ) -> Tensor<3> {
        self.forward_routed(x, rotary, context, exchange).0
    }

    /// [`DecoderLayer::forward`], with the router's logits `[batch · seq, experts]` of a
    /// mixture-of-experts layer.
    pub fn forward_routed(
        &self,
        x: Tensor<3>,
        rotary: &RotaryTables,
        context: Context<'_>,
        exchange: &dyn Exchange,
    ) -> (Tensor<3>, Option<Tensor<2>>) {
        let (queries, keys, values) = self.attention_inputs(x.clone(), rotary, exchange);
        let attended = self.self_attn.attend(queries, keys, values, context);
        let (h, normed) = self.after_attention(x, attended, exchange);
        let (transformed, router_logits) = self.feed_forward(normed, exchange);
        (h + transformed, router_logits)
    }

    /// The queries, keys and values `[batch, heads, seq, head_dim]` of the layer's input `x`:
    /// its norm, entering `exchange`'s split region, then the attention's projections (rotated).
    /// The first part of [`DecoderLayer::forward_routed`], and of activation checkpointing's
    /// stages (`crate::recompute`).
    pub fn attention_inputs(
        &self,
        x: Tensor<3>,
        rotary: &RotaryTables,
        exchange: &dyn Exchange,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let normed = exchange.enter(self.input_layernorm.forward(x));
        self.self_attn.project(normed, rotary)
    }

    /// What follows the attention core: the residual stream `h = x + o_proj(attended)` and the
    /// feed-forward network's normed input (entering `exchange`'s split region).
    pub fn after_attention(
        &self,
        x: Tensor<3>,
        attended: Tensor<3>,
        exchange: &dyn Exchange,
    ) -> (Tensor<3>, Tensor<3>) {
        let h = x + self.self_attn.output(attended, exchange);
        let normed = exchange.enter(self.post_attention_layernorm.forward(h.clone()));
        (h, normed)
    }

    /// The layer's feed-forward network (dense or a mixture) applied to the normed `x`, with the
    /// router's logits of a mixture.
    pub fn feed_forward(
        &self,
        x: Tensor<3>,
        exchange: &dyn Exchange,
    ) -> (Tensor<3>, Option<Tensor<2>>) {
        match (&self.moe, &self.mlp) {
            (Some(moe), _) => {
                let (output, router_logits) = moe.forward(x, exchange);
                (output, Some(router_logits))
            }
            (None, Some(mlp)) => (mlp.forward(x, exchange), None),
            (None, None) => panic!("a decoder layer has neither an MLP nor a mixture of experts"),
        }
    }

    /// The dense feed-forward network, for the code that works on its projections (LoRA,
    /// activation checkpointing); an error naming the layer in a mixture-of-experts layer.
    pub fn dense_mlp(&self) -> Result<&Mlp, MixtureLayer> {
        self.mlp.as_ref().ok_or(MixtureLayer)
    }

    /// [`DecoderLayer::dense_mlp`], mutable.
    pub fn dense_mlp_mut(&mut self) -> Result<&mut Mlp, MixtureLayer> {
        self.mlp.as_mut().ok_or(MixtureLayer)
    }
}

/// A dense feed-forward network was asked of a mixture-of-experts layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a mixture-of-experts layer has no dense MLP (its experts are `moe.experts.N`)")]
pub struct MixtureLayer;
