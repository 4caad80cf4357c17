//! HLAT's recipe inside burn-train's `Learner` (`TrainingStrategy::Custom(HlatStrategy)`): a
//! Burn `SupervisedTraining` launched with it, over a Burn data loader, trains the model exactly
//! as its optimizer step run by hand on the same micro-batches does (what `hlat bench train`
//! measures: gradient accumulation, clipping, the schedule stepped once per optimizer step), on
//! one device and on dp 2 × tp 2 with sequence parallelism and ZeRO-1.

use std::sync::Arc;

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::tensor::{Device, TensorData};
use burn::train::{SupervisedTraining, TrainingStrategy};
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::{Hlat, HlatConfig};
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::{HlatStrategy, LayoutBatcher, OptimizerStep};
use hlat_train::optimizer::AdamWSettings;
use hlat_train::parallel::ParallelLayout;
use hlat_train::schedule::WarmupCosine;

use test_support::training::{EVERY_PARALLELISM, Training};

const ROWS: usize = 16;
const ACCUMULATION: usize = 2;

/// `ROWS` packed rows of 17 tokens.
fn rows() -> Vec<Vec<u32>> {
    (0..ROWS as u32)
        .map(|row| (0..17).map(|i| (row * 31 + i * 7) % 64).collect())
        .collect()
}

fn settings() -> AdamWSettings {
    AdamWSettings {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        exclude_norms_from_weight_decay: true,
    }
}

fn schedule() -> WarmupCosine {
    WarmupCosine {
        peak: 5e-3,
        warmup_steps: 1,
        decay_steps: 1,
        min_ratio: 0.1,
    }
}

/// Every parameter's values, in visiting order.
fn parameters<M: Module>(model: &M) -> Vec<TensorData> {
    test_support::module::parameters(model)
}

/// Two optimizer steps of `ACCUMULATION` micro-batches each, run by hand and by the Learner's
/// training loop, from the same initial model on `device` in `layout`: the trained parameters agree to
/// the bit (joined when the model is split). `device` is served by the host executor:
/// deterministic reductions, so both runs agree to the bit.
fn check(device: TrainiumDevice, layout: ParallelLayout) {
    let _random = crate::exclusive_random();
    let device = &crate::trainium(device).autodiff();
    let config = HlatConfig::preset("hlat-test").unwrap();
    let whole = LanguageModel::new(config.init(device), None);
    let whole = whole.clone().load_record(whole.into_record());
    let initial = match layout.tensor_parallel() {
        Some(parallel) => LanguageModel::sharded(whole.hlat.shard(&parallel), None, parallel),
        None => whole,
    };
    let step = OptimizerStep {
        clip_grad_norm: 1.0,
        seed: 3,
        max_consecutive_skips: 2,
        layout,
    };
    let micro_batch_rows = ROWS / (2 * ACCUMULATION);
    let rows = rows();

    // The optimizer step run by hand.
    let mut training = Training::new(initial.clone(), settings(), schedule(), step);
    for step_rows in rows.chunks(micro_batch_rows * ACCUMULATION) {
        let micro_batches = step_rows
            .chunks(micro_batch_rows)
            .map(|rows| LmBatch::for_layout(rows, &layout, device))
            .collect();
        training.train(micro_batches).unwrap();
    }
    let expected = parameters(&joined(training.model()));

    // Burn's Learner with the HLAT strategy, over a Burn data loader of the same rows.
    let batcher = LayoutBatcher { layout };
    let train = DataLoaderBuilder::new(batcher)
        .batch_size(micro_batch_rows)
        .set_device(device.clone())
        .build(InMemDataset::new(rows.clone()));
    let valid = DataLoaderBuilder::new(batcher)
        .batch_size(micro_batch_rows)
        .set_device(device.clone().inner())
        .build(InMemDataset::new(rows[..micro_batch_rows].to_vec()));
    let strategy = HlatStrategy::new(step, device.clone());
    let learner = step.learner(initial, settings(), schedule());
    let folder = tempfile::tempdir().unwrap();
    let result = SupervisedTraining::new(folder.path(), train, valid)
        .with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy)))
        .with_application_logger(None)
        .grads_accumulation(ACCUMULATION)
        .num_epochs(1)
        .launch(learner);

    let actual = parameters(&joined(result.model));
    assert_eq!(actual.len(), expected.len());
    for (index, (actual, expected)) in actual.iter().zip(&expected).enumerate() {
        assert_eq!(actual, expected, "{layout:?}: parameter {index}");
    }
}

/// The whole model of a possibly split one.
fn joined(model: LanguageModel) -> Hlat {
    match &model.tensor_parallel {
        Some(parallel) => model.hlat.clone().unshard(parallel),
        None => model.hlat,
    }
}

#[test]
fn the_learner_with_hlat_strategy_trains_as_its_step_run_by_hand_does() {
    check(TrainiumDevice::HOST, ParallelLayout::SINGLE);
}

#[test]
fn the_learner_with_hlat_strategy_trains_parallel_layouts_as_its_step_run_by_hand_does() {
    check(
        TrainiumDevice::replicated(ExecutorKind::Host, 4),
        EVERY_PARALLELISM,
    );
}

/// The first token of every row of every micro-batch a loader yields.
fn loader_rows(loader: &dyn burn::data::dataloader::DataLoader<LmBatch>) -> Vec<Vec<i64>> {
    loader
        .iter()
        .map(|batch| {
            let batch = batch.unwrap();
            let [rows, _] = batch.inputs.dims();
            let data = batch.inputs.into_data();
            let ids: Vec<i64> = data.iter::<i64>().collect();
            (0..rows).map(|row| ids[row * 2]).collect()
        })
        .collect()
}

#[test]
fn the_step_loader_replays_the_sampler_and_slices_exactly() {
    use burn::data::dataloader::DataLoader;
    use hlat_train::data::{Sampler, SamplerState};
    use hlat_train::learner::StepLoader;

    let source: Arc<dyn hlat_train::data::RowSource> = Arc::new(crate::data_sampler::Numbered(7));
    let start = SamplerState {
        epoch: 1,
        position: 3,
        seed: 5,
    };
    // 3 steps of 4 rows in micro-batches of 2: 6 micro-batches, drawn across epoch ends.
    let loader = StepLoader::new(
        source.clone(),
        start,
        3,
        4,
        2,
        ParallelLayout::SINGLE,
        Device::flex(),
    )
    .unwrap();
    assert_eq!(loader.accumulation(), 2);
    let all = loader_rows(&loader);
    let mut sampler = Sampler::new(source.clone(), 5).unwrap();
    sampler.restore(start).unwrap();
    let expected: Vec<Vec<i64>> = sampler
        .next_batch(12)
        .chunks(2)
        .map(|rows| rows.iter().map(|row| i64::from(row[0])).collect())
        .collect();
    assert_eq!(all, expected);
    assert_eq!(loader_rows(&loader), all, "a second pass replays the first");
    assert_eq!(loader.sampler_state_after(3), sampler.state());
    // Items count rows: micro-batches 2..5 are rows 4..10.
    assert_eq!(loader.num_items(), 12);
    assert_eq!(
        loader_rows(loader.slice(4, 10).as_ref()),
        all[2..5].to_vec()
    );
    // Rows that do not divide into micro-batches are an error naming the setting.
    let error = StepLoader::new(
        source,
        start,
        1,
        5,
        2,
        ParallelLayout::SINGLE,
        Device::flex(),
    )
    .err()
    .unwrap();
    assert!(error.to_string().contains("rows per step"), "{error}");
}
