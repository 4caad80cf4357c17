//! A Burn 0.22 program, written as Burn's book writes one, trains on the Trainium device that
//! `burn_trainium::device` serves in the process, with the losses Flex gives.

use burn::module::Module;
use burn::nn::{Linear, Relu};
use burn::tensor::{Device, Tensor, TensorData};
use burn_trainium::{TrainiumDevice, stats};

use super::support::{adam_losses, linear, values};

/// A two-layer perceptron.
#[derive(Module, Debug)]
struct Mlp {
    first: Linear,
    activation: Relu,
    second: Linear,
}

impl Mlp {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.second
            .forward(self.activation.forward(self.first.forward(x)))
    }
}

/// The loss of each of `steps` Adam steps of the perceptron on `device` (with autodiff).
fn losses(device: Device, steps: usize) -> Vec<f32> {
    let device = device.autodiff();
    let model = Mlp {
        first: linear(1, 8, 16, &device),
        activation: Relu::new(),
        second: linear(3, 16, 4, &device),
    };
    let inputs = Tensor::<2>::from_data(TensorData::new(values(5, 32 * 8), [32, 8]), &device);
    let targets = Tensor::<2>::from_data(TensorData::new(values(6, 32 * 4), [32, 4]), &device);
    adam_losses(model, Mlp::forward, (inputs, targets), 1e-2, steps)
}

fn assert_close(expected: &[f32], actual: &[f32], tolerance: f32, what: &str) {
    assert_eq!(expected.len(), actual.len());
    for (step, (e, a)) in expected.iter().zip(actual).enumerate() {
        assert!(
            (e - a).abs() <= tolerance * e.abs().max(1.0),
            "{what}, step {step}: {a} where Flex gives {e} (all: {actual:?} against {expected:?})"
        );
    }
}

#[test]
fn a_burn_program_trains_on_the_host_device_as_on_flex() {
    let reference = losses(Device::flex(), 6);
    assert!(
        reference[5] < reference[0],
        "Flex's loss fell: {reference:?}"
    );
    let device = burn_trainium::device("host").expect("the host device is served");
    assert_close(&reference, &losses(device, 6), 1e-5, "host");
}

/// A device this process already serves to its own token cannot become Burn's default device
/// (its earlier handles live in another session): `set_default_device` says to call it first,
/// and leaves Burn's default as it was.
#[test]
fn a_device_served_before_cannot_become_the_default() {
    burn_trainium::device("host:3").expect("the host device is served");
    let refused = burn_trainium::set_default_device("host:3")
        .expect_err("the device was served before")
        .to_string();
    assert!(
        refused.contains("host:3") && refused.contains("set_default_device first"),
        "{refused}"
    );
    assert_ne!(std::env::var("BURN_DEVICE").as_deref(), Ok("remote"));
}

#[test]
fn a_burn_program_trains_on_the_xla_device_as_on_flex() {
    test_support::plugin::plugin_path();
    let reference = losses(Device::flex(), 6);
    let device = burn_trainium::device("xla:0").expect("the xla device is served");
    let before = stats(&TrainiumDevice::xla(0));
    assert_close(&reference, &losses(device, 6), 1e-4, "xla");
    let after = stats(&TrainiumDevice::xla(0));
    // The steps ran as compiled programs, every operation lowered.
    assert!(
        after.operations_captured > before.operations_captured + 100,
        "{before:?} -> {after:?}"
    );
    assert!(after.segments_run > before.segments_run, "{after:?}");
    assert_eq!(after.host_fallbacks, before.host_fallbacks, "{after:?}");
    assert_eq!(
        burn_trainium::host_fallbacks_by_kind(&TrainiumDevice::xla(0)),
        Vec::<(String, u64)>::new()
    );
}

/// Burn's sign of either zero is +0 (HLO's `sign` keeps a zero's sign), and of NaN is NaN.
#[test]
fn the_sign_of_a_negative_zero_is_a_positive_zero_on_xla() {
    test_support::plugin::plugin_path();
    let device = burn_trainium::device("xla:0").expect("the xla device is served");
    let values = [-0.0f32, 0.0, -2.5, 3.0, f32::NAN];
    let signs: Vec<f32> = Tensor::<1>::from_data(TensorData::from(values), &device)
        .sign()
        .into_data()
        .try_to_vec()
        .unwrap();
    let bits: Vec<u32> = signs[..4].iter().map(|sign| sign.to_bits()).collect();
    assert_eq!(
        bits,
        [0.0f32, 0.0, -1.0, 1.0].map(f32::to_bits),
        "{signs:?}"
    );
    assert!(signs[4].is_nan(), "{signs:?}");
}

#[test]
fn a_bad_device_string_is_an_error_naming_it() {
    let error = burn_trainium::device("tpu:0").unwrap_err().to_string();
    assert!(error.contains("tpu:0"), "{error}");
}

mod collectives {
    use burn::tensor::{Device, Tensor, TensorData};
    use burn_trainium::collective::{self, ReduceOp, ReplicaGroups, SourceTargetPairs};

    fn replicas(values: &[[f32; 2]]) -> Vec<TensorData> {
        values.iter().map(|row| TensorData::from(*row)).collect()
    }

    fn read(tensor: Tensor<1>) -> Vec<Vec<f32>> {
        collective::into_replicas(tensor)
            .expect("the replicas are read")
            .into_iter()
            .map(|data| data.try_to_vec::<f32>().expect("f32 data"))
            .collect()
    }

    /// Every collective on the two replicas of `spec`, against closed-form values.
    fn check(spec: &str) {
        let device = burn_trainium::device(spec).expect("the device is served");
        assert_eq!(collective::replica_count(&device), 2, "{spec}");
        let both = ReplicaGroups::contiguous(2, 2).unwrap();
        let x: Tensor<1> = collective::from_replicas(replicas(&[[1.0, 2.0], [3.0, 5.0]]), &device);
        assert_eq!(
            read(x.clone()),
            vec![vec![1.0, 2.0], vec![3.0, 5.0]],
            "{spec}"
        );
        assert_eq!(
            read(collective::all_reduce(x.clone(), ReduceOp::Sum, &both)),
            vec![vec![4.0, 7.0]; 2],
            "{spec}: all-reduce"
        );
        assert_eq!(
            read(collective::all_gather(x.clone(), 0, &both)),
            vec![vec![1.0, 2.0, 3.0, 5.0]; 2],
            "{spec}: all-gather"
        );
        assert_eq!(
            read(collective::reduce_scatter(x.clone(), 0, &both)),
            vec![vec![4.0], vec![7.0]],
            "{spec}: reduce-scatter"
        );
        let pairs = SourceTargetPairs::new(vec![(0, 1)]).unwrap();
        assert_eq!(
            read(collective::permute(x.clone(), &pairs)),
            vec![vec![0.0, 0.0], vec![1.0, 2.0]],
            "{spec}: permute"
        );
        // A barrier over tensors of two dtypes returns each unchanged, in its dtype.
        let fenced = collective::optimization_barrier(vec![
            x.clone(),
            x.clone().cast(burn::tensor::DType::BF16),
            x.clone().mul_scalar(2.0),
        ]);
        assert_eq!(fenced[1].dtype(), burn::tensor::DType::BF16, "{spec}");
        let as_f32 = |tensor: Tensor<1>| tensor.cast(burn::tensor::DType::F32);
        assert_eq!(
            read(as_f32(fenced[1].clone())),
            read(x.clone()),
            "{spec}: barrier"
        );
        assert_eq!(
            read(fenced[2].clone()),
            vec![vec![2.0, 4.0], vec![6.0, 10.0]],
            "{spec}: barrier"
        );
        // Under autodiff: the gradient of an all-gather is a reduce-scatter of the output's
        // gradient, here the sum over both replicas of a weight of 1, 2, 3, 4 per element.
        let tracked_device = device.clone().autodiff();
        let x: Tensor<1> =
            collective::from_replicas(replicas(&[[1.0, 2.0], [3.0, 5.0]]), &tracked_device)
                .require_grad();
        let weights = Tensor::<1>::from_data([1.0, 2.0, 3.0, 4.0], &tracked_device);
        let gathered = collective::all_gather(x.clone(), 0, &both);
        let loss = (gathered * weights).sum();
        let gradients = loss.backward();
        let gradient = x.grad(&gradients).expect("x has a gradient");
        assert_eq!(
            read(gradient),
            vec![vec![2.0, 4.0], vec![6.0, 8.0]],
            "{spec}: the all-gather's gradient"
        );
    }

    #[test]
    fn collectives_run_on_the_replicas_of_a_served_host_device() {
        check("host:0-1");
    }

    #[test]
    fn collectives_run_on_the_replicas_of_a_served_xla_device() {
        test_support::plugin::plugin_path();
        check("xla:0-1");
    }

    #[test]
    fn collectives_are_identities_on_a_device_of_one_replica() {
        let device = Device::flex();
        let one = ReplicaGroups::contiguous(1, 1).unwrap();
        let x = Tensor::<1>::from_data([1.0, 2.0], &device);
        assert_eq!(collective::replica_count(&device), 1);
        let reduced = collective::all_reduce(x.clone(), ReduceOp::Sum, &one);
        assert_eq!(
            reduced.into_data().try_to_vec::<f32>().unwrap(),
            vec![1.0, 2.0]
        );
        let fenced = collective::optimization_barrier(vec![
            x.clone(),
            x.clone().cast(burn::tensor::DType::BF16),
            x.clone() * 2.0,
        ]);
        assert_eq!(fenced[1].dtype(), burn::tensor::DType::BF16);
        assert_eq!(
            fenced[1]
                .clone()
                .cast(burn::tensor::DType::F32)
                .into_data()
                .try_to_vec::<f32>()
                .unwrap(),
            vec![1.0, 2.0]
        );
        assert_eq!(
            fenced[2].clone().into_data().try_to_vec::<f32>().unwrap(),
            vec![2.0, 4.0]
        );
    }
}

mod operations_new_in_burn_022 {
    use burn::tensor::activation;
    use burn::tensor::ops::PadMode;
    use burn::tensor::{Device, Int, Tensor, TensorData};
    use burn_trainium::TrainiumDevice;

    use super::values;

    /// What `compute` returns on `device`: every result as f32 data.
    type Results = Vec<(&'static str, TensorData)>;

    fn input(device: &Device) -> Tensor<2> {
        Tensor::from_data(TensorData::new(values(11, 4 * 6), [4, 6]), device).mul_scalar(3.0)
    }

    fn float(name: &'static str, tensor: Tensor<2>) -> (&'static str, TensorData) {
        (name, tensor.into_data())
    }

    fn int(name: &'static str, tensor: Tensor<2, Int>) -> (&'static str, TensorData) {
        (name, tensor.float().into_data())
    }

    /// Every operation kind Burn 0.22 records that 0.21 did not, forward and (through autodiff)
    /// backward.
    fn compute(device: &Device) -> Results {
        let x = input(device);
        let y = x.clone().flip([1]).add_scalar(0.25);
        let alpha = Tensor::<1>::from_data([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], device);
        let mut results = vec![
            float("relu", activation::relu(x.clone())),
            float("leaky_relu", activation::leaky_relu(x.clone(), 0.1)),
            float("prelu", activation::prelu(x.clone(), alpha)),
            float("gelu", activation::gelu(x.clone())),
            float("sigmoid", activation::sigmoid(x.clone())),
            float(
                "hard_sigmoid",
                activation::hard_sigmoid(x.clone(), 0.2, 0.5),
            ),
            float("log_sigmoid", activation::log_sigmoid(x.clone())),
            float("softmax", activation::softmax(x.clone(), 1)),
            float("log_softmax", activation::log_softmax(x.clone(), 1)),
            float("softmin", activation::softmin(x.clone(), 0)),
            float("neg", x.clone().neg()),
            float("sign", x.clone().sign()),
            float("clamp_min", x.clone().clamp_min(-0.5)),
            float("clamp_max", x.clone().clamp_max(0.5)),
            float("hypot", x.clone().hypot(y.clone())),
            float("sum_dims", x.clone().sum_dims(&[0, 1])),
            float("sort", x.clone().sort(1)),
            int("argsort", x.clone().argsort(0)),
            float("not_equal", x.clone().not_equal(y.clone()).float()),
            float(
                "xor",
                x.clone()
                    .greater_elem(0.0)
                    .bool_xor(y.clone().greater_elem(0.0))
                    .float(),
            ),
            float("any_dim", x.clone().greater_elem(2.0).any_dim(1).float()),
            float("all_dim", x.clone().greater_elem(-2.9).all_dim(0).float()),
            float(
                "pad_constant",
                x.clone().pad([(1, 2), (0, 1)], PadMode::Constant(7.0)),
            ),
            float(
                "pad_reflect",
                x.clone().pad([(1, 2), (2, 1)], PadMode::Reflect),
            ),
            float("pad_edge", x.clone().pad([(2, 0), (1, 3)], PadMode::Edge)),
        ];
        let (top, top_indices) = x.clone().topk_with_indices(3, 1);
        results.push(float("topk", top));
        results.push(int("topk_indices", top_indices));
        let (sorted, sorted_indices) = x.clone().sort_with_indices(0);
        results.push(float("sort_with_indices", sorted));
        results.push(int("sort_indices", sorted_indices));
        results.push((
            "all",
            x.clone().greater_elem(-10.0).all().float().into_data(),
        ));
        results.push((
            "any",
            x.clone().greater_elem(10.0).any().float().into_data(),
        ));

        // The backward operations: gradients of a weighted sum through each activation.
        let tracked = device.clone().autodiff();
        let weights = input(&tracked).flip([0]);
        type Activation = fn(Tensor<2>) -> Tensor<2>;
        let backward: [(&'static str, Activation); 4] = [
            ("relu_backward", activation::relu),
            ("gelu_backward", activation::gelu),
            ("sigmoid_backward", activation::sigmoid),
            ("log_sigmoid_backward", activation::log_sigmoid),
        ];
        for (name, function) in backward {
            let x = input(&tracked).require_grad();
            let gradients = (function(x.clone()) * weights.clone()).sum().backward();
            results.push((name, x.grad(&gradients).expect("a gradient").into_data()));
        }
        results.extend(modules(device));
        results.extend(nan_and_empty(device));
        results
    }

    /// Extrema, running extrema and sorts of rows holding NaN (and both zeros), and `any`/`all`
    /// over no elements.
    fn nan_and_empty(device: &Device) -> Results {
        let nan = f32::NAN;
        let rows = TensorData::from([
            [1.5, nan, -2.0, 4.0, nan],
            [nan, 3.0, 0.5, -1.0, 2.0],
            [0.0, -0.0, 7.0, -7.5, 1.0],
        ]);
        let x = Tensor::<2>::from_data(rows, device);
        let (max, max_at) = x.clone().max_dim_with_indices(1);
        let (min, min_at) = x.clone().min_dim_with_indices(0);
        let (sorted, order) = x.clone().sort_descending_with_indices(1);
        let empty = Tensor::<2>::empty([3, 0], device);
        let row = |tensor: Tensor<1>| tensor.reshape([1, -1]);
        vec![
            float("max", row(x.clone().max())),
            float("min", row(x.clone().min())),
            float("max_abs", row(x.clone().max_abs())),
            float("max_dim", x.clone().max_dim(1)),
            float("min_dim", x.clone().min_dim(0)),
            float("max_abs_dim", x.clone().max_abs_dim(1)),
            float("max_dim_with_indices", max),
            int("max_dim_indices", max_at),
            float("min_dim_with_indices", min),
            int("min_dim_indices", min_at),
            int("argmax_nan", x.clone().argmax(1)),
            int("argmin_nan", x.clone().argmin(0)),
            float("cummax", x.clone().cummax(1)),
            float("cummin", x.clone().cummin(0)),
            float("sort_nan", x.clone().sort(1)),
            int("argsort_zeros", x.clone().argsort(1)),
            float("sort_descending_nan", sorted),
            int("sort_descending_indices", order),
            float("any_empty", row(empty.clone().any().float())),
            float("all_empty", row(empty.clone().all().float())),
            float("any_dim_empty", empty.clone().any_dim(1).float()),
            float("all_dim_empty", empty.all_dim(1).float()),
        ]
    }

    /// Every result of `actual` (computed on `device`) equals Flex's within 1e-5 (relative
    /// above 1), NaN where Flex has NaN.
    fn assert_same(expected: &Results, actual: &Results, device: &str) {
        assert_eq!(expected.len(), actual.len());
        for ((name, expected), (_, actual)) in expected.iter().zip(actual) {
            assert_eq!(expected.shape(), actual.shape(), "{name} on {device}");
            let expected = expected
                .clone()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .unwrap();
            let actual = actual.clone().convert::<f32>().try_to_vec::<f32>().unwrap();
            for (index, (e, a)) in expected.iter().zip(&actual).enumerate() {
                assert!(
                    (e.is_nan() && a.is_nan()) || (e - a).abs() <= 1e-5 * e.abs().max(1.0),
                    "{name}[{index}]: {a} on {device}, {e} on Flex"
                );
            }
        }
    }

    fn tensor<const D: usize>(seed: u64, shape: [usize; D], device: &Device) -> Tensor<D> {
        let count = shape.iter().product();
        Tensor::from_data(TensorData::new(values(seed, count), shape), device)
    }

    /// The module operations Burn 0.22 records whole, forward and (through autodiff) backward.
    fn modules(device: &Device) -> Results {
        use burn::tensor::module::{
            adaptive_avg_pool3d, batch_norm, conv_transpose2d, layer_norm, unfold4d,
        };
        use burn::tensor::ops::{ConvTransposeOptions, UnfoldOptions};

        let image = tensor(21, [2, 3, 5, 6], device);
        let features = tensor(22, [4, 6], device);
        let gamma = tensor(23, [6], device).add_scalar(1.0);
        let beta = tensor(24, [6], device);
        let channel = |seed| tensor(seed, [3], device);
        let mut results = vec![
            (
                "layer_norm",
                layer_norm(features.clone(), gamma.clone(), Some(beta), 1e-5).into_data(),
            ),
            (
                "layer_norm_without_beta",
                layer_norm(features, gamma, None, 1e-5).into_data(),
            ),
            (
                "batch_norm",
                batch_norm(
                    image.clone(),
                    channel(25),
                    channel(26),
                    channel(27),
                    channel(28).abs().add_scalar(0.5),
                    1e-5,
                )
                .into_data(),
            ),
            (
                "unfold4d",
                unfold4d(
                    image.clone(),
                    [2, 3],
                    UnfoldOptions::new([1, 1], [1, 0], [1, 1]),
                )
                .into_data(),
            ),
            (
                "unfold4d_strided",
                unfold4d(
                    image.clone(),
                    [3, 2],
                    UnfoldOptions::new([2, 1], [0, 1], [1, 2]),
                )
                .into_data(),
            ),
        ];
        let tracked = device.clone().autodiff();
        let volume = tensor(29, [2, 2, 5, 4, 6], &tracked).require_grad();
        let pooled = adaptive_avg_pool3d(volume.clone(), [3, 2, 4]);
        let weights = tensor(30, [2, 2, 3, 2, 4], &tracked);
        let gradients = (pooled.clone() * weights).sum().backward();
        results.push(("adaptive_avg_pool3d", pooled.into_data()));
        results.push((
            "adaptive_avg_pool3d_backward",
            volume.grad(&gradients).expect("a gradient").into_data(),
        ));
        let x = tensor(31, [2, 4, 3, 3], &tracked).require_grad();
        let weight = tensor(32, [4, 2, 3, 3], &tracked).require_grad();
        let bias = tensor(33, [2], &tracked).require_grad();
        let options = ConvTransposeOptions::new([2, 2], [1, 1], [1, 1], [1, 1], 1);
        let y = conv_transpose2d(x.clone(), weight.clone(), Some(bias.clone()), options);
        let weights = tensor(34, y.dims(), &tracked);
        let gradients = (y.clone() * weights).sum().backward();
        results.push(("conv_transpose2d", y.into_data()));
        for (name, parameter) in [
            ("conv_transpose2d_x_gradient", x.grad(&gradients)),
            ("conv_transpose2d_weight_gradient", weight.grad(&gradients)),
        ] {
            results.push((name, parameter.expect("a gradient").into_data()));
        }
        results.push((
            "conv_transpose2d_bias_gradient",
            bias.grad(&gradients).expect("a gradient").into_data(),
        ));
        results.extend(grid_samples(device));
        results
    }

    /// `grid_sample_2d` in every mode, padding and corner alignment, on a grid reaching past
    /// the input's edges (so each padding mode decides some samples).
    fn grid_samples(device: &Device) -> Results {
        use burn::tensor::ops::{GridSampleOptions, GridSamplePaddingMode, InterpolateMode};

        let image = tensor(35, [2, 3, 4, 5], device);
        let grid = tensor(36, [2, 3, 6, 2], device).mul_scalar(1.4);
        let mut results = Vec::new();
        for mode in [InterpolateMode::Bilinear, InterpolateMode::Nearest] {
            for padding in [
                GridSamplePaddingMode::Zeros,
                GridSamplePaddingMode::Border,
                GridSamplePaddingMode::Reflection,
            ] {
                for align_corners in [false, true] {
                    let name = format!("grid_sample_2d {mode:?} {padding:?} align {align_corners}");
                    let options = GridSampleOptions::new(mode.clone())
                        .with_padding_mode(padding)
                        .with_align_corners(align_corners);
                    let sampled = image.clone().grid_sample_2d(grid.clone(), options);
                    // Names are 'static like the other results'; a test leaks these twelve.
                    results.push((&*Box::leak(name.into_boxed_str()), sampled.into_data()));
                }
            }
        }
        results
    }

    /// burn-signal's real FFTs (custom operations on a remote device) along either dimension,
    /// with the signal cut or padded to a length, and back.
    fn ffts(device: &Device) -> Results {
        let signal = tensor(37, [3, 8], device);
        let mut results = Vec::new();
        for (name, dim, length) in [
            ("rfft", 1, None),
            ("rfft_padded", 1, Some(16)),
            ("rfft_cut", 1, Some(4)),
            ("rfft_dim0", 0, Some(4)),
        ] {
            let (real, imaginary) = burn_signal::rfft(signal.clone(), dim, length);
            let back = burn_signal::irfft(real.clone(), imaginary.clone(), dim, length);
            results.push((name, real.into_data()));
            results.push((name, imaginary.into_data()));
            results.push((name, back.into_data()));
        }
        results
    }

    /// The FFTs compile on `xla` and run on `host`, as Flex computes them.
    #[test]
    fn ffts_run_on_the_trainium_devices_as_on_flex() {
        test_support::plugin::plugin_path();
        let expected = ffts(&Device::flex());
        for spec in ["host:1", "xla:1"] {
            let device = burn_trainium::device(spec).expect("the device is served");
            assert_same(&expected, &ffts(&device), spec);
        }
    }

    /// An extremum over an empty axis is an error, as Burn's reference panics there, and the
    /// device goes on (a panic inside a `host` kernel would leave that device unusable).
    #[test]
    fn an_extremum_of_an_empty_axis_is_an_error_and_the_device_goes_on() {
        test_support::plugin::plugin_path();
        for spec in ["host:1", "xla:2"] {
            extrema_of_empty_axes_are_refused(spec);
        }
    }

    fn extrema_of_empty_axes_are_refused(spec: &str) {
        let device = burn_trainium::device(spec).expect("the device is served");
        let empty = || Tensor::<2>::empty([3, 0], &device);
        type Attempt<'a> = Box<dyn Fn() -> Tensor<2> + 'a>;
        let attempts: [(&str, Attempt); 5] = [
            ("max", Box::new(|| empty().max().reshape([1, 1]))),
            ("min_dim", Box::new(|| empty().min_dim(1))),
            (
                "Max",
                Box::new(|| Tensor::<2>::empty([0, 0], &device).max_dim(1)),
            ),
            ("argmax", Box::new(|| empty().argmax(1).float())),
            ("max_abs_dim", Box::new(|| empty().max_abs_dim(1))),
        ];
        // Each is read on its own, so each error is its own operation's.
        for (name, attempt) in attempts {
            let error = attempt()
                .try_into_data()
                .expect_err(&format!("{name} of an empty axis is refused"));
            let message = format!("{error:?}");
            assert!(message.contains("empty"), "{name} on {spec}: {message}");
        }
        // What a failed segment left without a value reports that failure when used later.
        let failed = empty().max();
        let later = failed.clone().add_scalar(1.0);
        let first = failed.try_into_data().expect_err("refused");
        let second = later.try_into_data().expect_err("refused too");
        assert!(format!("{first:?}").contains("empty"), "{first:?}");
        assert!(format!("{second:?}").contains("empty"), "{second:?}");
        let sum: f32 = Tensor::<1>::from_data([1.0, 2.0], &device)
            .sum()
            .into_scalar();
        assert_eq!(sum, 3.0);
    }

    #[test]
    fn lower_on_xla_as_flex_computes_them() {
        test_support::plugin::plugin_path();
        let expected = compute(&Device::flex());
        let device = burn_trainium::device("xla:2").expect("the xla device is served");
        assert_same(&expected, &compute(&device), "xla");
        assert_eq!(
            burn_trainium::host_fallbacks_by_kind(&TrainiumDevice::xla(2)),
            Vec::<(String, u64)>::new(),
            "every operation ran compiled"
        );
    }
}
