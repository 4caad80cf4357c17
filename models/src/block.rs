//! One pre-norm decoder block.

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::attention::{Attention, Context};
use crate::config::HlatConfig;
use crate::mlp::Mlp;
use crate::norm::RmsNorm;
use crate::parallel::Exchange;
use crate::rotary::RotaryTables;

/// `h = x + attn(norm(x)); out = h + mlp(norm(h))`.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    /// Causal self-attention.
    pub self_attn: Attention<B>,
    /// SwiGLU feed-forward network.
    pub mlp: Mlp<B>,
    /// Norm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Norm before the feed-forward network.
    pub post_attention_layernorm: RmsNorm<B>,
}

impl<B: Backend> DecoderLayer<B> {
    /// A freshly initialised block, decoder layer `layer` of `config`.
    pub fn new(config: &HlatConfig, layer: usize, device: &B::Device) -> Self {
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
        x: Tensor<B, 3>,
        rotary: &RotaryTables<B>,
        context: Context<'_, B>,
        exchange: &dyn Exchange<B>,
    ) -> Tensor<B, 3> {
        let normed = exchange.enter(self.input_layernorm.forward(x.clone()));
        let (queries, keys, values) = self.self_attn.project(normed, rotary);
        let attended = self.self_attn.attend(queries, keys, values, context);
        let x = x + self.self_attn.output(attended, exchange);
        let normed = exchange.enter(self.post_attention_layernorm.forward(x.clone()));
        let transformed = self.mlp.forward(normed, exchange);
        x + transformed
    }
}
