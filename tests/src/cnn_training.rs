//! A small CNN in Burn's usual style (`hlat::vision::SmallCnn`: conv2d → ReLU → max-pool →
//! conv2d → adaptive average pool → linear) trained for ten Adam steps on generated images on
//! `Trainium`'s `xla` executor, with host fallbacks refused, from the same initial weights as on
//! `NdArray`: every loss agrees within 1e-4.

use burn::backend::Autodiff;
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_trainium::{HostFallback, Trainium, TrainiumDevice, set_host_fallback, stats};
use hlat::vision::{SmallCnn, generated_batch};

use crate::support::{Reference, xla};

const STEPS: usize = 10;
const BATCH: usize = 16;

/// The losses of `STEPS` Adam steps of `model` on one generated batch.
fn train<B: AutodiffBackend>(mut model: SmallCnn<B>, device: &B::Device) -> Vec<f64> {
    let (images, labels) = generated_batch::<B>(BATCH, 5, device);
    let mut optimizer = AdamConfig::new().init::<B, SmallCnn<B>>();
    (0..STEPS)
        .map(|_| {
            let loss = model.loss(images.clone(), labels.clone());
            let gradients = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(3e-3, model.clone(), gradients);
            loss.into_data().convert::<f64>().to_vec::<f64>().unwrap()[0]
        })
        .collect()
}

#[test]
fn a_small_cnn_trains_on_xla_without_the_host_as_on_ndarray() {
    let _random = crate::support::exclusive_random();
    let cpu = Default::default();
    <Reference as Backend>::seed(&cpu, 3);
    // Burn initialises parameters lazily, on first use: every run loads the same recorded
    // weights rather than cloning a model whose clones would draw their own.
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let weights = recorder
        .record(SmallCnn::<Reference>::new(&cpu).into_record(), ())
        .unwrap();
    let initial = SmallCnn::<Autodiff<Reference>>::new(&cpu)
        .load_record(recorder.load(weights.clone(), &cpu).unwrap());
    let expected = train(initial, &cpu);
    assert!(
        expected[STEPS - 1] < expected[0] * 0.9,
        "the loss falls: {expected:?}"
    );

    // A device of this test's own, so that refusing host fallbacks touches no other test.
    xla();
    let device = TrainiumDevice::xla(3);
    set_host_fallback(&device, HostFallback::Error);
    let model = SmallCnn::<Autodiff<Trainium>>::new(&device)
        .load_record(recorder.load(weights, &device).unwrap());
    let before = stats(&device).host_fallbacks;
    let actual = train(model, &device);
    for (step, (e, a)) in expected.iter().zip(&actual).enumerate() {
        assert!(
            (e - a).abs() <= 1e-4 * e.abs().max(1.0),
            "step {step}: loss {a} on xla, {e} on NdArray"
        );
    }
    assert_eq!(
        stats(&device).host_fallbacks,
        before,
        "the CNN fell back to the host"
    );
}
