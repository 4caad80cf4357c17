//! The published XLA operator list also restricts `power`: "Exponent argument must be a
//! compile-time integer constant". The lowering hoists scalar operands into parameters (so a
//! changing learning rate does not change the program) but keeps the exponents of `powf_scalar` /
//! `powi_scalar` (e.g. RMSNorm's square) as constants; this test checks the restriction on the
//! HLAT-like step. Whether `neuronx-cc` (rather than the older
//! `neuron-cc` the list was written for) still enforces the restriction is not known here.

mod neuron_support;

use burn_trainium::TrainiumDevice;
use neuron_support::hlat_step::{scan_modules, train};
use neuron_support::{Workspace, use_stand_in_for_the_executor};

#[test]
fn hlat_training_step_raises_to_constant_powers_only() {
    let workspace = Workspace::new("restrictions");
    // SAFETY: the only test of this binary; no device is open yet.
    unsafe { use_stand_in_for_the_executor(&workspace) };
    train(&TrainiumDevice::neuron(0));
    let scan = scan_modules(&workspace.cache_root());
    assert!(scan.modules > 0);
    assert!(
        scan.runtime_exponents.is_empty(),
        "{}",
        scan.runtime_exponents.join("\n")
    );
}
