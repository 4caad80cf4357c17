//! Rotary position embeddings in the Hugging Face "rotate half" convention.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// Cosine and sine tables `[positions, head_dim]` for a run of consecutive positions.
///
/// Frequencies follow transformers' default RoPE: `inv_freq[i] = 1 / theta^(2i / head_dim)` for
/// `i < head_dim / 2`, and each table repeats its half (`cat(freqs, freqs)`), computed in f32.
#[derive(Debug, Clone)]
pub struct RotaryTables<B: Backend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
}

impl<B: Backend> RotaryTables<B> {
    /// Tables for positions `start .. start + len`.
    pub fn new(head_dim: usize, theta: f64, start: usize, len: usize, device: &B::Device) -> Self {
        let half = head_dim / 2;
        let theta = theta as f32;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(len * head_dim);
        let mut sin = Vec::with_capacity(len * head_dim);
        for position in start..start + len {
            let angles: Vec<f32> = inv_freq.iter().map(|f| position as f32 * f).collect();
            for _ in 0..2 {
                cos.extend(angles.iter().map(|a| a.cos()));
                sin.extend(angles.iter().map(|a| a.sin()));
            }
        }
        Self {
            cos: Tensor::from_data(TensorData::new(cos, [len, head_dim]), device),
            sin: Tensor::from_data(TensorData::new(sin, [len, head_dim]), device),
        }
    }

    /// Rotates `x` `[batch, heads, positions, head_dim]`: `x·cos + rotate_half(x)·sin`, where
    /// `rotate_half(x) = cat(-x[.., d/2..], x[.., ..d/2])`.
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let dtype = x.dtype();
        let [_, _, _, head_dim] = x.dims();
        let half = head_dim / 2;
        let cos = self.cos.clone().cast(dtype).unsqueeze::<4>();
        let sin = self.sin.clone().cast(dtype).unsqueeze::<4>();
        let first = x.clone().narrow(3, 0, half);
        let second = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![second.neg(), first], 3);
        x * cos + rotated * sin
    }
}
