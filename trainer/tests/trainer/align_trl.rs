//! Preference alignment against TRL 1.16 (`fixtures/align-tiny-llama3`, made by
//! `fixtures/regenerate_align.py`): records tokenized as TRL's `DPOTrainer` and `ORPOTrainer`
//! tokenize them, plain and conversational; the DPO and ORPO losses and rewards of TRL's first
//! batch from its log-probabilities; those log-probabilities computed by the model here; and ten
//! training steps of each through HLAT's optimizer step.

use std::path::Path;

use burn::tensor::{Device, Int, Tensor, TensorData};
use hlat::Hlat;
use hlat::hf::{WeightDtype, import_hf};
use hlat::parallel::Unsharded;
use hlat_train::align::batch::{chosen_targets, masked_row_sums};
use hlat_train::align::records::extract_prompt;
use hlat_train::align::{
    AlignMethod, DpoLoss, PairLogProbs, PreferenceExample, PreferenceLoss, PreferenceObjective,
    PreferenceTokenizer, dpo, orpo,
};
use hlat_train::data::TextTokenizer;
use hlat_train::finetune::ChatTemplate;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::learner::OptimizerStep;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::parallel::ParallelLayout;
use hlat_train::progress::StepReport;
use hlat_train::schedule::WarmupCosine;
use serde_json::Value;
use test_support::training::Training;

use super::fixture;

fn expected() -> Value {
    let path = fixture("align-tiny-llama3/expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap() as u32)
        .collect()
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|value| value.as_f64().unwrap() as f32)
        .collect()
}

/// The examples of `file` tokenized for `method` with the tokenizer of `tokenizer_dir` (and its
/// chat template, when it has one).
pub(super) fn examples(
    file: &str,
    tokenizer_dir: &str,
    method: AlignMethod,
) -> Vec<PreferenceExample> {
    examples_at(
        &fixture(&format!("align-tiny-llama3/{file}")),
        tokenizer_dir,
        method,
    )
}

/// The records of the file at `path` tokenized for `method` with the fixture tokenizer
/// `tokenizer_dir` (and its chat template).
fn examples_at(path: &Path, tokenizer_dir: &str, method: AlignMethod) -> Vec<PreferenceExample> {
    let tokenizer =
        TextTokenizer::from_file(fixture(&format!("{tokenizer_dir}/tokenizer.json"))).unwrap();
    let config = fixture(&format!("{tokenizer_dir}/tokenizer_config.json"));
    let template = ChatTemplate::from_tokenizer_config(&config).unwrap();
    let eos_id = tokenizer.eos_id().unwrap();
    let eos_text = tokenizer.inner().id_to_token(eos_id).unwrap();
    PreferenceTokenizer {
        tokenizer: tokenizer.inner(),
        template: template.as_ref(),
        bos_id: Some(tokenizer.bos_id().unwrap()),
        eos: (eos_id, &eos_text),
        method,
    }
    .read_file(path)
    .unwrap()
}

/// Each example's ids as TRL stored them for `method`: DPO's prompt and completions, ORPO's
/// whole sequences with the prompt's labels masked.
fn assert_tokenized_as_trl(examples: &[PreferenceExample], tokenized: &Value, method: AlignMethod) {
    let tokenized = tokenized.as_array().unwrap();
    assert_eq!(examples.len(), tokenized.len());
    for (example, trl) in examples.iter().zip(tokenized) {
        let line = example.line;
        match method {
            AlignMethod::Dpo => {
                let prompt = ids(&trl["prompt_ids"]);
                for (side, name) in [(&example.chosen, "chosen"), (&example.rejected, "rejected")] {
                    assert_eq!(&side.ids[..side.prompt_len], prompt, "line {line} prompt");
                    assert_eq!(
                        side.completion(),
                        ids(&trl[format!("{name}_ids")]),
                        "line {line} {name}"
                    );
                }
            }
            AlignMethod::Orpo => {
                for (side, name) in [(&example.chosen, "chosen"), (&example.rejected, "rejected")] {
                    assert_eq!(
                        side.ids,
                        ids(&trl[format!("{name}_input_ids")]),
                        "line {line} {name}"
                    );
                    let masked = trl[format!("{name}_labels")]
                        .as_array()
                        .unwrap()
                        .iter()
                        .take_while(|label| label.as_i64() == Some(-100))
                        .count();
                    assert_eq!(side.prompt_len, masked, "line {line} {name} prompt");
                }
            }
        }
    }
}

/// Plain and conversational records, and records whose prompt is implicit in both completions
/// (plain text, conversations, and UltraFeedback's string prompt beside whole conversations),
/// tokenize as TRL's trainers tokenize them after extracting the prompt. TRL 1.16's DPO trainer
/// fails on the UltraFeedback-style records (it extracts no prompt when the first record has
/// one); they are checked against ORPO's extraction, which this crate applies to both methods.
#[test]
fn preference_records_tokenize_as_trl_does() {
    let expected = expected();
    for (method, key) in [(AlignMethod::Dpo, "dpo"), (AlignMethod::Orpo, "orpo")] {
        let plain = examples("prefs.jsonl", "llama3-tokenizer", method);
        assert_tokenized_as_trl(&plain, &expected[key]["tokenized"], method);
        let chat = examples("prefs-chat.jsonl", "chat-llama3", method);
        assert_tokenized_as_trl(&chat, &expected["chat"][key]["tokenized"], method);
        for (kind, tokenizer) in [
            ("plain", "llama3-tokenizer"),
            ("chat", "chat-llama3"),
            ("ultrafeedback", "chat-llama3"),
        ] {
            let implicit = &expected["implicit"][kind];
            let file = implicit["file"].as_str().unwrap();
            let tokenized = &implicit[key]["tokenized"];
            let found = examples(file, tokenizer, method);
            let extracted = implicit["orpo"]["extracted"].as_array().unwrap();
            assert_eq!(found.len(), extracted.len(), "{file}");
            if kind == "plain" {
                // The extraction itself, character by character, as TRL's.
                let records =
                    std::fs::read_to_string(fixture(&format!("align-tiny-llama3/{file}"))).unwrap();
                for (record, trl) in records.lines().zip(extracted) {
                    let record: Value = serde_json::from_str(record).unwrap();
                    let chars = |key: &str| -> Vec<char> {
                        record[key].as_str().unwrap().chars().collect()
                    };
                    let (chosen, rejected) = (chars("chosen"), chars("rejected"));
                    let at = extract_prompt(&chosen, &rejected, |c| *c == ' ').unwrap();
                    let text = |chars: &[char]| chars.iter().collect::<String>();
                    assert_eq!(
                        [
                            text(&chosen[..at]),
                            text(&chosen[at..]),
                            text(&rejected[at..])
                        ],
                        ["prompt", "chosen", "rejected"].map(|key| trl[key].as_str().unwrap()),
                    );
                }
            }
            match (method, kind) {
                (AlignMethod::Dpo, "ultrafeedback") => {
                    assert!(tokenized.is_null(), "TRL's DPO trainer now accepts {file}");
                    // DPO of ORPO's extraction, written as explicit records.
                    let explicit = tempfile::tempdir().unwrap();
                    let path = explicit.path().join("explicit.jsonl");
                    let lines: Vec<String> = extracted.iter().map(Value::to_string).collect();
                    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
                    let expected = examples_at(&path, tokenizer, method);
                    for (found, expected) in found.iter().zip(&expected) {
                        assert_eq!(
                            (&found.chosen, &found.rejected),
                            (&expected.chosen, &expected.rejected)
                        );
                    }
                }
                _ => assert_tokenized_as_trl(&found, tokenized, method),
            }
        }
    }
}

fn tensor(values: Vec<f32>) -> Tensor<1> {
    let count = values.len();
    Tensor::from_data(TensorData::new(values, [count]), &Device::flex())
}

fn scalar(value: Tensor<1>) -> f32 {
    value.into_data().try_to_vec::<f32>().unwrap()[0]
}

fn assert_close(found: f32, expected: &Value, what: &str) {
    let expected = expected.as_f64().unwrap() as f32;
    assert!(
        (found - expected).abs() <= 1e-5 * expected.abs().max(1.0),
        "{what}: {found}, TRL {expected}"
    );
}

/// The loss and reward metrics against TRL's logged ones.
fn assert_metrics(found: PreferenceLoss, batch: &Value, what: &str) {
    let metrics = &batch["metrics"];
    assert_close(scalar(found.loss), &batch["loss"], &format!("{what} loss"));
    for (value, key) in [
        (found.rewards_chosen, "rewards/chosen"),
        (found.rewards_rejected, "rewards/rejected"),
        (found.margins, "rewards/margins"),
        (found.accuracy, "rewards/accuracies"),
    ] {
        assert_close(scalar(value), &metrics[key], &format!("{what} {key}"));
    }
}

/// From TRL's log-probabilities of its first batch: its losses, rewards, margins and accuracy.
#[test]
fn the_losses_and_rewards_of_trls_first_batch() {
    let expected = expected();
    let batch = &expected["dpo"]["first_batch"];
    let pair = |chosen: &str, rejected: &str| PairLogProbs {
        chosen: tensor(floats(&batch[chosen])),
        rejected: tensor(floats(&batch[rejected])),
    };
    let policy = || pair("policy_chosen_logps", "policy_rejected_logps");
    let reference = || pair("ref_chosen_logps", "ref_rejected_logps");
    assert_metrics(
        dpo(policy(), reference(), 0.1, DpoLoss::Sigmoid),
        batch,
        "dpo",
    );
    let smoothing = &expected["dpo_label_smoothing"];
    let robust = DpoLoss::Robust {
        label_smoothing: smoothing["label_smoothing"].as_f64().unwrap(),
    };
    let loss = dpo(policy(), reference(), 0.1, robust).loss;
    assert_close(
        scalar(loss),
        &smoothing["first_batch_loss"]["robust"],
        "robust loss",
    );
    // TRL 1.16's sigmoid loss ignores label_smoothing: its smoothed run is the plain loss.
    let sigmoid = dpo(policy(), reference(), 0.1, DpoLoss::Sigmoid).loss;
    assert_close(
        scalar(sigmoid.clone()),
        &smoothing["first_batch_loss"]["sigmoid"],
        "sigmoid loss",
    );
    // Conservative DPO (`--label-smoothing` with the sigmoid loss), TRL's sigmoid loss before
    // 1.0: its closed form over the batch's log-ratios.
    let epsilon = 0.2;
    let conservative = DpoLoss::Conservative {
        label_smoothing: epsilon,
    };
    let found = scalar(dpo(policy(), reference(), 0.1, conservative).loss);
    let log_sigmoid = |x: f64| -(1.0 + (-x).exp()).ln();
    let values =
        |key: &str| -> Vec<f64> { floats(&batch[key]).iter().map(|&v| f64::from(v)).collect() };
    let (pc, pr) = (
        values("policy_chosen_logps"),
        values("policy_rejected_logps"),
    );
    let (rc, rr) = (values("ref_chosen_logps"), values("ref_rejected_logps"));
    let losses: Vec<f64> = (0..pc.len())
        .map(|i| {
            let h = 0.1 * ((pc[i] - rc[i]) - (pr[i] - rr[i]));
            -(1.0 - epsilon) * log_sigmoid(h) - epsilon * log_sigmoid(-h)
        })
        .collect();
    let closed_form = losses.iter().sum::<f64>() / losses.len() as f64;
    assert!(
        (f64::from(found) - closed_form).abs() < 1e-5,
        "conservative loss {found}, closed form {closed_form}"
    );
    assert!((closed_form - f64::from(scalar(sigmoid))).abs() > 1e-3);

    let batch = &expected["orpo"]["first_batch"];
    let policy = PairLogProbs {
        chosen: tensor(floats(&batch["chosen_logps"])),
        rejected: tensor(floats(&batch["rejected_logps"])),
    };
    let nll = tensor(vec![batch["nll_loss"].as_f64().unwrap() as f32]);
    let (found, log_odds) = orpo(policy, nll, 0.1);
    assert_close(
        scalar(log_odds),
        &batch["metrics"]["log_odds_chosen"],
        "log odds",
    );
    assert_metrics(found, batch, "orpo");
}

pub(super) fn model(path: &str) -> Hlat {
    import_hf(&fixture(path), &Device::flex(), WeightDtype::F32)
        .unwrap()
        .1
}

/// The per-token log-probabilities `[rows][seq - 1]` of TRL's batch `input_ids` (each row's
/// targets the next ids).
fn token_log_probs(model: &Hlat, batch: &Value) -> Vec<Vec<f32>> {
    let rows: Vec<Vec<u32>> = batch["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    let width = rows[0].len();
    let flat = |range: std::ops::Range<usize>| -> Vec<i64> {
        rows.iter()
            .flat_map(|row| row[range.clone()].iter().map(|&id| id as i64))
            .collect()
    };
    let device = Device::flex();
    let shape = [rows.len(), width - 1];
    let tensor = |range| Tensor::<2, Int>::from_data(TensorData::new(flat(range), shape), &device);
    let log_probs = model
        .token_log_probs_with(tensor(0..width - 1), tensor(1..width), None, &Unsharded)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    log_probs.chunks(width - 1).map(<[f32]>::to_vec).collect()
}

/// Which targets of each row of `batch` `key` keeps (its value at the target's position passes
/// `kept`).
fn target_mask(batch: &Value, key: &str, kept: impl Fn(i64) -> bool) -> Vec<Vec<bool>> {
    batch[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array().unwrap()[1..]
                .iter()
                .map(|value| kept(value.as_i64().unwrap()))
                .collect()
        })
        .collect()
}

/// Each row's sum and count of the log-probabilities `mask` keeps.
fn masked_sums(log_probs: &[Vec<f32>], mask: &[Vec<bool>]) -> Vec<(f32, usize)> {
    log_probs
        .iter()
        .zip(mask)
        .map(|(row, mask)| {
            let kept = row.iter().zip(mask).filter(|(_, kept)| **kept);
            kept.fold((0.0, 0), |(sum, count), (lp, _)| (sum + lp, count + 1))
        })
        .collect()
}

fn assert_all_close(found: &[f32], trl: &[f32], what: &str) {
    assert_eq!(found.len(), trl.len(), "{what}");
    for (index, (found, trl)) in found.iter().zip(trl).enumerate() {
        assert!(
            (found - trl).abs() <= 1e-4 * trl.abs().max(1.0),
            "{what} row {index}: {found}, TRL {trl}"
        );
    }
}

/// Computed by the model here on TRL's first batches: the policy's and the reference's summed
/// completion log-probabilities (DPO), and the policy's mean completion log-probabilities and
/// the chosen rows' negative log-likelihood over every token after BOS, prompt included (ORPO).
#[test]
fn the_models_log_probabilities_of_trls_first_batches() {
    let expected = expected();
    let batch = &expected["dpo"]["first_batch"];
    let completion = target_mask(batch, "completion_mask", |flag| flag == 1);
    for (model, chosen, rejected) in [
        (
            model("hf-tiny-llama3"),
            "policy_chosen_logps",
            "policy_rejected_logps",
        ),
        (
            model("align-tiny-llama3/reference"),
            "ref_chosen_logps",
            "ref_rejected_logps",
        ),
    ] {
        let sums: Vec<f32> = masked_sums(&token_log_probs(&model, batch), &completion)
            .into_iter()
            .map(|(sum, _)| sum)
            .collect();
        let trl = [floats(&batch[chosen]), floats(&batch[rejected])].concat();
        assert_all_close(&sums, &trl, chosen);
    }

    let batch = &expected["orpo"]["first_batch"];
    let log_probs = token_log_probs(&model("hf-tiny-llama3"), batch);
    let labelled = target_mask(batch, "labels", |label| label != -100);
    let means: Vec<f32> = masked_sums(&log_probs, &labelled)
        .into_iter()
        .map(|(sum, count)| sum / count as f32)
        .collect();
    let trl = [
        floats(&batch["chosen_logps"]),
        floats(&batch["rejected_logps"]),
    ]
    .concat();
    assert_all_close(&means, &trl, "orpo mean log-probabilities");
    let pairs = means.len() / 2;
    let attended = target_mask(batch, "attention_mask", |flag| flag == 1);
    let (sum, count) = masked_sums(&log_probs[..pairs], &attended[..pairs])
        .into_iter()
        .fold((0.0, 0), |(sum, count), (part, tokens)| {
            (sum + part, count + tokens)
        });
    assert_eq!(count as u64, batch["nll_tokens"].as_u64().unwrap());
    assert_close(-sum / count as f32, &batch["nll_loss"], "orpo nll");
}

/// A bad record is an error naming the file and its line, and what is wrong.
#[test]
fn bad_preference_records_name_the_file_and_line() {
    let tokenizer = TextTokenizer::from_file(fixture("llama3-tokenizer/tokenizer.json")).unwrap();
    let eos_text = tokenizer.inner().id_to_token(1001).unwrap();
    let records = PreferenceTokenizer {
        tokenizer: tokenizer.inner(),
        template: None,
        bos_id: Some(1000),
        eos: (1001, &eos_text),
        method: AlignMethod::Dpo,
    };
    let good = r#"{"prompt": "a", "chosen": " b", "rejected": " c"}"#;
    let folder = tempfile::tempdir().unwrap();
    for (bad, named) in [
        (r#"{"prompt": "a", "chosen": " b"}"#, "missing `rejected`"),
        (
            r#"{"prompt": "a", "chosen": 3, "rejected": " c"}"#,
            "two strings or two lists of messages",
        ),
        (
            r#"{"chosen": "", "rejected": " c"}"#,
            "no prompt to extract",
        ),
        (
            r#"{"prompt": [{"role": "user", "content": "a"}], "chosen": [{"role": "assistant", "content": "b"}], "rejected": [{"role": "assistant", "content": "c"}]}"#,
            "chat template",
        ),
        ("not json", "not a JSON object"),
    ] {
        let path = folder.path().join("prefs.jsonl");
        std::fs::write(&path, format!("{good}\n\n{bad}\n")).unwrap();
        let error = records.read_file(&path).unwrap_err().to_string();
        assert!(
            error.contains(&format!("{}:3:", path.display())) && error.contains(named),
            "{error}"
        );
    }
}

/// Each row's summed completion log-probability (chosen, rejected, ...) of `examples` under the
/// reference model `reference`, as a DPO run records them before training.
pub(super) fn reference_log_probs(
    reference: &Hlat,
    examples: &[PreferenceExample],
    seq_len: usize,
) -> Vec<f32> {
    let device = Device::flex();
    let objective = PreferenceObjective::Orpo { beta: 0.0 };
    let batch = LmBatch::preference_pairs(&[examples], seq_len, 1001, objective, None, &device);
    let log_probs =
        reference.token_log_probs_with(batch.inputs, batch.targets, batch.ignore_id, &Unsharded);
    let completion = batch.preference.unwrap().completion;
    masked_row_sums(log_probs, completion)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

/// Ten steps of DPO (against the fixture's reference model) and of ORPO through HLAT's optimizer
/// step, as TRL's trainers ran them (torch's AdamW at a constant 1e-3, betas 0.9 and 0.95, no
/// weight decay nor clipping; records 0–3, then 4–7, in turn), give TRL's losses within 1e-3.
#[test]
fn ten_steps_of_dpo_and_orpo_give_trls_losses() {
    let expected = expected();
    for (method, key) in [(AlignMethod::Dpo, "dpo"), (AlignMethod::Orpo, "orpo")] {
        let examples = examples("prefs.jsonl", "llama3-tokenizer", method);
        let seq_len = examples
            .iter()
            .flat_map(|pair| [pair.chosen.ids.len(), pair.rejected.ids.len()])
            .max()
            .unwrap()
            - 1;
        let beta = expected["settings"]["beta"].as_f64().unwrap();
        let (objective, references) = match method {
            AlignMethod::Dpo => (
                PreferenceObjective::Dpo {
                    beta,
                    loss: DpoLoss::Sigmoid,
                },
                Some(reference_log_probs(
                    &model("align-tiny-llama3/reference"),
                    &examples,
                    seq_len,
                )),
            ),
            AlignMethod::Orpo => (PreferenceObjective::Orpo { beta }, None),
        };
        let losses = floats(&expected[key]["train"]["losses"]);
        let run = train(
            &Device::flex().autodiff(),
            (&examples, references.as_deref()),
            (seq_len, objective),
            &as_trl_ran_them(losses.len()),
        );
        for (index, (report, trl)) in run.iter().zip(&losses).enumerate() {
            let loss = report.loss;
            let relative = (loss - *trl as f64).abs() / (*trl as f64).abs();
            assert!(
                relative < 1e-3,
                "{key} step {}: loss {loss}, TRL {trl} (relative {relative:.2e})",
                index + 1,
            );
        }
    }
}

/// The pairs of `steps` steps as TRL's trainers drew them: 0–3, then 4–7, in turn, one
/// micro-batch a step.
fn as_trl_ran_them(steps: usize) -> Vec<Vec<Vec<usize>>> {
    (0..steps)
        .map(|step| {
            let first = 4 * (step % 2);
            vec![(first..first + 4).collect()]
        })
        .collect()
}

/// The reports of `steps` steps (each a list of micro-batches, each the indices of its pairs) of
/// `objective` on the fixture's policy on one replica of `device`: torch's AdamW at a constant
/// 1e-3 (betas 0.9 and 0.95, no weight decay nor clipping), rows of `seq_len` targets.
pub(super) fn train(
    device: &Device,
    (examples, references): (&[PreferenceExample], Option<&[f32]>),
    (seq_len, objective): (usize, PreferenceObjective),
    steps: &[Vec<Vec<usize>>],
) -> Vec<StepReport> {
    let (_, policy) = import_hf(&fixture("hf-tiny-llama3"), device, WeightDtype::F32).unwrap();
    let settings = AdamWSettings {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.0,
        exclude_norms_from_weight_decay: false,
    };
    let step = OptimizerStep {
        clip_grad_norm: 0.0,
        seed: 0,
        max_consecutive_skips: 1,
        layout: ParallelLayout::SINGLE,
    };
    let model = LanguageModel::new(policy, None);
    let mut training = Training::new(model, settings, WarmupCosine::constant(1e-3), step);
    let batch = |indices: &Vec<usize>| {
        let pairs: Vec<PreferenceExample> = indices
            .iter()
            .map(|&index| examples[index].clone())
            .collect();
        let references: Option<Vec<f32>> = references.map(|references| {
            indices
                .iter()
                .flat_map(|&index| references[2 * index..2 * index + 2].iter().copied())
                .collect()
        });
        LmBatch::preference_pairs(
            &[&pairs],
            seq_len,
            1001,
            objective,
            references.as_ref().map(std::slice::from_ref),
            device,
        )
    };
    steps
        .iter()
        .map(|micro_batches| {
            // ORPO's negative log-likelihood is the step's token mean.
            let step_pairs = micro_batches
                .iter()
                .flatten()
                .map(|&index| &examples[index]);
            let nll_targets =
                chosen_targets(step_pairs, seq_len) as f64 / micro_batches.len() as f64;
            let batches = micro_batches
                .iter()
                .map(|indices| {
                    let mut batch = batch(indices);
                    batch.preference.as_mut().unwrap().nll_targets = nll_targets;
                    batch
                })
                .collect();
            training.train(batches).unwrap()
        })
        .collect()
}
