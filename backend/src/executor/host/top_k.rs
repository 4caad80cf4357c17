//! `arg_topk`, which burn-flex 0.21 leaves unimplemented: the positions of the `k` largest
//! elements along an axis, computed on the host from the input's data (a stable descending
//! order: equal elements keep their order, as the `xla` lowering's sort).

use burn_backend::TensorData;
use burn_ir::ReduceDimOpIr;

/// The positions of the largest `k` (the output's size along the axis) elements of `input`
/// along `ir.axis`, in descending order of value, as the output's dtype.
pub(super) fn arg_top_k(input: TensorData, ir: &ReduceDimOpIr) -> TensorData {
    let values: Vec<f64> = input.convert::<f64>().try_into_vec().unwrap_or_default();
    let shape = &ir.input.shape;
    let length = shape[ir.axis];
    let k = ir.out.shape[ir.axis];
    let inner: usize = shape[ir.axis + 1..].iter().product();
    let outer: usize = shape[..ir.axis].iter().product();
    let mut positions = vec![0i64; outer * k * inner];
    for before in 0..outer {
        for after in 0..inner {
            let at = |position: usize| values[(before * length + position) * inner + after];
            let mut order: Vec<usize> = (0..length).collect();
            order.sort_by(|&a, &b| at(b).total_cmp(&at(a)));
            for (rank, &position) in order.iter().take(k).enumerate() {
                positions[(before * k + rank) * inner + after] = position as i64;
            }
        }
    }
    TensorData::new(positions, ir.out.shape.clone()).convert_dtype(ir.out.dtype)
}
