//! RMSNorm as in Hugging Face LLaMA: normalise in f32, cast back, scale by `weight`.

use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::{DType, Device, Tensor};

/// Root-mean-square normalisation over the last dimension with a learned scale (`weight`).
#[derive(Module, Debug)]
pub struct RmsNorm {
    /// Per-feature scale, initialised to one.
    pub weight: Param<Tensor<1>>,
    /// Added to the mean square before the square root.
    pub eps: f64,
}

impl RmsNorm {
    /// A norm of width `size` with its scale set to one.
    pub fn new(size: usize, eps: f64, device: &Device) -> Self {
        Self {
            weight: Initializer::Ones.init([size], device),
            eps,
        }
    }

    /// `x / sqrt(mean(x²) + eps) · weight`, the statistics computed in f32.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = x.dtype();
        let x = x.cast(DType::F32);
        let mean_square = x.clone().square().mean_dim(D - 1);
        let normalised = x / (mean_square + self.eps).sqrt();
        normalised.cast(dtype) * self.weight.val().unsqueeze()
    }
}
