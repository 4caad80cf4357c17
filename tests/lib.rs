//! Shared helpers for the integration tests: deterministic inputs, the reference backend and
//! tolerant comparison of results.
//!
//! Every differential test builds the same inputs on the reference backend ([`Reference`],
//! `burn-ndarray`) and on the backend under test, runs the same Burn code on both, and compares.
//! In `bf16` mode the inputs are values exactly representable in bf16; the reference computes in
//! f32 on those values, the backend under test in bf16, and the tolerance covers bf16 rounding.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, Int, Tensor, TensorData, Tolerance};

/// The independent reference every backend result is compared with.
pub type Reference = burn::backend::NdArray<f32, i32>;

/// The float precision a differential case runs in on the backend under test.
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

    /// The tolerance used to compare a result computed in this precision with the f32 reference.
    pub fn tolerance(self) -> Tolerance<f32> {
        match self {
            Precision::F32 => Tolerance::absolute(2e-5).set_relative(2e-5),
            Precision::Bf16 => Tolerance::absolute(3e-2).set_relative(3e-2),
        }
    }
}

/// A deterministic stream of pseudo-random numbers (SplitMix64), so inputs are identical for
/// every backend and every run.
pub struct Numbers(u64);

impl Numbers {
    /// A stream for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `[0, bound)`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }
}

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

fn float_tensor<B: Backend, const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
    precision: Precision,
    device: &B::Device,
) -> Tensor<B, D> {
    let tensor = Tensor::<B, D>::from_data(TensorData::new(values, shape), device);
    match precision {
        Precision::F32 => tensor,
        Precision::Bf16 => tensor.cast(DType::BF16),
    }
}

/// A float tensor with values in `[-2, 2]`.
pub fn float<B: Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    precision: Precision,
    device: &B::Device,
) -> Tensor<B, D> {
    let values = grid_values(shape.iter().product(), seed, -2.0, 2.0);
    float_tensor(values, shape, precision, device)
}

/// A float tensor with values in `[0.25, 3]`, for `log`, `sqrt` and divisions.
pub fn positive<B: Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    precision: Precision,
    device: &B::Device,
) -> Tensor<B, D> {
    let values = grid_values(shape.iter().product(), seed, 0.25, 3.0);
    float_tensor(values, shape, precision, device)
}

/// A float tensor whose values are all different (a shuffled ramp), so that arg-max, sorting and
/// comparisons have no ties in any precision. At most 128 elements.
pub fn distinct<B: Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    precision: Precision,
    device: &B::Device,
) -> Tensor<B, D> {
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
pub fn ints<B: Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    high: i64,
    device: &B::Device,
) -> Tensor<B, D, Int> {
    let mut numbers = Numbers::new(seed);
    let values: Vec<i32> = (0..shape.iter().product::<usize>())
        .map(|_| numbers.below(high as u64) as i32)
        .collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// A bool tensor, true with probability one half.
pub fn mask<B: Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    device: &B::Device,
) -> Tensor<B, D, Bool> {
    let mut numbers = Numbers::new(seed);
    let values: Vec<bool> = (0..shape.iter().product::<usize>())
        .map(|_| numbers.below(2) == 1)
        .collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// Compares a result of the backend under test with the reference result.
///
/// Float results are compared within the precision's tolerance (after converting both to f32);
/// int and bool results must be equal.
pub fn assert_matches_reference(
    actual: TensorData,
    expected: TensorData,
    precision: Precision,
    what: &str,
) {
    assert_eq!(actual.shape, expected.shape, "{what}: shapes differ");
    if expected.dtype.is_float() {
        let actual = actual.convert::<f32>();
        let expected = expected.convert::<f32>();
        // `assert_approx_eq` panics with the first differing elements; say which case it was.
        eprintln!("comparing {what} ({precision:?})");
        actual.assert_approx_eq::<f32>(&expected, precision.tolerance());
    } else if expected.dtype.is_int() {
        assert_eq!(
            actual.convert::<i64>().to_vec::<i64>().unwrap(),
            expected.convert::<i64>().to_vec::<i64>().unwrap(),
            "{what} ({precision:?})"
        );
    } else {
        assert_eq!(
            actual.to_vec::<bool>().unwrap(),
            expected.to_vec::<bool>().unwrap(),
            "{what} ({precision:?})"
        );
    }
}

/// Declares a test that runs `body` on the reference and on the backend under test, in f32 and
/// bf16, and compares the results.
///
/// `body` sees a generic backend `B`, a `device: &B::Device` and a `precision: Precision`, and
/// returns any tensor (float, int or bool).
#[macro_export]
macro_rules! differential {
    ($under_test:ty, $name:ident, |$device:ident, $precision:ident| $body:expr) => {
        #[test]
        fn $name() {
            fn compute<B: burn::tensor::backend::Backend>(
                $device: &B::Device,
                $precision: $crate::Precision,
            ) -> burn::tensor::TensorData {
                $body.into_data()
            }
            for precision in $crate::Precision::ALL {
                let expected =
                    compute::<$crate::Reference>(&Default::default(), $crate::Precision::F32);
                let actual = compute::<$under_test>(&Default::default(), precision);
                $crate::assert_matches_reference(actual, expected, precision, stringify!($name));
            }
        }
    };
}
