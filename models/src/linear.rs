//! Bias-free projections initialised as in HLAT.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::backend::Backend;

use crate::config::HlatConfig;

/// A bias-free `Linear` `[d_input, d_output]` with weights normal(0, `config.init_std`).
pub fn projection<B: Backend>(
    config: &HlatConfig,
    d_input: usize,
    d_output: usize,
    device: &B::Device,
) -> Linear<B> {
    LinearConfig::new(d_input, d_output)
        .with_bias(false)
        .with_initializer(normal_init(config))
        .init(device)
}

/// The initializer of every HLAT weight matrix: normal(0, `config.init_std`).
pub fn normal_init(config: &HlatConfig) -> Initializer {
    Initializer::Normal {
        mean: 0.0,
        std: config.init_std,
    }
}
