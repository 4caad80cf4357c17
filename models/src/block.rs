//! One pre-norm decoder block.

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use crate::attention::{Attention, Context};
use crate::config::HlatConfig;
use crate::mlp::Mlp;
use crate::norm::RmsNorm;
use crate::parallel::Exchange;
use crate::rotary::RotaryTables;

/// `h = x + attn(norm(x)); out = h + mlp(norm(h))`.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    /// Causal self-attention.
    pub self_attn: Attention,
    /// SwiGLU feed-forward network.
    pub mlp: Mlp,
    /// Norm before attention.
    pub input_layernorm: RmsNorm,
    /// Norm before the feed-forward network.
    pub post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    /// A freshly initialised block, decoder layer `layer` of `config`.
    pub fn new(config: &HlatConfig, layer: usize, device: &Device) -> Self {
        Self {
            self_attn: Attention::new(config, layer, device),
            mlp: Mlp::new(config, device),
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
        let normed = exchange.enter(self.input_layernorm.forward(x.clone()));
        let (queries, keys, values) = self.self_attn.project(normed, rotary);
        let attended = self.self_attn.attend(queries, keys, values, context);
        let x = x + self.self_attn.output(attended, exchange);
        let normed = exchange.enter(self.post_attention_layernorm.forward(x.clone()));
        let transformed = self.mlp.forward(normed, exchange);
        x + transformed
    }
}
