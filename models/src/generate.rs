//! Autoregressive generation with a KV cache: greedy, or sampling with temperature, top-k and
//! top-p from a seeded generator.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cache::KvCache;
use crate::model::Hlat;

/// How the next token is chosen from the logits.
#[derive(Debug, Clone, PartialEq)]
pub enum Sampling {
    /// The most likely token (the first one on ties).
    Greedy,
    /// A draw from the softmax of `logits / temperature`, restricted to the `top_k` most likely
    /// tokens, then to the smallest set whose probability reaches `top_p` (applied in that
    /// order, as transformers' logits processors).
    Sample {
        /// Divides the logits; must be positive.
        temperature: f32,
        /// Keep only this many most likely tokens (`None`: all).
        top_k: Option<usize>,
        /// Keep the smallest most-likely set with this cumulative probability, in (0, 1].
        top_p: Option<f32>,
    },
}

/// Options of [`generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationOptions {
    /// Upper bound on the number of generated tokens.
    pub max_new_tokens: usize,
    /// Greedy or sampled decoding.
    pub sampling: Sampling,
    /// Seed of the sampling generator (unused by greedy decoding).
    pub seed: u64,
    /// Generation stops after producing any of these ids (the stop id is included in the output).
    pub stop_ids: Vec<u32>,
}

/// Errors of [`generate`].
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The prompt has no token.
    #[error("the prompt is empty: generation needs at least one token")]
    EmptyPrompt,
    /// A prompt id is not in the vocabulary.
    #[error("prompt token {id} at position {position} is outside the vocabulary of {vocab_size}")]
    TokenOutOfVocabulary {
        /// The id.
        id: u32,
        /// Its index in the prompt.
        position: usize,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// Prompt plus generated tokens would exceed the model's context.
    #[error(
        "prompt of {prompt} tokens plus {max_new_tokens} new tokens exceeds the context of {max_seq_len}"
    )]
    ContextTooLong {
        /// Prompt length.
        prompt: usize,
        /// Requested new tokens.
        max_new_tokens: usize,
        /// The model's `max_seq_len`.
        max_seq_len: usize,
    },
    /// A sampling parameter is out of range.
    #[error("invalid sampling option `{option}` = {value}: {reason}")]
    InvalidSampling {
        /// The option.
        option: &'static str,
        /// Its value.
        value: String,
        /// The accepted range.
        reason: &'static str,
    },
    /// The logits could not be read back from the device.
    #[error("could not read the logits back: {0}")]
    ReadLogits(String),
}

impl Sampling {
    fn validate(&self) -> Result<(), GenerateError> {
        let Sampling::Sample {
            temperature,
            top_k,
            top_p,
        } = self
        else {
            return Ok(());
        };
        let invalid = |option, value: String, reason| {
            Err(GenerateError::InvalidSampling {
                option,
                value,
                reason,
            })
        };
        if !(temperature.is_finite() && *temperature > 0.0) {
            return invalid("temperature", temperature.to_string(), "must be positive");
        }
        if *top_k == Some(0) {
            return invalid("top_k", "0".into(), "must be at least 1");
        }
        if let Some(top_p) = top_p
            && !(*top_p > 0.0 && *top_p <= 1.0)
        {
            return invalid("top_p", top_p.to_string(), "must be in (0, 1]");
        }
        Ok(())
    }

    /// Picks a token from one row of logits.
    fn pick(&self, logits: &[f32], rng: &mut StdRng) -> u32 {
        match self {
            Sampling::Greedy => argmax(logits),
            Sampling::Sample {
                temperature,
                top_k,
                top_p,
            } => {
                let mut candidates: Vec<(u32, f32)> = logits
                    .iter()
                    .enumerate()
                    .map(|(id, logit)| (id as u32, logit / temperature))
                    .collect();
                // Most likely first; stable, so ties keep the lower id first.
                candidates.sort_by(|a, b| b.1.total_cmp(&a.1));
                if let Some(k) = top_k {
                    candidates.truncate(*k);
                }
                let max = candidates[0].1;
                let mut weights: Vec<f32> =
                    candidates.iter().map(|(_, l)| (l - max).exp()).collect();
                let total: f32 = weights.iter().sum();
                weights.iter_mut().for_each(|w| *w /= total);
                if let Some(p) = top_p {
                    let mut cumulative = 0.0;
                    let keep = weights
                        .iter()
                        .position(|w| {
                            cumulative += w;
                            cumulative >= *p
                        })
                        .map_or(weights.len(), |last| last + 1);
                    weights.truncate(keep);
                }
                let total: f32 = weights.iter().sum();
                let mut draw = rng.random::<f32>() * total;
                for (index, weight) in weights.iter().enumerate() {
                    if draw < *weight {
                        return candidates[index].0;
                    }
                    draw -= weight;
                }
                candidates[weights.len() - 1].0
            }
        }
    }
}

/// Index of the largest value (the first one on ties, as `torch.argmax`).
fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (index, value) in values.iter().enumerate() {
        if *value > values[best] {
            best = index;
        }
    }
    best as u32
}

/// Generates up to `options.max_new_tokens` tokens after `prompt` and returns them (the prompt
/// excluded). `on_token` is called with each new token as soon as it is chosen.
///
/// The prompt is processed in one pass that fills a [`KvCache`]; each new token then costs one
/// single-position pass.
pub fn generate(
    model: &Hlat,
    prompt: &[u32],
    options: &GenerationOptions,
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>, GenerateError> {
    let config = model.config();
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if let Some((position, &id)) = prompt
        .iter()
        .enumerate()
        .find(|(_, id)| **id as usize >= config.vocab_size)
    {
        return Err(GenerateError::TokenOutOfVocabulary {
            id,
            position,
            vocab_size: config.vocab_size,
        });
    }
    if prompt
        .len()
        .checked_add(options.max_new_tokens)
        .is_none_or(|total| total > config.max_seq_len)
    {
        return Err(GenerateError::ContextTooLong {
            prompt: prompt.len(),
            max_new_tokens: options.max_new_tokens,
            max_seq_len: config.max_seq_len,
        });
    }
    options.sampling.validate()?;

    let device = model.embed_tokens.weight.device();
    let dtype = model.embed_tokens.weight.val().dtype();
    let mut rng = StdRng::seed_from_u64(options.seed);
    // One cache of the model's whole context, one program per prompt bucket, one for every
    // decoding step.
    let mut cache = KvCache::new(config, 1, config.max_seq_len, dtype, &device);
    let bucket = prompt_bucket(prompt.len(), config.max_seq_len);
    let mut padded: Vec<u32> = prompt.to_vec();
    padded.resize(bucket, config.pad_token_id.unwrap_or(0));
    let mut logits =
        model.forward_cached_at(token_ids(&padded, &device), &mut cache, prompt.len() - 1);
    cache.truncate(prompt.len());
    let mut generated = Vec::with_capacity(options.max_new_tokens);
    while generated.len() < options.max_new_tokens {
        let values = logits
            .cast(DType::F32)
            .try_into_data()
            .map_err(|error| GenerateError::ReadLogits(error.to_string()))?
            .try_into_vec::<f32>()
            .map_err(|error| GenerateError::ReadLogits(format!("{error:?}")))?;
        let token = options.sampling.pick(&values, &mut rng);
        generated.push(token);
        on_token(token);
        if options.stop_ids.contains(&token) || generated.len() == options.max_new_tokens {
            break;
        }
        logits = model.forward_cached_last(token_ids(&[token], &device), &mut cache);
    }
    Ok(generated)
}

/// The smallest prompt length of the buckets 16, 32, 64, … that holds `len` tokens, at most
/// `capacity`: prompts padded to it share a program.
pub fn prompt_bucket(len: usize, capacity: usize) -> usize {
    let mut bucket = 16;
    while bucket < len {
        bucket *= 2;
    }
    bucket.min(capacity).max(len)
}

/// `ids` as a `[1, len]` batch of 32-bit ids (ids below the vocabulary's size, which is at most
/// `i32::MAX`: no 64-bit integers reach the device, which trn1 would narrow).
fn token_ids(ids: &[u32], device: &Device) -> Tensor<2, Int> {
    let values: Vec<i32> = ids.iter().map(|&id| id as i32).collect();
    Tensor::from_data(TensorData::new(values, [1, ids.len()]), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.1, 2.0, -1.0, 1.9];
        let sampling = Sampling::Sample {
            temperature: 0.7,
            top_k: Some(1),
            top_p: None,
        };
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..20 {
            assert_eq!(sampling.pick(&logits, &mut rng), 1);
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_sufficient_set() {
        // Probabilities ≈ [0.64, 0.24, 0.09, 0.03]: top_p 0.8 keeps ids 0 and 1 only.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let sampling = Sampling::Sample {
            temperature: 1.0,
            top_k: None,
            top_p: Some(0.8),
        };
        let mut rng = StdRng::seed_from_u64(7);
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[sampling.pick(&logits, &mut rng) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0);
        assert_eq!(seen[2] + seen[3], 0);
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let sampling = Sampling::Sample {
            temperature: 1.3,
            top_k: Some(20),
            top_p: Some(0.9),
        };
        let draws = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..30)
                .map(|_| sampling.pick(&logits, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(11), draws(11));
        assert_ne!(draws(11), draws(12));
    }

    #[test]
    fn bad_sampling_options_are_named() {
        let sampling = Sampling::Sample {
            temperature: 0.0,
            top_k: None,
            top_p: None,
        };
        assert!(matches!(
            sampling.validate(),
            Err(GenerateError::InvalidSampling {
                option: "temperature",
                ..
            })
        ));
    }
}
