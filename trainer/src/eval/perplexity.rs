//! Perplexity (`hlat eval perplexity`): `exp` of the mean next-token cross-entropy over every
//! predicted token, rows evaluated independently; bits per byte for text.

use std::path::Path;

use burn::tensor::Device;
use hlat::Hlat;

use super::score::{ScoreRequest, log_likelihoods};
use crate::data::{ShardSet, Split, TextTokenizer, TokenStream};
use crate::error::TrainError;

/// The result of a perplexity evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerplexityReport {
    /// Rows evaluated.
    pub rows: usize,
    /// Tokens predicted (each row's tokens after its first).
    pub tokens: usize,
    /// Their summed negative log-likelihood, in nats.
    pub total_nll: f64,
    /// `exp(total_nll / tokens)`.
    pub perplexity: f64,
    /// For text: `total_nll / ln 2` per byte of the text (every token of it predicted once).
    pub bits_per_byte: Option<f64>,
}

/// The perplexity of `model` on `rows` (each at least 2 tokens, at most the model's context),
/// in batches of `batch_rows` rows; `bytes`, when given, is the length of the text the rows
/// cover, for bits per byte.
pub fn perplexity_of_rows(
    model: &Hlat,
    rows: &[Vec<u32>],
    bytes: Option<usize>,
    batch_rows: usize,
    device: &Device,
) -> Result<PerplexityReport, TrainError> {
    if rows.is_empty() {
        return Err(TrainError::Data("no rows to evaluate".into()));
    }
    let requests: Vec<ScoreRequest> = rows
        .iter()
        .map(|row| ScoreRequest {
            tokens: row.clone(),
            first_scored: 1,
        })
        .collect();
    let likelihoods = log_likelihoods(model, &requests, batch_rows, device)?;
    let tokens: usize = rows.iter().map(|row| row.len() - 1).sum();
    let total_nll = -likelihoods.iter().sum::<f64>();
    Ok(PerplexityReport {
        rows: rows.len(),
        tokens,
        total_nll,
        perplexity: (total_nll / tokens as f64).exp(),
        bits_per_byte: bytes
            .filter(|bytes| *bytes > 0)
            .map(|bytes| total_nll / std::f64::consts::LN_2 / bytes as f64),
    })
}

/// Rows of `text` for a model of `context` tokens: its tokens (no special tokens) in consecutive
/// pieces of `context - 1`, each after the beginning-of-sequence id `bos`, so every token of the
/// text is predicted exactly once.
pub fn text_rows(
    text: &str,
    tokenizer: &TextTokenizer,
    bos: u32,
    context: usize,
) -> Result<Vec<Vec<u32>>, TrainError> {
    if context < 2 {
        return Err(TrainError::Data(format!(
            "a context of {context} tokens leaves none to predict"
        )));
    }
    let tokens = tokenizer
        .encode(text, false)
        .map_err(|error| TrainError::Data(error.to_string()))?;
    if tokens.is_empty() {
        return Err(TrainError::Data("the text has no tokens".into()));
    }
    Ok(tokens
        .chunks(context - 1)
        .map(|piece| std::iter::once(bos).chain(piece.iter().copied()).collect())
        .collect())
}

/// Rows of the validation shards of `folder` (`val-00000.bin`, ...): their tokens in
/// consecutive rows of `context` tokens (a shorter last row is kept when it has 2 tokens or more).
pub fn shard_rows(folder: &Path, context: usize) -> Result<Vec<Vec<u32>>, TrainError> {
    let shards = ShardSet::open_split(folder, Split::Validation)
        .map_err(|error| TrainError::Data(error.to_string()))?;
    let total = shards.num_tokens();
    let mut rows = Vec::with_capacity(total.div_ceil(context.max(1)));
    let mut start = 0;
    while start + 2 <= total {
        let length = context.min(total - start);
        let mut row = vec![0; length];
        shards.copy_tokens(start, &mut row);
        rows.push(row);
        start += length;
    }
    Ok(rows)
}

/// Rows of a JSON list of lists of token ids.
pub fn json_rows(path: &Path) -> Result<Vec<Vec<u32>>, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|error| {
        TrainError::Data(format!(
            "{}: expected a JSON list of lists of token ids: {error}",
            path.display()
        ))
    })
}
