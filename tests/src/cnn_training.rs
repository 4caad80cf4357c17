//! A small CNN in Burn's usual style (`hlat::vision::SmallCnn`: conv2d → ReLU → max-pool →
//! conv2d → adaptive average pool → linear) trained for ten Adam steps on generated images on
//! the Trainium `xla` executor, with host fallbacks refused, from the same initial weights as on
//! Flex: every loss agrees within 1e-4.

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::Device;
use burn_trainium::{HostFallback, TrainiumDevice, set_host_fallback, stats};
use hlat::vision::{SmallCnn, generated_batch};

use crate::support::{reference, trainium, xla};

const STEPS: usize = 10;
const BATCH: usize = 16;

/// The losses of `STEPS` Adam steps of `model` on one generated batch.
fn train(mut model: SmallCnn, device: &Device) -> Vec<f64> {
    let (images, labels) = generated_batch(BATCH, 5, device);
    let mut optimizer = AdamConfig::new().init();
    (0..STEPS)
        .map(|_| {
            let loss = model.loss(images.clone(), labels.clone());
            let gradients = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(3e-3, model.clone(), gradients);
            loss.into_data()
                .convert::<f64>()
                .try_to_vec::<f64>()
                .unwrap()[0]
        })
        .collect()
}

#[test]
fn a_small_cnn_trains_on_xla_without_the_host_as_on_flex() {
    let _random = crate::support::exclusive_random();
    let cpu = reference().autodiff();
    cpu.seed(3);
    // Burn initialises parameters lazily, on first use: every run loads the same record rather
    // than cloning a model whose clones would draw their own.
    let weights = SmallCnn::new(&cpu).into_record();
    let initial = SmallCnn::new(&cpu).load_record(weights.clone());
    let expected = train(initial, &cpu);
    assert!(
        expected[STEPS - 1] < expected[0] * 0.9,
        "the loss falls: {expected:?}"
    );

    // A device of this test's own, so that refusing host fallbacks touches no other test.
    xla();
    let xla = TrainiumDevice::xla(3);
    set_host_fallback(&xla, HostFallback::Error);
    let device = trainium(xla).autodiff();
    let model = SmallCnn::new(&device).load_record(weights);
    device.sync().expect("the device syncs");
    let before = stats(&xla).host_fallbacks;
    let actual = train(model, &device);
    for (step, (e, a)) in expected.iter().zip(&actual).enumerate() {
        assert!(
            (e - a).abs() <= 1e-4 * e.abs().max(1.0),
            "step {step}: loss {a} on xla, {e} on Flex"
        );
    }
    device.sync().expect("the device syncs");
    assert_eq!(
        stats(&xla).host_fallbacks,
        before,
        "the CNN fell back to the host"
    );
}
