use burn::tensor::{Tensor, TensorData};
use burn_trainium::{Trainium, TrainiumDevice};

#[test]
fn matmul_runs_on_host() {
    let device = TrainiumDevice::HOST;
    let a =
        Tensor::<Trainium, 2>::from_data(TensorData::from([[1.0f32, 2.0], [3.0, 4.0]]), &device);
    let b = a.clone().matmul(a.transpose()) + 1.0;
    let data = b.into_data();
    data.assert_eq(&TensorData::from([[6.0f32, 12.0], [12.0, 26.0]]), false);
}
