//! Shared by the `xla_*` tests: the XLA CPU plugin, and comparisons against the host executor.
//!
//! The tests fail, never skip, when the plugin is missing.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Once;

use burn::tensor::TensorData;
use burn_trainium::{CPU_DEVICES_ENV, PLUGIN_ENV, TrainiumDevice};

/// Where `../shared/scripts/install-xla-cpu` installs the plugin when nothing overrides it.
fn default_plugin_path() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home)
        .join(".cache/burn-trainium/xla-cpu-2026.6.23/fastatomstruct_xla_cpu/libpjrt_cpu.so")
}

/// The plugin named by `TRAINIUM_PJRT_PLUGIN`, or the default install; fails when missing.
pub fn plugin_path() -> PathBuf {
    let path = std::env::var_os(PLUGIN_ENV)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(default_plugin_path);
    assert!(
        path.is_file(),
        "the XLA CPU PJRT plugin is missing at `{}`: run `../shared/scripts/install-xla-cpu` and set \
         {PLUGIN_ENV} to the path it prints",
        path.display()
    );
    path
}

/// Makes sure `TRAINIUM_PJRT_PLUGIN` names the XLA CPU plugin, and fails the test otherwise.
pub fn require_plugin() {
    static SET: Once = Once::new();
    SET.call_once(|| {
        if std::env::var_os(PLUGIN_ENV).is_none_or(|value| value.is_empty()) {
            // SAFETY: runs once, before any test of this binary opens an `xla` device.
            unsafe { std::env::set_var(PLUGIN_ENV, default_plugin_path()) };
        }
        if std::env::var_os(CPU_DEVICES_ENV).is_none() {
            // SAFETY: as above. Three devices let tests use `xla:2` alone.
            unsafe { std::env::set_var(CPU_DEVICES_ENV, "3") };
        }
    });
    let path = PathBuf::from(std::env::var_os(PLUGIN_ENV).unwrap_or_default());
    assert!(
        path.is_file(),
        "the XLA CPU PJRT plugin is missing at `{}`: run `../shared/scripts/install-xla-cpu` and set \
         {PLUGIN_ENV} to the path it prints",
        path.display()
    );
}

/// The `xla:index` device, with the plugin required.
pub fn xla(index: u16) -> TrainiumDevice {
    require_plugin();
    TrainiumDevice::xla(index)
}

/// Asserts that two tensors hold the same shape and values within `tolerance`
/// (absolute + relative).
pub fn assert_close(name: &str, expected: &TensorData, actual: &TensorData, tolerance: f64) {
    assert_eq!(expected.shape, actual.shape, "{name}: shapes differ");
    assert_eq!(expected.dtype, actual.dtype, "{name}: dtypes differ");
    let expected_values: Vec<f64> = expected.clone().convert::<f64>().to_vec().unwrap();
    let actual_values: Vec<f64> = actual.clone().convert::<f64>().to_vec().unwrap();
    for (index, (e, a)) in expected_values.iter().zip(&actual_values).enumerate() {
        let close =
            (e.is_nan() && a.is_nan()) || e == a || (e - a).abs() <= tolerance * (1.0 + e.abs());
        assert!(
            close,
            "{name}: element {index} is {a} on xla, {e} on host (tolerance {tolerance})"
        );
    }
}
