//! Global-norm clipping, AdamW and stochastic rounding against hand computations.

use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Device, Tensor, TensorData};
use hlat_train::clip::{clip_coefficient, grad_sum_of_squares, scale_grads};
use hlat_train::optimizer::{AdamWSettings, HlatAdamW};
use hlat_train::rounding::stochastic_round_bf16;

/// The reference device (burn-flex) with autodiff.
fn device() -> Device {
    Device::flex().autodiff()
}

/// A norm-like gain (one-dimensional) and a weight matrix.
#[derive(Module, Debug)]
struct Pair {
    gain: Param<Tensor<1>>,
    weight: Param<Tensor<2>>,
}

fn pair(gain: [f32; 2], weight: [[f32; 2]; 1]) -> Pair {
    let device = device();
    Pair {
        gain: Param::from_tensor(Tensor::from_floats(gain, &device)),
        weight: Param::from_tensor(Tensor::from_floats(weight, &device)),
    }
}

/// Gradients of `sum(gain * a) + sum(weight * b)`: exactly `a` and `b`.
fn linear_grads(model: &Pair, a: [f32; 2], b: [[f32; 2]; 1]) -> GradientsParams {
    let device = device();
    let loss = (model.gain.val() * Tensor::<1>::from_floats(a, &device)).sum()
        + (model.weight.val() * Tensor::<2>::from_floats(b, &device)).sum();
    GradientsParams::from_grads(loss.backward(), model)
}

fn values<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().try_to_vec().unwrap()
}

#[test]
fn global_norm_spans_all_parameters() {
    let model = pair([1.0, 1.0], [[1.0, 1.0]]);
    // Per-tensor norms 5 and 13 (Burn's per-tensor clipping would see those); globally
    // sqrt(9 + 16 + 144 + 0) = 13.
    let mut grads = linear_grads(&model, [3.0, 4.0], [[12.0, 0.0]]);
    let squares = grad_sum_of_squares(&model, &grads, None).unwrap();
    let norm = (values(squares)[0] as f64).sqrt();
    assert!((norm - 13.0).abs() < 1e-6, "{norm}");

    let factor = clip_coefficient(norm, 1.0);
    assert!((factor - 1.0 / (13.0 + 1e-6)).abs() < 1e-12);
    assert_eq!(clip_coefficient(0.5, 1.0), 1.0);
    assert_eq!(clip_coefficient(100.0, 0.0), 1.0);

    scale_grads(&model, &mut grads, factor);
    let gain = values(grads.get::<1>(model.gain.id).unwrap());
    let weight = values(grads.get::<2>(model.weight.id).unwrap());
    let expected = [3.0 / 13.0, 4.0 / 13.0, 12.0 / 13.0, 0.0];
    for (actual, expected) in gain.iter().chain(&weight).zip(expected) {
        assert!((actual - expected).abs() < 1e-6, "{actual} != {expected}");
    }
    let clipped = (gain.iter().chain(&weight).map(|g| g * g).sum::<f32>()).sqrt();
    assert!((clipped - 1.0).abs() < 1e-5);
}

/// torch.optim.AdamW for one scalar, in f64.
struct TorchAdamW {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    m: f64,
    v: f64,
    t: i32,
}

impl TorchAdamW {
    fn step(&mut self, param: f64, grad: f64) -> f64 {
        let param = param * (1.0 - self.lr * self.weight_decay);
        self.t += 1;
        self.m = self.betas.0 * self.m + (1.0 - self.betas.0) * grad;
        self.v = self.betas.1 * self.v + (1.0 - self.betas.1) * grad * grad;
        let bias1 = 1.0 - self.betas.0.powi(self.t);
        let bias2 = 1.0 - self.betas.1.powi(self.t);
        let denominator = self.v.sqrt() / bias2.sqrt() + self.eps;
        param - self.lr / bias1 * self.m / denominator
    }
}

fn run_adamw(exclude_norms: bool) -> (Vec<f32>, Vec<f32>) {
    let settings = AdamWSettings {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        exclude_norms_from_weight_decay: exclude_norms,
    };
    let mut optimizer = HlatAdamW::new(settings).init();
    let mut model = pair([1.0, -2.0], [[0.5, 3.0]]);
    let steps = [
        ([0.3, -0.2], [[1.5, 0.0]]),
        ([-0.1, 0.4], [[0.5, 2.0]]),
        ([0.2, 0.2], [[-1.0, 1e-4]]),
    ];
    for (step, (a, b)) in steps.into_iter().enumerate() {
        let grads = linear_grads(&model, a, b);
        model = optimizer.step(0.01 * (step + 1) as f64, model, grads);
    }
    (
        values(model.gain.val().inner()),
        values(model.weight.val().inner()),
    )
}

#[test]
fn adamw_matches_torch_formula() {
    let grads = [
        [0.3, -0.2, 1.5, 0.0],
        [-0.1, 0.4, 0.5, 2.0],
        [0.2, 0.2, -1.0, 1e-4],
    ];
    for exclude_norms in [false, true] {
        let (gain, weight) = run_adamw(exclude_norms);
        let actual: Vec<f32> = gain.into_iter().chain(weight).collect();
        for (index, start) in [1.0, -2.0, 0.5, 3.0].into_iter().enumerate() {
            let is_gain = index < 2;
            let mut reference = TorchAdamW {
                lr: 0.0,
                betas: (0.9, 0.95),
                eps: 1e-8,
                weight_decay: if exclude_norms && is_gain { 0.0 } else { 0.1 },
                m: 0.0,
                v: 0.0,
                t: 0,
            };
            let mut param = start;
            for (step, grad) in grads.iter().enumerate() {
                reference.lr = 0.01 * (step + 1) as f64;
                param = reference.step(param, f64::from(grad[index] as f32));
            }
            let got = f64::from(actual[index]);
            assert!(
                (got - param).abs() < 1e-6,
                "parameter {index} (exclude_norms {exclude_norms}): {got} != {param}"
            );
        }
    }
}

#[test]
fn stochastic_rounding_is_unbiased_between_neighbours() {
    let _random = crate::exclusive_random();
    // The Trainium host executor (burn-flex) rounds to bf16.
    let device = crate::host();
    device.seed(7);
    let count = 20_000;
    // 1 + 2^-9 lies a quarter of the way from bf16's 1 to 1 + 2^-7; likewise for its negation.
    for value in [1.0 + 2f32.powi(-9), -(1.0 + 2f32.powi(-9)), 3.0e-3] {
        let input = Tensor::<1>::from_data(TensorData::new(vec![value; count], [count]), &device);
        let rounded = stochastic_round_bf16(input);
        assert_eq!(rounded.dtype(), DType::BF16);
        let rounded = values(rounded.cast(DType::F32));
        let (low, high) = neighbours(value);
        assert!(
            rounded.iter().all(|&x| x == low || x == high),
            "{value}: not a neighbour"
        );
        let mean = rounded.iter().map(|&x| f64::from(x)).sum::<f64>() / count as f64;
        let spacing = f64::from(high - low);
        assert!(
            (mean - f64::from(value)).abs() < 0.02 * spacing,
            "{value}: mean {mean} between {low} and {high}"
        );
    }
    // Values bf16 holds exactly never move.
    let exact = Tensor::<1>::from_floats([0.0, 1.0, -0.5, 3.0, 1.0 + 2f32.powi(-7)], &device);
    assert_eq!(
        values(stochastic_round_bf16(exact.clone()).cast(DType::F32)),
        values(exact)
    );
}

/// The bf16 values just below and above `value`, by walking bf16 bit patterns.
fn neighbours(value: f32) -> (f32, f32) {
    let truncated = f32::from_bits(value.to_bits() & 0xFFFF_0000);
    let away = f32::from_bits((value.to_bits() & 0xFFFF_0000) + 0x1_0000);
    if truncated < away {
        (truncated, away)
    } else {
        (away, truncated)
    }
}
