//! The operations of an HLAT training step (a LLaMA-style block: embedding, RMSNorm, rotary
//! embeddings, grouped-query causal attention, SwiGLU, cross-entropy with ignored targets),
//! forward and backward, in f32 and bf16: on `xla:0` they need no host fallback, and the loss
//! and gradients match the host executor.

mod xla_support;

use burn::backend::Autodiff;
use burn::tensor::activation::{log_softmax, silu, softmax};
use burn::tensor::module::{embedding, linear};
use burn::tensor::{Bool, DType, Int, Tensor, TensorData};
use burn_trainium::{Trainium, TrainiumDevice, stats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use xla_support::{assert_close, xla};

type B = Autodiff<Trainium>;

const BATCH: usize = 2;
const SEQ: usize = 6;
const HIDDEN: usize = 16;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
const FFN: usize = 24;
const VOCAB: usize = 11;
const IGNORE: i64 = -100;

fn random(shape: &[usize], seed: u64, scale: f32) -> TensorData {
    let mut rng = StdRng::seed_from_u64(seed);
    let values: Vec<f32> = (0..shape.iter().product())
        .map(|_| rng.random_range(-scale..scale))
        .collect();
    TensorData::new(values, shape.to_vec())
}

/// The weights of the block, in the order of [`WEIGHTS`].
const WEIGHTS: [(&str, &[usize]); 10] = [
    ("embed", &[VOCAB, HIDDEN]),
    ("norm", &[HIDDEN]),
    ("q", &[HIDDEN, HIDDEN]),
    ("k", &[HIDDEN, KV_HEADS * HEAD_DIM]),
    ("v", &[HIDDEN, KV_HEADS * HEAD_DIM]),
    ("o", &[HIDDEN, HIDDEN]),
    ("gate", &[HIDDEN, FFN]),
    ("up", &[HIDDEN, FFN]),
    ("down", &[FFN, HIDDEN]),
    ("head", &[HIDDEN, VOCAB]),
];

fn rms_norm<const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 1>) -> Tensor<B, D> {
    let dtype = x.dtype();
    let x = x.cast(DType::F32);
    let mean_square = x.clone().square().mean_dim(D - 1);
    let normalised = x / (mean_square + 1e-5).sqrt();
    normalised.cast(dtype) * weight.unsqueeze()
}

fn rotary(x: Tensor<B, 4>, cos: &Tensor<B, 2>, sin: &Tensor<B, 2>) -> Tensor<B, 4> {
    let dtype = x.dtype();
    let half = HEAD_DIM / 2;
    let cos = cos.clone().cast(dtype).unsqueeze::<4>();
    let sin = sin.clone().cast(dtype).unsqueeze::<4>();
    let first = x.clone().narrow(3, 0, half);
    let second = x.clone().narrow(3, half, half);
    let rotated = Tensor::cat(vec![second.neg(), first], 3);
    x * cos + rotated * sin
}

fn tables(device: &TrainiumDevice) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for position in 0..SEQ {
        for _ in 0..2 {
            for i in 0..HEAD_DIM / 2 {
                let angle = position as f32 / 10_000f32.powf((2 * i) as f32 / HEAD_DIM as f32);
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
    }
    (
        Tensor::from_data(TensorData::new(cos, [SEQ, HEAD_DIM]), device),
        Tensor::from_data(TensorData::new(sin, [SEQ, HEAD_DIM]), device),
    )
}

/// The loss and the gradient of every weight, computed on `device` in `dtype`.
fn step(device: &TrainiumDevice, dtype: DType) -> Vec<TensorData> {
    let weights: Vec<Tensor<B, 2>> = WEIGHTS
        .iter()
        .enumerate()
        .map(|(index, (_, shape))| {
            let shape2 = if shape.len() == 1 {
                vec![1, shape[0]]
            } else {
                shape.to_vec()
            };
            Tensor::<B, 2>::from_data(random(&shape2, index as u64, 0.5), device)
                .cast(dtype)
                .require_grad()
        })
        .collect();
    let w = |name: &str| weights[WEIGHTS.iter().position(|(n, _)| *n == name).unwrap()].clone();
    let tokens = Tensor::<B, 2, Int>::from_data(
        TensorData::new(
            (0..BATCH * SEQ)
                .map(|i| ((i * 7) % VOCAB) as i32)
                .collect::<Vec<_>>(),
            [BATCH, SEQ],
        ),
        device,
    );
    let mut target_ids: Vec<i32> = (0..BATCH * SEQ)
        .map(|i| ((i * 5 + 3) % VOCAB) as i32)
        .collect();
    target_ids[4] = IGNORE as i32;
    let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(target_ids, [BATCH, SEQ]), device);

    let x = embedding(w("embed"), tokens);
    let normed = rms_norm(x.clone(), w("norm").reshape([HIDDEN]));
    let heads =
        |t: Tensor<B, 3>, count: usize| t.reshape([BATCH, SEQ, count, HEAD_DIM]).swap_dims(1, 2);
    let (cos, sin) = tables(device);
    let queries = rotary(
        heads(linear(normed.clone(), w("q"), None), HEADS),
        &cos,
        &sin,
    );
    let keys = rotary(
        heads(linear(normed.clone(), w("k"), None), KV_HEADS),
        &cos,
        &sin,
    );
    let values = heads(linear(normed, w("v"), None), KV_HEADS);
    let repeat = |t: Tensor<B, 4>| {
        t.unsqueeze_dim::<5>(2)
            .expand([BATCH, KV_HEADS, HEADS / KV_HEADS, SEQ, HEAD_DIM])
            .reshape([BATCH, HEADS, SEQ, HEAD_DIM])
    };
    let scores = queries.matmul(repeat(keys).swap_dims(2, 3)) * (HEAD_DIM as f64).powf(-0.5);
    let future = Tensor::<B, 2, Bool>::tril_mask([SEQ, SEQ], 0, device)
        .unsqueeze::<4>()
        .expand([BATCH, HEADS, SEQ, SEQ]);
    let scores = scores.mask_fill(future, f32::NEG_INFINITY);
    let attention = softmax(scores.cast(DType::F32), 3).cast(dtype);
    let attended = attention
        .matmul(repeat(values))
        .swap_dims(1, 2)
        .reshape([BATCH, SEQ, HIDDEN]);
    let x = x + linear(attended, w("o"), None);
    let normed = rms_norm(x.clone(), w("norm").reshape([HIDDEN]));
    let feed = linear(
        silu(linear(normed.clone(), w("gate"), None)) * linear(normed, w("up"), None),
        w("down"),
        None,
    );
    let x = x + feed;
    let logits = linear(x, w("head"), None);

    let rows = BATCH * SEQ;
    let log_probs = log_softmax(logits.reshape([rows, VOCAB]).cast(DType::F32), 1);
    let targets = targets.reshape([rows, 1]);
    let ignored = targets.clone().equal_elem(IGNORE);
    let safe_targets = targets.mask_fill(ignored.clone(), 0);
    let kept = ignored.bool_not().float().cast(DType::F32);
    let picked = log_probs.gather(1, safe_targets) * kept.clone();
    let loss = picked.sum().neg() / kept.sum().clamp_min(1.0);

    let gradients = loss.backward();
    let mut results = vec![loss.into_data()];
    results.extend(
        weights
            .iter()
            .map(|weight| weight.grad(&gradients).expect("a gradient").into_data()),
    );
    results
}

fn check(dtype: DType, tolerance: f64) {
    let device = xla(0);
    let expected = step(&TrainiumDevice::HOST, dtype);
    let actual = step(&device, dtype);
    assert_close(
        &format!("{dtype:?} loss"),
        &expected[0],
        &actual[0],
        tolerance,
    );
    for ((name, _), (e, a)) in WEIGHTS.iter().zip(expected[1..].iter().zip(&actual[1..])) {
        assert_close(&format!("{dtype:?} gradient of {name}"), e, a, tolerance);
    }
    assert_eq!(stats(&device).host_fallbacks, 0, "{:?}", stats(&device));
}

#[test]
fn hlat_block_step_in_f32_needs_no_fallback_and_matches_the_host() {
    check(DType::F32, 1e-4);
}

#[test]
fn hlat_block_step_in_bf16_needs_no_fallback_and_matches_the_host() {
    check(DType::BF16, 6e-2);
}
