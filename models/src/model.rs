//! [`Hlat`]: the decoder, its logits and its training loss.

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use crate::attention::Context;
use crate::block::DecoderLayer;
use crate::cache::KvCache;
use crate::config::HlatConfig;
use crate::linear::{normal_init, projection};
use crate::norm::RmsNorm;
use crate::parallel::{Exchange, Unsharded, local_ids};
use crate::rotary::RotaryTables;

/// The decoder: token embedding, pre-norm blocks, final RMSNorm, LM head (untied in HLAT, the
/// embedding itself when the configuration ties them).
///
/// Field names follow Hugging Face's `LlamaForCausalLM` (`embed_tokens`, `layers.N.self_attn.q_proj`,
/// ...), so a parameter's Burn path is its Hugging Face name without the `model.` prefix. The
/// model keeps its [`HlatConfig`] (not a parameter; not saved in records): see [`Hlat::config`].
#[derive(Module, Debug)]
pub struct Hlat {
    /// Token embedding `[vocab, hidden]`.
    pub embed_tokens: Embedding,
    /// The decoder blocks.
    pub layers: Vec<DecoderLayer>,
    /// Final norm.
    pub norm: RmsNorm,
    /// LM head `hidden -> vocab`; `None` when tied: the logits are then the final hidden states
    /// times the embedding, transposed (one weight, whose gradient sums both uses).
    pub lm_head: Option<Linear>,
    #[module(skip)]
    config: HlatConfig,
}

impl Hlat {
    /// A freshly initialised model; `config` must be valid (see [`HlatConfig::try_init`]).
    pub(crate) fn new(config: HlatConfig, device: &Device) -> Self {
        Self {
            embed_tokens: EmbeddingConfig::new(config.vocab_size, config.hidden_size)
                .with_initializer(normal_init(&config))
                .init(device),
            layers: (0..config.num_layers)
                .map(|layer| DecoderLayer::new(&config, layer, device))
                .collect(),
            norm: RmsNorm::new(config.hidden_size, config.rms_norm_eps, device),
            lm_head: (!config.tie_word_embeddings).then(|| {
                projection(
                    &config,
                    config.hidden_size,
                    config.vocab_size,
                    false,
                    device,
                )
            }),
            config,
        }
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &HlatConfig {
        &self.config
    }

    /// The model with every mixture-of-experts layer routing under `capacity_factor`
    /// ([`crate::SparseMoe::capacity_factor`]; `None`: dropless). A dense model is unchanged.
    pub fn with_moe_capacity_factor(mut self, capacity_factor: Option<f64>) -> Self {
        for moe in self
            .layers
            .iter_mut()
            .filter_map(|layer| layer.moe.as_mut())
        {
            moe.capacity_factor = capacity_factor;
        }
        self
    }

    /// The same model with other decoder layers (a pipeline stage's slots, or the whole model
    /// joined from them).
    pub(crate) fn with_layers(self, layers: Vec<DecoderLayer>) -> Self {
        Self { layers, ..self }
    }

    /// Logits `[batch, seq, vocab]` for `input_ids` `[batch, seq]` (positions start at 0).
    pub fn forward(&self, input_ids: Tensor<2, Int>) -> Tensor<3> {
        self.forward_with(input_ids, &Unsharded)
    }

    /// Logits for `input_ids` on a model split by `exchange`: each rank's slice of the vocabulary
    /// `[batch, seq, vocab / degree]`, for the full sequence.
    pub fn forward_with(&self, input_ids: Tensor<2, Int>, exchange: &dyn Exchange) -> Tensor<3> {
        let hidden = self.run_layers(input_ids, None, exchange).0;
        self.head(hidden, exchange)
    }

    /// Logits `[batch, seq, vocab]` for `input_ids` that continue the positions in `cache`, which
    /// is extended with them.
    pub fn forward_cached(&self, input_ids: Tensor<2, Int>, cache: &mut KvCache) -> Tensor<3> {
        let hidden = self.run_layers(input_ids, Some(cache), &Unsharded).0;
        self.head(hidden, &Unsharded)
    }

    /// Logits `[batch, vocab]` of the last position only, extending `cache` (used by generation:
    /// the LM head runs on one position).
    pub fn forward_cached_last(&self, input_ids: Tensor<2, Int>, cache: &mut KvCache) -> Tensor<2> {
        let [_, seq] = input_ids.dims();
        self.forward_cached_at(input_ids, cache, seq - 1)
    }

    /// Logits `[batch, vocab]` of input position `position`, extending `cache` by every input
    /// position. The position is a run-time index, not part of the program: prompts padded to
    /// one length run the same program whatever their real length.
    pub fn forward_cached_at(
        &self,
        input_ids: Tensor<2, Int>,
        cache: &mut KvCache,
        position: usize,
    ) -> Tensor<2> {
        let device = input_ids.device();
        let hidden = self.run_layers(input_ids, Some(cache), &Unsharded).0;
        let [batch, _, _] = hidden.dims();
        let index = TensorData::new(vec![position as i32], [1]);
        let index = Tensor::<1, Int>::from_data(index, &device);
        let logits = self.head(hidden.select(1, index), &Unsharded);
        let vocab = logits.dims()[2];
        logits.reshape([batch, vocab])
    }

    /// Mean next-token cross-entropy. `targets` `[batch, seq]` aligns with `input_ids`: the target
    /// at position `i` is the token that follows `input_ids[.., i]` (shift before calling).
    /// Positions whose target equals `ignore_id` are left out of the mean. Computed in f32.
    pub fn loss(
        &self,
        input_ids: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        ignore_id: Option<u32>,
    ) -> Tensor<1> {
        self.loss_with(input_ids, targets, ignore_id, &Unsharded)
    }

    /// [`Hlat::loss`] on a model split by `exchange`: the cross-entropy of the
    /// vocabulary-parallel logits (each rank holds its slice of the vocabulary), the same value
    /// on every rank.
    pub fn loss_with(
        &self,
        input_ids: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        ignore_id: Option<u32>,
        exchange: &dyn Exchange,
    ) -> Tensor<1> {
        let logits = self.forward_with(input_ids, exchange);
        loss_from_logits(logits, targets, ignore_id, exchange)
    }

    /// The log-probability of each target token `[batch, seq]` of a batch on a model split by
    /// `exchange` (0 where the target is `ignore_id`; see [`token_log_probs`]).
    pub fn token_log_probs_with(
        &self,
        input_ids: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        ignore_id: Option<u32>,
        exchange: &dyn Exchange,
    ) -> Tensor<2> {
        let logits = self.forward_with(input_ids, exchange);
        token_log_probs(logits, targets, ignore_id, exchange)
    }

    /// The training objective of a batch: [`Hlat::loss_with`]'s cross-entropy plus, for a
    /// mixture of experts, `router_aux_loss_coef` times the load-balancing loss of its routers
    /// ([`crate::moe::load_balancing_loss`], as transformers adds it with
    /// `output_router_logits`). Returns the objective and the load-balancing loss (`None` for a
    /// dense model).
    pub fn objective_with(
        &self,
        input_ids: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        ignore_id: Option<u32>,
        exchange: &dyn Exchange,
    ) -> (Tensor<1>, Option<Tensor<1>>) {
        let (hidden, router_logits) = self.run_layers(input_ids, None, exchange);
        let logits = self.head(hidden, exchange);
        let cross_entropy = loss_from_logits(logits, targets, ignore_id, exchange);
        let balance = self.config.moe.as_ref().and_then(|moe| {
            crate::moe::load_balancing_loss(&router_logits, moe.experts_per_token)
                .map(|balance| (balance, moe.router_aux_loss_coef))
        });
        match balance {
            Some((balance, coefficient)) => {
                // Every tensor-parallel rank computes the same load-balancing loss, and its
                // gradient reaches parameters and inputs whose gradients the group sums (the
                // router's, the layer input's): each rank passes on its share.
                let share = match exchange.degree() {
                    1 => balance.clone(),
                    degree => {
                        let part = balance.clone().div_scalar(degree as f64);
                        part.clone() + (balance.clone() - part).detach()
                    }
                };
                (cross_entropy + share.mul_scalar(coefficient), Some(balance))
            }
            None => (cross_entropy, None),
        }
    }

    /// Token embeddings of `input_ids`; with a split vocabulary each rank looks up the ids of
    /// its slice (others give zero rows) and `exchange` sums the ranks' parts.
    pub(crate) fn embed(&self, input_ids: Tensor<2, Int>, exchange: &dyn Exchange) -> Tensor<3> {
        if exchange.degree() == 1 {
            return self.embed_tokens.forward(input_ids);
        }
        let local_vocab = self.embed_tokens.weight.dims()[0];
        let (local, outside) = local_ids(exchange, input_ids, local_vocab);
        let inside = outside.bool_not().float().unsqueeze_dim::<3>(2);
        let part = self.embed_tokens.forward(local);
        exchange.exit(part * inside.cast(self.embed_tokens.weight.dtype()))
    }

    /// The rotary tables of `seq` positions from `start`.
    pub(crate) fn rotary(&self, start: usize, seq: usize, device: &Device) -> RotaryTables {
        RotaryTables::scaled(
            &self.config.rope_scaling,
            self.config.head_dim(),
            self.config.rope_theta,
            start,
            seq,
            device,
        )
    }

    /// Logits of the last layer's output `x`: the final norm and the LM head (each rank's slice
    /// of the vocabulary, for the full sequence). A tied head multiplies by this rank's rows of
    /// the vocabulary-parallel embedding: the same slice of the vocabulary.
    pub(crate) fn head(&self, x: Tensor<3>, exchange: &dyn Exchange) -> Tensor<3> {
        let x = exchange.enter(self.norm.forward(x));
        match &self.lm_head {
            Some(lm_head) => lm_head.forward(x),
            None => x.matmul(self.embed_tokens.weight.val().transpose().unsqueeze()),
        }
    }

    /// The output of the last layer `[batch, seq, hidden]` (this rank's slice of the sequence
    /// under sequence parallelism), through `cache` when given, and the router logits of the
    /// mixture-of-experts layers in order.
    fn run_layers(
        &self,
        input_ids: Tensor<2, Int>,
        mut cache: Option<&mut KvCache>,
        exchange: &dyn Exchange,
    ) -> (Tensor<3>, Vec<Tensor<2>>) {
        let [_, seq] = input_ids.dims();
        let device = input_ids.device();
        let start = cache.as_ref().map_or(0, |cache| cache.len());
        let rotary = self.rotary(start, seq, &device);
        let write = cache.as_ref().map(|cache| cache.write_for(seq, &device));
        let mut x = self.embed(input_ids, exchange);
        let mut router_logits = Vec::new();
        for (index, layer) in self.layers.iter().enumerate() {
            let context = match (cache.as_deref_mut(), &write) {
                (Some(cache), Some(write)) => Context::Cached {
                    cache,
                    layer: index,
                    write,
                },
                _ => Context::Full,
            };
            let (output, routed) = layer.forward_routed(x, &rotary, context, exchange);
            x = output;
            router_logits.extend(routed);
        }
        if let Some(cache) = cache {
            cache.advance(seq);
        }
        (x, router_logits)
    }
}

/// Mean next-token cross-entropy of `logits` `[batch, seq, vocab / degree]` (each rank's slice
/// of the vocabulary under `exchange`) against `targets`, leaving out `ignore_id`; in f32, the
/// same value on every rank.
pub(crate) fn loss_from_logits(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    ignore_id: Option<u32>,
    exchange: &dyn Exchange,
) -> Tensor<1> {
    let (per_token, kept) = token_cross_entropy(logits, targets, ignore_id, exchange);
    match kept {
        None => per_token.mean(),
        Some(kept) => {
            let count = kept.clone().sum().clamp_min(1.0);
            (per_token * kept).sum() / count
        }
    }
}

/// The log-probability of each target token `[batch, seq]` under `logits` `[batch, seq, vocab /
/// degree]` (each rank's slice of the vocabulary under `exchange`), in f32, 0 where the target
/// is `ignore_id`: what preference losses sum per sequence.
pub fn token_log_probs(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    ignore_id: Option<u32>,
    exchange: &dyn Exchange,
) -> Tensor<2> {
    let [batch, seq, _] = logits.dims();
    let (per_token, kept) = token_cross_entropy(logits, targets, ignore_id, exchange);
    let log_probs = per_token.neg();
    match kept {
        Some(kept) => log_probs * kept,
        None => log_probs,
    }
    .reshape([batch, seq])
}

/// Each target's cross-entropy `[batch · seq, 1]` (ignored targets read as id 0) and, with
/// `ignore_id`, the f32 mask of the targets kept.
fn token_cross_entropy(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    ignore_id: Option<u32>,
    exchange: &dyn Exchange,
) -> (Tensor<2>, Option<Tensor<2>>) {
    let [batch, seq, vocab] = logits.dims();
    let rows = batch * seq;
    let logits = logits.reshape([rows, vocab]).cast(DType::F32);
    let targets = targets.reshape([rows, 1]);
    let ignored = ignore_id.map(|ignore_id| targets.clone().equal_elem(ignore_id as i64));
    // Ignored targets may lie outside the vocabulary: they are weighed by 0.
    let targets = match &ignored {
        Some(ignored) => targets.mask_fill(ignored.clone(), 0),
        None => targets,
    };
    let kept = ignored.map(|ignored| ignored.bool_not().float().cast(DType::F32));
    (cross_entropy_rows(logits, targets, exchange), kept)
}

/// Per-row cross-entropy `[rows, 1]`: the log of the row's sum of exponentials (shifted by the
/// row's maximum, which keeps exp() in range and takes no gradient) minus the target's logit.
/// Under an `exchange` of several ranks the logits are split by vocabulary (Megatron's
/// vocabulary-parallel cross-entropy): the maximum, the sum of exponentials and the target's
/// logit are combined over the group, the same value on every rank.
///
/// Written this way rather than as a log-softmax and a gather, the backward pass takes the
/// gradient of the log-sum once per row; through a log-softmax it sums the gather's scattered
/// `[rows, vocab]` gradient back to one value per row, and the forward pass writes the whole
/// `[rows, vocab]` log-softmax to read one value per row.
fn cross_entropy_rows(
    logits: Tensor<2>,
    targets: Tensor<2, Int>,
    exchange: &dyn Exchange,
) -> Tensor<2> {
    let [_, local_vocab] = logits.dims();
    let maximum = exchange.max(logits.clone().detach().max_dim(1));
    let total = exchange.sum((logits.clone() - maximum.clone()).exp().sum_dim(1));
    // The target's logit is read from the logits themselves, after the sum: measured on
    // NdArray's autodiff (1,024 rows of 32,000), the backward pass then holds three
    // [rows, vocabulary] tensors at its peak, where reading it from the shifted logits held four.
    let target = if exchange.degree() == 1 {
        logits.gather(1, targets)
    } else {
        let (local, outside) = local_ids(exchange, targets, local_vocab);
        exchange.sum(logits.gather(1, local) * outside.bool_not().float())
    };
    total.log() + maximum - target
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loss is the mean over kept rows of `log(sum(exp(x))) - x[target]`, and its gradient
    /// with respect to the logits `(softmax(x) - one_hot(target)) / kept` on kept rows and 0 on
    /// ignored ones: computed here in f64 from the formulas, independently of the model's code.
    #[test]
    fn the_loss_and_its_gradient_follow_the_closed_form() {
        let device = Device::flex().autodiff();
        let (rows, vocab, ignore_id) = (3, 5, 7);
        let values: Vec<f32> = (0..rows * vocab)
            .map(|i| ((i * 7) % 11) as f32 * 0.75 - 3.0)
            .collect();
        let targets = [2i64, 0, ignore_id as i64];
        let logits =
            Tensor::<3>::from_data(TensorData::new(values.clone(), [1, rows, vocab]), &device)
                .require_grad();
        let target_ids =
            Tensor::<2, Int>::from_data(TensorData::new(targets.to_vec(), [1, rows]), &device);
        let loss = loss_from_logits(logits.clone(), target_ids, Some(ignore_id), &Unsharded);
        let gradient = logits
            .grad(&loss.backward())
            .expect("the logits take part in the loss")
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let loss = loss.into_data().try_to_vec::<f32>().unwrap()[0];

        let kept = 2.0;
        let (mut expected_loss, mut expected_gradient) = (0.0f64, vec![0.0f64; rows * vocab]);
        for (row, &target) in targets.iter().enumerate().take(2) {
            let line: Vec<f64> = values[row * vocab..(row + 1) * vocab]
                .iter()
                .map(|&value| value as f64)
                .collect();
            let total: f64 = line.iter().map(|value| value.exp()).sum();
            expected_loss += (total.ln() - line[target as usize]) / kept;
            for (column, value) in line.iter().enumerate() {
                let one_hot = if column == target as usize { 1.0 } else { 0.0 };
                expected_gradient[row * vocab + column] = (value.exp() / total - one_hot) / kept;
            }
        }
        assert!(
            (loss as f64 - expected_loss).abs() < 1e-5,
            "{loss} vs {expected_loss}"
        );
        for (index, (actual, expected)) in gradient.iter().zip(&expected_gradient).enumerate() {
            assert!(
                (*actual as f64 - expected).abs() < 1e-6,
                "gradient {index}: {actual} vs {expected}"
            );
        }
    }
}
