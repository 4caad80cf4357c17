//! The SwiGLU feed-forward network.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::activation::silu;
use burn::tensor::backend::Backend;

use crate::config::HlatConfig;
use crate::linear::projection;

/// `down(silu(gate(x)) · up(x))`, without biases.
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
        let (hidden, ffn) = (config.hidden_size, config.ffn_size);
        Self {
            gate_proj: projection(config, hidden, ffn, device),
            up_proj: projection(config, hidden, ffn, device),
            down_proj: projection(config, ffn, hidden, device),
        }
    }

    /// Applies the network to `[batch, seq, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let gate = self.gate_proj.forward(x.clone());
        let up = self.up_proj.forward(x);
        self.down_proj.forward(Self::activate(gate, up))
    }

    /// The activation between the projections: `silu(gate) · up`.
    pub fn activate(gate: Tensor<B, 3>, up: Tensor<B, 3>) -> Tensor<B, 3> {
        silu(gate) * up
    }
}
