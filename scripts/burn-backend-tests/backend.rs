// Replaces upstream's common/backend.rs (`TestBackend = burn_dispatch::Dispatch`).
use ctor::ctor;

use super::{FloatElem, IntElem};

/// The backend under test. Its default device is `TrainiumDevice::default()`, i.e. the one named
/// by `TRAINIUM_DEVICE` (`host:0` when unset): run with `TRAINIUM_DEVICE=xla:0`.
pub type TestBackend = burn_trainium::Trainium;

#[ctor]
fn init_device_settings() {
    let device = burn_trainium::TrainiumDevice::default();
    burn_tensor::set_default_dtypes::<TestBackend>(
        &device,
        <FloatElem as burn_tensor::Element>::dtype(),
        <IntElem as burn_tensor::Element>::dtype(),
    )
    .unwrap();
}

#[allow(unused)]
pub mod prelude {
    pub use burn_tensor::Tensor;

    use super::*;
    pub type TestTensor<const D: usize> = Tensor<TestBackend, D>;
    pub type TestTensorInt<const D: usize> = Tensor<TestBackend, D, burn_tensor::Int>;
    pub type TestTensorBool<const D: usize> = Tensor<TestBackend, D, burn_tensor::Bool>;
}

#[allow(unused)]
pub use prelude::*;
