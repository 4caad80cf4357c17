//! HLAT's optimizer step ([`hlat_train::learner::OptimizerStep`]): gradient accumulation and
//! non-finite skipping.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Device, Tensor};
use burn_trainium::TrainiumDevice;
use hlat::HlatConfig;
use hlat_train::config::TrainConfig;
use hlat_train::error::TrainError;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::OptimizerStep;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::schedule::WarmupCosine;

use test_support::training::Training;

/// The project's own device, the host executor, with autodiff: deterministic reductions, so the
/// only difference between one batch and its micro-batches is the order of the sums.
fn device() -> Device {
    crate::host().autodiff()
}

/// The recipe's optimizer step at a constant learning rate, stopping after
/// `max_consecutive_skips` non-finite steps in a row.
fn constant_lr_training(model: LanguageModel, max_consecutive_skips: u32) -> Training {
    let recipe = TrainConfig::default();
    // A large ε keeps Adam's first step smooth in the gradient: with 1e-8, a parameter whose
    // gradient is nearly zero moves by up to ±lr depending on rounding noise in the gradient (the
    // order of parallel sums varies with load), which is not what these tests are about.
    let settings = AdamWSettings {
        eps: 1e-3,
        ..AdamWSettings::from_config(&recipe)
    };
    let step = OptimizerStep {
        seed: 3,
        max_consecutive_skips,
        ..OptimizerStep::from_config(&recipe)
    };
    Training::new(model, settings, WarmupCosine::constant(1e-2), step)
}

fn tiny_model() -> LanguageModel {
    let device = device();
    device.seed(11);
    let config = HlatConfig::preset("hlat-test").unwrap();
    LanguageModel::new(config.init(&device), None)
}

fn rows() -> Vec<Vec<u32>> {
    (0..2u32)
        .map(|row| (0..17).map(|i| (i * 7 + row * 13 + 3) % 64).collect())
        .collect()
}

fn flat_params(model: &LanguageModel) -> Vec<f32> {
    let mut values = Vec::new();
    struct Collect<'a>(&'a mut Vec<f32>);
    impl burn::module::ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.extend(
                param
                    .val()
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .unwrap(),
            );
        }
    }
    model.visit(&mut Collect(&mut values));
    values
}

#[test]
fn accumulated_micro_batches_equal_one_batch() {
    let _random = crate::exclusive_random();
    let device = device();
    let rows = rows();
    let model = tiny_model();
    // Parameters initialise lazily: read them once so both clones hold the same values.
    let initial = flat_params(&model);

    let mut whole = constant_lr_training(model.clone(), 3);
    let whole_report = whole
        .train(vec![LmBatch::from_rows(&rows, &device)])
        .unwrap();
    let mut split = constant_lr_training(model.clone(), 3);
    assert!(
        flat_params(&model) == initial,
        "the first step changed the shared model"
    );
    let split_report = split
        .train(vec![
            LmBatch::from_rows(&rows[..1], &device),
            LmBatch::from_rows(&rows[1..], &device),
        ])
        .unwrap();

    assert_eq!(whole_report.tokens, 32);
    assert_eq!(split_report.tokens, 32);
    assert!(
        (whole_report.loss - split_report.loss).abs() < 1e-5,
        "{whole_report:?} vs {split_report:?}"
    );
    assert!(
        (whole_report.grad_norm - split_report.grad_norm).abs() < 1e-5 * whole_report.grad_norm,
        "{whole_report:?} vs {split_report:?}"
    );
    // The norm at this init exceeds 1, so clipping took part in both updates.
    assert!(whole_report.grad_norm > 1.0, "{}", whole_report.grad_norm);
    let max_difference = flat_params(&whole.model())
        .iter()
        .zip(flat_params(&split.model()))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(
        max_difference < 1e-5,
        "parameters differ by {max_difference}"
    );
}

/// Multiplies every parameter by NaN; the products are parameters of their own (leaves of the
/// autodiff graph, as an optimizer step leaves them), not results of the multiplication, whose
/// graph the first backward pass would consume.
struct Poison;

impl ModuleMapper for Poison {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.map(|tensor| tensor.mul_scalar(f32::NAN).detach().require_grad())
    }
}

#[test]
fn non_finite_steps_are_skipped_then_stop_the_run() {
    let _random = crate::exclusive_random();
    let device = device();
    let rows = rows();
    let mut training = constant_lr_training(tiny_model().map(&mut Poison), 3);
    for step in 1..=2 {
        let report = training
            .train(vec![LmBatch::from_rows(&rows, &device)])
            .unwrap();
        assert!(report.skipped);
        assert_eq!(report.step, step);
        assert_eq!(training.progress.skipped_steps, step);
        assert_eq!(training.progress.consecutive_skips, step as u32);
    }
    let error = training
        .train(vec![LmBatch::from_rows(&rows, &device)])
        .unwrap_err();
    assert!(
        matches!(
            error,
            TrainError::NonFinite {
                step: 3,
                count: 3,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("3 consecutive"), "{error}");
}

/// A batch padded to a fixed number of rows has the loss and the gradients of the rows alone:
/// the padding rows' targets are left out.
#[test]
fn padding_rows_change_neither_loss_nor_gradients() {
    let _random = crate::exclusive_random();
    let model = tiny_model();
    let device = device();
    let rows = rows();
    let plain = LmBatch::from_rows(&rows, &device);
    let padded = LmBatch::padded(&rows, 5, &device);
    assert_eq!(padded.inputs.dims(), [5, 16]);
    assert_eq!(padded.tokens(), plain.tokens());

    let gradients = |batch: &LmBatch| {
        let loss = model.loss(batch);
        let value: f32 = loss.clone().into_scalar::<f32>();
        let gradients = loss.backward();
        let head = model
            .hlat
            .lm_head
            .as_ref()
            .unwrap()
            .weight
            .grad(&gradients)
            .unwrap();
        (value, head.into_data().try_to_vec::<f32>().unwrap())
    };
    let (plain_loss, plain_gradient) = gradients(&plain);
    let (padded_loss, padded_gradient) = gradients(&padded);
    assert!(
        (plain_loss - padded_loss).abs() <= 1e-6 * plain_loss.abs(),
        "loss {padded_loss} padded, {plain_loss} plain"
    );
    for (index, (p, q)) in plain_gradient.iter().zip(&padded_gradient).enumerate() {
        assert!(
            (p - q).abs() <= 1e-6 + 1e-5 * p.abs(),
            "head gradient #{index}: {q} padded, {p} plain"
        );
    }
}

/// A token id outside the vocabulary fails the step with the device's error, naming the
/// operation and the id, instead of a panic; the device and the model computed before go on
/// working.
#[test]
fn a_token_outside_the_vocabulary_is_an_error_of_the_step() {
    let _random = crate::exclusive_random();
    let device =
        crate::trainium(TrainiumDevice::new(burn_trainium::ExecutorKind::Host, 5)).autodiff();
    device.seed(11);
    let config = HlatConfig::preset("hlat-test").unwrap();
    let mut training = constant_lr_training(LanguageModel::new(config.init(&device), None), 3);
    training
        .train(vec![LmBatch::from_rows(&rows(), &device)])
        .unwrap();
    let mut rows = rows();
    rows[1][4] = 64;
    let error = training
        .train(vec![LmBatch::from_rows(&rows, &device)])
        .expect_err("token 64 is outside a 64-token vocabulary");
    let message = error.to_string();
    assert!(
        matches!(error, TrainError::Device(_)) && message.contains("index 64"),
        "{message}"
    );
    let report = training
        .train(vec![LmBatch::from_rows(&self::rows(), &device)])
        .unwrap();
    assert!(report.loss.is_finite());
}
