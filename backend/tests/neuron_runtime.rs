//! The `neuron` executor on a machine without the Neuron runtime (like this one): opening a
//! device fails with an error that lists every place `libnrt` was searched.

use burn_trainium::{TrainiumDevice, check_device};

#[test]
fn a_missing_runtime_is_reported_with_the_paths_searched() {
    if std::env::var_os("NEURON_RT_LIB_DIR").is_some()
        || std::path::Path::new("/opt/aws/neuron/lib").exists()
    {
        eprintln!("a Neuron runtime may be installed here; the on-chip tests cover this machine");
        return;
    }
    let error = check_device(&TrainiumDevice::neuron(0))
        .unwrap_err()
        .to_string();
    for searched in [
        "/opt/aws/neuron/lib/libnrt.so.1",
        "/opt/aws/neuron/lib/libnrt.so",
        "libnrt.so.1 on the dynamic loader search path",
        "libnrt.so on the dynamic loader search path",
        "NEURON_RT_LIB_DIR",
    ] {
        assert!(
            error.contains(searched),
            "`{searched}` missing from: {error}"
        );
    }
    assert!(
        error.contains("the `neuron` executor is unavailable"),
        "{error}"
    );
}
