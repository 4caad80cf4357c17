// Replaces upstream's common/autodiff.rs (`run` writes the path of the suite's autodiff/mod.rs,
// relative to tests/common/, where AUTODIFF_MOD stands). Upstream turns autodiff on through the
// Dispatch device
// (`DispatchDevice::autodiff(..)`); here the backend type is `Autodiff<Trainium>` instead, and the
// device is the plain Trainium device.

pub use super::*;

#[allow(unused)]
pub type TestBackend = burn_autodiff::Autodiff<burn_trainium::Trainium>;
#[allow(unused)]
pub type TestTensor<const D: usize> = burn_tensor::Tensor<TestBackend, D>;
#[allow(unused)]
pub type TestTensorInt<const D: usize> = burn_tensor::Tensor<TestBackend, D, burn_tensor::Int>;
#[allow(unused)]
pub type TestTensorBool<const D: usize> = burn_tensor::Tensor<TestBackend, D, burn_tensor::Bool>;

pub struct AutodiffDevice;

impl AutodiffDevice {
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> burn_trainium::TrainiumDevice {
        burn_trainium::TrainiumDevice::default()
    }
}

#[path = "AUTODIFF_MOD"]
mod base;

mod checkpointing {
    pub use super::FloatElem;

    #[allow(unused)]
    pub type TestBackend = burn_autodiff::Autodiff<
        burn_trainium::Trainium,
        burn_autodiff::checkpoint::strategy::BalancedCheckpointing,
    >;
    #[allow(unused)]
    pub type TestTensor<const D: usize> = burn_tensor::Tensor<TestBackend, D>;
    #[allow(unused)]
    pub type TestTensorInt<const D: usize> = burn_tensor::Tensor<TestBackend, D, burn_tensor::Int>;
    #[allow(unused)]
    pub type TestTensorBool<const D: usize> =
        burn_tensor::Tensor<TestBackend, D, burn_tensor::Bool>;

    pub struct AutodiffDevice;

    impl AutodiffDevice {
        #[allow(clippy::new_ret_no_self)]
        pub fn new() -> burn_trainium::TrainiumDevice {
            burn_trainium::TrainiumDevice::default()
        }
    }

    include!("AUTODIFF_MOD");
}
