//! Rotary position embeddings in the Hugging Face "rotate half" convention, with the frequency
//! scalings transformers implements for longer contexts ([`RopeScaling`]).

use std::f64::consts::PI;

use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

/// How the rotary frequencies are scaled (transformers' `rope_type`, read from `rope_scaling` or
/// transformers 5's `rope_parameters`; each variant holds the fields transformers reads for it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// `inv_freq[i] = 1 / θ^(2i / d)`.
    #[default]
    Default,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        /// The context extension factor.
        factor: f64,
    },
    /// Llama 3.1's scaling: long wavelengths divided by `factor`, short ones kept, a smooth
    /// interpolation between.
    Llama3(Llama3Scaling),
    /// YaRN (Peng et al. 2023): frequencies blended between interpolation and extrapolation by a
    /// linear ramp over the dimensions, and the tables scaled by an attention factor.
    Yarn(YarnScaling),
}

/// The fields of Llama 3.1's RoPE scaling ([`RopeScaling::Llama3`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Llama3Scaling {
    /// The divisor of the long wavelengths.
    pub factor: f64,
    /// Wavelengths above `original / low_freq_factor` are scaled.
    pub low_freq_factor: f64,
    /// Wavelengths below `original / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// The context the model was pretrained with.
    pub original_max_position_embeddings: usize,
}

/// The fields of YaRN's RoPE scaling ([`RopeScaling::Yarn`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct YarnScaling {
    /// The context extension factor.
    pub factor: f64,
    /// The context the model was pretrained with.
    pub original_max_position_embeddings: usize,
    /// Rotations above which dimensions are extrapolated (transformers' default 32).
    pub beta_fast: f64,
    /// Rotations below which dimensions are interpolated (transformers' default 1).
    pub beta_slow: f64,
    /// Multiplies the tables; `None`: derived from `factor`, `mscale` and `mscale_all_dim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_factor: Option<f64>,
    /// DeepSeek's `mscale` (used with `mscale_all_dim` when both are set and non-zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mscale: Option<f64>,
    /// DeepSeek's `mscale_all_dim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mscale_all_dim: Option<f64>,
    /// Whether the ramp's ends are rounded to whole dimensions (transformers' default true).
    pub truncate: bool,
}

/// A field of a RoPE scaling that is out of range: `(field, value, reason)`.
type InvalidField = (&'static str, String, String);

/// `Ok` when `value` (of `field`) is a finite positive number.
fn positive(field: &'static str, value: f64) -> Result<(), InvalidField> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err((
            field,
            value.to_string(),
            "must be a finite positive number".to_string(),
        ))
    }
}

/// `Ok` when `original_max_position_embeddings` is at least 1.
fn some_context(original_max_position_embeddings: usize) -> Result<(), InvalidField> {
    if original_max_position_embeddings == 0 {
        Err((
            "original_max_position_embeddings",
            "0".to_string(),
            "must be at least 1".to_string(),
        ))
    } else {
        Ok(())
    }
}

impl RopeScaling {
    /// Whether this is the unscaled rotary embedding (what HLAT uses).
    pub fn is_default(&self) -> bool {
        *self == RopeScaling::Default
    }

    /// transformers' name of the scaling (`rope_type`).
    pub fn rope_type(&self) -> &'static str {
        match self {
            RopeScaling::Default => "default",
            RopeScaling::Linear { .. } => "linear",
            RopeScaling::Llama3(_) => "llama3",
            RopeScaling::Yarn(_) => "yarn",
        }
    }

    /// Checks the scaling's fields: `Err((field, value, reason))`.
    pub(crate) fn check(&self) -> Result<(), InvalidField> {
        match self {
            RopeScaling::Default => Ok(()),
            RopeScaling::Linear { factor } => positive("factor", *factor),
            RopeScaling::Llama3(scaling) => scaling.check(),
            RopeScaling::Yarn(scaling) => scaling.check(),
        }
    }

    /// The inverse frequencies `[head_dim / 2]` for base `theta`, and the factor the cosine and
    /// sine tables are multiplied by (1 except for YaRN), as transformers'
    /// `ROPE_INIT_FUNCTIONS` compute them.
    pub fn inverse_frequencies(&self, head_dim: usize, theta: f64) -> (Vec<f32>, f32) {
        let half = head_dim / 2;
        // The unscaled frequencies in f32, as transformers computes them (`base ** (arange(0, d,
        // 2).float() / d)`).
        let theta32 = theta as f32;
        let default: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta32.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        match *self {
            RopeScaling::Default => (default, 1.0),
            RopeScaling::Linear { factor } => {
                (default.iter().map(|f| f / factor as f32).collect(), 1.0)
            }
            RopeScaling::Llama3(scaling) => (scaling.scale(&default), 1.0),
            RopeScaling::Yarn(scaling) => scaling.scale(&default, head_dim, theta),
        }
    }
}

impl Llama3Scaling {
    /// Checks the fields: `Err((field, value, reason))`.
    fn check(&self) -> Result<(), InvalidField> {
        positive("factor", self.factor)?;
        positive("low_freq_factor", self.low_freq_factor)?;
        positive("high_freq_factor", self.high_freq_factor)?;
        some_context(self.original_max_position_embeddings)?;
        if self.high_freq_factor <= self.low_freq_factor {
            return Err((
                "high_freq_factor",
                self.high_freq_factor.to_string(),
                format!("must be above low_freq_factor {}", self.low_freq_factor),
            ));
        }
        Ok(())
    }

    /// The `default` inverse frequencies scaled.
    fn scale(&self, default: &[f32]) -> Vec<f32> {
        let original = self.original_max_position_embeddings as f32;
        let (factor, low, high) = (
            self.factor as f32,
            self.low_freq_factor as f32,
            self.high_freq_factor as f32,
        );
        let low_freq_wavelen = original / low;
        let high_freq_wavelen = original / high;
        default
            .iter()
            .map(|&frequency| {
                let wavelen = 2.0 * std::f32::consts::PI / frequency;
                if wavelen > low_freq_wavelen {
                    frequency / factor
                } else if wavelen < high_freq_wavelen {
                    frequency
                } else {
                    let smooth = (original / wavelen - low) / (high - low);
                    (1.0 - smooth) * frequency / factor + smooth * frequency
                }
            })
            .collect()
    }
}

impl YarnScaling {
    /// Checks the fields: `Err((field, value, reason))`.
    fn check(&self) -> Result<(), InvalidField> {
        positive("factor", self.factor)?;
        positive("beta_fast", self.beta_fast)?;
        positive("beta_slow", self.beta_slow)?;
        if let Some(attention_factor) = self.attention_factor {
            positive("attention_factor", attention_factor)?;
        }
        some_context(self.original_max_position_embeddings)
    }

    /// The `default` inverse frequencies (of `head_dim`, base `theta`) scaled, and the factor
    /// of the tables.
    fn scale(&self, default: &[f32], head_dim: usize, theta: f64) -> (Vec<f32>, f32) {
        let get_mscale = |scale: f64, mscale: f64| {
            if scale <= 1.0 {
                1.0
            } else {
                0.1 * mscale * scale.ln() + 1.0
            }
        };
        let factor = self.factor;
        let attention_factor =
            self.attention_factor
                .unwrap_or(match (self.mscale, self.mscale_all_dim) {
                    (Some(mscale), Some(all)) if mscale != 0.0 && all != 0.0 => {
                        get_mscale(factor, mscale) / get_mscale(factor, all)
                    }
                    _ => get_mscale(factor, 1.0),
                });
        let dim = head_dim as f64;
        let original = self.original_max_position_embeddings as f64;
        let correction_dim =
            |rotations: f64| dim * (original / (rotations * 2.0 * PI)).ln() / (2.0 * theta.ln());
        let (mut low, mut high) = (
            correction_dim(self.beta_fast),
            correction_dim(self.beta_slow),
        );
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0) as f32, high.min(dim - 1.0) as f32);
        if low == high {
            high += 0.001;
        }
        let factor = factor as f32;
        let scaled = default
            .iter()
            .enumerate()
            .map(|(i, &extrapolation)| {
                let interpolation = extrapolation / factor;
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation_share = 1.0 - ramp;
                interpolation * (1.0 - extrapolation_share) + extrapolation * extrapolation_share
            })
            .collect();
        (scaled, attention_factor as f32)
    }
}

/// Cosine and sine tables `[positions, head_dim]` for a run of consecutive positions.
///
/// Frequencies follow transformers' RoPE for the model's [`RopeScaling`]; each table repeats its
/// half (`cat(freqs, freqs)`) and is multiplied by the scaling's attention factor, computed in
/// f32.
#[derive(Debug, Clone)]
pub struct RotaryTables {
    cos: Tensor<2>,
    sin: Tensor<2>,
}

impl RotaryTables {
    /// Tables for positions `start .. start + len` of unscaled rotary embeddings.
    pub fn new(head_dim: usize, theta: f64, start: usize, len: usize, device: &Device) -> Self {
        Self::scaled(&RopeScaling::Default, head_dim, theta, start, len, device)
    }

    /// Tables for positions `start .. start + len` with the frequencies of `scaling`.
    pub fn scaled(
        scaling: &RopeScaling,
        head_dim: usize,
        theta: f64,
        start: usize,
        len: usize,
        device: &Device,
    ) -> Self {
        let (inv_freq, attention_factor) = scaling.inverse_frequencies(head_dim, theta);
        let mut cos = Vec::with_capacity(len * head_dim);
        let mut sin = Vec::with_capacity(len * head_dim);
        for position in start..start + len {
            let angles: Vec<f32> = inv_freq.iter().map(|f| position as f32 * f).collect();
            for _ in 0..2 {
                cos.extend(angles.iter().map(|a| a.cos() * attention_factor));
                sin.extend(angles.iter().map(|a| a.sin() * attention_factor));
            }
        }
        Self {
            cos: Tensor::from_data(TensorData::new(cos, [len, head_dim]), device),
            sin: Tensor::from_data(TensorData::new(sin, [len, head_dim]), device),
        }
    }

    /// Rotates `x` `[batch, heads, positions, head_dim]`: `x·cos + rotate_half(x)·sin`, where
    /// `rotate_half(x) = cat(-x[.., d/2..], x[.., ..d/2])`.
    pub fn apply(&self, x: Tensor<4>) -> Tensor<4> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama 3.1's published example: with factor 8, low 1, high 4 and an original context of
    /// 8192, wavelengths below 2048 are kept, above 8192 divided by 8, and between interpolated.
    #[test]
    fn llama3_keeps_short_wavelengths_and_scales_long_ones() {
        let scaling = RopeScaling::Llama3(Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        });
        let (default, _) = RopeScaling::Default.inverse_frequencies(128, 500000.0);
        let (scaled, factor) = scaling.inverse_frequencies(128, 500000.0);
        assert_eq!(factor, 1.0);
        let (mut kept, mut divided, mut between) = (0, 0, 0);
        for (d, s) in default.iter().zip(&scaled) {
            let wavelen = 2.0 * std::f32::consts::PI / d;
            if wavelen < 2048.0 {
                assert_eq!(s, d);
                kept += 1;
            } else if wavelen > 8192.0 {
                assert_eq!(*s, d / 8.0);
                divided += 1;
            } else {
                assert!(*s < *d && *s > d / 8.0, "{s} between {} and {d}", d / 8.0);
                between += 1;
            }
        }
        assert!(kept > 0 && divided > 0 && between > 0);
    }

    /// YaRN's attention factor without `attention_factor`: `0.1·ln(factor) + 1`.
    #[test]
    fn yarn_attention_factor_follows_the_paper() {
        let scaling = RopeScaling::Yarn(YarnScaling {
            factor: 4.0,
            original_max_position_embeddings: 32768,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: None,
            mscale: None,
            mscale_all_dim: None,
            truncate: true,
        });
        let (scaled, factor) = scaling.inverse_frequencies(128, 1e6);
        assert!((factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
        let (default, _) = RopeScaling::Default.inverse_frequencies(128, 1e6);
        // The fastest dimensions extrapolate (kept), the slowest interpolate (divided by 4).
        assert_eq!(scaled[0], default[0]);
        assert!((scaled[63] - default[63] / 4.0).abs() <= default[63] * 1e-6);
    }
}
