//! Shared by the tests of this binary: tolerant comparison, device locks and IR tensors, with
//! the workspace's `test-support` helpers they use (the XLA CPU plugin, the random-state lock).

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::{Device, Tensor, TensorData};
use burn_trainium::TrainiumDevice;
pub use test_support::plugin::{plugin_path, xla};
pub use test_support::random::exclusive_random;

/// Asserts that two tensors hold the same shape and values within `tolerance`
/// (absolute + relative).
pub fn assert_close(name: &str, expected: &TensorData, actual: &TensorData, tolerance: f64) {
    assert_eq!(expected.shape(), actual.shape(), "{name}: shapes differ");
    let expected_values: Vec<f64> = expected.clone().convert::<f64>().try_to_vec().unwrap();
    let actual_values: Vec<f64> = actual.clone().convert::<f64>().try_to_vec().unwrap();
    for (index, (e, a)) in expected_values.iter().zip(&actual_values).enumerate() {
        let close =
            (e.is_nan() && a.is_nan()) || e == a || (e - a).abs() <= tolerance * (1.0 + e.abs());
        assert!(
            close,
            "{name}: element {index} is {a}, expected {e} (tolerance {tolerance})"
        );
    }
}

/// Holds `device` for the caller alone until the guard drops: tests that compare statistics of
/// a shared device (statistics are kept per device) take it first.
pub fn lock_device(device: &TrainiumDevice) -> std::sync::MutexGuard<'static, ()> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static LOCKS: OnceLock<Mutex<HashMap<TrainiumDevice, &'static Mutex<()>>>> = OnceLock::new();
    let lock: &'static Mutex<()> = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .entry(*device)
        .or_insert_with(|| Box::leak(Box::new(Mutex::new(()))));
    lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An `f32` tensor of Burn's IR: id, shape and status (for operations built by hand).
pub fn tensor(id: u64, shape: &[usize], status: burn_ir::TensorStatus) -> burn_ir::TensorIr {
    burn_ir::TensorIr {
        id: burn_ir::TensorId::new(id),
        shape: shape.to_vec().into(),
        status,
        dtype: burn::tensor::DType::F32,
    }
}

/// `count` reproducible values in [-1, 1) (a linear congruential generator), so every device
/// starts from the same weights and data.
pub fn values(seed: u64, count: usize) -> Vec<f32> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A linear layer of reproducible weights (`seed`) on `device`, the same on every device.
pub fn linear(seed: u64, inputs: usize, outputs: usize, device: &Device) -> Linear {
    let weight = TensorData::new(values(seed, inputs * outputs), [inputs, outputs]);
    let bias = TensorData::new(values(seed + 1, outputs), [outputs]);
    Linear {
        weight: Param::from_tensor(Tensor::from_data(weight, device).mul_scalar(0.3)),
        bias: Some(Param::from_tensor(
            Tensor::from_data(bias, device).mul_scalar(0.1),
        )),
    }
}

/// The loss of each of `steps` Adam steps (learning rate `lr`) of `model` fitting `targets` from
/// `inputs` by mean squared error, its output computed by `forward`.
pub fn adam_losses<M: Module, const D: usize>(
    mut model: M,
    forward: impl Fn(&M, Tensor<D>) -> Tensor<D>,
    (inputs, targets): (Tensor<D>, Tensor<D>),
    lr: f64,
    steps: usize,
) -> Vec<f32> {
    let mut optimizer = AdamConfig::new().init();
    (0..steps)
        .map(|_| {
            let error = forward(&model, inputs.clone()) - targets.clone();
            let loss = (error.clone() * error).mean();
            let value = loss.clone().into_scalar::<f32>();
            let gradients = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(lr, model.clone(), gradients);
            value
        })
        .collect()
}
