//! Shared by the tests of this binary: the XLA CPU plugin (the tests fail, never skip, when it
//! is missing) and tolerant comparison.

use std::path::PathBuf;

use burn::tensor::TensorData;
use burn_trainium::{PLUGIN_ENV, TrainiumDevice};

/// The plugin `TRAINIUM_PJRT_PLUGIN` names; fails the test when it is unset or missing.
pub fn plugin_path() -> PathBuf {
    let path = PathBuf::from(std::env::var_os(PLUGIN_ENV).unwrap_or_default());
    assert!(
        path.is_file(),
        "the XLA CPU PJRT plugin is missing (`{PLUGIN_ENV}` = `{}`): run the tests with \
         `scripts/test`, or set {PLUGIN_ENV} to the path `scripts/install-xla-cpu` prints",
        path.display()
    );
    path
}

/// The `xla:index` device, with the plugin required.
pub fn xla(index: u16) -> TrainiumDevice {
    plugin_path();
    TrainiumDevice::xla(index)
}

/// Asserts that two tensors hold the same shape and values within `tolerance`
/// (absolute + relative).
pub fn assert_close(name: &str, expected: &TensorData, actual: &TensorData, tolerance: f64) {
    assert_eq!(expected.shape, actual.shape, "{name}: shapes differ");
    let expected_values: Vec<f64> = expected.clone().convert::<f64>().to_vec().unwrap();
    let actual_values: Vec<f64> = actual.clone().convert::<f64>().to_vec().unwrap();
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

/// Held by the tests that seed: seeding any device also seeds the host's process-wide generator
/// (host fallbacks draw from it), so such tests take turns.
pub fn exclusive_random() -> std::sync::MutexGuard<'static, ()> {
    static RANDOM_STATE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    RANDOM_STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
