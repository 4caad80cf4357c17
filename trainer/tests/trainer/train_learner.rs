//! HLAT's recipe inside burn-train's `Learner` (`TrainingStrategy::Custom(HlatStrategy)`): a
//! Burn `SupervisedTraining` launched with it trains the model exactly as the project's own
//! `Trainer` does on the same micro-batches (gradient accumulation, clipping, the schedule
//! stepped once per optimizer step).

use std::sync::Arc;

use burn::backend::Autodiff;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn::train::{Learner, SupervisedTraining, TrainingStrategy};
use burn_trainium::{Trainium, TrainiumDevice};
use hlat::HlatConfig;
use hlat_train::learner::HlatStrategy;
use hlat_train::optimizer::{AdamWSettings, HlatAdamW};
use hlat_train::parallel::ParallelLayout;
use hlat_train::schedule::{WarmupCosine, WarmupCosineScheduler};
use hlat_train::step::{LanguageModel, LmBatch};
use hlat_train::trainer::Trainer;

/// Deterministic reductions (the host executor), so both runs agree to the bit.
type B = Autodiff<Trainium>;

const ROWS: usize = 8;
const MICRO_BATCH_ROWS: usize = 2;
const ACCUMULATION: usize = 2;

/// Packed rows of 17 tokens become one micro-batch.
#[derive(Clone)]
struct RowBatcher;

impl<Q: Backend> Batcher<Q, Vec<u32>, LmBatch<Q>> for RowBatcher {
    fn batch(&self, rows: Vec<Vec<u32>>, device: &Q::Device) -> LmBatch<Q> {
        LmBatch::from_rows(&rows, device)
    }
}

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
fn parameters<M: Module<Q>, Q: Backend>(model: &M) -> Vec<TensorData> {
    struct Collect(Vec<TensorData>);
    impl<Q: Backend> ModuleVisitor<Q> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Q, D>>) {
            self.0.push(param.val().into_data());
        }
    }
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

#[test]
fn the_learner_with_hlat_strategy_trains_as_the_trainer_does() {
    let device = TrainiumDevice::HOST;
    let config = HlatConfig::preset("hlat-test").unwrap();
    let initial = LanguageModel::new(config.init::<B>(&device), None);
    let initial = initial.clone().load_record(initial.into_record());

    // The project's own loop: two optimizer steps of two micro-batches.
    let mut trainer = Trainer::new(initial.clone(), settings(), schedule(), 1.0, 3, 2);
    let rows = rows();
    for step in rows.chunks(MICRO_BATCH_ROWS * ACCUMULATION) {
        let micro_batches = step
            .chunks(MICRO_BATCH_ROWS)
            .map(|rows| LmBatch::from_rows(rows, &device))
            .collect();
        trainer.train_step(micro_batches).unwrap();
    }
    let expected = parameters(&trainer.model);

    // Burn's Learner with the HLAT strategy, over a Burn data loader of the same rows.
    let train = DataLoaderBuilder::<B, _, _>::new(RowBatcher)
        .batch_size(MICRO_BATCH_ROWS)
        .build(InMemDataset::new(rows.clone()));
    let valid = DataLoaderBuilder::<Trainium, _, _>::new(RowBatcher)
        .batch_size(MICRO_BATCH_ROWS)
        .build(InMemDataset::new(rows[..MICRO_BATCH_ROWS].to_vec()));
    let strategy = HlatStrategy {
        clip_grad_norm: 1.0,
        seed: 3,
        max_consecutive_skips: 2,
        layout: ParallelLayout::SINGLE,
    };
    let learner = Learner::new(
        initial,
        HlatAdamW::new(settings()).init(),
        WarmupCosineScheduler::new(schedule()),
    );
    let folder = tempfile::tempdir().unwrap();
    let result = SupervisedTraining::new(folder.path(), train, valid)
        .with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy)))
        .with_application_logger(None)
        .grads_accumulation(ACCUMULATION)
        .num_epochs(1)
        .launch(learner);

    let actual = parameters(&result.model);
    assert_eq!(actual.len(), expected.len());
    for (index, (actual, expected)) in actual.iter().zip(&expected).enumerate() {
        assert_eq!(actual, expected, "parameter {index}");
    }
}
