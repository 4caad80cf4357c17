//! The differential suite of the backend: every operation family burn-nn and HLAT use, on
//! the Trainium `host` and `xla` executors in f32 and bf16, against Flex (see
//! [`crate::support::check`]). On `xla` none of them may fall back to the host.

use burn::tensor::activation::{gelu, log_softmax, relu, sigmoid, silu, softmax};
use burn::tensor::module::{attention, embedding, linear};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, Device, IndexingUpdateOp, Int, Tensor, TensorData, s};

use crate::support::{
    Numbers, Precision, assert_matches, check, check_with, devices_under_test, distinct, float,
    ints, mask, positive, unit,
};

fn matmul(device: &Device, p: Precision) -> TensorData {
    float::<2>([7, 16], 1, p, device)
        .matmul(float([16, 5], 2, p, device))
        .into_data()
}

fn batched_matmul(device: &Device, p: Precision) -> TensorData {
    float::<3>([3, 6, 8], 3, p, device)
        .matmul(float([3, 8, 4], 4, p, device))
        .into_data()
}

fn broadcast_batched_matmul(device: &Device, p: Precision) -> TensorData {
    float::<4>([2, 3, 5, 8], 5, p, device)
        .matmul(float([1, 3, 8, 6], 6, p, device))
        .into_data()
}

fn matmul_with_transposed_operand(device: &Device, p: Precision) -> TensorData {
    float::<2>([5, 8], 45, p, device)
        .matmul(float::<2>([6, 8], 46, p, device).transpose())
        .into_data()
}

fn linear_module(device: &Device, p: Precision) -> TensorData {
    linear(
        float::<3>([2, 3, 8], 7, p, device),
        float([8, 5], 8, p, device),
        Some(float([5], 9, p, device)),
    )
    .into_data()
}

#[test]
fn matrix_products() {
    check("matmul", matmul);
    check("batched_matmul", batched_matmul);
    check("broadcast_batched_matmul", broadcast_batched_matmul);
    check(
        "matmul_with_transposed_operand",
        matmul_with_transposed_operand,
    );
    check("linear_module", linear_module);
}

fn arithmetic_with_broadcasting(device: &Device, p: Precision) -> TensorData {
    let a = float::<3>([2, 3, 4], 10, p, device);
    let b = float::<3>([1, 3, 1], 11, p, device);
    let c = positive::<3>([2, 1, 4], 12, p, device);
    ((a.clone() + b.clone()) * c.clone() - b / c).into_data()
}

fn scalar_arithmetic(device: &Device, p: Precision) -> TensorData {
    let x = float::<2>([5, 5], 13, p, device);
    ((x.clone() * 1.5 + 0.25) / 2.0 - 1.0)
        .remainder_scalar(0.75)
        .into_data()
}

fn remainder_and_powers(device: &Device, p: Precision) -> TensorData {
    let x = positive::<2>([4, 5], 17, p, device);
    let y = float::<2>([4, 5], 18, p, device);
    (x.clone().powf(y.clone()) + y.remainder(x.clone()) + x.clone().powi_scalar(3)
        - x.powf_scalar(1.5))
    .into_data()
}

fn unary_math(device: &Device, p: Precision) -> TensorData {
    let x = positive::<2>([6, 7], 14, p, device);
    (x.clone().log()
        + x.clone().log1p()
        + x.clone().sqrt()
        + (-x.clone()).exp()
        + x.clone().floor()
        + x.clone().ceil()
        + (x * 2.0).round())
    .into_data()
}

fn trigonometry_and_erf(device: &Device, p: Precision) -> TensorData {
    let x = float::<2>([6, 7], 15, p, device);
    (x.clone().sin() + x.clone().cos() + x.clone().tanh() + x.clone().erf() + x.abs()).into_data()
}

fn inverse_trigonometry(device: &Device, p: Precision) -> TensorData {
    let x = unit::<2>([5, 6], 16, p, device);
    let above_one = positive::<2>([5, 6], 17, p, device) + 1.0;
    (x.clone().acos()
        + x.clone().asin()
        + x.clone().atan()
        + x.clone().atanh()
        + x.asinh()
        + above_one.acosh())
    .into_data()
}

fn activations(device: &Device, p: Precision) -> TensorData {
    let x = float::<3>([2, 5, 6], 16, p, device);
    (relu(x.clone()) + gelu(x.clone()) + silu(x.clone()) + sigmoid(x.clone()) + x.clamp(-0.5, 0.75))
        .into_data()
}

#[test]
fn elementwise() {
    check("arithmetic_with_broadcasting", arithmetic_with_broadcasting);
    check("scalar_arithmetic", scalar_arithmetic);
    check("remainder_and_powers", remainder_and_powers);
    check("unary_math", unary_math);
    check("trigonometry_and_erf", trigonometry_and_erf);
    check("inverse_trigonometry", inverse_trigonometry);
    check("activations", activations);
}

fn sum_and_mean(device: &Device, p: Precision) -> TensorData {
    let x = float::<3>([3, 4, 5], 19, p, device);
    (x.clone().sum_dim(1)
        + x.clone().mean_dim(1)
        + x.clone().sum().unsqueeze()
        + x.mean().unsqueeze())
    .into_data()
}

fn max_min_and_product(device: &Device, p: Precision) -> TensorData {
    let x = distinct::<3>([2, 4, 6], 21, p, device);
    (x.clone().max_dim(2) - x.clone().min_dim(2)
        + x.clone().max().unsqueeze()
        + (x * 0.5).prod_dim(2))
    .into_data()
}

fn arg_max_and_min(device: &Device, p: Precision) -> TensorData {
    let x = distinct::<2>([8, 12], 22, p, device);
    (x.clone().argmax(1) + x.clone().argmin(1) * 100 + x.max_dim_with_indices(1).1 * 10_000)
        .into_data()
}

/// Rows with NaN, ties and infinities: the first NaN is the extremum of a row that holds one
/// (NumPy's and PyTorch's rule; burn-ndarray skips NaN instead, so the expected values are
/// written out), the first of tied values wins.
fn arg_max_and_min_of_special_values(device: &Device, p: Precision) -> TensorData {
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let rows = [
        [1.0, nan, 3.0, nan],
        [2.0, 2.0, 1.0, 1.0],
        [inf, 1.0, inf, -inf],
        [-inf, 0.0, -inf, 0.0],
        [0.5, 0.25, 0.5, nan],
    ];
    let x = Tensor::<2>::from_data(TensorData::from(rows), device).cast(p.dtype());
    Tensor::cat(vec![x.clone().argmax(1), x.argmin(1)], 1).into_data()
}

fn rms_norm_pattern(device: &Device, p: Precision) -> TensorData {
    let x = float::<3>([2, 3, 16], 24, p, device);
    let scale = (x.clone().powf_scalar(2.0).mean_dim(2) + 1e-5)
        .sqrt()
        .recip();
    (x * scale).into_data()
}

fn softmax_last_dim(device: &Device, p: Precision) -> TensorData {
    softmax(float::<3>([2, 5, 9], 25, p, device), 2).into_data()
}

fn log_softmax_last_dim(device: &Device, p: Precision) -> TensorData {
    log_softmax(float::<2>([6, 11], 26, p, device), 1).into_data()
}

fn cumulative(device: &Device, p: Precision) -> TensorData {
    let x = float::<2>([3, 7], 27, p, device) * 0.5;
    (x.clone().cumsum(1) + x.clone().cumprod(1) + x.clone().cummin(1) + x.cummax(1)).into_data()
}

#[test]
fn reductions() {
    check("sum_and_mean", sum_and_mean);
    check("max_min_and_product", max_min_and_product);
    check("arg_max_and_min", arg_max_and_min);
    check("rms_norm_pattern", rms_norm_pattern);
    check("softmax_last_dim", softmax_last_dim);
    check("log_softmax_last_dim", log_softmax_last_dim);
    check("cumulative", cumulative);
}

#[test]
fn arg_max_and_min_agree_on_nan_ties_and_infinities() {
    // (argmax, argmin) of each row.
    let expected = TensorData::from([[1i64, 1], [0, 2], [0, 3], [1, 0], [3, 3]]);
    for (trainium, device) in devices_under_test() {
        for precision in Precision::ALL {
            let actual = arg_max_and_min_of_special_values(&device, precision);
            assert_matches(
                &format!("arg_max_and_min_of_special_values on {trainium} in {precision:?}"),
                &expected,
                &actual,
                0.0,
            );
        }
    }
}

/// Right shifts are logical for unsigned integers (zeros come in) and arithmetic for signed
/// ones (the sign comes in), as Rust's `>>`, on every device. (On Burn 0.21 the `host` executor
/// held no unsigned data; on 0.22 it does.)
#[test]
fn right_shifts_follow_the_integer_type() {
    let unsigned = [0xF000_0000u32, 7, 0x8000_0001];
    let signed = [-64i32, 7, i32::MIN];
    for (trainium, device) in devices_under_test() {
        let shifted =
            Tensor::<1, Int>::from_data(TensorData::from(unsigned), (&device, DType::U32))
                .bitwise_right_shift_scalar(4)
                .into_data();
        assert_eq!(
            shifted.convert::<i64>().try_to_vec::<i64>().unwrap(),
            unsigned.map(|value| i64::from(value >> 4)),
            "unsigned on {trainium}"
        );
        let shifted = Tensor::<1, Int>::from_data(TensorData::from(signed), &device)
            .cast(DType::I32)
            .bitwise_right_shift_scalar(4)
            .into_data();
        assert_eq!(
            shifted.convert::<i64>().try_to_vec::<i64>().unwrap(),
            signed.map(|value| i64::from(value >> 4)),
            "signed on {trainium}"
        );
    }
}

fn embedding_lookup(device: &Device, p: Precision) -> TensorData {
    embedding(
        float::<2>([10, 6], 27, p, device),
        ints([3, 5], 28, 10, device),
    )
    .into_data()
}

fn gather_along_dim(device: &Device, p: Precision) -> TensorData {
    float::<2>([4, 9], 29, p, device)
        .gather(1, ints([4, 3], 30, 9, device))
        .into_data()
}

fn select_rows(device: &Device, p: Precision) -> TensorData {
    float::<2>([8, 5], 31, p, device)
        .select(0, ints([6], 32, 8, device))
        .into_data()
}

fn select_assign_add(device: &Device, p: Precision) -> TensorData {
    float::<2>([6, 4], 33, p, device)
        .select_assign(
            0,
            ints([5], 34, 6, device),
            float([5, 4], 35, p, device),
            IndexingUpdateOp::Add,
        )
        .into_data()
}

fn scatter_add(device: &Device, p: Precision) -> TensorData {
    float::<2>([3, 7], 36, p, device)
        .scatter(
            1,
            ints([3, 4], 37, 7, device),
            float([3, 4], 38, p, device),
            IndexingUpdateOp::Add,
        )
        .into_data()
}

/// One index per row, then one per column: the scatter of a gather's gradient with one target
/// per row (the cross-entropy's), which `xla` lowers elementwise.
fn scatter_add_one_per_line(device: &Device, p: Precision) -> TensorData {
    let tensor = float::<2>([3, 7], 75, p, device);
    let rows = tensor.clone().scatter(
        1,
        ints([3, 1], 76, 7, device),
        float([3, 1], 77, p, device),
        IndexingUpdateOp::Add,
    );
    let columns = tensor.scatter(
        0,
        ints([1, 7], 78, 3, device),
        float([1, 7], 79, p, device),
        IndexingUpdateOp::Add,
    );
    Tensor::cat(vec![rows, columns], 0).into_data()
}

/// 300 ones added into one slot: a bf16 accumulator stops at 256 (256 + 1 rounds back to 256),
/// an f32 one reaches 300, which bf16 represents exactly.
fn scatter_add_accumulates_widely(device: &Device, p: Precision) -> TensorData {
    let dtype = p.dtype();
    let target = Tensor::<1>::zeros([4], device).cast(dtype);
    let ones = Tensor::<1>::ones([300], device).cast(dtype);
    let slots = Tensor::<1, Int>::zeros([300], device);
    let scattered = target
        .clone()
        .scatter(0, slots.clone(), ones.clone(), IndexingUpdateOp::Add);
    let selected = target.select_assign(0, slots, ones, IndexingUpdateOp::Add);
    Tensor::cat(vec![scattered, selected], 0)
        .cast(DType::F32)
        .into_data()
}

/// 300 lookups of one token: its gradient row sums 300 ones (bf16 accumulation stops at 256).
/// Burn's embedding backward is a select-assign sum, widened on every executor.
fn embedding_gradient_accumulates_widely(device: &Device, p: Precision) -> TensorData {
    let device = device.clone().autodiff();
    let weights = Tensor::<2>::zeros([4, 3], (&device, p.dtype())).require_grad();
    let ids = Tensor::<2, Int>::zeros([1, 300], &device);
    let gradients = embedding(weights.clone(), ids).sum().backward();
    weights
        .grad(&gradients)
        .expect("the weights take part in the sum")
        .cast(DType::F32)
        .into_data()
}

#[test]
fn indexing() {
    check(
        "embedding_gradient_accumulates_widely",
        embedding_gradient_accumulates_widely,
    );
    check(
        "scatter_add_accumulates_widely",
        scatter_add_accumulates_widely,
    );
    check("embedding_lookup", embedding_lookup);
    check("gather_along_dim", gather_along_dim);
    check("select_rows", select_rows);
    check("select_assign_add", select_assign_add);
    check("scatter_add", scatter_add);
    check("scatter_add_one_per_line", scatter_add_one_per_line);
}

fn gather_nd_slices(device: &Device, p: Precision) -> TensorData {
    float::<3>([4, 3, 5], 80, p, device)
        .gather_nd::<3, 3>(ints([2, 3, 2], 81, 3, device))
        .into_data()
}

fn scatter_nd_add(device: &Device, p: Precision) -> TensorData {
    float::<3>([4, 3, 5], 82, p, device)
        .scatter_nd(
            ints::<2>([6, 2], 83, 3, device),
            float::<2>([6, 5], 84, p, device),
            IndexingUpdateOp::Add,
        )
        .into_data()
}

fn unfold_windows(device: &Device, p: Precision) -> TensorData {
    float::<3>([3, 10, 2], 85, p, device)
        .unfold::<4, _>(1, 4, 3)
        .into_data()
}

fn cross_product(device: &Device, p: Precision) -> TensorData {
    let lhs = float::<3>([2, 3, 4], 86, p, device);
    let rhs = float::<3>([1, 3, 4], 87, p, device);
    lhs.cross(rhs, 1).into_data()
}

fn top_values(device: &Device, p: Precision) -> TensorData {
    let tensor = distinct::<2>([6, 9], 88, p, device);
    let rows = tensor.clone().topk(3, 1).flatten::<1>(0, 1);
    let columns = tensor.topk(2, 0).flatten::<1>(0, 1);
    Tensor::cat(vec![rows, columns], 0).into_data()
}

/// `argtopk` (burn-ndarray has none: the reference takes the positions of a descending sort).
fn top_positions(device: &Device, p: Precision) -> TensorData {
    let tensor = distinct::<2>([6, 9], 89, p, device);
    let rows = tensor.clone().argtopk(3, 1).flatten::<1>(0, 1);
    let columns = tensor.argtopk(2, 0).flatten::<1>(0, 1);
    Tensor::cat(vec![rows, columns], 0).into_data()
}

fn top_positions_by_sort(device: &Device, p: Precision) -> TensorData {
    let tensor = distinct::<2>([6, 9], 89, p, device);
    let rows = tensor.clone().topk_with_indices(3, 1).1.flatten::<1>(0, 1);
    let columns = tensor.topk_with_indices(2, 0).1.flatten::<1>(0, 1);
    Tensor::cat(vec![rows, columns], 0).into_data()
}

#[test]
fn multi_dimensional_indexing_windows_cross_and_top_k() {
    check("gather_nd_slices", gather_nd_slices);
    check("scatter_nd_add", scatter_nd_add);
    check("unfold_windows", unfold_windows);
    check("cross_product", cross_product);
    check("top_values", top_values);
    check_with("top_positions", top_positions_by_sort, top_positions);
}

fn slice_and_slice_assign(device: &Device, p: Precision) -> TensorData {
    let x = float::<3>([4, 6, 5], 39, p, device);
    let part = x.clone().slice(s![1..3, 2..6, ..]);
    let stepped = x.clone().slice(s![.., 0..5;2, 1..]).sum();
    let assigned = x.clone().slice_assign(s![0..2, 0..4, ..], part * 2.0) + stepped.unsqueeze();
    // Negative steps walk their range backwards: [7, 5, 3] of 2..8;-2.
    let backward = x.clone().slice(s![..;-1, 1..6;-2, 1..4]);
    let values = float::<3>([2, 3, 5], 91, p, device);
    let stepped_assign = x.slice_assign(s![1..4;2, 0..5;-2, ..], values);
    Tensor::cat(
        vec![
            assigned.flatten::<1>(0, 2),
            backward.flatten::<1>(0, 2),
            stepped_assign.flatten::<1>(0, 2),
        ],
        0,
    )
    .into_data()
}

fn concatenation(device: &Device, p: Precision) -> TensorData {
    Tensor::cat(
        vec![
            float::<3>([2, 3, 4], 40, p, device),
            float([2, 2, 4], 41, p, device),
            float([2, 1, 4], 42, p, device),
        ],
        1,
    )
    .into_data()
}

fn reshape_swap_permute(device: &Device, p: Precision) -> TensorData {
    float::<3>([2, 6, 4], 43, p, device)
        .reshape([2, 3, 2, 4])
        .swap_dims(1, 2)
        .permute([3, 0, 2, 1])
        .reshape([4, 12])
        .into_data()
}

fn expand_repeat_flip(device: &Device, p: Precision) -> TensorData {
    let x = float::<3>([1, 3, 1], 44, p, device);
    (x.clone().expand([2, 3, 4]) + x.repeat_dim(0, 2).repeat_dim(2, 4).flip([1])).into_data()
}

fn zeros_ones_full(device: &Device, p: Precision) -> TensorData {
    let dtype = p.dtype();
    (Tensor::<2>::zeros([2, 3], (device, dtype))
        + Tensor::<2>::ones([2, 3], (device, dtype))
        + Tensor::<2>::full([2, 3], 2.5, (device, dtype)))
    .into_data()
}

#[test]
fn layout() {
    check("slice_and_slice_assign", slice_and_slice_assign);
    check("concatenation", concatenation);
    check("reshape_swap_permute", reshape_swap_permute);
    check("expand_repeat_flip", expand_repeat_flip);
    check("zeros_ones_full", zeros_ones_full);
}

fn comparisons(device: &Device, p: Precision) -> TensorData {
    let a = distinct::<2>([6, 8], 47, p, device);
    let b = distinct::<2>([6, 8], 48, p, device);
    (a.clone().greater(b.clone()).int()
        + a.clone().lower_equal(b).int() * 2
        + a.equal_elem(0.0).int() * 4)
        .into_data()
}

fn causal_mask_fill(device: &Device, p: Precision) -> TensorData {
    let scores = float::<3>([2, 5, 5], 49, p, device);
    let causal = Tensor::<2, Bool>::triu_mask([5, 5], 1, device).unsqueeze::<3>();
    softmax(scores.mask_fill(causal, f32::NEG_INFINITY), 2).into_data()
}

fn mask_where(device: &Device, p: Precision) -> TensorData {
    float::<2>([5, 6], 50, p, device)
        .mask_where(mask([5, 6], 51, device), float([5, 6], 52, p, device))
        .into_data()
}

fn bool_logic(device: &Device, _: Precision) -> TensorData {
    mask::<2>([4, 5], 53, device)
        .bool_and(mask([4, 5], 54, device))
        .bool_or(mask::<2>([4, 5], 55, device).bool_not())
        .into_data()
}

#[test]
fn comparisons_and_masks() {
    check("comparisons", comparisons);
    check("causal_mask_fill", causal_mask_fill);
    check("mask_where", mask_where);
    check("bool_logic", bool_logic);
}

fn float_to_int_and_back(device: &Device, p: Precision) -> TensorData {
    (float::<2>([4, 5], 56, p, device) * 4.0)
        .int()
        .float()
        .cast(DType::F32)
        .into_data()
}

fn bool_to_float(device: &Device, _: Precision) -> TensorData {
    mask::<2>([3, 7], 58, device).float().into_data()
}

fn int_arithmetic(device: &Device, _: Precision) -> TensorData {
    let a = ints::<2>([4, 6], 59, 50, device);
    let b = ints::<2>([4, 6], 60, 50, device);
    ((a.clone() + b.clone()) * 3 - a.clone() * b.clone() + a.div_scalar(3) + b.remainder_scalar(7))
        .into_data()
}

fn int_reductions_and_indexing(device: &Device, _: Precision) -> TensorData {
    let a = ints::<2>([5, 6], 61, 40, device);
    let positions = Tensor::<1, Int>::arange(0..6, device).unsqueeze::<2>();
    (a.clone().sum_dim(1)
        + a.clone().gather(1, ints([5, 1], 62, 6, device))
        + a.clone().max_dim(1)
        + a.cumsum(1).slice(s![.., 5..6])
        + positions.sum_dim(1))
    .into_data()
}

fn int_cat_select_slice(device: &Device, _: Precision) -> TensorData {
    Tensor::cat(
        vec![
            ints::<2>([2, 4], 63, 9, device),
            ints([3, 4], 64, 9, device),
        ],
        0,
    )
    .select(0, ints([4], 65, 5, device))
    .slice(s![.., 1..3])
    .into_data()
}

fn int_comparisons_and_mask(device: &Device, _: Precision) -> TensorData {
    let a = ints::<2>([4, 5], 66, 10, device);
    let keep = a.clone().greater_elem(4);
    a.mask_fill(keep, -1).into_data()
}

#[test]
fn casts_and_integers() {
    check("float_to_int_and_back", float_to_int_and_back);
    check("bool_to_float", bool_to_float);
    check("int_arithmetic", int_arithmetic);
    check("int_reductions_and_indexing", int_reductions_and_indexing);
    check("int_cat_select_slice", int_cat_select_slice);
    check("int_comparisons_and_mask", int_comparisons_and_mask);
}

fn causal_attention(device: &Device, p: Precision) -> TensorData {
    let options = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal: true,
    };
    attention(
        float::<4>([2, 3, 5, 4], 67, p, device),
        float([2, 3, 7, 4], 68, p, device),
        float([2, 3, 7, 6], 69, p, device),
        None,
        None,
        options,
    )
    .into_data()
}

/// Causal self-attention over `positions` positions: above 512, lowered by query blocks.
fn long_causal_attention<const POSITIONS: usize>(device: &Device, p: Precision) -> TensorData {
    let positions = POSITIONS;
    // A given scale (a hoisted scalar) at a multiple of the block, the default one otherwise.
    let options = AttentionModuleOptions {
        scale: positions.is_multiple_of(512).then_some(0.4),
        softcap: None,
        is_causal: true,
    };
    attention(
        float::<4>([1, 2, positions, 8], 75, p, device),
        float([1, 2, positions, 8], 76, p, device),
        float([1, 2, positions, 4], 77, p, device),
        None,
        None,
        options,
    )
    .into_data()
}

fn attention_with_mask_bias_and_softcap(device: &Device, p: Precision) -> TensorData {
    let options = AttentionModuleOptions {
        scale: Some(0.3),
        softcap: Some(2.0),
        is_causal: false,
    };
    attention(
        float::<4>([2, 3, 5, 4], 70, p, device),
        float([2, 3, 7, 4], 71, p, device),
        float([2, 3, 7, 6], 72, p, device),
        Some(mask([2, 3, 5, 7], 73, device)),
        Some(float::<4>([2, 3, 5, 7], 74, p, device) * 0.25),
        options,
    )
    .into_data()
}

/// Equal scores over 600 keys: every softmax numerator is 1, and a bf16 sum of them stops at 256
/// (256 + 1 rounds back to 256), which would weigh each value 1/256 instead of 1/600. Summed in
/// f32 the weights are 1/600 and the output, the mean of the values, is exact: all ones. The
/// query and key are one tensor, as in a self-attention over a constant sequence. The XLA CPU
/// plugin and burn-flex compute bf16 arithmetic in f32 anyway; the case tells on devices with
/// native bf16 (a GPU plugin, Neuron), and `backend/tests/backend/lowering.rs` checks the module.
fn attention_sums_its_softmax_widely(device: &Device, p: Precision) -> TensorData {
    let options = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal: false,
    };
    let keys = Tensor::<4>::zeros([1, 2, 600, 4], device).cast(p.dtype());
    let values = Tensor::<4>::ones([1, 2, 600, 3], device).cast(p.dtype());
    attention(keys.clone(), keys, values, None, None, options).into_data()
}

#[test]
fn attention_module() {
    check(
        "attention_sums_its_softmax_widely",
        attention_sums_its_softmax_widely,
    );
    check("causal_attention", causal_attention);
    check(
        "attention_with_mask_bias_and_softcap",
        attention_with_mask_bias_and_softcap,
    );
    // Query blocks: a multiple of the block and a last block of 76 queries.
    check("long_causal_attention_1024", long_causal_attention::<1024>);
    check("long_causal_attention_1100", long_causal_attention::<1100>);
}

/// f32 -> bf16 -> f32 rounds to nearest even, as the `half` crate does, on every device.
#[test]
fn bf16_cast_rounds_like_half() {
    let mut numbers = Numbers::new(99);
    let values: Vec<f32> = (0..256)
        .map(|_| (numbers.next_u64() as f64 / u64::MAX as f64 * 200.0 - 100.0) as f32)
        .collect();
    let expected: Vec<f32> = values
        .iter()
        .map(|v| half::bf16::from_f32(*v).to_f32())
        .collect();
    for (_, device) in crate::support::devices_under_test() {
        let round_trip = Tensor::<1>::from_data(TensorData::new(values.clone(), [256]), &device)
            .cast(DType::BF16)
            .cast(DType::F32)
            .into_data();
        round_trip.assert_eq(&TensorData::new(expected.clone(), [256]), false);
    }
}

/// `recip` against `1 / x` computed here: an approximate `recip` (burn-ndarray's SIMD one has
/// about 12 bits) cannot be the reference.
#[test]
fn reciprocals_are_exact_to_f32_rounding() {
    for (trainium, device) in crate::support::devices_under_test() {
        let x = positive::<2>([6, 7], 14, Precision::F32, &device);
        let values = x.clone().into_data().try_to_vec::<f32>().unwrap();
        let expected: Vec<f32> = values.iter().map(|value| 1.0 / value).collect();
        let actual = x.recip().into_data();
        crate::support::assert_matches(
            &format!("recip on {trainium}"),
            &TensorData::new(expected, [6, 7]),
            &actual,
            1e-7,
        );
    }
}
