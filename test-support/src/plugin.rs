//! The XLA CPU PJRT plugin the tests run the `xla` executor on: a test that needs it fails,
//! never skips, when it is missing.

use std::path::PathBuf;

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
