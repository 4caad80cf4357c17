//! Behaviour of the `xla` executor beyond single operations: random tensors (host fallback),
//! reading any live tensor, several devices on one PJRT client, buffers released when tensors
//! die, scalar hoisting, and errors. The `xla` devices are served in the process
//! (`burn_trainium::device`); their statistics are read on the `TrainiumDevice` they serve.

use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use burn_trainium::{TrainiumDevice, reset_stats, stats};

/// The `xla:index` device served in this process (the plugin required), and the Trainium device
/// it serves, whose statistics the tests read.
fn xla(index: u16) -> (Device, TrainiumDevice) {
    let trainium = super::support::xla(index);
    let device = burn_trainium::device(&trainium.to_string()).expect("the xla device is served");
    (device, trainium)
}

/// `tensor`'s values as f32.
fn floats<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().try_to_vec().unwrap()
}

/// `tensor`'s values as i64 (whatever the integer type the device reads back).
fn integers<const D: usize>(tensor: Tensor<D, Int>) -> Vec<i64> {
    tensor.into_data().convert::<i64>().try_to_vec().unwrap()
}

/// Mean and standard deviation of `values`.
fn moments(values: &[f32]) -> (f64, f64) {
    let count = values.len() as f64;
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / count;
    let variance = values
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum::<f64>()
        / count;
    (mean, variance.sqrt())
}

#[test]
fn random_tensors_are_drawn_on_the_device_with_the_right_distribution() {
    let _random = super::support::exclusive_random();
    let (device, trainium) = xla(1);
    device.seed(11);
    let draw = |distribution| floats(Tensor::<2>::random([200, 100], distribution, &device));
    let before = stats(&trainium).host_fallbacks;
    let uniform = draw(Distribution::Uniform(-1.0, 3.0));
    assert!(uniform.iter().all(|value| (-1.0..3.0).contains(value)));
    let (mean, std) = moments(&uniform);
    assert!(
        (mean - 1.0).abs() < 0.05 && (std - 4.0 / 12f64.sqrt()).abs() < 0.05,
        "{mean} {std}"
    );
    let normal = draw(Distribution::Normal(2.0, 0.5));
    let (mean, std) = moments(&normal);
    assert!(
        (mean - 2.0).abs() < 0.02 && (std - 0.5).abs() < 0.02,
        "{mean} {std}"
    );
    let bernoulli = draw(Distribution::Bernoulli(0.3));
    assert!(bernoulli.iter().all(|value| *value == 0.0 || *value == 1.0));
    let (mean, _) = moments(&bernoulli);
    assert!((mean - 0.3).abs() < 0.02, "{mean}");
    let default = draw(Distribution::Default);
    assert!(default.iter().all(|value| (0.0..1.0).contains(value)));
    assert_eq!(
        stats(&trainium).host_fallbacks,
        before,
        "random tensors fell back to the host"
    );

    // The same program draws new numbers at every run; a seed replays them.
    let again = draw(Distribution::Default);
    assert_ne!(default, again);
    device.seed(11);
    let replay: Vec<Vec<f32>> = [Distribution::Uniform(-1.0, 3.0)]
        .into_iter()
        .map(draw)
        .collect();
    assert_eq!(replay[0], uniform);
}

/// Integers of the default distribution cover the whole type (`rand`'s standard uniform), normal
/// integers are normal floats truncated toward zero, both drawn on the device.
#[test]
fn random_integers_are_drawn_on_the_device() {
    let _random = super::support::exclusive_random();
    let (device, trainium) = xla(1);
    let before = stats(&trainium).host_fallbacks;
    let whole: Vec<i32> = Tensor::<2, Int>::random([100, 100], Distribution::Default, &device)
        .into_data()
        .convert::<i32>()
        .try_to_vec()
        .unwrap();
    let (low, high) = (whole.iter().min().unwrap(), whole.iter().max().unwrap());
    assert!(*low < -(1 << 30) && *high > 1 << 30, "{low} {high}");
    let negative = whole.iter().filter(|&&value| value < 0).count();
    assert!(
        (4_500..5_500).contains(&negative),
        "{negative} of 10000 negative"
    );
    let normal = floats(
        Tensor::<2, Int>::random([100, 100], Distribution::Normal(20.0, 4.0), &device).float(),
    );
    assert!(normal.iter().all(|value| value.fract() == 0.0));
    let (mean, std) = moments(&normal);
    // Truncation toward zero of N(20, 4) lowers the mean by about one half.
    assert!(
        (mean - 19.5).abs() < 0.2 && (std - 4.0).abs() < 0.2,
        "{mean} {std}"
    );
    assert_eq!(
        stats(&trainium).host_fallbacks,
        before,
        "random integers fell back"
    );
}

#[test]
fn any_live_tensor_can_be_read_between_and_after_segments() {
    let (device, _) = xla(0);
    let a = Tensor::<1>::from_data(TensorData::from([1.0f32, 2.0, 3.0]), &device);
    let b = a.clone() * 3.0;
    let c = b.clone() + a.clone();
    let indices = c.clone().argmax(0);
    assert_eq!(floats(b.clone()), [3.0, 6.0, 9.0]);
    assert_eq!(floats(c), [4.0, 8.0, 12.0]);
    assert_eq!(integers(indices), [2]);
    let counted = Tensor::<1, Int>::arange(0..5, &device) * 2;
    assert_eq!(integers(counted), [0, 2, 4, 6, 8]);
    assert_eq!(floats(a), [1.0, 2.0, 3.0]);
    assert_eq!(floats(b), [3.0, 6.0, 9.0]);
}

#[test]
fn two_devices_share_one_client_and_exchange_tensors() {
    let (first, _) = xla(0);
    let (second, second_trainium) = xla(1);
    let a = Tensor::<2>::from_data(TensorData::from([[1.0f32, 2.0], [3.0, 4.0]]), &first);
    let b = (a.clone() + 1.0).to_device(&second);
    assert_eq!(b.device(), second);
    let product = b.clone().matmul(b) * 0.5;
    let back = product.to_device(&first) - a;
    assert_eq!(floats(back), [7.0, 8.5, 11.0, 14.5]);
    assert!(stats(&second_trainium).compiles + stats(&second_trainium).cache_hits > 0);
}

fn dropped_tensors_release_their_device_buffers() {
    // A device no other test of this file uses: the live tensor gauge is per device.
    let (device, trainium) = xla(2);
    let x = Tensor::<2>::ones([8, 8], &device);
    // The client sends the drops of tensors in the stream of operations: a sync waits until the
    // server has handled them.
    let live_before = {
        x.clone().sum().into_data();
        device.sync().unwrap();
        stats(&trainium).live_tensors
    };
    assert!(live_before >= 1, "x is live on the device: {live_before}");
    for _ in 0..5 {
        let y = (x.clone() * 2.0).exp();
        y.sum().into_data();
    }
    device.sync().unwrap();
    assert_eq!(
        stats(&trainium).live_tensors,
        live_before,
        "temporaries leaked on the device"
    );
}

fn changing_scalars_reuse_the_compiled_program() {
    let (device, trainium) = xla(2);
    let x = Tensor::<1>::from_data(TensorData::from([1.0f32, -2.0, 4.0]), &device);
    device.sync().unwrap();
    reset_stats(&trainium);
    let mut results = Vec::new();
    for step in 0..5 {
        let scale = 0.5 + step as f32;
        results.push(floats(x.clone() * scale + step as f32));
    }
    for (step, result) in results.iter().enumerate() {
        let scale = 0.5 + step as f32;
        let expected: Vec<f32> = [1.0f32, -2.0, 4.0]
            .iter()
            .map(|v| v * scale + step as f32)
            .collect();
        assert_eq!(result, &expected);
    }
    let after = stats(&trainium);
    assert!(
        after.compiles <= 2 && after.cache_hits >= 3,
        "five scalar values reuse one program (the first run may also drop earlier tensors): {after:?}"
    );
    assert!(
        after.segments_reused >= 3,
        "the repeated segment is recognised before lowering: {after:?}"
    );
}

fn a_segment_is_lowered_again_when_an_operand_it_fixed_changes() {
    // Exponents are baked into the program (XLA's `power` with a constant), so a new exponent
    // is a new program, whatever the fingerprint says; bounds that are equal, then not, are
    // two operands with one value.
    let (device, _) = xla(2);
    let values = [0.5f32, -2.0, 3.0];
    let x = Tensor::<1>::from_data(TensorData::from(values), &device);
    // Non-integer exponents (Burn turns integer ones into another operation).
    for exponent in [2.5f32, 1.5, 2.5, 0.5] {
        let result = floats(x.clone().abs().powf_scalar(exponent));
        let expected: Vec<f32> = values.iter().map(|v| v.abs().powf(exponent)).collect();
        assert_eq!(result.len(), expected.len());
        for (result, expected) in result.iter().zip(&expected) {
            assert!(
                (result - expected).abs() <= 1e-6 * expected.abs(),
                "x^{exponent}"
            );
        }
    }
    for (low, high) in [(0.0f32, 0.0), (-1.0, 1.0), (1.0, 1.0), (-3.0, 0.5)] {
        let result = floats(x.clone().clamp(low, high));
        let expected: Vec<f32> = values.iter().map(|v| v.clamp(low, high)).collect();
        assert_eq!(result, expected, "clamp({low}, {high})");
    }
}

#[test]
fn a_missing_device_index_is_a_clear_error() {
    super::support::plugin_path();
    let error = burn_trainium::check_device(&TrainiumDevice::xla(99))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("xla:99") && error.contains("devices"),
        "{error}"
    );
    // Serving it is the same error.
    let error = burn_trainium::device("xla:99").unwrap_err().to_string();
    assert!(
        error.contains("xla:99") && error.contains("devices"),
        "{error}"
    );
}

#[test]
fn empty_boolean_and_wide_tensors_round_trip() {
    let (device, _) = xla(0);
    let empty = Tensor::<2>::zeros([0, 3], &device) + 1.0;
    assert_eq!(empty.into_data().shape().to_vec(), [0, 3]);

    let flags =
        Tensor::<1, burn::tensor::Bool>::from_data(TensorData::from([true, false, true]), &device);
    let flipped = flags.clone().bool_not();
    assert_eq!(
        flipped.into_data().try_to_vec::<bool>().unwrap(),
        [false, true, false]
    );
    assert_eq!(
        flags.into_data().try_to_vec::<bool>().unwrap(),
        [true, false, true]
    );

    // Beyond i32: 2^40.
    let wide = Tensor::<1, Int>::from_data(
        TensorData::from([1i64 << 40, -3]),
        (&device, burn::tensor::DType::I64),
    );
    assert_eq!(wide.dtype(), burn::tensor::DType::I64);
    let wide = (wide * 2 + 1).into_data();
    assert_eq!(wide.dtype(), burn::tensor::DType::I64);
    assert_eq!(wide.try_to_vec::<i64>().unwrap(), [(1i64 << 41) + 1, -5]);

    let double = Tensor::<1>::from_data(
        TensorData::from([1.0f64 / 3.0, 2.0]),
        (&device, burn::tensor::DType::F64),
    );
    let double = (double * 3.0).into_data();
    assert_eq!(double.dtype(), burn::tensor::DType::F64);
    assert_eq!(double.try_to_vec::<f64>().unwrap(), [1.0, 6.0]);
}

/// An optimizer step over parameters of one shape (Adam's formulas): each new moment and
/// parameter takes over the buffer of the one it replaces, so the compiled update needs no
/// scratch copy of its inputs. Offered as anonymous donors, the compiler paired the new moments
/// with other parameters' gradients, still to be read, and copied whole buffers.
fn an_update_in_place_needs_no_scratch_copies_of_its_inputs() {
    let (device, trainium) = xla(2);
    let shape = [64, 128];
    let tensor_bytes = (shape[0] * shape[1] * 4) as u64;
    let value = |index: usize, seed: usize, offset: usize| {
        ((index * 7 + seed * 13 + offset) % 17) as f32 / 17.0 + 0.1
    };
    let states = |seed: usize| {
        let values = |offset: usize| {
            let data = (0..shape[0] * shape[1])
                .map(|index| value(index, seed, offset))
                .collect::<Vec<_>>();
            Tensor::<2>::from_data(TensorData::new(data, shape), &device)
        };
        (values(0), values(1), values(2), values(3))
    };
    let parameters: Vec<_> = (0..4).map(states).collect();
    device.sync().unwrap();
    reset_stats(&trainium);
    let updated: Vec<_> = parameters
        .into_iter()
        .map(|(moment, gradient, second_moment, parameter)| {
            let moment = moment * 0.9 + gradient.clone() * 0.1;
            let second_moment = second_moment * 0.99 + gradient.clone() * gradient * 0.01;
            let step = moment.clone() / (second_moment.clone().sqrt() + 1e-8);
            (moment, second_moment, parameter - step * 1e-3)
        })
        .collect();
    device.sync().unwrap();
    let after = stats(&trainium);
    assert_eq!(after.segments_run, 1, "{after:?}");
    assert!(
        after.largest_scratch_bytes < tensor_bytes,
        "the update needs {} bytes of scratch memory, more than one {tensor_bytes}-byte state",
        after.largest_scratch_bytes
    );
    let (moment, second_moment, parameter) = &updated[3];
    let first = |tensor: &Tensor<2>| floats(tensor.clone())[0];
    let (m, g, v, p) = (
        value(0, 3, 0),
        value(0, 3, 1),
        value(0, 3, 2),
        value(0, 3, 3),
    );
    let (m, v) = (m * 0.9 + g * 0.1, v * 0.99 + g * g * 0.01);
    let tolerance = 1e-6;
    assert!((first(moment) - m).abs() < tolerance);
    assert!((first(second_moment) - v).abs() < tolerance);
    assert!((first(parameter) - (p - m / (v.sqrt() + 1e-8) * 1e-3)).abs() < tolerance);
}

/// A batch made as Burn's batchers make one — a tensor per item from host data, reshaped and
/// stacked — stays on the host until a program uses it: those operations are done on the host,
/// the batch is one upload and one input, its arithmetic runs on the device, and the values
/// are the same.
fn a_batch_made_from_host_items_is_uploaded_once_by_the_program_using_it() {
    let (device, trainium) = xla(2);
    device.sync().unwrap();
    reset_stats(&trainium);
    let items: Vec<Tensor<2>> = (0..4)
        .map(|item| {
            let values = [item as f32, 1.0, 2.0];
            Tensor::<1>::from_floats(values, &device).reshape([1, 3])
        })
        .collect();
    let batch = (Tensor::cat(items, 0) - 1.0) / 2.0;
    let weights = Tensor::<2>::ones([3, 2], &device);
    let product = batch.matmul(weights);
    assert_eq!(floats(product), [0.0, 0.0, 0.5, 0.5, 1.0, 1.0, 1.5, 1.5]);
    let after = stats(&trainium);
    // Four reshapes and the concatenation; the subtraction and division compute on the device.
    assert_eq!(after.host_folded, 5, "{after:?}");
    assert_eq!(after.bytes_to_device, 4 * 3 * 4, "{after:?}");
    assert_eq!(after.host_fallbacks, 0, "{after:?}");
}

/// Tests that count on `xla:2` alone (statistics are per device), one after the other.
#[test]
fn device_statistics_on_a_device_of_their_own() {
    a_batch_made_from_host_items_is_uploaded_once_by_the_program_using_it();
    dropped_tensors_release_their_device_buffers();
    changing_scalars_reuse_the_compiled_program();
    a_segment_is_lowered_again_when_an_operand_it_fixed_changes();
    an_update_in_place_needs_no_scratch_copies_of_its_inputs();
}

/// An operation kept on the host (`TRAINIUM_HOST_OPERATIONS`: a deformable convolution) on `xla`: with
/// `TRAINIUM_HOST_FALLBACK=error` the read fails naming it and the setting; with `warn` (the
/// default) it runs on the host, with Flex's result, counted by kind and reported in one line.
#[test]
fn host_fallbacks_are_refused_or_counted_by_kind() {
    use burn::tensor::module::deform_conv2d;
    use burn::tensor::ops::DeformConvOptions;
    use burn_trainium::{
        HostFallback, host_fallback_report, host_fallbacks_by_kind, set_host_fallback,
        set_host_operations,
    };

    // A device no other test of this binary uses: its policy is this test's own.
    let (served, device) = xla(3);
    let deform = |device: &Device| {
        let input = Tensor::<4>::ones([1, 1, 4, 4], device);
        let offset = Tensor::<4>::zeros([1, 18, 2, 2], device) + 0.25;
        let weight = Tensor::<4>::ones([1, 1, 3, 3], device);
        let options = DeformConvOptions::new([1, 1], [0, 0], [1, 1], 1, 1);
        deform_conv2d(input, offset, weight, None, None, options).try_into_data()
    };
    let unknown = set_host_operations(&device, &["Module::Conv9d"]).unwrap_err();
    assert!(
        unknown.to_string().contains("`Module::Conv9d`"),
        "{unknown}"
    );
    set_host_operations(&device, &["Module::DeformableConv2d"]).unwrap();
    set_host_fallback(&device, HostFallback::Error);
    let error = deform(&served).expect_err("no lowering, and fallbacks are errors");
    let message = error.to_string();
    assert!(
        message.contains("Module::DeformableConv2d") && message.contains("TRAINIUM_HOST_FALLBACK"),
        "{message}"
    );

    set_host_fallback(&device, HostFallback::Warn);
    reset_stats(&device);
    assert_eq!(host_fallback_report(&device), None);
    let on_xla = deform(&served).unwrap();
    // The host executor replays the operation on Flex.
    assert_eq!(on_xla, deform(&Device::flex()).unwrap());
    assert_eq!(
        host_fallbacks_by_kind(&device),
        [("Module::DeformableConv2d".to_string(), 1)]
    );
    assert_eq!(
        host_fallback_report(&device).as_deref(),
        Some("host fallbacks: 1 (Module::DeformableConv2d ×1)")
    );
    assert_eq!(stats(&device).host_fallbacks, 1);
}

/// bf16 matrix products on `xla` in every form the lowering writes: those XLA CPU's matrix
/// library takes as bf16 × bf16 → f32 (a matmul, a linear layer, a batched product) and those
/// kept as bf16 products (a batched product of a transposed operand, which XLA folds into the
/// product and whose bf16 × bf16 → f32 form the plugin cannot run; a vector; a tiny one). Each
/// runs and equals the exact product: small integers, so every sum is exact in bf16.
#[test]
fn bf16_matrix_products_of_every_form_run_and_are_exact() {
    use burn::tensor::DType;
    use burn::tensor::module::linear;
    let (device, _) = xla(0);
    let integers = |shape: [usize; 4], seed: usize| {
        let count = shape.iter().product::<usize>();
        let values: Vec<f32> = (0..count)
            .map(|i| ((i * 7 + seed) % 5) as f32 - 2.0)
            .collect();
        Tensor::<4>::from_data(TensorData::new(values, shape), &device)
    };
    let bf16 = |tensor: Tensor<4>| tensor.cast(DType::BF16);
    let exact = |lhs: &Tensor<4>, rhs: &Tensor<4>| -> Vec<f32> {
        let [batch, heads, m, k] = lhs.dims();
        let n = rhs.dims()[3];
        let (a, b) = (
            lhs.to_data().try_to_vec::<f32>().unwrap(),
            rhs.to_data().try_to_vec::<f32>().unwrap(),
        );
        let mut out = vec![0.0; batch * heads * m * n];
        for p in 0..batch * heads {
            for i in 0..m {
                for j in 0..n {
                    out[(p * m + i) * n + j] = (0..k)
                        .map(|l| a[(p * m + i) * k + l] * b[(p * k + l) * n + j])
                        .sum();
                }
            }
        }
        out
    };
    let read = |tensor: Tensor<4>| -> Vec<f32> {
        assert_eq!(tensor.dtype(), DType::BF16);
        floats(tensor.cast(DType::F32))
    };
    let cases: [(&str, [usize; 4], [usize; 4]); 4] = [
        ("matrix", [1, 1, 8, 16], [1, 1, 16, 8]),
        ("batched", [2, 3, 8, 16], [2, 3, 16, 8]),
        ("vector", [1, 1, 1, 16], [1, 1, 16, 8]),
        ("tiny", [1, 1, 2, 3], [1, 1, 3, 2]),
    ];
    for (name, lhs_shape, rhs_shape) in cases {
        let (lhs, rhs) = (integers(lhs_shape, 1), integers(rhs_shape, 3));
        let expected = exact(&lhs, &rhs);
        assert_eq!(
            read(bf16(lhs.clone()).matmul(bf16(rhs.clone()))),
            expected,
            "{name}"
        );
        // The same product with the left operand made by a transpose of data laid out the
        // other way.
        let laid_out = Tensor::<4>::from_data(lhs.clone().swap_dims(2, 3).into_data(), &device);
        let transposed = bf16(laid_out).swap_dims(2, 3);
        assert_eq!(
            read(transposed.matmul(bf16(rhs.clone()))),
            expected,
            "{name}, transposed"
        );
        if lhs_shape[0] * lhs_shape[1] == 1 {
            // As a linear layer: x [.., in] times weight [in, out].
            let weight: Tensor<2> = bf16(rhs.clone()).flatten(0, 2);
            assert_eq!(
                read(linear(bf16(lhs.clone()), weight, None)),
                expected,
                "{name}, linear"
            );
        }
    }
}
