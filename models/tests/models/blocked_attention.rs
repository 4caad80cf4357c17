//! Blocked causal attention (`hlat::blocked_attention`) against attention computed in one piece:
//! outputs and gradients against a closed-form f64 reference, at lengths that are and are not
//! multiples of the block, on Flex and on `host`; and the model's logits over a sequence long
//! enough to attend by blocks, in training (by blocks) and in inference (Burn's attention module).

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData, Tolerance};
use hlat::blocked_attention::{ATTENTION_BLOCK, blocked_causal_attention};
use hlat::{Hlat, HlatConfig};

use crate::host;

/// Batch, heads and head width of the attention tests.
const BATCH: usize = 2;
const HEADS: usize = 3;
const HEAD_DIM: usize = 8;

/// Deterministic values in [-2, 2) for a tensor of `count` elements (`salt` varies them).
fn values(count: usize, salt: u64) -> Vec<f32> {
    (0..count as u64)
        .map(|i| {
            let mixed = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ salt.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let mixed = mixed ^ (mixed >> 29);
            (mixed % 4096) as f32 / 1024.0 - 2.0
        })
        .collect()
}

/// Queries, keys, values and output weights `[BATCH, HEADS, seq, HEAD_DIM]`, flattened.
fn inputs(seq: usize) -> [Vec<f32>; 4] {
    let count = BATCH * HEADS * seq * HEAD_DIM;
    [1, 2, 3, 4].map(|salt| values(count, salt))
}

/// Closed-form causal attention in f64: the output `O = softmax(Q·Kᵀ/√d + mask)·V` and the
/// gradients of `Σ W∘O` with respect to Q, K and V (`dV = Pᵀ·W`, `dP = W·Vᵀ`,
/// `dS = P∘(dP − rowsum(dP∘P))`, `dQ = dS·K/√d`, `dK = dSᵀ·Q/√d`), flattened.
fn reference(seq: usize) -> [Vec<f64>; 4] {
    let [q, k, v, w] = inputs(seq).map(|x| x.into_iter().map(f64::from).collect::<Vec<_>>());
    let scale = (HEAD_DIM as f64).powf(-0.5);
    let mut outputs = [q.clone(), q.clone(), q.clone(), q.clone()].map(|x| vec![0.0; x.len()]);
    let [output, dq, dk, dv] = &mut outputs;
    for head in 0..BATCH * HEADS {
        let at = |row: usize, column: usize| (head * seq + row) * HEAD_DIM + column;
        let dot = |a: &[f64], i: usize, b: &[f64], j: usize| -> f64 {
            (0..HEAD_DIM).map(|c| a[at(i, c)] * b[at(j, c)]).sum()
        };
        for i in 0..seq {
            let scores: Vec<f64> = (0..=i).map(|j| dot(&q, i, &k, j) * scale).collect();
            let maximum = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let exps: Vec<f64> = scores.iter().map(|s| (s - maximum).exp()).collect();
            let total: f64 = exps.iter().sum();
            let p: Vec<f64> = exps.iter().map(|e| e / total).collect();
            let dp: Vec<f64> = (0..=i).map(|j| dot(&w, i, &v, j)).collect();
            let mean: f64 = p.iter().zip(&dp).map(|(p, dp)| p * dp).sum();
            for j in 0..=i {
                let ds = p[j] * (dp[j] - mean);
                for c in 0..HEAD_DIM {
                    output[at(i, c)] += p[j] * v[at(j, c)];
                    dv[at(j, c)] += p[j] * w[at(i, c)];
                    dq[at(i, c)] += ds * k[at(j, c)] * scale;
                    dk[at(j, c)] += ds * q[at(i, c)] * scale;
                }
            }
        }
    }
    outputs
}

/// The output of blocked attention in blocks of `block` on `device` (with autodiff), and the gradients of `Σ W∘O`.
fn blocked(seq: usize, block: usize, device: &Device) -> [TensorData; 4] {
    let shape = [BATCH, HEADS, seq, HEAD_DIM];
    let [q, k, v, w] =
        inputs(seq).map(|x| Tensor::<4>::from_data(TensorData::new(x, shape), device));
    let [q, k, v] = [q, k, v].map(Tensor::require_grad);
    let output = blocked_causal_attention(q.clone(), k.clone(), v.clone(), block);
    let gradients = (output.clone() * w).sum().backward();
    let gradient = |leaf: &Tensor<4>| leaf.grad(&gradients).expect("a gradient").into_data();
    [output.into_data(), gradient(&q), gradient(&k), gradient(&v)]
}

/// Blocked attention on `device` (with autodiff) equals the reference at lengths around blocks of 4.
fn check_blocked_attention(device: &Device) {
    let block = 4;
    // Shorter than one block, multiples of the block, and lengths between.
    for seq in [1, 3, 4, 8, 11, 13, 16] {
        let expected = reference(seq);
        let actual = blocked(seq, block, device);
        for (name, (actual, expected)) in ["output", "queries", "keys", "values"]
            .iter()
            .zip(actual.iter().zip(expected))
        {
            let expected = TensorData::new(
                expected.into_iter().map(|x| x as f32).collect(),
                [BATCH, HEADS, seq, HEAD_DIM],
            );
            // Shown with the failure: which length and which tensor.
            println!("seq {seq}: {name}");
            actual.assert_approx_eq::<f32>(&expected, Tolerance::absolute(1e-5));
        }
    }
}

#[test]
fn blocked_attention_equals_attention_in_one_piece_on_flex() {
    check_blocked_attention(&Device::flex().autodiff());
}

#[test]
fn blocked_attention_equals_attention_in_one_piece_on_host() {
    check_blocked_attention(&host().autodiff());
}

#[test]
fn a_sequence_longer_than_a_block_gives_the_logits_of_its_prefix() {
    // Positions 0..prefix of a long sequence see only themselves and earlier positions: their
    // logits equal those of the prefix alone, which attends in one piece.
    let mut config = HlatConfig::preset("hlat-test").unwrap();
    let seq = 2 * ATTENTION_BLOCK + 100;
    config.max_seq_len = seq;
    let device = Device::flex();
    let model: Hlat = config.init(&device);
    let ids: Vec<i64> = (0..seq as i64).map(|i| (i * 37 + 5) % 64).collect();
    let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, seq]), &device);
    let long = model.forward(ids.clone());
    for prefix in [ATTENTION_BLOCK, ATTENTION_BLOCK + 1] {
        let short = model.forward(ids.clone().narrow(1, 0, prefix));
        long.clone()
            .narrow(1, 0, prefix)
            .into_data()
            .assert_approx_eq::<f32>(&short.into_data(), Tolerance::absolute(1e-5));
    }
}

/// Over a long sequence the model attends by blocks when training (autodiff) and through Burn's
/// attention module in inference: both give the same logits.
/// `device` has autodiff; inference runs on it without.
fn inference_attention_equals_training_attention(device: &Device) {
    let mut config = HlatConfig::preset("hlat-test").unwrap();
    let seq = 2 * ATTENTION_BLOCK + 100;
    config.max_seq_len = seq;
    let model: Hlat = config.init(device);
    let ids: Vec<i64> = (0..seq as i64).map(|i| (i * 29 + 3) % 64).collect();
    let ids = TensorData::new(ids, [1, seq]);
    let training = model
        .forward(Tensor::<2, Int>::from_data(ids.clone(), device))
        .into_data();
    let inference = model
        .valid()
        .forward(Tensor::<2, Int>::from_data(ids, &device.clone().inner()))
        .into_data();
    inference.assert_approx_eq::<f32>(&training, Tolerance::absolute(1e-4));
}

#[test]
fn inference_attention_equals_training_attention_on_flex() {
    inference_attention_equals_training_attention(&Device::flex().autodiff());
}

#[test]
fn inference_attention_equals_training_attention_on_host() {
    inference_attention_equals_training_attention(&host().autodiff());
}
