//! Evaluation of a saved model (`hlat eval`): validation loss of a run's data, perplexity of
//! token rows, text or shards, and multiple-choice tasks by log-likelihood; all on a fixed set
//! of programs (rows padded to buckets, batches to a fixed row count).

pub mod choice;
pub mod perplexity;
pub mod score;
mod validation;

pub use choice::{ChoiceReport, ChoiceTask, Question, evaluate_choice};
pub use perplexity::{PerplexityReport, json_rows, perplexity_of_rows, shard_rows, text_rows};
pub use score::{ScoreRequest, bucket_length, log_likelihoods};
pub use validation::{EvalReport, evaluate_checkpoint, evaluate_model, mean_loss};
