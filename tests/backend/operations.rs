//! Differential tests of every operation family burn-nn uses: `Trainium` (on the device that
//! `TRAINIUM_DEVICE` selects, `host` by default) against `burn-ndarray`, in f32 and bf16.

use burn::tensor::activation::{gelu, log_softmax, relu, sigmoid, silu, softmax};
use burn::tensor::module::embedding;
use burn::tensor::{DType, IndexingUpdateOp, Int, Tensor, TensorData, s};
use burn_trainium::Trainium;
use integration_tests::{differential, distinct, float, ints, mask, positive};

// Matrix products.
differential!(Trainium, matmul, |device, precision| float::<B, 2>(
    [7, 16],
    1,
    precision,
    device
)
.matmul(float([16, 5], 2, precision, device)));
differential!(Trainium, batched_matmul, |device, precision| float::<B, 3>(
    [3, 6, 8],
    3,
    precision,
    device
)
.matmul(float([3, 8, 4], 4, precision, device)));
differential!(Trainium, broadcast_batched_matmul, |device, precision| {
    float::<B, 4>([2, 3, 5, 8], 5, precision, device).matmul(float(
        [1, 3, 8, 6],
        6,
        precision,
        device,
    ))
});

// Element-wise arithmetic with broadcasting.
differential!(Trainium, add_broadcast, |device, precision| float::<B, 3>(
    [2, 3, 4],
    7,
    precision,
    device
) + float(
    [1, 3, 1],
    8,
    precision,
    device
));
differential!(Trainium, sub_mul_div, |device, precision| (float::<B, 2>(
    [4, 6],
    9,
    precision,
    device
) - float(
    [4, 1],
    10,
    precision,
    device
)) * float(
    [1, 6],
    11,
    precision,
    device
) / positive(
    [4, 6],
    12,
    precision,
    device
));
differential!(Trainium, scalar_arithmetic, |device, precision| ((float::<
    B,
    2,
>(
    [5, 5],
    13,
    precision,
    device
) * 1.5
    + 0.25)
    / 2.0
    - 1.0)
    .powf_scalar(2.0));
differential!(Trainium, unary_math, |device, precision| {
    let x = positive::<B, 2>([6, 7], 14, precision, device);
    x.clone().log() + x.clone().sqrt() + x.clone().recip() + (-x.clone()).exp() + x.powf_scalar(1.5)
});
differential!(Trainium, trigonometry_and_erf, |device, precision| {
    let x = float::<B, 2>([6, 7], 15, precision, device);
    x.clone().sin() + x.clone().cos() + x.clone().tanh() + x.clone().erf() + x.abs()
});
differential!(Trainium, activations, |device, precision| {
    let x = float::<B, 3>([2, 5, 6], 16, precision, device);
    relu(x.clone()) + gelu(x.clone()) + silu(x.clone()) + sigmoid(x.clone()) + x.clamp(-0.5, 0.75)
});
differential!(Trainium, powf_tensor, |device, precision| positive::<B, 2>(
    [4, 5],
    17,
    precision,
    device
)
.powf(float([4, 5], 18, precision, device)));

// Reductions.
differential!(Trainium, sum_all, |device, precision| float::<B, 3>(
    [3, 4, 5],
    19,
    precision,
    device
)
.sum());
differential!(Trainium, sum_and_mean_dims, |device, precision| {
    let x = float::<B, 3>([3, 4, 5], 20, precision, device);
    x.clone().sum_dim(1) + x.mean_dim(1)
});
differential!(Trainium, max_min_dims, |device, precision| {
    let x = distinct::<B, 3>([2, 4, 6], 21, precision, device);
    x.clone().max_dim(2) - x.min_dim(2)
});
differential!(Trainium, argmax, |device, precision| distinct::<B, 2>(
    [8, 12],
    22,
    precision,
    device
)
.argmax(1));
differential!(Trainium, argmin, |device, precision| distinct::<B, 2>(
    [12, 8],
    23,
    precision,
    device
)
.argmin(0));
differential!(Trainium, variance_like_norm, |device, precision| {
    // RMSNorm's shape of computation.
    let x = float::<B, 3>([2, 3, 16], 24, precision, device);
    let scale = (x.clone().powf_scalar(2.0).mean_dim(2) + 1e-5)
        .sqrt()
        .recip();
    x * scale
});

// Softmax and log-softmax.
differential!(Trainium, softmax_last_dim, |device, precision| softmax(
    float::<B, 3>([2, 5, 9], 25, precision, device),
    2
));
differential!(Trainium, log_softmax_last_dim, |device, precision| {
    log_softmax(float::<B, 2>([6, 11], 26, precision, device), 1)
});

// Gather, select and embedding.
differential!(Trainium, embedding_lookup, |device, precision| embedding(
    float::<B, 2>([10, 6], 27, precision, device),
    ints([3, 5], 28, 10, device)
));
differential!(Trainium, gather_along_dim, |device, precision| {
    float::<B, 2>([4, 9], 29, precision, device).gather(1, ints([4, 3], 30, 9, device))
});
differential!(Trainium, select_rows, |device, precision| float::<B, 2>(
    [8, 5],
    31,
    precision,
    device
)
.select(0, ints([6], 32, 8, device)));
differential!(Trainium, select_assign_add, |device, precision| {
    float::<B, 2>([6, 4], 33, precision, device).select_assign(
        0,
        ints([5], 34, 6, device),
        float([5, 4], 35, precision, device),
        IndexingUpdateOp::Add,
    )
});
differential!(Trainium, scatter_add, |device, precision| float::<B, 2>(
    [3, 7],
    36,
    precision,
    device
)
.scatter(
    1,
    ints([3, 4], 37, 7, device),
    float([3, 4], 38, precision, device),
    IndexingUpdateOp::Add
));

// Layout: slice, slice_assign, cat, reshape, swap_dims, permute, expand, repeat, flip.
differential!(Trainium, slice_and_slice_assign, |device, precision| {
    let x = float::<B, 3>([4, 6, 5], 39, precision, device);
    let part = x.clone().slice(s![1..3, 2..6, ..]);
    x.slice_assign(s![0..2, 0..4, ..], part * 2.0)
});
differential!(Trainium, cat_dims, |device, precision| Tensor::cat(
    vec![
        float::<B, 3>([2, 3, 4], 40, precision, device),
        float([2, 2, 4], 41, precision, device),
        float([2, 1, 4], 42, precision, device),
    ],
    1
));
differential!(Trainium, reshape_swap_permute, |device, precision| float::<
    B,
    3,
>(
    [2, 6, 4],
    43,
    precision,
    device
)
.reshape([2, 3, 2, 4])
.swap_dims(1, 2)
.permute([3, 0, 2, 1])
.reshape([4, 12]));
differential!(Trainium, expand_repeat_flip, |device, precision| {
    let x = float::<B, 3>([1, 3, 1], 44, precision, device);
    x.clone().expand([2, 3, 4]) + x.repeat_dim(0, 2).repeat_dim(2, 4).flip([1])
});
differential!(
    Trainium,
    transpose_of_matmul_operand,
    |device, precision| float::<B, 2>([5, 8], 45, precision, device)
        .matmul(float::<B, 2>([6, 8], 46, precision, device).transpose())
);

// Comparisons and masks.
differential!(Trainium, comparisons, |device, precision| {
    let a = distinct::<B, 2>([6, 8], 47, precision, device);
    let b = distinct::<B, 2>([6, 8], 48, precision, device);
    a.clone().greater(b.clone()).int()
        + a.clone().lower_equal(b).int() * 2
        + a.equal_elem(0.0).int() * 4
});
differential!(Trainium, mask_fill_causal, |device, precision| {
    let scores = float::<B, 3>([2, 5, 5], 49, precision, device);
    let causal = Tensor::<B, 2, burn::tensor::Bool>::triu_mask([5, 5], 1, device).unsqueeze::<3>();
    softmax(scores.mask_fill(causal, f32::NEG_INFINITY), 2)
});
differential!(Trainium, mask_where, |device, precision| float::<B, 2>(
    [5, 6],
    50,
    precision,
    device
)
.mask_where(
    mask([5, 6], 51, device),
    float([5, 6], 52, precision, device)
));
differential!(Trainium, bool_logic, |device, _precision| mask::<B, 2>(
    [4, 5],
    53,
    device
)
.bool_and(mask([4, 5], 54, device))
.bool_or(mask::<B, 2>([4, 5], 55, device).bool_not()));

// Casts.
differential!(Trainium, float_to_int_and_back, |device, precision| {
    (float::<B, 2>([4, 5], 56, precision, device) * 4.0)
        .int()
        .float()
        .cast(DType::F32)
});
differential!(Trainium, bool_to_float, |device, _precision| mask::<B, 2>(
    [3, 7],
    58,
    device
)
.float());

// Integer index operations.
differential!(Trainium, int_arithmetic, |device, _precision| {
    let a = ints::<B, 2>([4, 6], 59, 50, device);
    let b = ints::<B, 2>([4, 6], 60, 50, device);
    (a.clone() + b.clone()) * 3 - a.clone() * b.clone()
        + a.clone().div_scalar(3)
        + b.remainder_scalar(7)
});
differential!(Trainium, int_reductions_and_index, |device, _precision| {
    let a = ints::<B, 2>([5, 6], 61, 40, device);
    let positions = Tensor::<B, 1, Int>::arange(0..6, device).unsqueeze::<2>();
    a.clone().sum_dim(1)
        + a.clone().gather(1, ints([5, 1], 62, 6, device))
        + a.max_dim(1)
        + positions.sum_dim(1)
});
differential!(Trainium, int_cat_select_slice, |device, _precision| {
    Tensor::cat(
        vec![
            ints::<B, 2>([2, 4], 63, 9, device),
            ints([3, 4], 64, 9, device),
        ],
        0,
    )
    .select(0, ints([4], 65, 5, device))
    .slice(s![.., 1..3])
});
differential!(Trainium, int_comparisons_and_mask, |device, _precision| {
    let a = ints::<B, 2>([4, 5], 66, 10, device);
    let keep = a.clone().greater_elem(4);
    a.mask_fill(keep, -1)
});

/// f32 -> bf16 -> f32 rounds to nearest even, as the `half` crate does.
#[test]
fn bf16_cast_rounds_like_half() {
    let mut numbers = integration_tests::Numbers::new(99);
    let values: Vec<f32> = (0..256)
        .map(|_| (numbers.next_u64() as f64 / u64::MAX as f64 * 200.0 - 100.0) as f32)
        .collect();
    let expected: Vec<f32> = values
        .iter()
        .map(|v| half::bf16::from_f32(*v).to_f32())
        .collect();
    let device = Default::default();
    let round_trip = Tensor::<Trainium, 1>::from_data(TensorData::new(values, [256]), &device)
        .cast(DType::BF16)
        .cast(DType::F32)
        .into_data();
    round_trip.assert_eq(&TensorData::new(expected, [256]), false);
}
