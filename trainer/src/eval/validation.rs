//! Validation loss and perplexity of a saved model on a run's validation data (`hlat eval`).

use std::path::Path;

use burn::tensor::Device;
use burn::train::InferenceStep;
use hlat::Hlat;

use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::language_model::{LanguageModel, LmBatch};
use crate::pretrain::{DataChoice, validation_source};

/// The result of an evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalReport {
    /// Mean next-token cross-entropy over the rows.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Rows measured.
    pub rows: usize,
    /// Target tokens measured.
    pub tokens: usize,
}

/// Measures `model` on up to `rows` validation rows of `data`, split and cut as a run with
/// `config` does (`seq_len`, seed and corpus budgets), in batches of `micro_batch_rows` (the
/// last one padded to that size).
pub fn evaluate_model(
    model: Hlat,
    data: &DataChoice,
    config: &TrainConfig,
    rows: usize,
    device: &Device,
) -> Result<EvalReport, TrainError> {
    let seq_len = config.seq_len;
    if seq_len > model.config().max_seq_len {
        return Err(TrainError::Mismatch(format!(
            "seq_len {seq_len} is longer than the model's context of {} tokens",
            model.config().max_seq_len
        )));
    }
    let source = validation_source(data, config)?;
    let rows: Vec<Vec<u32>> = (0..rows.min(source.num_rows()))
        .map(|index| source.row(index))
        .collect();
    if rows.is_empty() {
        return Err(TrainError::Data("the validation data holds no row".into()));
    }
    if let Some(&max) = rows.iter().flatten().max()
        && max as usize >= model.config().vocab_size
    {
        return Err(TrainError::Mismatch(format!(
            "the validation data holds token {max}, the model's vocabulary has {} tokens",
            model.config().vocab_size
        )));
    }
    let model = LanguageModel::new(model, None);
    let tokens = rows.len() * seq_len;
    let loss = mean_loss(&model, &rows, config.micro_batch_rows, device)?;
    Ok(EvalReport {
        loss,
        perplexity: loss.exp(),
        rows: rows.len(),
        tokens,
    })
}

/// Loads any checkpoint `hlat::checkpoint::load_any` accepts (native, Hugging Face, or a run
/// folder) and evaluates it.
pub fn evaluate_checkpoint(
    dir: &Path,
    data: &DataChoice,
    config: &TrainConfig,
    rows: usize,
    device: &Device,
) -> Result<EvalReport, TrainError> {
    let (_, model, _) = hlat::checkpoint::load_any(dir, device)
        .map_err(|error| TrainError::Model(format!("{}: {error}", dir.display())))?;
    evaluate_model(model, data, config, rows, device)
}

/// Mean loss of `model` (in inference mode) over `rows`, in batches of exactly `batch_rows` rows
/// (the last one padded, so every batch has one shape and a compiled device one program), each
/// weighted by its target tokens; a failed read is [`TrainError::Device`].
pub fn mean_loss(
    model: &LanguageModel,
    rows: &[Vec<u32>],
    batch_rows: usize,
    device: &Device,
) -> Result<f64, TrainError> {
    let batch_rows = batch_rows.max(1);
    let mut weighted = 0.0;
    let mut tokens = 0;
    for chunk in rows.chunks(batch_rows) {
        let batch = LmBatch::padded(chunk, batch_rows, device);
        let output = InferenceStep::step(model, batch);
        let batch_tokens = output.tokens;
        let loss = output.read()?.loss;
        weighted += loss * batch_tokens as f64;
        tokens += batch_tokens;
    }
    Ok(weighted / tokens.max(1) as f64)
}
