//! Log-likelihoods of token sequences on a fixed set of programs: rows are padded on the right
//! to a few bucket lengths (powers of two from 16 up to the model's context) and batched in a
//! fixed number of rows, so a compiled device compiles one program per bucket whatever the
//! data. Padding comes after every scored token, where causal attention keeps it from changing
//! them, and is left out of the sums.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use hlat::Hlat;

use crate::error::TrainError;

/// The shortest bucket length.
pub const SHORTEST_BUCKET: usize = 16;

/// A sequence to score: the log-likelihood of `tokens[first_scored..]`, each token given the
/// ones before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoreRequest {
    /// The whole sequence.
    pub tokens: Vec<u32>,
    /// The first scored position (at least 1: the first token has nothing before it).
    pub first_scored: usize,
}

/// The length a row of `length` tokens is padded to: the next power of two from
/// [`SHORTEST_BUCKET`], at most `context`.
pub fn bucket_length(length: usize, context: usize) -> usize {
    length.max(SHORTEST_BUCKET).next_power_of_two().min(context)
}

/// The summed natural-log likelihood of each request's scored tokens, in order, computed in
/// batches of `batch_rows` rows of one bucket length.
pub fn log_likelihoods(
    model: &Hlat,
    requests: &[ScoreRequest],
    batch_rows: usize,
    device: &Device,
) -> Result<Vec<f64>, TrainError> {
    let context = model.config().max_seq_len;
    let vocab = model.config().vocab_size;
    for (index, request) in requests.iter().enumerate() {
        let length = request.tokens.len();
        if request.first_scored == 0 || request.first_scored >= length {
            return Err(TrainError::Data(format!(
                "sequence {index}: {length} tokens with the first scored at {} leave nothing to \
                 score (a sequence needs a token before each scored one)",
                request.first_scored
            )));
        }
        if length > context {
            return Err(TrainError::Data(format!(
                "sequence {index} has {length} tokens, longer than the model's context of \
                 {context}"
            )));
        }
        if let Some(&token) = request
            .tokens
            .iter()
            .find(|&&token| token as usize >= vocab)
        {
            return Err(TrainError::Data(format!(
                "sequence {index} holds token {token}, the model's vocabulary has {vocab} tokens"
            )));
        }
    }
    let batch_rows = batch_rows.max(1);
    let mut results = vec![0.0; requests.len()];
    // Requests grouped by bucket, in order within each.
    let mut buckets: Vec<(usize, Vec<usize>)> = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        let bucket = bucket_length(request.tokens.len(), context);
        match buckets.iter_mut().find(|(length, _)| *length == bucket) {
            Some((_, members)) => members.push(index),
            None => buckets.push((bucket, vec![index])),
        }
    }
    for (length, members) in buckets {
        for chunk in members.chunks(batch_rows) {
            // 32-bit ids, as the training batches hold them.
            let mut inputs = vec![0i32; batch_rows * length];
            let mut targets = vec![0i32; batch_rows * length];
            for (row, &index) in chunk.iter().enumerate() {
                let tokens = &requests[index].tokens;
                for (position, &token) in tokens.iter().enumerate() {
                    inputs[row * length + position] = token as i32;
                    if position > 0 {
                        targets[row * length + position - 1] = token as i32;
                    }
                }
            }
            let shape = [batch_rows, length];
            let inputs = Tensor::<2, Int>::from_data(TensorData::new(inputs, shape), device);
            let targets = Tensor::<2, Int>::from_data(TensorData::new(targets, shape), device);
            let logits = model.forward(inputs).cast(burn::tensor::DType::F32);
            let chosen = log_softmax(logits, 2)
                .gather(2, targets.unsqueeze_dim::<3>(2))
                .reshape(shape);
            let values = chosen
                .try_into_data()?
                .convert::<f32>()
                .try_to_vec::<f32>()
                .map_err(|error| TrainError::Data(format!("reading scores: {error:?}")))?;
            for (row, &index) in chunk.iter().enumerate() {
                let request = &requests[index];
                // Position p predicts token p + 1.
                results[index] = (request.first_scored - 1..request.tokens.len() - 1)
                    .map(|position| f64::from(values[row * length + position]))
                    .sum();
            }
        }
    }
    Ok(results)
}
