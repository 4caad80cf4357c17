//! The `host` executor sums a whole f32 tensor of 4M elements or more in a fixed order (along
//! its last axis, then the row sums), where `burn-flex` alone sums it with rayon, whose grouping
//! of partial sums depends on work stealing: one program, one result.

use burn::tensor::{Device, Tensor, TensorData};

/// The value of a one-element tensor, as its f32 bits.
fn bits(tensor: Tensor<1>) -> u32 {
    tensor
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap()[0]
        .to_bits()
}

#[test]
fn the_host_sums_a_long_tensor_along_its_rows_then_their_sums() {
    // 4,222,976 elements in rows of an odd length, of many magnitudes.
    let shape: [usize; 2] = [4096, 1031];
    let values: Vec<f32> = (0..shape[0] * shape[1])
        .map(|index| ((index * 7919 % 10007) as f32 - 5000.0) * 1e-3 * (1 + index % 13) as f32)
        .collect();
    let tensor = |device: &Device| {
        Tensor::<2>::from_data(TensorData::new(values.clone(), shape), device).add_scalar(0.25)
    };
    let host = burn_trainium::device("host:0").unwrap();
    let on_host = bits(tensor(&host).sum());
    let in_order = bits(tensor(&Device::flex()).sum_dim(1).sum());
    assert_eq!(
        f32::from_bits(on_host),
        f32::from_bits(in_order),
        "the host's sum is not the sum of the row sums"
    );
    // And the same again.
    assert_eq!(bits(tensor(&host).sum()), on_host);
}
