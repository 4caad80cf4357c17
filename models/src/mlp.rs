//! The SwiGLU feed-forward network.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::activation::silu;
use burn::tensor::backend::Backend;

use crate::config::HlatConfig;
use crate::linear::{projection, row_parallel};
use crate::parallel::Exchange;

/// `down(silu(gate(x)) · up(x))`, with biases when the configuration's `mlp_bias` says so.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// Gate projection `hidden -> ffn`.
    pub gate_proj: Linear<B>,
    /// Up projection `hidden -> ffn`.
    pub up_proj: Linear<B>,
    /// Down projection `ffn -> hidden`.
    pub down_proj: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    /// A freshly initialised feed-forward network.
    pub fn new(config: &HlatConfig, device: &B::Device) -> Self {
        let (hidden, ffn, bias) = (config.hidden_size, config.ffn_size, config.mlp_bias);
        Self {
            gate_proj: projection(config, hidden, ffn, bias, device),
            up_proj: projection(config, hidden, ffn, bias, device),
            down_proj: projection(config, ffn, hidden, bias, device),
        }
    }

    /// Applies the network to `[batch, seq, hidden]` (the whole input of this rank's slice of
    /// the inner width); the down projection is row-parallel under `exchange`.
    pub fn forward(&self, x: Tensor<B, 3>, exchange: &dyn Exchange<B>) -> Tensor<B, 3> {
        let gate = self.gate_proj.forward(x.clone());
        let up = self.up_proj.forward(x);
        row_parallel(&self.down_proj, Self::activate(gate, up), exchange)
    }

    /// The activation between the projections: `silu(gate) · up`.
    pub fn activate(gate: Tensor<B, 3>, up: Tensor<B, 3>) -> Tensor<B, 3> {
        silu(gate) * up
    }
}
