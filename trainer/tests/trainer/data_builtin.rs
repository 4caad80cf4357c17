//! The built-in corpus, its tokenizer and its rows.

use hlat_train::data::{
    BuiltinDataConfig, RowSource, builtin_dataset, builtin_document, default_tokenizer,
};

#[test]
fn documents_are_reproducible_english_like_text_with_fixed_facts() {
    assert_eq!(builtin_document(1, 5), builtin_document(1, 5));
    assert_ne!(builtin_document(1, 5), builtin_document(1, 6));
    assert_ne!(builtin_document(1, 5), builtin_document(2, 5));
    let text: String = (0..300).map(|index| builtin_document(9, index)).collect();
    assert!(text.is_ascii());
    // Facts hold everywhere: Alice always lives in the same city.
    let cities: std::collections::BTreeSet<&str> = text
        .match_indices("Alice lives in ")
        .map(|(at, prefix)| text[at + prefix.len()..].split('.').next().unwrap())
        .collect();
    assert_eq!(cities.len(), 1, "{cities:?}");
    // Additions are correct.
    for sentence in text.split(". ").filter(|s| s.contains(" plus ")) {
        let words: Vec<&str> = sentence.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "plus").unwrap();
        let number = |word: &str| word.trim_end_matches('.').parse::<u64>().unwrap();
        assert_eq!(
            number(words[at - 1]) + number(words[at + 1]),
            number(words[at + 3])
        );
    }
}

#[test]
fn the_default_tokenizer_is_deterministic_and_compresses_the_corpus() {
    let first = default_tokenizer().unwrap();
    let second = default_tokenizer().unwrap();
    assert_eq!(first.vocab_size(), 512);
    let document: String = (0..50).map(|index| builtin_document(123, index)).collect();
    let ids = first.encode(&document, false).unwrap();
    assert_eq!(second.encode(&document, false).unwrap(), ids);
    assert_eq!(first.decode(&ids).unwrap(), document);
    assert!(
        ids.len() * 3 < document.len(),
        "{} ids for {} bytes",
        ids.len(),
        document.len()
    );
    assert_eq!(
        (
            first.pad_id().unwrap(),
            first.bos_id().unwrap(),
            first.eos_id().unwrap()
        ),
        (0, 1, 2)
    );
}

#[test]
fn the_dataset_packs_train_and_validation_rows_from_separate_documents() {
    let config = BuiltinDataConfig {
        seq_len: 64,
        train_tokens: 20_000,
        validation_tokens: 2_000,
        seed: 3,
    };
    let data = builtin_dataset(&config).unwrap();
    assert_eq!(data.train.row_len(), 65);
    assert!(data.train.num_rows() >= 20_000 / 65);
    assert!(data.validation.num_rows() >= 2_000 / 65);
    let eos = data.tokenizer.eos_id().unwrap();
    let documents = |rows: &dyn RowSource| -> Vec<String> {
        let tokens: Vec<u32> = (0..rows.num_rows()).flat_map(|i| rows.row(i)).collect();
        tokens
            .split(|&t| t == eos)
            .skip(1) // the first and last pieces may be cut by the row boundaries
            .collect::<Vec<_>>()
            .split_last()
            .unwrap()
            .1
            .iter()
            .map(|ids| data.tokenizer.decode(ids).unwrap())
            .collect()
    };
    let train = documents(&data.train);
    let validation = documents(&data.validation);
    assert!(validation.len() >= 5);
    assert!(train.iter().all(|d| d.starts_with("A story about ")));
    let held_out = |document: &String| train.contains(document);
    assert!(
        validation.iter().filter(|d| held_out(d)).count() * 10 < validation.len(),
        "validation documents are mostly absent from training"
    );
    let again = builtin_dataset(&config).unwrap();
    assert_eq!(again.train.row(7), data.train.row(7));
}

#[test]
fn budgets_below_one_row_are_errors() {
    let config = BuiltinDataConfig {
        seq_len: 64,
        train_tokens: 20_000,
        validation_tokens: 10,
        seed: 3,
    };
    let error = builtin_dataset(&config).err().unwrap().to_string();
    assert!(error.contains("validation token budget"), "{error}");
}
