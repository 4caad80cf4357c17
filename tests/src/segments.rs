//! Segment behaviour of the lazy client: when segments run, what they keep alive, and the size cap.
//!
//! Each test uses its own host device index: devices have their own client and statistics, so
//! tests running in parallel don't see each other's counters. The devices are served in the
//! process (`burn_trainium::device`): the Burn client sends operations asynchronously, so a test
//! reads the counters of the `TrainiumDevice` once the server has handled what it sent (a sync,
//! or [`captured`] where a sync would run the pending segment).

use std::time::{Duration, Instant};

use burn::tensor::{Device, Tensor, TensorData};
use burn_trainium::{
    ExecutorKind, SMALL_TENSOR_SEGMENT_CAP, Stats, TrainiumDevice, set_segment_cap, stats,
};

use crate::support::trainium;

/// The host device `host:index`, as the Trainium device (its counters) and the Burn device
/// serving it.
fn host(index: u16) -> (TrainiumDevice, Device) {
    let device = TrainiumDevice::new(ExecutorKind::Host, index);
    (device, trainium(device))
}

/// The counters of `trainium` once its server has captured at least `operations` operations
/// (sent by a flush, which runs nothing): a sync would run the pending segment.
fn captured(trainium: &TrainiumDevice, device: &Device, operations: u64) -> Stats {
    device.flush().expect("the device flushes");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let counted = stats(trainium);
        if counted.operations_captured >= operations || Instant::now() > deadline {
            return counted;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn ramp(device: &Device) -> Tensor<2> {
    Tensor::from_data(
        TensorData::new((0..12).map(|i| i as f32 / 4.0).collect::<Vec<_>>(), [3, 4]),
        device,
    )
}

#[test]
fn reading_runs_the_pending_segment_once() {
    let (trainium, device) = host(11);
    let x = ramp(&device);
    let first = x.clone().exp() * 2.0;
    let second = x.matmul(Tensor::ones([4, 2], &device)) + 1.0;
    let before = captured(&trainium, &device, 5);
    assert!(before.operations_captured >= 5, "{before:?}");
    assert_eq!(before.segments_run, 0, "nothing runs before a read");

    let first = first.into_data();
    let after_first = stats(&trainium);
    assert_eq!(after_first.segments_run, 1);

    // `second` was computed by the same segment: reading it runs nothing new.
    let second = second.into_data();
    assert_eq!(stats(&trainium).segments_run, 1);

    first.assert_approx_eq::<f32>(
        &TensorData::new(
            (0..12)
                .map(|i| (i as f32 / 4.0).exp() * 2.0)
                .collect::<Vec<_>>(),
            [3, 4],
        ),
        burn::tensor::Tolerance::default(),
    );
    let row_sums: Vec<f32> = (0..3)
        .flat_map(|r| {
            let sum: f32 = (0..4).map(|c| (r * 4 + c) as f32 / 4.0).sum();
            [sum + 1.0, sum + 1.0]
        })
        .collect();
    second.assert_eq(&TensorData::new(row_sums, [3, 2]), false);
}

#[test]
fn dropped_intermediates_are_not_kept() {
    let (trainium, device) = host(12);
    let mut value = ramp(&device);
    for _ in 0..200 {
        value = value * 0.5 + 1.0;
    }
    let data = value.into_data();
    device.sync().unwrap();
    // 200 multiplications and 200 additions made 400 intermediates; none of them may survive.
    assert_eq!(stats(&trainium).live_tensors, 0, "{:?}", stats(&trainium));
    // Fixed point of v -> v/2 + 1 is 2; after 200 steps every element is 2.
    data.assert_approx_eq::<f32>(
        &TensorData::new(vec![2.0f32; 12], [3, 4]),
        burn::tensor::Tolerance::default(),
    );
}

#[test]
fn live_tensors_count_what_the_program_still_holds() {
    let (trainium, device) = host(13);
    let kept = ramp(&device) * 3.0;
    let also_kept = kept.clone().exp();
    device.sync().unwrap();
    assert_eq!(stats(&trainium).live_tensors, 2, "{:?}", stats(&trainium));
    drop(kept);
    drop(also_kept);
    device.sync().unwrap();
    assert_eq!(stats(&trainium).live_tensors, 0, "{:?}", stats(&trainium));
}

fn long_chain(device: &Device) -> TensorData {
    let mut value = ramp(device);
    let weight = Tensor::<2>::from_data(TensorData::new(vec![0.25f32; 16], [4, 4]), device);
    for step in 0..30 {
        value = (value.matmul(weight.clone()) + step as f32).tanh() * 2.0;
    }
    value.into_data()
}

#[test]
fn a_segment_cap_splits_long_streams_without_changing_results() {
    let ((capped, capped_device), (uncapped, uncapped_device)) = (host(14), host(15));
    set_segment_cap(&capped, 3);
    let capped_result = long_chain(&capped_device);
    let uncapped_result = long_chain(&uncapped_device);
    capped_device.sync().unwrap();
    uncapped_device.sync().unwrap();

    capped_result.assert_eq(&uncapped_result, true);
    assert_eq!(stats(&uncapped).segments_run, 1);
    let capped_stats = stats(&capped);
    assert!(
        capped_stats.segments_run >= capped_stats.operations_captured / 3 - 1,
        "a cap of 3 must split the stream: {capped_stats:?}"
    );
}

/// A seed with no random draw waiting leaves the waiting operations for the program after it
/// (a training step seeded before its update stays one program); with a draw waiting, the seed
/// runs it first, under the old state.
#[test]
fn a_seed_cuts_the_stream_only_before_waiting_draws() {
    let _random = crate::support::exclusive_random();
    let (trainium, device) = host(20);
    let draw = || Tensor::<2>::random([3, 4], burn::tensor::Distribution::Default, &device);
    let segments = |before: u64| stats(&trainium).segments_run - before;

    let start = stats(&trainium).segments_run;
    let doubled = ramp(&device) * 2.0;
    device.seed(7);
    let drawn = draw();
    let read = Tensor::cat(vec![doubled, drawn], 0).into_data();
    assert_eq!(segments(start), 1, "no draw waited: one program");

    let start = stats(&trainium).segments_run;
    let earlier = draw() * 2.0;
    device.seed(7);
    let later = ramp(&device) + draw();
    let _ = Tensor::cat(vec![earlier, later], 0).into_data();
    assert_eq!(segments(start), 2, "a draw waited: the seed ran it first");

    // The draw after the seed is the seed's first in both.
    let values = read.try_to_vec::<f32>().unwrap();
    device.seed(7);
    let again = draw().into_data().try_to_vec::<f32>().unwrap();
    assert_eq!(values[12..], again[..]);
}

#[test]
fn seeding_applies_after_the_operations_captured_before_it() {
    let _random = crate::support::exclusive_random();
    let (_, device) = host(16);
    let draw = || Tensor::<1>::random([64], burn::tensor::Distribution::Default, &device);
    device.seed(42);
    let first = draw();
    device.seed(42);
    let second = draw();
    first.into_data().assert_eq(&second.into_data(), true);
}

#[test]
fn a_failing_kernel_is_an_error_naming_the_operation_and_the_device_stays_usable() {
    let (_, device) = host(17);
    let values = Tensor::<1>::from_data(TensorData::from([1.0f32, 2.0, 3.0]), &device);
    let out_of_range = Tensor::<1, burn::tensor::Int>::from_data(TensorData::from([7i32]), &device);
    let error = values
        .clone()
        .select(0, out_of_range)
        .try_into_data()
        .expect_err("an index past the end must fail");
    let message = error.to_string();
    assert!(
        message.contains("host") && message.contains("Select") && message.contains("index 7"),
        "{message}"
    );
    let integers =
        Tensor::<1, burn::tensor::Int>::from_data(TensorData::from([4i32, -6, 9]), &device);
    let zeros = Tensor::<1, burn::tensor::Int>::zeros([3], &device);
    let error = (integers.clone() / zeros)
        .try_into_data()
        .expect_err("an integer division by zero must fail");
    assert!(error.to_string().contains("division by zero"), "{error}");
    let error = (integers.clone() % 0)
        .try_into_data()
        .expect_err("an integer remainder by zero must fail");
    assert!(error.to_string().contains("remainder by zero"), "{error}");
    // The device and the tensors it held before stay usable.
    let doubled = (values * 2.0).try_into_data().unwrap();
    doubled.assert_eq(&TensorData::from([2.0f32, 4.0, 6.0]), true);
    (integers / 2)
        .try_into_data()
        .unwrap()
        .assert_eq(&TensorData::from([2i32, -3, 4]), false);
}

/// Five SGD steps of a small two-layer network on `device`: the loss of each step and the
/// programs the device had needed after it.
fn train_steps((trainium, device): &(TrainiumDevice, Device)) -> Vec<(f32, u64)> {
    let device = &device.clone().autodiff();
    let tensor = |shape: [usize; 2], seed: u64| {
        crate::support::float::<2>(shape, seed, crate::support::Precision::F32, device)
    };
    let (inputs, targets) = (tensor([8, 6], 1), tensor([8, 1], 2));
    let mut first = tensor([6, 5], 3).require_grad();
    let mut second = tensor([5, 1], 4).require_grad();
    let mut steps = Vec::new();
    for _ in 0..5 {
        let hidden = inputs.clone().matmul(first.clone()).tanh();
        let loss = (hidden.matmul(second.clone()) - targets.clone())
            .powi_scalar(2)
            .mean();
        let gradients = loss.backward();
        let update = |weight: Tensor<2>| {
            let gradient = weight.grad(&gradients).expect("a gradient");
            Tensor::from_inner(weight.inner() - gradient * 0.05).require_grad()
        };
        (first, second) = (update(first), update(second));
        let loss = loss.into_scalar::<f32>();
        device.sync().unwrap();
        steps.push((loss, crate::support::programs(trainium)));
    }
    steps
}

#[test]
fn a_step_cut_into_several_programs_compiles_them_once() {
    let reference = train_steps(&host(18));
    // A device no other test shares: its cap and counters are this test's own.
    let (_device, xla_1) = crate::support::exclusive_second_xla();
    set_segment_cap(&xla_1, 12);
    let device = (xla_1, trainium(xla_1));
    let steps = train_steps(&device);
    for (step, ((loss, _), (expected, _))) in steps.iter().zip(&reference).enumerate() {
        assert!(
            (loss - expected).abs() <= 1e-5 * expected.abs().max(1.0),
            "step {step}: {loss} on xla with a cap of 12 operations, {expected} on host"
        );
    }
    let programs: Vec<u64> = steps.iter().map(|(_, programs)| *programs).collect();
    assert!(
        programs[0] > 2,
        "a cap of 12 operations must cut a step into several programs: {programs:?}"
    );
    assert_eq!(
        programs[2],
        programs[4],
        "steady steps must reuse every program of the step: {programs:?}, {:?}",
        stats(&xla_1)
    );
    // Run again from new tensors (the last run's are dropped meanwhile, in other places of the
    // stream): the cap counts computing operations only, so the cuts and programs are the same.
    let again: Vec<u64> = train_steps(&device)
        .iter()
        .map(|(_, programs)| *programs)
        .collect();
    assert_eq!(again[4], programs[4], "{again:?} after {programs:?}");
}

/// Runs `operations` elementwise operations on a `shape` tensor of `device` and reads the result:
/// the value, and how many segments ran for it.
fn elementwise_chain(
    (trainium, device): &(TrainiumDevice, Device),
    shape: [usize; 2],
    operations: usize,
) -> (TensorData, u64) {
    device.sync().unwrap();
    let before = stats(trainium).segments_run;
    let elements = shape[0] * shape[1];
    let data = (0..elements)
        .map(|i| (i % 7) as f32 / 8.0)
        .collect::<Vec<_>>();
    let mut value = Tensor::<2>::from_data(TensorData::new(data, shape), device);
    for step in 0..operations / 2 {
        value = (value * 0.5).add_scalar(step as f32 / operations as f32);
    }
    let value = value.into_data();
    device.sync().unwrap();
    (value, stats(trainium).segments_run - before)
}

#[test]
fn xla_cuts_long_segments_of_small_tensors_unless_a_cap_is_set() {
    crate::support::xla();
    assert!(
        std::env::var_os(burn_trainium::SEGMENT_CAP_ENV).is_none(),
        "this test checks the cut made when no cap is set: unset TRAINIUM_SEGMENT_CAP"
    );
    // A device of this test alone: its cap and counters are its own.
    let xla = TrainiumDevice::new(ExecutorKind::Xla, 2).with_replicas(2);
    let device = (xla, trainium(xla));
    let operations = SMALL_TENSOR_SEGMENT_CAP + SMALL_TENSOR_SEGMENT_CAP / 2;
    let (small, small_segments) = elementwise_chain(&device, [4, 4], operations);
    assert_eq!(
        small_segments, 2,
        "{operations} operations on 16 elements each run as programs of at most \
         {SMALL_TENSOR_SEGMENT_CAP}"
    );
    let (_, large_segments) = elementwise_chain(&device, [64, 512], operations);
    assert_eq!(
        large_segments, 1,
        "operations on 32,768 elements each stay one program"
    );
    let reference = elementwise_chain(&host(19), [4, 4], operations).0;
    small.assert_approx_eq::<f32>(&reference, burn::tensor::Tolerance::absolute(1e-5));

    set_segment_cap(&xla, 65_536);
    let (capped, capped_segments) = elementwise_chain(&device, [4, 4], operations);
    assert_eq!(capped_segments, 1, "a cap set for the device decides alone");
    capped.assert_approx_eq::<f32>(&reference, burn::tensor::Tolerance::absolute(1e-5));
}

/// One step of a loop whose loss another thread takes the mean of (as Burn's metrics thread
/// does), arriving after `arriving_after` of the step's later operations: the mean and the
/// step's result.
fn step_with_a_mean_from_another_thread(
    device: &Device,
    arriving_after: usize,
) -> (f32, TensorData) {
    let weight = Tensor::<2>::from_data(TensorData::new(vec![0.5f32; 12], [3, 4]), device);
    let x = ramp(device);
    let loss = (x.clone() * weight).sum();
    let mut later = x;
    for step in 0..arriving_after {
        later = (later * 1.5).add_scalar(step as f32);
    }
    // The client sends each stream's operations when flushed: this orders the streams.
    device.flush().unwrap();
    let other_device = device.clone();
    let mean = std::thread::spawn(move || {
        let mean = loss.mean();
        other_device.flush().unwrap();
        mean
    })
    .join()
    .unwrap();
    for step in arriving_after..3 {
        later = (later * 1.5).add_scalar(step as f32);
    }
    device.flush().unwrap();
    let mean = mean.into_data().try_to_vec::<f32>().unwrap()[0];
    (mean, later.into_data())
}

/// Another stream's operations on the capturing stream's tensors run at the end of the program
/// that computes what they need, wherever they arrived among the capturing stream's operations:
/// the same step with the mean arriving at another point compiles nothing new.
#[test]
fn another_streams_operations_do_not_change_the_capturing_streams_programs() {
    crate::support::xla();
    let trainium = TrainiumDevice::new(ExecutorKind::Xla, 3);
    let device = crate::support::trainium(trainium);
    let (first_mean, first) = step_with_a_mean_from_another_thread(&device, 0);
    device.sync().unwrap();
    let programs = stats(&trainium).compiles;
    for arriving_after in [2, 3] {
        let (mean, result) = step_with_a_mean_from_another_thread(&device, arriving_after);
        device.sync().unwrap();
        assert_eq!(mean, first_mean);
        result.assert_eq(&first, true);
        let counted = stats(&trainium);
        assert_eq!(
            counted.compiles, programs,
            "arriving after {arriving_after} operations: {counted:?}"
        );
    }
}
