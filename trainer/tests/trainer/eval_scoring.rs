//! Perplexity and multiple-choice scoring (`hlat_train::eval`) against what transformers
//! computed for the fixture (`fixtures/hf-tiny-llama/expected.json`): its training loss and its
//! logits at the first positions.

use burn::tensor::Device;
use hlat::Hlat;
use hlat::hf::{WeightDtype, import_hf};
use hlat_train::data::TextTokenizer;
use hlat_train::eval::{
    ChoiceTask, ScoreRequest, bucket_length, evaluate_choice, log_likelihoods, perplexity_of_rows,
};
use serde_json::Value;

use test_support::fixtures::token_ids;

use super::fixture;

fn expected() -> Value {
    test_support::fixtures::expected("hf-tiny-llama")
}

fn model(device: &Device) -> Hlat {
    import_hf(&fixture("hf-tiny-llama"), device, WeightDtype::F32)
        .unwrap()
        .1
}

/// `log_softmax(logits)[token]` in f64.
fn log_probability(logits: &Value, token: u32) -> f64 {
    let logits: Vec<f64> = logits
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let maximum = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let total: f64 = logits.iter().map(|v| (v - maximum).exp()).sum();
    logits[token as usize] - maximum - total.ln()
}

fn perplexity_equals_exp_of_the_fixture_loss(device: &Device) {
    let expected = expected();
    let rows: Vec<Vec<u32>> = expected["train"]["batch"]
        .as_array()
        .unwrap()
        .iter()
        .map(token_ids)
        .collect();
    // transformers' mean cross-entropy of the batch before any step.
    let loss = expected["train"]["losses"][0].as_f64().unwrap();
    // Rows of 33 tokens are padded to the bucket of 64; one row per batch pads the batch too.
    for batch_rows in [1, 3] {
        let report = perplexity_of_rows(&model(device), &rows, None, batch_rows, device).unwrap();
        assert_eq!(report.tokens, 64);
        assert!(
            (report.perplexity / loss.exp() - 1.0).abs() < 1e-5,
            "{} vs {}",
            report.perplexity,
            loss.exp()
        );
    }
}

#[test]
fn perplexity_equals_exp_of_the_fixture_loss_on_flex() {
    perplexity_equals_exp_of_the_fixture_loss(&Device::flex());
}

#[test]
fn perplexity_equals_exp_of_the_fixture_loss_on_host() {
    perplexity_equals_exp_of_the_fixture_loss(&crate::host());
}

#[test]
fn log_likelihoods_of_prefixes_equal_the_fixture_logits() {
    let expected = expected();
    let row = token_ids(&expected["input_ids"][0]);
    let logits = &expected["logits_first_positions"][0];
    let device = Device::flex();
    let model = model(&device);
    // Prefixes of 2 to 5 tokens, scored from their second token, and one scored from its third.
    let mut requests: Vec<ScoreRequest> = (2..=5)
        .map(|length| ScoreRequest {
            tokens: row[..length].to_vec(),
            first_scored: 1,
        })
        .collect();
    requests.push(ScoreRequest {
        tokens: row[..5].to_vec(),
        first_scored: 2,
    });
    let scores = log_likelihoods(&model, &requests, 2, &device).unwrap();
    for (request, score) in requests.iter().zip(scores) {
        let known: f64 = (request.first_scored..request.tokens.len())
            .map(|position| log_probability(&logits[position - 1], request.tokens[position]))
            .sum();
        assert!(
            (score - known).abs() < 1e-4,
            "{request:?}: {score} vs {known}"
        );
    }
    assert_eq!(bucket_length(5, 32), 16);
    assert_eq!(bucket_length(33, 32), 32);
    assert_eq!(bucket_length(100, 4096), 128);
}

/// A word-level tokenizer whose word `wN` is id N (the fixture has no tokenizer of its own).
fn numbered_tokenizer(dir: &std::path::Path) -> TextTokenizer {
    let vocab: serde_json::Map<String, Value> = (0..1024)
        .map(|id| (format!("w{id}"), Value::from(id)))
        .collect();
    let json = test_support::tokenizer::word_level_json(vocab.into(), "w0", Value::Null);
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    TextTokenizer::from_file(&path).unwrap()
}

#[test]
fn multiple_choice_scores_follow_known_log_likelihoods() {
    let expected = expected();
    let logits = &expected["logits_first_positions"][0];
    // After `w203` (the fixture's first token) the fixture knows every next-token probability,
    // and after `w203 w802` those of the token after.
    let choices = ["w802 w2", "w451", "w7"];
    let known = [
        log_probability(&logits[0], 802) + log_probability(&logits[1], 2),
        log_probability(&logits[0], 451),
        log_probability(&logits[0], 7),
    ];
    let work = tempfile::tempdir().unwrap();
    let tokenizer = numbered_tokenizer(work.path());
    let task_path = work.path().join("task.jsonl");
    let lines = [
        serde_json::json!({"context": "w203", "choices": choices, "gold": 0}),
        serde_json::json!({"context": "w203", "choices": [choices[1], choices[2], choices[0]], "gold": 1}),
        serde_json::json!({"context": "w9 w10", "choices": ["w1"], "gold": 0, "split": "train"}),
    ];
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&task_path, text).unwrap();
    let task = ChoiceTask::from_file(&task_path).unwrap();
    assert_eq!((task.questions.len(), task.examples.len()), (2, 1));

    let device = Device::flex();
    let model = model(&device);
    let report = evaluate_choice(&model, &tokenizer, &task, 0, 2, &device).unwrap();
    let orders = [[0, 1, 2], [1, 2, 0]];
    let argmax = |values: &[f64]| {
        (0..values.len()).fold(0, |best, i| if values[i] > values[best] { i } else { best })
    };
    let mut right = 0.0;
    let mut right_normalized = 0.0;
    for ((order, gold), scores) in orders.iter().zip([0, 1]).zip(&report.log_likelihoods) {
        let values: Vec<f64> = order.iter().map(|&i| known[i]).collect();
        for (score, value) in scores.iter().zip(&values) {
            assert!((score - value).abs() < 1e-4, "{score} vs {value}");
        }
        let per_byte: Vec<f64> = order
            .iter()
            .map(|&i| known[i] / choices[i].len() as f64)
            .collect();
        right += f64::from(u8::from(argmax(&values) == gold));
        right_normalized += f64::from(u8::from(argmax(&per_byte) == gold));
    }
    assert_eq!(report.acc, right / 2.0);
    assert_eq!(report.acc_norm, right_normalized / 2.0);
    // Two 0/1 outcomes: the standard error of their mean.
    let stderr = |mean: f64| (mean * (1.0 - mean) * 2.0 / 1.0 / 2.0).sqrt();
    assert!((report.acc_stderr - stderr(report.acc)).abs() < 1e-12);

    // One shot puts the example, with its gold answer, before each question.
    assert_eq!(
        task.prompt(&task.questions[0], 1).unwrap(),
        "w9 w10 w1\n\nw203"
    );
    let error = task.prompt(&task.questions[0], 2).unwrap_err().to_string();
    assert!(
        error.contains("task.jsonl") && error.contains("2 shots"),
        "{error}"
    );
}

#[test]
fn a_bad_task_line_is_refused_with_its_file_and_line() {
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"context\": \"a\", \"choices\": [\"b\"], \"gold\": 0}\n{\"context\": \"a\", \"choices\": [\"b\"], \"gold\": 3}\n",
    )
    .unwrap();
    let error = ChoiceTask::from_file(&path).unwrap_err().to_string();
    assert!(
        error.contains("bad.jsonl:2") && error.contains("gold"),
        "{error}"
    );
}
