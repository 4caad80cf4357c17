//! The repository's `fixtures/` folder: tiny models and tokenizers the tests load.

use std::path::PathBuf;

/// The tiny Hugging Face checkpoints of `fixtures/` (written by the transformers library) of
/// every family: Llama 2-style, Llama 3.2-style (tied, `llama3` RoPE), Qwen2 (q/k/v biases,
/// tied), Qwen3 (q/k norms, wider heads, YaRN), Mistral (a sliding window shorter than the
/// inputs), Llama with every bias and linear RoPE.
pub const HF_FIXTURES: [&str; 9] = [
    "hf-tiny-llama",
    "hf-tiny-llama3",
    "hf-tiny-qwen2",
    "hf-tiny-qwen3",
    "hf-tiny-mistral",
    "hf-tiny-llama-bias",
    "hf-tiny-mixtral",
    "hf-tiny-qwen2-moe",
    "hf-tiny-qwen3-moe",
];

/// A file or folder of the repository's `fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name)
}

/// What transformers computed for the fixture `name` (its `expected.json`).
pub fn expected(name: &str) -> serde_json::Value {
    let path = fixture(name).join("expected.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// A list of token ids of an `expected.json` (`greedy_prompt`, a row of `train.batch`, …).
pub fn token_ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list of token ids: {value}"))
        .iter()
        .map(|id| id.as_u64().expect("a token id") as u32)
        .collect()
}
