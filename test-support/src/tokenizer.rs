//! Hugging Face tokenizers written by hand for tests that need a vocabulary of their own.

use serde_json::{Value, json};

/// A `tokenizer.json` of a word-level model over `vocab` (each word's id) that splits on white
/// space, `unk_token` standing for unknown words, with `post_processor` (`null`: none).
pub fn word_level_json(vocab: Value, unk_token: &str, post_processor: Value) -> Value {
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": post_processor,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": unk_token},
    })
}
