//! Reading a Burn module's parameters back, to compare two models value for value.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Tensor, TensorData};

/// Every float parameter's values of `module`, in visiting order (replica 0's on a replicated
/// device).
pub fn parameters<M: Module>(module: &M) -> Vec<TensorData> {
    struct Collect(Vec<TensorData>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().into_data());
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}
