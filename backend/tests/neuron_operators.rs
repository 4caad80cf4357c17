//! Every HLO module the `neuron` executor hands to `neuronx-cc` for an HLAT-like training step
//! (`neuron_support::hlat_step`) uses only operators of the Neuron compiler's published XLA
//! operator list (`backend/src/neuron/supported_operators.txt`, which says where the list comes
//! from), and `reduce` only with the computations the list allows. The step runs on `neuron:0`
//! in compile-only mode with the stand-in compiler; the modules are read back from the cache.

mod neuron_support;

use burn_trainium::{TrainiumDevice, stats};
use neuron_support::hlat_step::{scan_modules, supported_opcodes, train};
use neuron_support::{Workspace, use_stand_in_for_the_executor};

#[test]
fn hlat_training_step_uses_only_supported_neuron_operators() {
    let workspace = Workspace::new("operators");
    // SAFETY: the only test of this binary; no device is open yet.
    unsafe { use_stand_in_for_the_executor(&workspace) };
    let device = TrainiumDevice::neuron(0);
    train(&device);

    let supported = supported_opcodes();
    assert!(
        supported.contains("dot") && supported.contains("parameter"),
        "{supported:?}"
    );
    let scan = scan_modules(&workspace.cache_root());
    let compiles = stats(&device).compiles;
    assert!(
        compiles > 0 && scan.modules as u64 == compiles,
        "{compiles} compiles, {scan:?}"
    );
    println!("{} modules, operators used: {:?}", scan.modules, scan.used);
    assert!(
        scan.used.contains_key("dot") && scan.used.contains_key("reduce"),
        "{scan:?}"
    );
    assert!(
        scan.unsupported.is_empty(),
        "not in the published list:\n{}",
        scan.unsupported.join("\n")
    );
    assert!(
        scan.unsupported_reductions.is_empty(),
        "{}",
        scan.unsupported_reductions.join("\n")
    );
}
