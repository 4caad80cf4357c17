//! Ten AdamW steps from each Hugging Face fixture's weights give the losses torch computed
//! (`fixtures/hf-tiny-*/expected.json`, `train`): Llama 2-style, tied (Llama 3.2-style), biased
//! and tied (Qwen2), q/k norms with YaRN (Qwen3), a sliding window (Mistral), every bias
//! (Llama with `attention_bias` and `mlp_bias`).

use super::fixture;
use burn::tensor::Device;
use hlat::hf::{WeightDtype, import_hf};
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::OptimizerStep;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::parallel::ParallelLayout;
use hlat_train::schedule::WarmupCosine;
use test_support::fixtures::{HF_FIXTURES, expected, token_ids};
use test_support::training::Training;

#[test]
fn ten_adamw_steps_match_torch() {
    for name in HF_FIXTURES {
        ten_adamw_steps_of(name);
    }
}

/// Trains fixture `name` for its ten steps and compares each loss with torch's.
fn ten_adamw_steps_of(name: &str) {
    let expected = expected(name);
    let train = &expected["train"];
    let number = |key: &str| train[key].as_f64().unwrap();
    let rows: Vec<Vec<u32>> = train["batch"]
        .as_array()
        .unwrap()
        .iter()
        .map(token_ids)
        .collect();
    // A mixture of experts trains on the cross-entropy plus its weighted load-balancing loss,
    // which the fixture records as transformers computes it.
    let objective = expected.get("train_with_aux").unwrap_or(train);
    let losses: Vec<f64> = objective["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|loss| loss.as_f64().unwrap())
        .collect();

    // transformers' unweighted load-balancing loss of each step (mixtures only).
    let balance: Option<Vec<f64>> = expected.get("train_with_aux").map(|aux| {
        aux["aux_loss"]
            .as_array()
            .unwrap()
            .iter()
            .map(|loss| loss.as_f64().unwrap())
            .collect()
    });
    let device = Device::flex().autodiff();
    let (_, model) = import_hf(&fixture(name), &device, WeightDtype::F32).unwrap();
    let settings = AdamWSettings {
        beta1: train["betas"][0].as_f64().unwrap(),
        beta2: train["betas"][1].as_f64().unwrap(),
        eps: number("eps"),
        weight_decay: number("weight_decay"),
        exclude_norms_from_weight_decay: false,
    };
    let step = OptimizerStep {
        clip_grad_norm: number("clip_global_norm"),
        seed: 0,
        max_consecutive_skips: 1,
        layout: ParallelLayout::SINGLE,
    };
    let model = LanguageModel::new(model, None);
    let mut training = Training::new(model, settings, WarmupCosine::constant(number("lr")), step);
    for (step, expected) in losses.iter().enumerate() {
        let report = training
            .train(vec![LmBatch::from_rows(&rows, &device)])
            .unwrap();
        assert!(!report.skipped);
        let relative = (report.loss - expected).abs() / expected.abs();
        assert!(
            relative < 1e-3,
            "{name} step {}: loss {} vs torch {expected} (relative {relative:.2e})",
            step + 1,
            report.loss
        );
        let logged = report.load_balancing_loss;
        match &balance {
            Some(balance) => {
                let logged = logged.expect("a mixture logs its load-balancing loss");
                let relative = (logged - balance[step]).abs() / balance[step];
                assert!(
                    relative < 1e-3,
                    "{name} step {}: load-balancing loss {logged} vs torch {}",
                    step + 1,
                    balance[step]
                );
            }
            None => assert_eq!(logged, None, "{name}"),
        }
    }
}
