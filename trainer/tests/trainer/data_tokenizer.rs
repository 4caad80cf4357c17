//! Tokenizers: the fixtures made by the Python `tokenizers` library (Llama 2, Llama 3, Qwen2),
//! and trained BPE.

use super::fixture;
use hlat_train::data::tokenizer::TRAINED_SPECIAL_TOKENS;
use hlat_train::data::{TOKENIZER_CONFIG_FILE, TextTokenizer};
use tokenizers::AddedToken;
use tokenizers::processors::template::TemplateProcessing;

/// A tokenizer fixture, made (or checked) by the Python `tokenizers` library, with the special
/// tokens its `tokenizer_config.json` names.
struct Fixture {
    name: &'static str,
    vocab_size: usize,
    bos: Option<u32>,
    eos: u32,
    pad: Option<u32>,
    /// Whether documents are encoded word by word (`TextTokenizer::encodes_documents_piecewise`).
    piecewise: bool,
}

const FIXTURES: [Fixture; 3] = [
    // SentencePiece BPE with byte fallback; <s> 1, </s> 2, no padding.
    Fixture {
        name: "llama2-tokenizer",
        vocab_size: 32000,
        bos: Some(1),
        eos: 2,
        pad: None,
        piecewise: true,
    },
    // Byte-level BPE: <|begin_of_text|> 1000 (added by the post-processor), <|end_of_text|> 1001.
    Fixture {
        name: "llama3-tokenizer",
        vocab_size: 1003,
        bos: Some(1000),
        eos: 1001,
        pad: None,
        piecewise: false,
    },
    // Byte-level BPE with NFC: no BOS, <|endoftext|> 1000 as EOS and padding.
    Fixture {
        name: "qwen2-tokenizer",
        vocab_size: 1003,
        bos: None,
        eos: 1000,
        pad: Some(1000),
        piecewise: false,
    },
];

#[test]
fn fixture_tokenizers_match_the_python_tokenizers_library() {
    for fixture in &FIXTURES {
        check_against_python(fixture);
    }
}

/// Checks the tokenizer of a fixture against its `expected.json`: the ids with the
/// post-processor's special tokens, the ids without them, and the text the ids decode to
/// (`expected.json` decodes with Python's default, `skip_special_tokens=True`), the ids of its
/// `documents` as ingest encodes them, then its special tokens.
fn check_against_python(
    &Fixture {
        name,
        vocab_size,
        bos,
        eos,
        pad,
        piecewise,
    }: &Fixture,
) {
    let dir = fixture(name);
    let tokenizer = TextTokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    assert_eq!(expected["add_special_tokens"], true, "{name}");
    let cases = expected["cases"].as_array().unwrap();
    assert!(cases.len() >= 5, "{name}");
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let decoded = case["decoded"].as_str().unwrap();
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(
            tokenizer.encode(text, true).unwrap(),
            ids,
            "{name}: ids of {text:?}"
        );
        // Without special tokens the post-processor's BOS (if any) is absent, and so are the
        // special tokens: the plain decoding gives the text.
        let plain = match bos {
            Some(bos) => {
                assert_eq!(ids[0], bos, "{name}: {text:?}");
                &ids[1..]
            }
            None => &ids[..],
        };
        assert_eq!(
            tokenizer.encode(text, false).unwrap(),
            plain,
            "{name}: {text:?}"
        );
        assert_eq!(
            tokenizer.inner().decode(&ids, true).unwrap(),
            decoded,
            "{name}: decoding of {text:?}"
        );
        assert_eq!(
            tokenizer.decode(plain).unwrap(),
            decoded,
            "{name}: {text:?}"
        );
    }
    // Whole documents without special tokens, as ingest encodes them (Llama 2's word by word).
    let documents = expected["documents"].as_array().unwrap();
    assert!(documents.len() >= 50, "{name}");
    let texts: Vec<&str> = documents
        .iter()
        .map(|document| document["text"].as_str().unwrap())
        .collect();
    let encoded = tokenizer.encode_documents(&texts).unwrap();
    for ((document, text), ids) in documents.iter().zip(&texts).zip(&encoded) {
        let expected: Vec<u32> = serde_json::from_value(document["ids"].clone()).unwrap();
        assert_eq!(ids, &expected, "{name}: document {text:?}");
    }
    assert_eq!(
        tokenizer.encodes_documents_piecewise(),
        piecewise,
        "{name}: how documents are encoded"
    );
    assert_eq!(tokenizer.vocab_size(), vocab_size, "{name}");
    assert_eq!(tokenizer.bos_id().ok(), bos, "{name}: BOS");
    assert_eq!(tokenizer.eos_id().unwrap(), eos, "{name}: EOS");
    assert_eq!(tokenizer.pad_id().ok(), pad, "{name}: padding");
}

/// A folder holding the Llama 3 fixture's `tokenizer.json` (its text edited by `edit`) and, when
/// given, `config` as its `tokenizer_config.json`.
fn llama3_folder(edit: impl FnOnce(String) -> String, config: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let json = std::fs::read_to_string(fixture("llama3-tokenizer/tokenizer.json")).unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), edit(json)).unwrap();
    if let Some(config) = config {
        std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), config).unwrap();
    }
    dir
}

#[test]
fn special_tokens_come_from_the_config_then_the_post_processor_then_the_names() {
    // Llama 3 Instruct's config: the tokens as objects, EOS <|eot_id|> rather than the base
    // model's <|end_of_text|>.
    let instruct = llama3_folder(
        |json| json,
        Some(
            r#"{"bos_token": {"content": "<|begin_of_text|>", "lstrip": false},
                "eos_token": {"content": "<|eot_id|>", "special": true},
                "pad_token": "<|end_of_text|>"}"#,
        ),
    );
    let tokenizer = TextTokenizer::from_file(instruct.path().join("tokenizer.json")).unwrap();
    let ids = [tokenizer.bos_id(), tokenizer.eos_id(), tokenizer.pad_id()];
    assert_eq!(ids.map(Result::unwrap), [1000, 1002, 1001]);
    assert!(tokenizer.config_json().unwrap().contains("<|eot_id|>"));

    // A tokenizer.json alone: BOS from its post-processor, EOS by its name.
    let alone = llama3_folder(|json| json, None);
    let tokenizer = TextTokenizer::from_file(alone.path().join("tokenizer.json")).unwrap();
    assert_eq!(tokenizer.bos_id().unwrap(), 1000);
    assert_eq!(tokenizer.eos_id().unwrap(), 1001);
    assert!(tokenizer.pad_id().is_err());
    assert_eq!(tokenizer.config_json(), None);

    // The post-processor's tokens win over the usual names: before the text BOS, after it EOS.
    let mut inner = tokenizer.inner().clone();
    inner.add_special_tokens(&[
        AddedToken::from("<start>", true),
        AddedToken::from("<stop>", true),
    ]);
    let (start, stop) = (
        inner.token_to_id("<start>").unwrap(),
        inner.token_to_id("<stop>").unwrap(),
    );
    let template = TemplateProcessing::builder()
        .try_single("<start> $A <stop>")
        .unwrap()
        .special_tokens(vec![("<start>", start), ("<stop>", stop)])
        .build()
        .unwrap();
    inner.with_post_processor(Some(template));
    let tokenizer = TextTokenizer::from(inner);
    assert_eq!((start, stop), (1003, 1004));
    assert_eq!(tokenizer.bos_id().unwrap(), start);
    assert_eq!(tokenizer.eos_id().unwrap(), stop);
}

#[test]
fn a_tokenizer_without_eos_or_with_a_bad_config_is_an_error_naming_the_files() {
    let message = |dir: &tempfile::TempDir| {
        let tokenizer = dir.path().join("tokenizer.json");
        let config = dir.path().join(TOKENIZER_CONFIG_FILE);
        let error = match TextTokenizer::from_file(&tokenizer) {
            Ok(loaded) => loaded.eos_id().unwrap_err(),
            Err(error) => error,
        };
        (
            error.to_string(),
            tokenizer.display().to_string(),
            config.display().to_string(),
        )
    };

    // No config, and no token the post-processor puts after the text or of a usual name.
    let dir = llama3_folder(|json| json.replace("<|end_of_text|>", "<|end|>"), None);
    let (error, tokenizer, _) = message(&dir);
    assert!(
        error.contains(&format!("{tokenizer} has no EOS token"))
            && error.contains("no tokenizer_config.json beside it names one")
            && error.contains("<|end_of_text|>"),
        "{error}"
    );

    // A config that sets no EOS.
    let dir = llama3_folder(|json| json, Some(r#"{"eos_token": null}"#));
    let (error, tokenizer, config) = message(&dir);
    assert!(
        error.contains(&format!("{tokenizer} has no EOS token"))
            && error.contains(&format!("{config} sets `eos_token` to null")),
        "{error}"
    );

    // A config naming a token the tokenizer does not hold, or malformed.
    for (text, problem) in [
        (
            r#"{"eos_token": "</s>"}"#,
            r#"`eos_token` "</s>" is not a token of"#,
        ),
        (r#"{"eos_token": 5}"#, "`eos_token` is 5, not a token"),
        (r#"{"eos_token": {"id": 5}}"#, "without a string `content`"),
        ("[]", "not a JSON object"),
        ("{", "not JSON"),
    ] {
        let dir = llama3_folder(|json| json, Some(text));
        let (error, _, config) = message(&dir);
        assert!(
            error.starts_with(&format!("{config}: ")) && error.contains(problem),
            "{text}: {error}"
        );
    }
}

fn corpus() -> Vec<String> {
    (0..200)
        .map(|i| {
            format!(
                "The cat number {i} sat on the mat. The dog {} barked.\n",
                i * 7
            )
        })
        .collect()
}

#[test]
fn trained_byte_level_bpe_round_trips_and_adds_bos() {
    let tokenizer = TextTokenizer::train_byte_level_bpe(&corpus(), 300).unwrap();
    assert_eq!(tokenizer.vocab_size(), 300);
    let ids: Vec<u32> = TRAINED_SPECIAL_TOKENS
        .iter()
        .map(|token| tokenizer.encode(token, false).unwrap()[0])
        .collect();
    assert_eq!(ids, [0, 1, 2]);
    assert_eq!(tokenizer.pad_id().unwrap(), 0);
    assert_eq!(tokenizer.bos_id().unwrap(), 1);
    assert_eq!(tokenizer.eos_id().unwrap(), 2);
    // Any text, unseen bytes included, decodes back exactly.
    let text = "The cat sat.  Ünïcödé 🚀\n\ttab";
    let with_bos = tokenizer.encode(text, true).unwrap();
    assert_eq!(with_bos[0], 1);
    assert_eq!(with_bos[1..], tokenizer.encode(text, false).unwrap());
    assert_eq!(tokenizer.decode(&with_bos[1..]).unwrap(), text);
    // Frequent words became single tokens: far fewer ids than bytes.
    assert!(
        tokenizer
            .encode(" The cat sat on the mat.", false)
            .unwrap()
            .len()
            <= 8
    );
}

#[test]
fn training_is_deterministic_and_survives_saving() {
    let first = TextTokenizer::train_byte_level_bpe(&corpus(), 320).unwrap();
    let second = TextTokenizer::train_byte_level_bpe(&corpus(), 320).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    first.save(&path).unwrap();
    let loaded = TextTokenizer::from_file(&path).unwrap();
    for text in ["The dog 63 barked.", "mat sat cat", "x"] {
        let ids = first.encode(text, true).unwrap();
        assert_eq!(second.encode(text, true).unwrap(), ids);
        assert_eq!(loaded.encode(text, true).unwrap(), ids);
    }
}

#[test]
fn too_small_vocabulary_and_missing_file_are_errors() {
    let error = TextTokenizer::train_byte_level_bpe(&corpus(), 100)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("vocabulary size") && error.contains("100"),
        "{error}"
    );
    let error = TextTokenizer::from_file("/nonexistent/tokenizer.json")
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("/nonexistent/tokenizer.json"), "{error}");
}
