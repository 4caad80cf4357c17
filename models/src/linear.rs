//! Projections initialised as in HLAT, and the row-parallel application of one.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::{Device, Tensor};

use crate::config::HlatConfig;
use crate::lora::Lora;
use crate::parallel::Exchange;

/// A `Linear` `[d_input, d_output]` with weights normal(0, `config.init_std`) and, when `bias`,
/// a bias initialised to zero (as transformers initialises biases).
pub fn projection(
    config: &HlatConfig,
    d_input: usize,
    d_output: usize,
    bias: bool,
    device: &Device,
) -> Linear {
    let mut linear = LinearConfig::new(d_input, d_output)
        .with_bias(false)
        .with_initializer(normal_init(config))
        .init(device);
    if bias {
        linear.bias = Some(Initializer::Zeros.init([d_output], device));
    }
    linear
}

/// The initializer of every HLAT weight matrix: normal(0, `config.init_std`).
pub fn normal_init(config: &HlatConfig) -> Initializer {
    Initializer::Normal {
        mean: 0.0,
        std: config.init_std,
    }
}

/// A row-parallel layer (the attention output and MLP down projections): each rank multiplies
/// its slice of the input features, `exchange` sums the partial products (scattering the
/// sequence under sequence parallelism), and the bias, held whole by every rank, is added once
/// after the sum, as Megatron's `RowParallelLinear` adds it. A LoRA adapter's update (`A` split
/// by input features like the weight, `B` whole) is a partial product too, summed with it.
/// This rank's partial product of a row-parallel layer ([`row_parallel`] before the sum over
/// the group and the bias), its LoRA update included.
pub fn row_parallel_partial(linear: &Linear, lora: Option<&Lora>, x: Tensor<3>) -> Tensor<3> {
    match lora {
        Some(lora) => {
            burn::tensor::module::linear(x.clone(), linear.weight.val(), None) + lora.delta(x)
        }
        None => burn::tensor::module::linear(x, linear.weight.val(), None),
    }
}

pub fn row_parallel(
    linear: &Linear,
    lora: Option<&Lora>,
    x: Tensor<3>,
    exchange: &dyn Exchange,
) -> Tensor<3> {
    let summed = exchange.exit(row_parallel_partial(linear, lora, x));
    match &linear.bias {
        Some(bias) => summed + bias.val().unsqueeze(),
        None => summed,
    }
}
