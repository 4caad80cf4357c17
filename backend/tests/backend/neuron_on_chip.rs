//! The `neuron` executor on a NeuronCore, served in the process, compared with Flex (what the host
//! executor replays on). These tests need a
//! Trainium instance with the Neuron SDK (runtime, driver and `neuronx-cc`) and have never run
//! yet; on a trn1/trn2 instance:
//!
//! ```text
//! cargo test -p burn-trainium --test backend neuron_on_chip -- --ignored --test-threads=1
//! ```
//!
//! They use the real compiler (`NEURON_CC`, default `neuronx-cc` on `PATH`) and the cache
//! (`NEURON_COMPILE_CACHE_URL`, default `/var/tmp/neuron-compile-cache`). With
//! `HLAT_NEURON_FLASH_ATTENTION=on`, `flash_attention_matches_the_host` checks the SDK's flash
//! kernel (the default `auto` falls back to HLO attention when the tracer's probe fails).

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Tensor, TensorData};
use burn_trainium::{TrainiumDevice, check_device, stats};
use trainium_ffi::nrt::NeuronRuntime;

fn assert_close(name: &str, expected: &TensorData, actual: &TensorData, tolerance: f64) {
    assert_eq!(expected.shape(), actual.shape(), "{name}: shapes differ");
    let expected: Vec<f64> = expected.clone().convert::<f64>().try_to_vec().unwrap();
    let actual: Vec<f64> = actual.clone().convert::<f64>().try_to_vec().unwrap();
    for (index, (e, a)) in expected.iter().zip(&actual).enumerate() {
        assert!(
            (e - a).abs() <= tolerance * (1.0 + e.abs()),
            "{name}: element {index} is {a} on neuron, {e} on Flex (tolerance {tolerance})"
        );
    }
}

/// `neuron:0` served in the process, and the Trainium device it serves.
fn neuron() -> (Device, TrainiumDevice) {
    let trainium = TrainiumDevice::neuron(0);
    check_device(&trainium).unwrap();
    let device = burn_trainium::device(&trainium.to_string()).expect("the device is served");
    (device, trainium)
}

#[test]
#[ignore = "needs a Trainium (trn1/trn2) instance"]
fn the_runtime_reports_its_version_and_cores() {
    let runtime = NeuronRuntime::global().unwrap();
    let version = runtime.version().unwrap();
    assert!(version.numbers[0] >= 2, "{version:?}");
    let visible = runtime.visible_core_count().unwrap();
    assert!(visible >= 1 && visible <= runtime.total_core_count().unwrap());
    println!(
        "libnrt {version} from {}: {visible} cores visible",
        runtime.library().path().display()
    );
}

fn small_program(device: &Device, dtype_bf16: bool) -> TensorData {
    let a: Vec<f32> = (0..64)
        .map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0)
        .collect();
    let b: Vec<f32> = (0..64)
        .map(|i| ((i * 11 % 13) as f32 - 6.0) / 6.0)
        .collect();
    let mut a = Tensor::<2>::from_data(TensorData::new(a, [8, 8]), device);
    let mut b = Tensor::<2>::from_data(TensorData::new(b, [8, 8]), device);
    if dtype_bf16 {
        a = a.cast(burn::tensor::DType::BF16);
        b = b.cast(burn::tensor::DType::BF16);
    }
    let product = a.matmul(b.clone());
    let result = softmax(product * 0.5, 1) + b.exp().sum_dim(0);
    result.cast(burn::tensor::DType::F32).into_data()
}

#[test]
#[ignore = "needs a Trainium (trn1/trn2) instance"]
fn a_small_program_matches_the_host() {
    let (device, trainium) = neuron();
    let expected = small_program(&Device::flex(), false);
    let actual = small_program(&device, false);
    assert_close("f32 program", &expected, &actual, 1e-3);
    let expected = small_program(&Device::flex(), true);
    let actual = small_program(&device, true);
    assert_close("bf16 program", &expected, &actual, 3e-2);
    assert!(stats(&trainium).compiles + stats(&trainium).cache_hits >= 2);
}

#[derive(Module, Debug)]
struct Mlp {
    hidden: Linear,
    output: Linear,
    activation: Relu,
}

/// The initial weights of every run: drawn once, on Flex, with a fixed seed.
fn initial_mlp() -> Mlp {
    let flex = Device::flex();
    flex.seed(5);
    let flex = flex.autodiff();
    let model = Mlp {
        hidden: LinearConfig::new(8, 32).init(&flex),
        output: LinearConfig::new(32, 4).init(&flex),
        activation: Relu::new(),
    };
    // Parameters initialize lazily: drawn now.
    for linear in [&model.hidden, &model.output] {
        linear.weight.val();
        linear.bias.as_ref().map(Param::val);
    }
    model
}

/// Five AdamW steps of a small MLP from `initial` on `device`; the loss of each step.
fn train(initial: &Mlp, device: &Device) -> Vec<f32> {
    let device = device.clone().autodiff();
    let mut model = initial.clone().fork(&device);
    let x: Vec<f32> = (0..128)
        .map(|i| ((i * 29 % 23) as f32 - 11.0) / 11.0)
        .collect();
    let y: Vec<f32> = (0..64).map(|i| ((i * 5 % 7) as f32 - 3.0) / 3.0).collect();
    let x = Tensor::<2>::from_data(TensorData::new(x, [16, 8]), &device);
    let y = Tensor::<2>::from_data(TensorData::new(y, [16, 4]), &device);
    let mut optimizer = AdamWConfig::new().with_weight_decay(0.1).init();
    let mut losses = Vec::new();
    for _ in 0..5 {
        let prediction = model
            .output
            .forward(model.activation.forward(model.hidden.forward(x.clone())));
        let loss = (prediction - y.clone()).powi_scalar(2).mean();
        losses.push(loss.clone().into_scalar::<f32>());
        let gradients = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(1e-2, model, gradients);
    }
    losses
}

#[test]
#[ignore = "needs a Trainium (trn1/trn2) instance"]
fn training_steps_match_the_host() {
    let (device, _) = neuron();
    let initial = initial_mlp();
    let expected = train(&initial, &Device::flex());
    let actual = train(&initial, &device);
    assert_close(
        "losses",
        &TensorData::new(expected, [5]),
        &TensorData::new(actual, [5]),
        1e-3,
    );
}

/// Causal attention over 1,024 positions with a given scale: on a chip whose SDK traces the flash
/// kernel (`HLAT_NEURON_FLASH_ATTENTION=on` makes a failed trace an error), the kernel's result.
fn long_attention(device: &Device, bf16: bool) -> TensorData {
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;

    let input = |salt: usize, shape: [usize; 4]| {
        let count = shape.iter().product::<usize>();
        let values: Vec<f32> = (0..count)
            .map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 - 1001.0) / 1001.0)
            .collect();
        let tensor = Tensor::<4>::from_data(TensorData::new(values, shape), device);
        if bf16 {
            tensor.cast(burn::tensor::DType::BF16)
        } else {
            tensor
        }
    };
    let shape = [1, 2, 1024, 64];
    let options = AttentionModuleOptions {
        scale: Some(0.2),
        softcap: None,
        is_causal: true,
    };
    attention(
        input(1, shape),
        input(2, shape),
        input(3, shape),
        None,
        None,
        options,
    )
    .cast(burn::tensor::DType::F32)
    .into_data()
}

#[test]
#[ignore = "needs a Trainium (trn1/trn2) instance with the Neuron SDK's NKI kernels"]
fn flash_attention_matches_the_host() {
    let (device, _) = neuron();
    for (bf16, tolerance) in [(false, 1e-3), (true, 3e-2)] {
        let expected = long_attention(&Device::flex(), bf16);
        let actual = long_attention(&device, bf16);
        assert_close(
            &format!("attention (bf16: {bf16})"),
            &expected,
            &actual,
            tolerance,
        );
    }
}
