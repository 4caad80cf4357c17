//! The decoder on NdArray and Trainium (host): agreement, causality, KV cache, loss.

use crate::host;
use burn::module::Module;
use burn::tensor::{DType, Device, Int, Tensor, TensorData, Tolerance};
use burn_store::ModuleSnapshot;
use hlat::{Hlat, HlatConfig, KvCache, ModelFamily, SlidingWindow};

fn test_model() -> (HlatConfig, Hlat) {
    let config = HlatConfig::preset("hlat-test").unwrap();
    let model = config.init(&Device::flex());
    (config, model)
}

fn ids(rows: &[&[i64]], device: &Device) -> Tensor<2, Int> {
    let flat: Vec<i64> = rows.iter().flat_map(|row| row.iter().copied()).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), rows[0].len()]), device)
}

const BATCH: &[&[i64]] = &[&[1, 5, 9, 33, 2, 17, 63, 0], &[4, 4, 8, 15, 16, 23, 42, 7]];

#[test]
fn ndarray_and_trainium_host_give_the_same_logits() {
    let (_, model) = test_model();
    let expected = model.forward(ids(BATCH, &Device::flex()));
    let device = host();
    let mut on_trainium: Hlat = model.config().init(&device);
    let result = on_trainium.apply(model.collect(None, None, false), None, None, false);
    assert!(result.is_success() && result.missing.is_empty(), "{result}");
    let logits = on_trainium.forward(ids(BATCH, &device));
    logits
        .into_data()
        .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::absolute(1e-5));
}

#[test]
fn changing_a_later_token_never_changes_earlier_logits() {
    let (config, model) = test_model();
    let device = Device::flex();
    let logits = model.forward(ids(BATCH, &device));
    for changed in 1..BATCH[0].len() {
        let mut row = BATCH[0].to_vec();
        row[changed] = (row[changed] + 1) % config.vocab_size as i64;
        let other = model.forward(ids(&[&row], &device));
        let before = |t: Tensor<3>| t.narrow(0, 0, 1).narrow(1, 0, changed).into_data();
        before(other.clone()).assert_eq(&before(logits.clone()), true);
        let at = |t: Tensor<3>| t.narrow(0, 0, 1).narrow(1, changed, 1).into_data();
        assert_ne!(
            at(other),
            at(logits.clone()),
            "position {changed} ignores its own token"
        );
    }
}

#[test]
fn cached_decoding_equals_full_recompute() {
    let (config, model) = test_model();
    let device = Device::flex();
    let full = model.forward(ids(BATCH, &device));
    let mut cache = KvCache::new(
        &config,
        BATCH.len(),
        config.max_seq_len,
        DType::F32,
        &device,
    );
    let prefix = 3;
    let mut pieces =
        vec![model.forward_cached(ids(BATCH, &device).narrow(1, 0, prefix), &mut cache)];
    for position in prefix..BATCH[0].len() {
        let step = ids(BATCH, &device).narrow(1, position, 1);
        pieces.push(model.forward_cached(step, &mut cache));
    }
    assert_eq!(cache.len(), BATCH[0].len());
    Tensor::cat(pieces, 1)
        .into_data()
        .assert_approx_eq::<f32>(&full.into_data(), Tolerance::absolute(1e-5));
}

/// A configuration whose second layer slides over a window of 100 positions (the first
/// attends to every earlier one), as Qwen's `max_window_layers` lays them out.
pub(crate) fn windowed_config(context: usize) -> HlatConfig {
    HlatConfig {
        family: ModelFamily::Qwen2,
        qkv_bias: true,
        max_seq_len: context,
        sliding_window: Some(SlidingWindow {
            size: 100,
            first_layer: 1,
        }),
        ..HlatConfig::preset("hlat-test").unwrap()
    }
}

/// Over 600 positions the window hides the first 500 from the last query. The forward pass
/// (query blocks, the window in a mask built on the device) equals decoding through the KV cache
/// (the window in a mask built on the host) in two pieces of 300.
#[test]
fn a_sliding_window_over_a_long_sequence_equals_cached_decoding() {
    let (seq, device) = (600, Device::flex());
    let config = windowed_config(seq);
    let model = config.init(&device);
    let row: Vec<i64> = (0..seq as i64).map(|i| (i * 37 + 5) % 64).collect();
    let input = || ids(&[&row], &device);
    let full = model.forward(input());
    let mut cache = KvCache::new(&config, 1, seq, DType::F32, &device);
    let first = model.forward_cached(input().narrow(1, 0, 300), &mut cache);
    let second = model.forward_cached(input().narrow(1, 300, 300), &mut cache);
    Tensor::cat(vec![first, second], 1)
        .into_data()
        .assert_approx_eq::<f32>(&full.clone().into_data(), Tolerance::absolute(1e-4));
    // Without the window the last positions see the whole prefix and change.
    let unwindowed = HlatConfig {
        sliding_window: None,
        ..config
    };
    let mut plain = unwindowed.init(&device);
    plain = plain.load_record(model.clone().into_record());
    let difference = (plain.forward(input()) - full)
        .narrow(1, seq - 1, 1)
        .abs()
        .max()
        .into_scalar::<f32>();
    assert!(
        difference > 1e-3,
        "the window changes nothing ({difference})"
    );
}

#[test]
fn loss_is_the_mean_cross_entropy_over_kept_targets() {
    let (config, model) = test_model();
    let device = Device::flex();
    let inputs = ids(BATCH, &device);
    let targets_rows: Vec<Vec<i64>> = BATCH
        .iter()
        .map(|r| r.iter().map(|t| (t * 7 + 3) % 64).collect())
        .collect();
    let pad = 0i64;
    let mut masked_rows = targets_rows.clone();
    masked_rows[1][2] = pad;
    masked_rows[0][5] = pad;
    let masked_refs: Vec<&[i64]> = masked_rows.iter().map(|r| r.as_slice()).collect();
    let loss = model
        .loss(inputs.clone(), ids(&masked_refs, &device), Some(pad as u32))
        .into_scalar::<f32>();

    // Reference: log-softmax computed here from the logits, over the kept positions.
    let logits = model
        .forward(inputs)
        .into_data()
        .try_into_vec::<f32>()
        .unwrap();
    let vocab = config.vocab_size;
    let (mut total, mut count) = (0.0f64, 0);
    for (b, row) in masked_rows.iter().enumerate() {
        for (s, &target) in row.iter().enumerate() {
            if target == pad {
                continue;
            }
            let start = (b * row.len() + s) * vocab;
            let scores = &logits[start..start + vocab];
            let max = scores.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let log_sum = scores
                .iter()
                .map(|x| (*x as f64 - max).exp())
                .sum::<f64>()
                .ln()
                + max;
            total += log_sum - scores[target as usize] as f64;
            count += 1;
        }
    }
    let expected = total / count as f64;
    assert!(
        (loss as f64 - expected).abs() < 1e-5,
        "loss {loss} vs {expected}"
    );
}

#[test]
fn initialisation_follows_hlat() {
    let config = HlatConfig::preset("hlat-tiny").unwrap();
    let model = config.init(&Device::flex());
    assert_eq!(model.num_params() as u64, config.num_params());
    let weights = model.layers[0]
        .dense_mlp()
        .unwrap()
        .gate_proj
        .weight
        .val()
        .into_data()
        .try_into_vec::<f32>()
        .unwrap();
    let n = weights.len() as f64;
    let mean = weights.iter().map(|w| *w as f64).sum::<f64>() / n;
    let std = (weights
        .iter()
        .map(|w| (*w as f64 - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    assert!(mean.abs() < 2e-3, "mean {mean}");
    assert!((std - 0.021).abs() < 1e-3, "std {std}");
    let norm = model.layers[1]
        .post_attention_layernorm
        .weight
        .val()
        .into_data();
    norm.assert_eq(
        &TensorData::new(vec![1.0f32; config.hidden_size], [config.hidden_size]),
        false,
    );
}
