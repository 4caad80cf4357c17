//! The SwiGLU feed-forward network.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::activation::silu;
use burn::tensor::{Device, Tensor};

use crate::config::HlatConfig;
use crate::linear::{projection, row_parallel, row_parallel_partial};
use crate::lora::{GateUpLora, Lora, project};
use crate::parallel::Exchange;

/// `down(silu(gate(x)) · up(x))`, with biases when the configuration's `mlp_bias` says so.
#[derive(Module, Debug)]
pub struct Mlp {
    /// Gate projection `hidden -> ffn`.
    pub gate_proj: Linear,
    /// Up projection `hidden -> ffn`.
    pub up_proj: Linear,
    /// Down projection `ffn -> hidden`.
    pub down_proj: Linear,
    /// LoRA adapter of the gate projection ([`crate::lora`]).
    pub gate_lora: Option<Lora>,
    /// LoRA adapter of the up projection.
    pub up_lora: Option<Lora>,
    /// LoRA adapter of the down projection.
    pub down_lora: Option<Lora>,
    /// LoRA adapter of the gate and up projections together, one `A` for both: a mixture's
    /// experts are adapted so, as PEFT adapts `experts.gate_up_proj`.
    pub gate_up_lora: Option<GateUpLora>,
}

impl Mlp {
    /// A freshly initialised feed-forward network of the configuration's `ffn_size`.
    pub fn new(config: &HlatConfig, device: &Device) -> Self {
        Self::with_width(config, config.ffn_size, device)
    }

    /// A freshly initialised feed-forward network of inner width `ffn` (an expert's).
    pub fn with_width(config: &HlatConfig, ffn: usize, device: &Device) -> Self {
        let (hidden, bias) = (config.hidden_size, config.mlp_bias);
        Self {
            gate_proj: projection(config, hidden, ffn, bias, device),
            up_proj: projection(config, hidden, ffn, bias, device),
            down_proj: projection(config, ffn, hidden, bias, device),
            gate_lora: None,
            up_lora: None,
            down_lora: None,
            gate_up_lora: None,
        }
    }

    /// Applies the network to `[batch, seq, hidden]` (the whole input of this rank's slice of
    /// the inner width); the down projection is row-parallel under `exchange`.
    pub fn forward(&self, x: Tensor<3>, exchange: &dyn Exchange) -> Tensor<3> {
        let (gate, up) = self.gate_up(x);
        self.down(Self::activate(gate, up), exchange)
    }

    /// The network's output before the row-parallel sum over `exchange`'s group: this rank's
    /// partial product (a mixture weights its experts' partials and sums the group once). With
    /// one rank there is nothing to sum and the down projection's bias is added; a mixture with
    /// biases is not split ([`crate::parallel::check_degree`]).
    pub fn partial(&self, x: Tensor<3>, exchange: &dyn Exchange) -> Tensor<3> {
        let (gate, up) = self.gate_up(x);
        let partial = row_parallel_partial(
            &self.down_proj,
            self.down_lora.as_ref(),
            Self::activate(gate, up),
        );
        match (&self.down_proj.bias, exchange.degree()) {
            (Some(bias), 1) => partial + bias.val().unsqueeze(),
            _ => partial,
        }
    }

    /// The gate and up projections of `x` (with their adapters).
    pub fn gate_up(&self, x: Tensor<3>) -> (Tensor<3>, Tensor<3>) {
        let gate = project(&self.gate_proj, self.gate_lora.as_ref(), x.clone());
        let up = project(&self.up_proj, self.up_lora.as_ref(), x.clone());
        match &self.gate_up_lora {
            Some(lora) => {
                let (gate_delta, up_delta) = lora.deltas(x);
                (gate + gate_delta, up + up_delta)
            }
            None => (gate, up),
        }
    }

    /// The down projection (row-parallel under `exchange`) of the activation.
    pub fn down(&self, activation: Tensor<3>, exchange: &dyn Exchange) -> Tensor<3> {
        row_parallel(
            &self.down_proj,
            self.down_lora.as_ref(),
            activation,
            exchange,
        )
    }

    /// The activation between the projections: `silu(gate) · up`.
    pub fn activate(gate: Tensor<3>, up: Tensor<3>) -> Tensor<3> {
        silu(gate) * up
    }
}
