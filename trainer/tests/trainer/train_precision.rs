//! The bf16 precision modes train on the Trainium host executor (NdArray has no bf16): parameters
//! keep their storage dtype and the loss falls as in f32.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{DType, Tensor};
use hlat::HlatConfig;
use hlat_train::config::TrainConfig;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::OptimizerStep;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::precision::{Precision, cast_params};
use hlat_train::schedule::WarmupCosine;

use test_support::training::Training;

fn param_dtypes<M: Module>(model: &M) -> Vec<DType> {
    struct Dtypes(Vec<DType>);
    impl ModuleVisitor for Dtypes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().dtype());
        }
    }
    let mut dtypes = Dtypes(Vec::new());
    model.visit(&mut dtypes);
    dtypes.0
}

fn losses(precision: Precision) -> (Vec<f64>, Vec<DType>) {
    let device = crate::host().autodiff();
    device.seed(5);
    let hlat = HlatConfig::preset("hlat-test").unwrap().init(&device);
    let hlat = cast_params(hlat, precision.param_dtype());
    let recipe = TrainConfig::default();
    let settings = AdamWSettings {
        exclude_norms_from_weight_decay: true,
        ..AdamWSettings::from_config(&recipe)
    };
    let model = LanguageModel::new(hlat, precision.compute_cast());
    let step = OptimizerStep {
        seed: 9,
        max_consecutive_skips: 1,
        ..OptimizerStep::from_config(&recipe)
    };
    let mut training = Training::new(model, settings, WarmupCosine::constant(1e-2), step);
    let rows: Vec<Vec<u32>> = (0..4u32)
        .map(|row| (0..17).map(|i| (i * 5 + row * 11) % 64).collect())
        .collect();
    let losses = (0..8)
        .map(|_| {
            training
                .train(vec![LmBatch::from_rows(&rows, &device)])
                .unwrap()
                .loss
        })
        .collect();
    (losses, param_dtypes(&training.model()))
}

#[test]
fn bf16_modes_train_and_keep_their_storage_dtype() {
    let _random = crate::exclusive_random();
    let (reference, dtypes) = losses(Precision::F32);
    assert!(dtypes.iter().all(|&dtype| dtype == DType::F32));
    for (precision, storage) in [
        (Precision::Bf16StochasticRounding, DType::BF16),
        (Precision::Bf16Mixed, DType::F32),
    ] {
        let (losses, dtypes) = losses(precision);
        assert!(
            dtypes.iter().all(|&dtype| dtype == storage),
            "{precision}: {dtypes:?}"
        );
        // Same start (bf16 rounding of the same weights), same fall, within bf16's precision.
        assert!(
            (losses[0] - reference[0]).abs() < 0.05,
            "{precision}: {losses:?}"
        );
        assert!(losses[7] < losses[0] - 1.0, "{precision}: {losses:?}");
        assert!(
            (losses[7] - reference[7]).abs() < 0.25,
            "{precision}: {losses:?} vs {reference:?}"
        );
    }
}
