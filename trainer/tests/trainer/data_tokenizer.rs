//! Tokenizers: the Llama-2 fixture made by the Python `tokenizers` library, and trained BPE.

use super::fixture;
use hlat_train::data::TextTokenizer;
use hlat_train::data::tokenizer::TRAINED_SPECIAL_TOKENS;

#[test]
fn llama2_ids_match_the_python_tokenizers_library() {
    let tokenizer = TextTokenizer::from_file(fixture("llama2-tokenizer/tokenizer.json")).unwrap();
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("llama2-tokenizer/expected.json")).unwrap())
            .unwrap();
    assert_eq!(expected["add_special_tokens"], true);
    let cases = expected["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(
            tokenizer.encode(text, true).unwrap(),
            ids,
            "ids of {text:?}"
        );
        // Without special tokens the post-processor's BOS is absent.
        assert_eq!(tokenizer.encode(text, false).unwrap(), ids[1..], "{text:?}");
        let decoded = tokenizer.decode(&ids[1..]).unwrap();
        assert_eq!(decoded, case["decoded"].as_str().unwrap());
    }
    assert_eq!(tokenizer.vocab_size(), 32000);
    assert_eq!(tokenizer.bos_id().unwrap(), 1);
    assert_eq!(tokenizer.eos_id().unwrap(), 2);
    assert!(tokenizer.pad_id().is_err(), "Llama-2 has no padding token");
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
