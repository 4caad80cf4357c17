//! [`Hlat`]: the decoder, its logits and its training loss.

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor};

use crate::attention::Context;
use crate::block::DecoderLayer;
use crate::cache::KvCache;
use crate::config::HlatConfig;
use crate::linear::{normal_init, projection};
use crate::norm::RmsNorm;
use crate::rotary::RotaryTables;

/// The HLAT decoder: token embedding, pre-norm blocks, final RMSNorm, untied LM head.
///
/// Field names follow Hugging Face's `LlamaForCausalLM` (`embed_tokens`, `layers.N.self_attn.q_proj`,
/// ...), so a parameter's Burn path is its Hugging Face name without the `model.` prefix. The
/// model keeps its [`HlatConfig`] (not a parameter; not saved in records): see [`Hlat::config`].
#[derive(Module, Debug)]
pub struct Hlat<B: Backend> {
    /// Token embedding `[vocab, hidden]`.
    pub embed_tokens: Embedding<B>,
    /// The decoder blocks.
    pub layers: Vec<DecoderLayer<B>>,
    /// Final norm.
    pub norm: RmsNorm<B>,
    /// LM head `hidden -> vocab` (untied from the embedding).
    pub lm_head: Linear<B>,
    #[module(skip)]
    config: HlatConfig,
}

impl<B: Backend> Hlat<B> {
    /// A freshly initialised model; `config` must be valid (see [`HlatConfig::try_init`]).
    pub(crate) fn new(config: HlatConfig, device: &B::Device) -> Self {
        Self {
            embed_tokens: EmbeddingConfig::new(config.vocab_size, config.hidden_size)
                .with_initializer(normal_init(&config))
                .init(device),
            layers: (0..config.num_layers)
                .map(|_| DecoderLayer::new(&config, device))
                .collect(),
            norm: RmsNorm::new(config.hidden_size, config.rms_norm_eps, device),
            lm_head: projection(&config, config.hidden_size, config.vocab_size, device),
            config,
        }
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &HlatConfig {
        &self.config
    }

    /// Logits `[batch, seq, vocab]` for `input_ids` `[batch, seq]` (positions start at 0).
    pub fn forward(&self, input_ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let hidden = self.hidden_states(input_ids, None);
        self.lm_head.forward(hidden)
    }

    /// Logits `[batch, seq, vocab]` for `input_ids` that continue the positions in `cache`, which
    /// is extended with them.
    pub fn forward_cached(
        &self,
        input_ids: Tensor<B, 2, Int>,
        cache: &mut KvCache<B>,
    ) -> Tensor<B, 3> {
        let hidden = self.hidden_states(input_ids, Some(cache));
        self.lm_head.forward(hidden)
    }

    /// Logits `[batch, vocab]` of the last position only, extending `cache` (used by generation:
    /// the LM head runs on one position).
    pub fn forward_cached_last(
        &self,
        input_ids: Tensor<B, 2, Int>,
        cache: &mut KvCache<B>,
    ) -> Tensor<B, 2> {
        let hidden = self.hidden_states(input_ids, Some(cache));
        let [batch, seq, width] = hidden.dims();
        let last = hidden.narrow(1, seq - 1, 1).reshape([batch, width]);
        self.lm_head.forward(last)
    }

    /// Mean next-token cross-entropy. `targets` `[batch, seq]` aligns with `input_ids`: the target
    /// at position `i` is the token that follows `input_ids[.., i]` (shift before calling).
    /// Positions whose target equals `ignore_id` are left out of the mean. Computed in f32.
    pub fn loss(
        &self,
        input_ids: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
        ignore_id: Option<u32>,
    ) -> Tensor<B, 1> {
        let logits = self.forward(input_ids);
        let [batch, seq, vocab] = logits.dims();
        let rows = batch * seq;
        let log_probs = log_softmax(logits.reshape([rows, vocab]).cast(DType::F32), 1);
        let targets = targets.reshape([rows, 1]);
        match ignore_id {
            None => log_probs.gather(1, targets).mean().neg(),
            Some(ignore_id) => {
                let ignored = targets.clone().equal_elem(ignore_id as i64);
                // Ignored targets may lie outside the vocabulary: gather at 0, then weigh by 0.
                let safe_targets = targets.mask_fill(ignored.clone(), 0);
                let kept = ignored.bool_not().float().cast(DType::F32);
                let picked = log_probs.gather(1, safe_targets) * kept.clone();
                let count = kept.sum().clamp_min(1.0);
                picked.sum().neg() / count
            }
        }
    }

    /// Final hidden states `[batch, seq, hidden]`, through `cache` when given.
    fn hidden_states(
        &self,
        input_ids: Tensor<B, 2, Int>,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let [_, seq] = input_ids.dims();
        let device = input_ids.device();
        let start = cache.as_ref().map_or(0, |cache| cache.len());
        let rotary = RotaryTables::new(
            self.config.head_dim(),
            self.config.rope_theta,
            start,
            seq,
            &device,
        );
        let mut x = self.embed_tokens.forward(input_ids);
        for (index, layer) in self.layers.iter().enumerate() {
            let context = match cache.as_deref_mut() {
                Some(cache) => Context::Cached {
                    cache,
                    layer: index,
                },
                None => Context::Full,
            };
            x = layer.forward(x, &rotary, context);
        }
        if let Some(cache) = cache {
            cache.advance(seq);
        }
        self.norm.forward(x)
    }
}
