//! What the integration tests share: deterministic inputs, the reference backend, the devices
//! under test, the one tolerance table, and the differential check.
//!
//! A differential case is a plain function `fn case(&Device, Precision) -> TensorData`: Burn
//! 0.22's tensors carry no backend, so the same function runs on every device. [`check`] runs it
//! on the reference (Flex, f32) and on the Trainium `host` and `xla` executors served in the
//! process (`burn_trainium::device`), in f32 and bf16. In bf16 the inputs are values bf16 represents
//! exactly; the reference computes in f32 on those values.

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};

use burn::tensor::{Bool, DType, Device, Int, Tensor, TensorData};
use burn_trainium::server::{Access, ServeOptions};
use burn_trainium::{TrainiumDevice, stats};

/// The independent reference every backend result is compared with: Flex (burn-ndarray is
/// deprecated in Burn 0.22 and gone in 0.23).
pub fn reference() -> Device {
    Device::flex()
}

/// `device` served as a Burn device in this process (`burn_trainium::device`).
pub fn trainium(device: TrainiumDevice) -> Device {
    burn_trainium::device(&device.to_string())
        .unwrap_or_else(|error| panic!("serving {device}: {error}"))
}

/// A server of `devices` on a loopback port the system picks, as `hlat serve` runs it, with
/// `limits` applied to its options; its address.
pub fn serve_on_loopback(
    devices: Vec<TrainiumDevice>,
    limits: impl FnOnce(ServeOptions) -> ServeOptions,
) -> SocketAddr {
    let options = ServeOptions::new(devices, "127.0.0.1:0".parse().unwrap(), Access::Loopback);
    burn_trainium::server::bind(&limits(options))
        .unwrap()
        .serve_in_background()
        .unwrap()
}

/// The `host` executor (one replica) served as a Burn device.
pub fn host() -> Device {
    trainium(TrainiumDevice::HOST)
}

/// The float precision a case runs in on the backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// f32 everywhere.
    F32,
    /// bf16 tensors on the backend under test (the reference stays f32).
    Bf16,
}

impl Precision {
    /// Both precisions, in test order.
    pub const ALL: [Precision; 2] = [Precision::F32, Precision::Bf16];

    /// The float dtype of this precision.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
        }
    }

    /// The tolerance of a float result computed in this precision against the f32 reference:
    /// `|actual - expected| <= tolerance * (1 + |expected|)`. Int and bool results are exact.
    pub fn tolerance(self) -> f64 {
        match self {
            Precision::F32 => 2e-5,
            Precision::Bf16 => 3e-2,
        }
    }
}

/// A differential case: the same Burn code on any device.
pub type Case = fn(&Device, Precision) -> TensorData;

/// The `xla` device of the differential tests, with the plugin required (the tests fail, never
/// skip, without it).
pub fn xla() -> TrainiumDevice {
    test_support::plugin::xla(0)
}

/// The devices every case runs on: the host executor and the `xla` executor, each as the
/// Trainium device (whose statistics the tests read) and the Burn device serving it.
pub fn devices_under_test() -> [(TrainiumDevice, Device); 2] {
    let xla = xla();
    [
        (TrainiumDevice::HOST, trainium(TrainiumDevice::HOST)),
        (xla, trainium(xla)),
    ]
}

/// Tests that read the counters of the `xla` device ([`xla`]) run one at a time, so each one sees
/// only its own host fallbacks and compiled programs.
static XLA_DEVICE: Mutex<()> = Mutex::new(());

/// Holds the `xla` device ([`xla`]) for a test that reads its counters.
pub fn exclusive_xla() -> MutexGuard<'static, ()> {
    XLA_DEVICE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Tests that set the segment cap of `xla:1` or read its counters run one at a time.
static SECOND_XLA_DEVICE: Mutex<()> = Mutex::new(());

/// Holds `xla:1`, which only the tests that take it use: no other test's operations join its
/// stream (a read of theirs would cut its segments) or its counters. Each sets the segment cap
/// it needs.
pub fn exclusive_second_xla() -> (MutexGuard<'static, ()>, TrainiumDevice) {
    let guard = SECOND_XLA_DEVICE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    (guard, test_support::plugin::xla(1))
}

pub use test_support::random::exclusive_random;

/// Runs `case` on every device under test in both precisions and compares it with the
/// reference's result in f32. On `xla` no operation may fall back to the host.
pub fn check(name: &str, case: Case) {
    check_with(name, case, case);
}

/// [`check`] with a reference computed otherwise than the case under test (an operation Flex
/// lacks, say).
pub fn check_with(name: &str, reference: Case, under_test: Case) {
    check_all_with(
        name,
        |device, precision| vec![reference(device, precision)],
        |device, precision| vec![under_test(device, precision)],
    );
}

/// [`check`] for a case with several results (an output and its gradients, say: a case that
/// needs gradients calls `device.autodiff()` itself).
pub fn check_all(name: &str, case: impl Fn(&Device, Precision) -> Vec<TensorData>) {
    check_all_with(name, &case, &case);
}

/// [`check_all`] for a case that takes gradients: it runs on the autodiff form of every device.
pub fn check_gradients(name: &str, case: impl Fn(&Device, Precision) -> Vec<TensorData>) {
    check_all(name, |device, precision| {
        case(&device.clone().autodiff(), precision)
    });
}

/// [`check_all`] with a reference computed otherwise than the case under test.
pub fn check_all_with(
    name: &str,
    reference_case: impl Fn(&Device, Precision) -> Vec<TensorData>,
    case: impl Fn(&Device, Precision) -> Vec<TensorData>,
) {
    let expected = reference_case(&reference(), Precision::F32);
    for (trainium, device) in devices_under_test() {
        let _exclusive = exclusive_xla();
        device.sync().expect("the device syncs");
        let before = stats(&trainium).host_fallbacks;
        for precision in Precision::ALL {
            let actual = case(&device, precision);
            assert_eq!(
                actual.len(),
                expected.len(),
                "{name}: results differ in number"
            );
            for (index, (expected, actual)) in expected.iter().zip(&actual).enumerate() {
                assert_matches(
                    &format!("{name} #{index} on {trainium} in {precision:?}"),
                    expected,
                    actual,
                    precision.tolerance(),
                );
            }
        }
        if trainium != TrainiumDevice::HOST {
            // The client sends operations asynchronously: the counters are read once the
            // device has run every one.
            device.sync().expect("the device syncs");
            assert_eq!(
                stats(&trainium).host_fallbacks,
                before,
                "{name}: an operation fell back to the host on {trainium} (since the start: {})",
                burn_trainium::host_fallback_report(&trainium).unwrap_or_default()
            );
        }
    }
}

/// Compares a result with the reference: float results within `tolerance` (both read as f64,
/// NaN equal to NaN), int and bool results exactly.
pub fn assert_matches(what: &str, expected: &TensorData, actual: &TensorData, tolerance: f64) {
    assert_eq!(actual.shape(), expected.shape(), "{what}: shapes differ");
    if expected.dtype().is_float() {
        let expected = expected
            .clone()
            .convert::<f64>()
            .try_into_vec::<f64>()
            .unwrap();
        let actual = actual
            .clone()
            .convert::<f64>()
            .try_into_vec::<f64>()
            .unwrap();
        for (index, (e, a)) in expected.iter().zip(&actual).enumerate() {
            let close = e == a
                || (e.is_nan() && a.is_nan())
                || (e - a).abs() <= tolerance * (1.0 + e.abs());
            assert!(
                close,
                "{what}: element {index} is {a}, the reference {e} (tolerance {tolerance})"
            );
        }
    } else if expected.dtype().is_int() {
        assert_eq!(
            actual.clone().convert::<i64>().try_to_vec::<i64>().unwrap(),
            expected
                .clone()
                .convert::<i64>()
                .try_to_vec::<i64>()
                .unwrap(),
            "{what}"
        );
    } else {
        assert_eq!(
            actual.try_to_vec::<bool>().unwrap(),
            expected.try_to_vec::<bool>().unwrap(),
            "{what}"
        );
    }
}

/// A deterministic stream of pseudo-random numbers (the pipeline's SplitMix64), so inputs are
/// identical for every backend and every run.
pub type Numbers = hlat_train::data::rng::SplitMix64;

/// Values that bf16 represents exactly: multiples of 1/32 in `[low, high]` (|value| < 4).
fn grid_values(count: usize, seed: u64, low: f32, high: f32) -> Vec<f32> {
    let mut numbers = Numbers::new(seed);
    let low_step = (low * 32.0).ceil() as i64;
    let high_step = (high * 32.0).floor() as i64;
    let span = (high_step - low_step + 1) as u64;
    (0..count)
        .map(|_| (low_step + numbers.below(span) as i64) as f32 / 32.0)
        .collect()
}

fn float_tensor<const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
    precision: Precision,
    device: &Device,
) -> Tensor<D> {
    Tensor::<D>::from_data(TensorData::new(values, shape), device).cast(precision.dtype())
}

/// A float tensor with values in `[-2, 2]`.
pub fn float<const D: usize>(
    shape: [usize; D],
    seed: u64,
    precision: Precision,
    device: &Device,
) -> Tensor<D> {
    let values = grid_values(shape.iter().product(), seed, -2.0, 2.0);
    float_tensor(values, shape, precision, device)
}

/// A float tensor with values in `[0.25, 3]`, for `log`, `sqrt` and divisions.
pub fn positive<const D: usize>(
    shape: [usize; D],
    seed: u64,
    precision: Precision,
    device: &Device,
) -> Tensor<D> {
    let values = grid_values(shape.iter().product(), seed, 0.25, 3.0);
    float_tensor(values, shape, precision, device)
}

/// A float tensor with values in `(-1, 1)`, for the inverse trigonometric functions.
pub fn unit<const D: usize>(
    shape: [usize; D],
    seed: u64,
    precision: Precision,
    device: &Device,
) -> Tensor<D> {
    let values = grid_values(shape.iter().product(), seed, -0.96875, 0.96875);
    float_tensor(values, shape, precision, device)
}

/// A float tensor whose values are all different (a shuffled ramp), so that arg-max, sorting and
/// comparisons have no ties in any precision. At most 128 elements.
pub fn distinct<const D: usize>(
    shape: [usize; D],
    seed: u64,
    precision: Precision,
    device: &Device,
) -> Tensor<D> {
    let count: usize = shape.iter().product();
    assert!(
        count <= 128,
        "distinct inputs are limited to 128 exact bf16 values"
    );
    let mut values: Vec<f32> = (0..count)
        .map(|i| (i as f32 - count as f32 / 2.0) / 32.0)
        .collect();
    let mut numbers = Numbers::new(seed);
    for i in (1..count).rev() {
        values.swap(i, numbers.below(i as u64 + 1) as usize);
    }
    float_tensor(values, shape, precision, device)
}

/// An int tensor with values in `[0, high)`.
pub fn ints<const D: usize>(
    shape: [usize; D],
    seed: u64,
    high: i64,
    device: &Device,
) -> Tensor<D, Int> {
    let mut numbers = Numbers::new(seed);
    let values: Vec<i32> = (0..shape.iter().product::<usize>())
        .map(|_| numbers.below(high as u64) as i32)
        .collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// A bool tensor, true with probability one half.
pub fn mask<const D: usize>(shape: [usize; D], seed: u64, device: &Device) -> Tensor<D, Bool> {
    let mut numbers = Numbers::new(seed);
    let values: Vec<bool> = (0..shape.iter().product::<usize>())
        .map(|_| numbers.below(2) == 1)
        .collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// The programs `device` needed since its statistics were reset: those compiled and those loaded
/// compiled from the persistent compile cache (warm when the tests ran before on this machine).
pub fn programs(device: &TrainiumDevice) -> u64 {
    let stats = stats(device);
    stats.compiles + stats.programs_loaded
}
