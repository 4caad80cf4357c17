//! `tokenizer.json` through the `tokenizers` crate.

use std::path::Path;

use tokenizers::Tokenizer;

use super::error::HfError;

/// The tokenizer file name of Hugging Face folders (and of native checkpoints).
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Text every tokenizer is made to encode and decode when it is loaded.
const PROBE_TEXT: &str = "Tokenizer check: 123, äöü 你好\n";

/// Reads a `tokenizer.json` and makes it encode and decode `PROBE_TEXT`. A malformed file is
/// an error, including those on which the `tokenizers` crate (0.22) panics instead of returning
/// one (a malformed `decoder` while reading; a template post-processor naming a special token it
/// does not define, at every encoding).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, HfError> {
    let text = std::fs::read_to_string(path).map_err(HfError::io(path))?;
    let malformed = |message: String| HfError::Tokenizer {
        path: path.to_path_buf(),
        message,
    };
    let load_and_probe = || {
        let tokenizer = text.parse::<Tokenizer>()?;
        // An error of the probe is no reason to refuse the file (a vocabulary without an
        // unknown token cannot encode every text); a panic is, since it would recur at use.
        if let Ok(encoding) = tokenizer.encode(PROBE_TEXT, true) {
            let _ = tokenizer.decode(encoding.get_ids(), false);
        }
        Ok::<_, tokenizers::Error>(tokenizer)
    };
    match std::panic::catch_unwind(load_and_probe) {
        Ok(loaded) => loaded.map_err(|error| malformed(error.to_string())),
        Err(panic) => Err(malformed(format!(
            "the tokenizers library failed on it: {}",
            burn_trainium::panic_message(&*panic)
        ))),
    }
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
