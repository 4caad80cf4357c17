//! `Autodiff<Trainium>` gradients equal those of `Autodiff<NdArray>` for an MLP and for a causal
//! self-attention block.

use burn::backend::Autodiff;
use burn::tensor::activation::{log_softmax, silu, softmax};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Bool, Tensor, TensorData};
use burn_trainium::Trainium;
use integration_tests::{Precision, Reference, assert_matches_reference, float, ints};

/// A leaf parameter with deterministic values that requires a gradient.
fn parameter<B: AutodiffBackend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    device: &B::Device,
) -> Tensor<B, D> {
    (float::<B, D>(shape, seed, Precision::F32, device) * 0.5)
        .detach()
        .require_grad()
}

/// Two-layer SiLU MLP with a cross-entropy loss: returns the loss and every gradient.
fn mlp_gradients<B: AutodiffBackend>(device: &B::Device) -> Vec<TensorData> {
    let input = float::<B, 2>([6, 8], 1, Precision::F32, device);
    let targets = ints::<B, 1>([6], 2, 4, device);
    let w1 = parameter::<B, 2>([8, 16], 3, device);
    let b1 = parameter::<B, 1>([16], 4, device);
    let w2 = parameter::<B, 2>([16, 4], 5, device);
    let b2 = parameter::<B, 1>([4], 6, device);

    let hidden = silu(input.matmul(w1.clone()) + b1.clone().unsqueeze());
    let logits = hidden.matmul(w2.clone()) + b2.clone().unsqueeze();
    let picked = log_softmax(logits, 1).gather(1, targets.unsqueeze_dim(1));
    let loss = -picked.mean();

    let gradients = loss.backward();
    let mut results = vec![loss.into_data()];
    for grad in [
        w1.grad(&gradients).unwrap().into_data(),
        b1.grad(&gradients).unwrap().into_data(),
        w2.grad(&gradients).unwrap().into_data(),
        b2.grad(&gradients).unwrap().into_data(),
    ] {
        results.push(grad);
    }
    results
}

/// One causal multi-head self-attention block with a residual connection.
fn attention_gradients<B: AutodiffBackend>(device: &B::Device) -> Vec<TensorData> {
    let (batch, seq, hidden, heads) = (2, 5, 8, 2);
    let head_dim = hidden / heads;
    let input = parameter::<B, 3>([batch, seq, hidden], 10, device);
    let weights: Vec<Tensor<B, 2>> = (0..4)
        .map(|i| parameter([hidden, hidden], 11 + i, device))
        .collect();

    let project = |weight: &Tensor<B, 2>| {
        input
            .clone()
            .matmul(weight.clone().unsqueeze())
            .reshape([batch, seq, heads, head_dim])
            .swap_dims(1, 2)
    };
    let (query, key, value) = (
        project(&weights[0]),
        project(&weights[1]),
        project(&weights[2]),
    );
    let scores = query.matmul(key.swap_dims(2, 3)) / (head_dim as f64).sqrt();
    let causal = Tensor::<B, 2, Bool>::triu_mask([seq, seq], 1, device).unsqueeze::<4>();
    let attention = softmax(scores.mask_fill(causal, f32::NEG_INFINITY), 3);
    let mixed = attention
        .matmul(value)
        .swap_dims(1, 2)
        .reshape([batch, seq, hidden]);
    let output = input.clone() + mixed.matmul(weights[3].clone().unsqueeze());
    let loss = output.powf_scalar(2.0).mean();

    let gradients = loss.backward();
    let mut results = vec![
        loss.into_data(),
        input.grad(&gradients).unwrap().into_data(),
    ];
    results.extend(
        weights
            .iter()
            .map(|weight| weight.grad(&gradients).unwrap().into_data()),
    );
    results
}

fn compare(actual: Vec<TensorData>, expected: Vec<TensorData>, what: &str) {
    assert_eq!(actual.len(), expected.len());
    for (index, (actual, expected)) in actual.into_iter().zip(expected).enumerate() {
        assert_matches_reference(
            actual,
            expected,
            Precision::F32,
            &format!("{what} #{index}"),
        );
    }
}

#[test]
fn mlp_gradients_match_ndarray() {
    compare(
        mlp_gradients::<Autodiff<Trainium>>(&Default::default()),
        mlp_gradients::<Autodiff<Reference>>(&Default::default()),
        "mlp loss and gradients",
    );
}

#[test]
fn causal_attention_gradients_match_ndarray() {
    compare(
        attention_gradients::<Autodiff<Trainium>>(&Default::default()),
        attention_gradients::<Autodiff<Reference>>(&Default::default()),
        "attention loss and gradients",
    );
}
