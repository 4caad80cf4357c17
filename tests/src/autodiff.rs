//! Gradients on the Trainium `host` and `xla` devices equal those of Flex with autodiff for an
//! MLP (the HLAT model's gradients are checked through training, in `hlat_training`).

use burn::tensor::activation::{log_softmax, silu};
use burn::tensor::{Device, Tensor, TensorData};

use crate::support::{Precision, assert_matches, devices_under_test, float, ints, reference};

/// A leaf parameter with deterministic values that requires a gradient.
fn parameter<const D: usize>(shape: [usize; D], seed: u64, device: &Device) -> Tensor<D> {
    (float::<D>(shape, seed, Precision::F32, device) * 0.5)
        .detach()
        .require_grad()
}

/// Two-layer SiLU MLP with a cross-entropy loss: returns the loss and every gradient.
fn mlp_gradients(device: &Device) -> Vec<TensorData> {
    let input = float::<2>([6, 8], 1, Precision::F32, device);
    let targets = ints::<1>([6], 2, 4, device);
    let w1 = parameter::<2>([8, 16], 3, device);
    let b1 = parameter::<1>([16], 4, device);
    let w2 = parameter::<2>([16, 4], 5, device);
    let b2 = parameter::<1>([4], 6, device);

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

#[test]
fn mlp_gradients_match_flex_on_every_device() {
    let expected = mlp_gradients(&reference().autodiff());
    for (trainium, device) in devices_under_test() {
        let actual = mlp_gradients(&device.autodiff());
        assert_eq!(actual.len(), expected.len());
        for (index, (actual, expected)) in actual.iter().zip(&expected).enumerate() {
            assert_matches(
                &format!("mlp loss and gradients #{index} on {trainium}"),
                expected,
                actual,
                Precision::F32.tolerance(),
            );
        }
    }
}
