//! `tokenizer.json` through the `tokenizers` crate.

use std::path::Path;

use tokenizers::Tokenizer;

use super::error::HfError;

/// The tokenizer file name of Hugging Face folders (and of native checkpoints).
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Reads a `tokenizer.json`.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, HfError> {
    Tokenizer::from_file(path).map_err(|error| HfError::Tokenizer {
        path: path.to_path_buf(),
        message: error.to_string(),
    })
}

/// Reads `DIR/tokenizer.json` when the folder has one.
pub fn find_tokenizer(dir: &Path) -> Result<Option<Tokenizer>, HfError> {
    let path = dir.join(TOKENIZER_FILE);
    if path.is_file() {
        load_tokenizer(&path).map(Some)
    } else {
        Ok(None)
    }
}

/// Writes `tokenizer` as `DIR/tokenizer.json`.
pub fn save_tokenizer(tokenizer: &Tokenizer, dir: &Path) -> Result<(), HfError> {
    let path = dir.join(TOKENIZER_FILE);
    tokenizer
        .save(&path, false)
        .map_err(|error| HfError::Tokenizer {
            path,
            message: error.to_string(),
        })
}
