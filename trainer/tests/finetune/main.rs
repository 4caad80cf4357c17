//! Supervised fine-tuning data: the chat template against transformers' `apply_chat_template`
//! (`fixtures/chat-llama3`, made by `fixtures/regenerate_finetune.py chat`), the loss masks of
//! prompt/completion and conversation records, bad records named by file and line, the masked
//! loss against a hand-computed cross-entropy, and a batch of padded rows against its examples
//! one by one.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use hlat::hf::{WeightDtype, import_hf, load_tokenizer};
use hlat_train::finetune::{ChatTemplate, Message, SftExample, SftRows, SftTokenizer, bucket_len};
use hlat_train::language_model::{LanguageModel, LmBatch};
use serde_json::Value;
use test_support::fixtures::{fixture, token_ids};
use tokenizers::Tokenizer;

const EOT: u32 = 1002;

fn tokenizer() -> Tokenizer {
    load_tokenizer(&fixture("chat-llama3/tokenizer.json")).unwrap()
}

fn template() -> ChatTemplate {
    ChatTemplate::from_tokenizer_config(&fixture("chat-llama3/tokenizer_config.json"))
        .unwrap()
        .unwrap()
}

/// The chat fixture's tokenizer and template, which fine-tuning reads records with.
struct ChatFixture {
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

impl ChatFixture {
    fn load() -> Self {
        Self {
            tokenizer: tokenizer(),
            template: template(),
        }
    }

    /// The fixture's record reader, `<|eot_id|>` ending each example.
    fn sft(&self) -> SftTokenizer<'_> {
        SftTokenizer {
            tokenizer: &self.tokenizer,
            template: Some(&self.template),
            eos_id: EOT,
        }
    }
}

#[test]
fn the_llama3_template_renders_as_transformers_does() {
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("chat-llama3/expected.json")).unwrap(),
    )
    .unwrap();
    let template = template();
    let tokenizer = tokenizer();
    for conversation in expected["conversations"].as_array().unwrap() {
        let messages: Vec<Message> =
            serde_json::from_value(conversation["messages"].clone()).unwrap();
        let text = template.render(&messages, false).unwrap();
        assert_eq!(text, conversation["text"].as_str().unwrap());
        let prompt = template.render(&messages, true).unwrap();
        assert_eq!(
            prompt,
            conversation["text_generation_prompt"].as_str().unwrap()
        );
        let ids = token_ids(&conversation["ids"]);
        assert_eq!(tokenizer.encode(text, false).unwrap().get_ids(), ids);
    }
}

fn write(dir: &Path, lines: &[&str]) -> PathBuf {
    let path = dir.join("data.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn trained_text(tokenizer: &Tokenizer, example: &SftExample) -> String {
    let ids: Vec<u32> = example
        .ids
        .iter()
        .zip(&example.trained)
        .filter(|(_, trained)| **trained)
        .map(|(&id, _)| id)
        .collect();
    tokenizer.decode(&ids, false).unwrap()
}

#[test]
fn only_completions_and_assistant_messages_are_trained_on() {
    let chat_fixture = ChatFixture::load();
    let (tokenizer, template) = (&chat_fixture.tokenizer, &chat_fixture.template);
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        &[
            r#"{"prompt": "The capital of France is", "completion": " Paris."}"#,
            "",
            r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "Seven."}, {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Two."}]}"#,
        ],
    );
    let examples = chat_fixture.sft().read_file(&path).unwrap();
    assert_eq!(examples.len(), 2);
    let (completion, chat) = (&examples[0], &examples[1]);
    assert_eq!((completion.line, chat.line), (1, 3));

    // The prompt (with BOS) is not trained on; the completion and EOS are.
    let prompt_ids = tokenizer.encode("The capital of France is", true).unwrap();
    let prompt_len = prompt_ids.get_ids().len();
    assert_eq!(&completion.ids[..prompt_len], prompt_ids.get_ids());
    assert!(completion.trained[..prompt_len].iter().all(|t| !t));
    assert!(completion.trained[prompt_len..].iter().all(|&t| t));
    assert_eq!(*completion.ids.last().unwrap(), EOT);
    assert_eq!(trained_text(tokenizer, completion), " Paris.<|eot_id|>");

    // Each assistant message's content and the end of its turn, nothing else.
    assert_eq!(
        trained_text(tokenizer, chat),
        "Seven.<|eot_id|>Two.<|eot_id|>"
    );
    let text = template
        .render(
            &serde_json::from_str::<Vec<Message>>(
                r#"[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "Seven."}, {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Two."}]"#,
            )
            .unwrap(),
            false,
        )
        .unwrap();
    assert_eq!(chat.ids, tokenizer.encode(text, false).unwrap().get_ids());
}

#[test]
fn bad_records_name_the_file_and_line() {
    let chat_fixture = ChatFixture::load();
    let sft = chat_fixture.sft();
    let good = r#"{"prompt": "a", "completion": " b"}"#;
    let dir = tempfile::tempdir().unwrap();
    for (record, expected) in [
        (r#"{"prompt": "a"}"#, "missing `completion`"),
        (r#"{"completion": "a"}"#, "missing `prompt`"),
        (
            r#"{"prompt": "a", "completion": 3}"#,
            "`completion` must be a string",
        ),
        (
            r#"{"prompt": "a", "completion": ""}"#,
            "tokenizes to nothing",
        ),
        (
            r#"{"messages": [{"role": "robot", "content": "hi"}]}"#,
            "unknown role `robot`",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
            "no assistant message",
        ),
        (r#"{"messages": [{"role": "user"}]}"#, "no string `content`"),
        ("not json", "not a JSON object"),
    ] {
        let path = write(dir.path(), &[good, record]);
        let error = sft.read_file(&path).unwrap_err().to_string();
        let place = format!("{}:2: ", path.display());
        assert!(
            error.starts_with(&place) && error.contains(expected),
            "{record}: {error}"
        );
    }
    // Conversations without a template.
    let plain = SftTokenizer {
        template: None,
        ..sft
    };
    let path = write(
        dir.path(),
        &[
            r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}"#,
        ],
    );
    let error = plain.read_file(&path).unwrap_err().to_string();
    assert!(
        error.contains(":1: ") && error.contains("--chat-template"),
        "{error}"
    );
}

fn examples() -> Vec<SftExample> {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        &[
            r#"{"prompt": "Once upon a time", "completion": " there was a tiny model."}"#,
            r#"{"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello there."}]}"#,
            r#"{"prompt": "Two plus two is", "completion": " four"}"#,
        ],
    );
    ChatFixture::load().sft().read_file(&path).unwrap()
}

fn model() -> LanguageModel {
    let (_, hlat) = import_hf(
        &fixture("hf-tiny-llama3"),
        &Device::flex(),
        WeightDtype::F32,
    )
    .unwrap();
    LanguageModel::new(hlat, None)
}

/// The masked mean cross-entropy computed on the host in f64 from the model's logits.
fn hand_computed(model: &LanguageModel, examples: &[SftExample]) -> (f64, usize) {
    let (mut total, mut count) = (0.0f64, 0usize);
    for example in examples {
        let inputs: Vec<i32> = example.ids.iter().map(|&id| id as i32).collect();
        let seq = inputs.len();
        let logits = model
            .hlat
            .forward(Tensor::<2, Int>::from_data(
                TensorData::new(inputs, [1, seq]),
                &Device::flex(),
            ))
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let vocab = logits.len() / seq;
        for position in 1..seq {
            if !example.trained[position] {
                continue;
            }
            let row = &logits[(position - 1) * vocab..position * vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            let target = row[example.ids[position] as usize] as f64;
            total += sum.ln() + max - target;
            count += 1;
        }
    }
    (total / count as f64, count)
}

fn batch_loss(model: &LanguageModel, rows: &SftRows) -> f64 {
    let batch = LmBatch::from_rows(rows.rows(), &Device::flex());
    model.loss(&batch).into_scalar::<f32>() as f64
}

#[test]
fn the_masked_loss_is_the_hand_computed_masked_cross_entropy() {
    let examples = examples();
    let model = model();
    let seq_len = bucket_len(examples.iter().map(|example| example.ids.len()), 64);
    assert_eq!(seq_len, 32);
    let (rows, dropped) = SftRows::new(&examples, seq_len, 0);
    assert_eq!(dropped, 0);
    let (expected, count) = hand_computed(&model, &examples);
    assert_eq!(rows.trained_tokens(), count);
    let loss = batch_loss(&model, &rows);
    assert!(
        (loss - expected).abs() < 1e-5,
        "batch loss {loss} vs hand-computed {expected}"
    );
}

#[test]
fn a_batch_of_padded_rows_equals_its_examples_one_by_one() {
    let examples = examples();
    let model = model();
    let seq_len = bucket_len(examples.iter().map(|example| example.ids.len()), 64);
    let (rows, _) = SftRows::new(&examples, seq_len, 0);
    let together = batch_loss(&model, &rows) * rows.trained_tokens() as f64;
    let mut apart = 0.0;
    for example in &examples {
        // Each alone, unpadded: the row is the example itself.
        let (row, _) = SftRows::new(std::slice::from_ref(example), example.ids.len() - 1, 0);
        apart += batch_loss(&model, &row) * row.trained_tokens() as f64;
    }
    assert!(
        (together - apart).abs() < 1e-4 * apart.abs(),
        "summed losses {together} vs {apart}"
    );
}
