//! Burn's convolution, pooling and interpolation modules, forward and backward, on the Trainium
//! `host` and `xla` executors in f32 and bf16 against Flex with autodiff (see
//! [`crate::support::check_gradients`]): on `xla` none of them may fall back to the host. Each case
//! returns its output and the gradient of `Σ output · upstream` for every input.

use burn::tensor::activation::log_softmax;
use burn::tensor::module::{
    adaptive_avg_pool1d, adaptive_avg_pool2d, avg_pool1d, avg_pool2d, conv_transpose1d,
    conv_transpose2d, conv_transpose3d, conv1d, conv2d, conv3d, ctc_loss, deform_conv2d,
    interpolate, max_pool1d, max_pool2d,
};
use burn::tensor::ops::{
    AvgPoolOptions, ConvOptions, ConvTransposeOptions, DeformConvOptions, InterpolateMode,
    InterpolateOptions, MaxPoolOptions,
};
use burn::tensor::{Device, Gradients, Int, Tensor, TensorData};
use burn_trainium::stats;

use crate::support::{
    Precision, assert_matches, check, check_gradients, distinct, float, host, trainium, xla,
};

/// An input that requires a gradient.
fn leaf<const D: usize>(
    shape: [usize; D],
    seed: u64,
    precision: Precision,
    device: &Device,
) -> Tensor<D> {
    float::<D>(shape, seed, precision, device)
        .detach()
        .require_grad()
}

/// An input with distinct values (no ties for max pooling) that requires a gradient.
fn distinct_leaf<const D: usize>(
    shape: [usize; D],
    seed: u64,
    precision: Precision,
    device: &Device,
) -> Tensor<D> {
    distinct::<D>(shape, seed, precision, device)
        .detach()
        .require_grad()
}

/// The output, then the gradients of `Σ output · upstream` for `inputs` (by `grad_of`).
fn output_and_gradients<const D: usize>(
    output: Tensor<D>,
    precision: Precision,
    device: &Device,
    gradients_of: impl FnOnce(&Gradients) -> Vec<TensorData>,
) -> Vec<TensorData> {
    let upstream = float::<D>(output.dims(), 99, precision, device);
    let gradients = (output.clone() * upstream).sum().backward();
    let mut results = vec![output.into_data()];
    results.extend(gradients_of(&gradients));
    results
}

/// The gradient of `tensor` as data.
fn gradient<const D: usize>(tensor: &Tensor<D>, gradients: &Gradients) -> TensorData {
    tensor
        .grad(gradients)
        .expect("the input has a gradient")
        .into_data()
}

fn convolution_2d(
    device: &Device,
    p: Precision,
    options: ConvOptions<2>,
    channels: [usize; 2],
) -> Vec<TensorData> {
    let [inputs, outputs] = channels;
    let groups = options.groups;
    let x = leaf::<4>([2, inputs, 7, 6], 1, p, device);
    let weight = leaf::<4>([outputs, inputs / groups, 3, 2], 2, p, device);
    let bias = leaf::<1>([outputs], 3, p, device);
    let out = conv2d(x.clone(), weight.clone(), Some(bias.clone()), options);
    output_and_gradients(out, p, device, |g| {
        vec![gradient(&x, g), gradient(&weight, g), gradient(&bias, g)]
    })
}

fn strided_conv2d(device: &Device, p: Precision) -> Vec<TensorData> {
    convolution_2d(
        device,
        p,
        ConvOptions::new([2, 2], [1, 1], [1, 1], 1),
        [3, 4],
    )
}

fn grouped_dilated_conv2d(device: &Device, p: Precision) -> Vec<TensorData> {
    convolution_2d(
        device,
        p,
        ConvOptions::new([1, 2], [2, 1], [2, 1], 2),
        [4, 6],
    )
}

fn strided_grouped_conv1d(device: &Device, p: Precision) -> Vec<TensorData> {
    let x = leaf::<3>([2, 4, 11], 4, p, device);
    let weight = leaf::<3>([6, 2, 3], 5, p, device);
    let bias = leaf::<1>([6], 6, p, device);
    let options = ConvOptions::new([2], [1], [2], 2);
    let out = conv1d(x.clone(), weight.clone(), Some(bias.clone()), options);
    output_and_gradients(out, p, device, |g| {
        vec![gradient(&x, g), gradient(&weight, g), gradient(&bias, g)]
    })
}

fn small_conv3d(device: &Device, p: Precision) -> Vec<TensorData> {
    let x = leaf::<5>([1, 2, 4, 5, 4], 7, p, device);
    let weight = leaf::<5>([3, 2, 2, 3, 2], 8, p, device);
    let options = ConvOptions::new([1, 2, 1], [1, 1, 0], [1, 1, 2], 1);
    let out = conv3d(x.clone(), weight.clone(), None, options);
    output_and_gradients(out, p, device, |g| {
        vec![gradient(&x, g), gradient(&weight, g)]
    })
}

#[test]
fn convolutions_and_their_gradients() {
    check_gradients("strided_conv2d", strided_conv2d);
    check_gradients("grouped_dilated_conv2d", grouped_dilated_conv2d);
    check_gradients("strided_grouped_conv1d", strided_grouped_conv1d);
    check_gradients("small_conv3d", small_conv3d);
}

fn grouped_conv_transpose2d(device: &Device, p: Precision) -> Vec<TensorData> {
    let x = leaf::<4>([2, 4, 3, 4], 10, p, device);
    let weight = leaf::<4>([4, 3, 3, 2], 11, p, device);
    let bias = leaf::<1>([6], 12, p, device);
    let options = ConvTransposeOptions::new([2, 1], [1, 0], [1, 0], [1, 2], 2);
    let out = conv_transpose2d(x.clone(), weight.clone(), Some(bias.clone()), options);
    output_and_gradients(out, p, device, |g| {
        vec![gradient(&x, g), gradient(&weight, g), gradient(&bias, g)]
    })
}

fn conv_transpose1d_and_3d(device: &Device, p: Precision) -> Vec<TensorData> {
    let x = leaf::<3>([1, 2, 5], 13, p, device);
    let weight = leaf::<3>([2, 3, 3], 14, p, device);
    let options = ConvTransposeOptions::new([3], [1], [2], [1], 1);
    let line = conv_transpose1d(x.clone(), weight.clone(), None, options);
    let volume_x = leaf::<5>([1, 2, 2, 3, 2], 15, p, device);
    let volume_weight = leaf::<5>([2, 1, 2, 2, 2], 16, p, device);
    let options = ConvTransposeOptions::new([2, 1, 2], [0, 1, 0], [1, 0, 0], [1, 1, 1], 1);
    let volume = conv_transpose3d(volume_x.clone(), volume_weight.clone(), None, options);
    let combined = line.sum() + volume.sum();
    output_and_gradients(combined, p, device, |g| {
        vec![
            gradient(&x, g),
            gradient(&weight, g),
            gradient(&volume_x, g),
            gradient(&volume_weight, g),
        ]
    })
}

/// A deformable convolution with two weight groups, `offset_groups` offset groups, offsets that
/// move taps between pixels and past the border, a mask and a bias; and one with neither. The
/// offsets never land a tap on a whole pixel, where the bilinear weights have no derivative (the
/// backends' choices differ there).
fn deformable_conv2d(device: &Device, p: Precision, offset_groups: usize) -> Vec<TensorData> {
    let x = leaf::<4>([2, 4, 5, 6], 50, p, device);
    let weight = leaf::<4>([6, 2, 3, 2], 51, p, device);
    let offset = leaf::<4>([2, 2 * offset_groups * 6, 5, 2], 52, p, device);
    let mask = leaf::<4>([2, offset_groups * 6, 5, 2], 53, p, device);
    let bias = leaf::<1>([6], 54, p, device);
    let options = DeformConvOptions::new([1, 2], [1, 0], [1, 2], 2, offset_groups);
    let masked = deform_conv2d(
        x.clone(),
        off_grid(offset.clone()),
        weight.clone(),
        Some(mask.clone()),
        Some(bias.clone()),
        options,
    );
    let plain_x = leaf::<4>([1, 2, 4, 4], 55, p, device);
    let plain_weight = leaf::<4>([3, 2, 2, 2], 56, p, device);
    let plain_offset = leaf::<4>([1, 8, 3, 3], 57, p, device);
    let plain = deform_conv2d(
        plain_x.clone(),
        off_grid(plain_offset.clone()),
        plain_weight.clone(),
        None,
        None,
        DeformConvOptions::new([1, 1], [0, 0], [1, 1], 1, 1),
    );
    let mut results = vec![masked.clone().into_data(), plain.clone().into_data()];
    let upstream = float::<4>(masked.dims(), 58, p, device);
    let combined = (masked * upstream).sum() + plain.sum();
    results.extend(output_and_gradients(combined, p, device, |g| {
        vec![
            gradient(&x, g),
            gradient(&weight, g),
            gradient(&offset, g),
            gradient(&mask, g),
            gradient(&bias, g),
            gradient(&plain_x, g),
            gradient(&plain_weight, g),
            gradient(&plain_offset, g),
        ]
    }));
    results
}

/// Offsets `0.5 · o + 19/128` (`o` a multiple of 1/32): an odd number of 128ths, never a whole
/// number, and exact in bf16.
fn off_grid(offset: Tensor<4>) -> Tensor<4> {
    offset * 0.5 + 19.0 / 128.0
}

#[test]
fn deformable_convolutions_and_their_gradients() {
    check_gradients("deformable_conv2d", |device, p| {
        deformable_conv2d(device, p, 1)
    });
}

/// Two offset groups, `xla` against the host executor (burn-flex): burn-ndarray 0.21's offset
/// and mask gradients read the first group's column gradients for every group, so it is no
/// reference there.
#[test]
fn deformable_convolutions_of_several_offset_groups_agree_with_the_host() {
    let _device = crate::support::exclusive_xla();
    let xla = xla();
    let device = trainium(xla).autodiff();
    device.sync().expect("the device syncs");
    let before = stats(&xla).host_fallbacks;
    let host = deformable_conv2d(&host().autodiff(), Precision::F32, 2);
    let on_xla = deformable_conv2d(&device, Precision::F32, 2);
    device.sync().expect("the device syncs");
    for (index, (expected, actual)) in host.iter().zip(&on_xla).enumerate() {
        assert_matches(
            &format!("deformable_conv2d with two offset groups #{index}"),
            expected,
            actual,
            Precision::F32.tolerance(),
        );
    }
    assert_eq!(stats(&xla).host_fallbacks, before, "fell back to the host");
}

#[test]
fn transposed_convolutions_and_their_gradients() {
    check_gradients("grouped_conv_transpose2d", grouped_conv_transpose2d);
    check_gradients("conv_transpose1d_and_3d", conv_transpose1d_and_3d);
}

fn average_pools(device: &Device, p: Precision) -> Vec<TensorData> {
    let x = leaf::<4>([2, 3, 7, 6], 20, p, device);
    let padded = avg_pool2d(
        x.clone(),
        AvgPoolOptions::new([3, 2])
            .with_stride([2, 2])
            .with_padding([1, 1])
            .with_count_include_pad(true)
            .with_ceil_mode(true),
    );
    let exact = avg_pool2d(
        x.clone(),
        AvgPoolOptions::new([3, 3])
            .with_stride([2, 1])
            .with_padding([1, 0])
            .with_count_include_pad(false)
            .with_ceil_mode(true),
    );
    let line = leaf::<3>([2, 3, 9], 21, p, device);
    let pooled_line = avg_pool1d(
        line.clone(),
        AvgPoolOptions::new([3])
            .with_stride([2])
            .with_padding([1])
            .with_count_include_pad(false)
            .with_ceil_mode(false),
    );
    let combined = padded.sum() + exact.sum() * 0.5 + pooled_line.sum() * 2.0;
    let mut results = vec![
        avg_pool2d(
            x.clone(),
            AvgPoolOptions::new([3, 2])
                .with_stride([2, 2])
                .with_padding([1, 1])
                .with_count_include_pad(true)
                .with_ceil_mode(true),
        )
        .into_data(),
        avg_pool2d(
            x.clone(),
            AvgPoolOptions::new([3, 3])
                .with_stride([2, 1])
                .with_padding([1, 0])
                .with_count_include_pad(false)
                .with_ceil_mode(true),
        )
        .into_data(),
    ];
    results.extend(output_and_gradients(combined, p, device, |g| {
        vec![gradient(&x, g), gradient(&line, g)]
    }));
    results
}

fn max_pools(device: &Device, p: Precision) -> Vec<TensorData> {
    let x = distinct_leaf::<4>([1, 2, 7, 8], 22, p, device);
    let pooled = max_pool2d(
        x.clone(),
        MaxPoolOptions::new([3, 2])
            .with_stride([2, 2])
            .with_padding([1, 0])
            .with_dilation([1, 2])
            .with_ceil_mode(true),
    );
    let line = distinct_leaf::<3>([2, 3, 10], 23, p, device);
    let pooled_line = max_pool1d(
        line.clone(),
        MaxPoolOptions::new([3])
            .with_stride([2])
            .with_padding([1])
            .with_dilation([2])
            .with_ceil_mode(false),
    );
    let mut results = vec![pooled.clone().into_data(), pooled_line.clone().into_data()];
    let upstream = float::<4>(pooled.dims(), 24, p, device);
    let combined = (pooled * upstream).sum() + pooled_line.sum();
    results.extend(output_and_gradients(combined, p, device, |g| {
        vec![gradient(&x, g), gradient(&line, g)]
    }));
    results
}

fn adaptive_pools(device: &Device, p: Precision) -> Vec<TensorData> {
    let x = leaf::<4>([2, 3, 7, 5], 25, p, device);
    let pooled = adaptive_avg_pool2d(x.clone(), [3, 4]);
    let line = leaf::<3>([2, 2, 10], 26, p, device);
    let pooled_line = adaptive_avg_pool1d(line.clone(), 4);
    let mut results = vec![pooled.clone().into_data(), pooled_line.clone().into_data()];
    let upstream = float::<4>(pooled.dims(), 27, p, device);
    let combined = (pooled * upstream).sum() + pooled_line.sum();
    results.extend(output_and_gradients(combined, p, device, |g| {
        vec![gradient(&x, g), gradient(&line, g)]
    }));
    results
}

#[test]
fn pooling_and_its_gradients() {
    check_gradients("average_pools", average_pools);
    check_gradients("max_pools", max_pools);
    check_gradients("adaptive_pools", adaptive_pools);
}

/// The CTC loss of two sequences of different lengths (Burn computes it from other operations,
/// a scan over time), and its gradient. Always in f32: the recursion's log-sum-exps drift
/// beyond bf16's tolerance on every executor (the host's included), so the bf16 run repeats
/// the f32 one.
fn ctc(device: &Device, _: Precision) -> Vec<TensorData> {
    let p = Precision::F32;
    let logits = leaf::<3>([6, 2, 5], 40, p, device);
    let log_probs = log_softmax(logits.clone(), 2);
    let targets = Tensor::<2, Int>::from_ints([[1, 2, 2], [3, 4, 0]], device);
    let input_lengths = Tensor::<1, Int>::from_ints([6, 5], device);
    let target_lengths = Tensor::<1, Int>::from_ints([3, 2], device);
    let loss = ctc_loss(log_probs, targets, input_lengths, target_lengths, 0);
    output_and_gradients(loss, p, device, |g| vec![gradient(&logits, g)])
}

#[test]
fn ctc_loss_and_its_gradient() {
    check_gradients("ctc", ctc);
}

/// Every interpolation mode, down and up, with and without aligned corners.
fn interpolations(device: &Device, p: Precision) -> TensorData {
    let x = float::<4>([1, 2, 5, 6], 30, p, device);
    let modes = [
        InterpolateMode::Nearest,
        InterpolateMode::Bilinear,
        InterpolateMode::Bicubic,
        InterpolateMode::Lanczos3,
    ];
    let mut parts = Vec::new();
    for mode in modes {
        for align_corners in [false, true] {
            for size in [[3, 4], [8, 11]] {
                let options = InterpolateOptions::new(mode.clone())
                    .with_align_corners(align_corners)
                    .with_output_size(size);
                parts.push(interpolate(x.clone(), options).flatten::<1>(0, 3));
            }
        }
    }
    Tensor::cat(parts, 0).into_data()
}

fn nearest_gradient(device: &Device, p: Precision) -> Vec<TensorData> {
    let x = leaf::<4>([1, 2, 5, 6], 31, p, device);
    let up = interpolate(
        x.clone(),
        InterpolateOptions::new(InterpolateMode::Nearest).with_output_size([8, 13]),
    );
    let down = interpolate(
        x.clone(),
        InterpolateOptions::new(InterpolateMode::Nearest).with_output_size([2, 4]),
    );
    let combined = up.sum() + down.sum() * 3.0;
    output_and_gradients(combined, p, device, |g| vec![gradient(&x, g)])
}

#[test]
fn interpolation_and_its_gradient() {
    check("interpolations", interpolations);
    check_gradients("nearest_gradient", nearest_gradient);
}

/// The filtering interpolations are linear maps `M`, so the gradient `Mᵀ g` of `Σ (M x) · g`
/// satisfies `Σ (Mᵀ g) · x = Σ (M x) · g` (burn-ndarray has no backward pass for them).
#[test]
fn filtering_interpolation_gradients_are_the_adjoint_maps() {
    let _device = crate::support::exclusive_xla();
    let xla = xla();
    let device = trainium(xla).autodiff();
    device.sync().expect("the device syncs");
    let before = stats(&xla).host_fallbacks;
    for mode in [
        InterpolateMode::Bilinear,
        InterpolateMode::Bicubic,
        InterpolateMode::Lanczos3,
    ] {
        for (align_corners, size) in [(false, [8, 11]), (true, [3, 4]), (false, [4, 3])] {
            let x = leaf::<4>([2, 3, 5, 6], 32, Precision::F32, &device);
            let options = InterpolateOptions::new(mode.clone())
                .with_align_corners(align_corners)
                .with_output_size(size);
            let out = interpolate(x.clone(), options);
            let upstream = float::<4>(out.dims(), 33, Precision::F32, &device);
            let forward = (out * upstream).sum();
            let gradients = forward.backward();
            let x_gradient = x.grad(&gradients).unwrap();
            let adjoint = (x_gradient * x.inner()).sum();
            assert_matches(
                &format!("{mode:?} (align_corners {align_corners}) to {size:?}"),
                &forward.into_data(),
                &adjoint.into_data(),
                1e-5,
            );
        }
    }
    device.sync().expect("the device syncs");
    assert_eq!(
        stats(&xla).host_fallbacks,
        before,
        "an interpolation fell back to the host"
    );
}
