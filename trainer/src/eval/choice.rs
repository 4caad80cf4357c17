//! Multiple-choice evaluation by log-likelihood (`hlat eval choice`), scored as
//! lm-evaluation-harness scores `multiple_choice` tasks.
//!
//! A task file is JSONL, one question per line: `{"context": "...", "choices": ["...", ...],
//! "gold": INDEX}`, optionally `"split": "train"` for the questions few-shot examples are taken
//! from (the others are evaluated). Each choice is scored as the continuation `" " + choice` of
//! the prompt (the harness's default target delimiter); the prompt is the first `shots`
//! few-shot questions, each written `context + " " + gold choice`, joined and followed by the
//! question's context with blank lines (`"\n\n"`). `acc` is the share of questions whose highest
//! summed continuation log-likelihood is the gold choice; `acc_norm` divides each
//! log-likelihood by the choice's length in bytes first. Standard errors are those of a mean of
//! 0/1 values (sample standard deviation over √n).

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use hlat::Hlat;
use serde::Deserialize;

use super::score::{ScoreRequest, log_likelihoods};
use crate::data::TextTokenizer;
use crate::error::TrainError;

/// One question of a task file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// The text before the answer.
    pub context: String,
    /// The candidate answers.
    pub choices: Vec<String>,
    /// The index of the right one.
    pub gold: usize,
    /// `"train"` for few-shot examples; evaluated otherwise.
    #[serde(default)]
    pub split: Option<String>,
}

/// A task: the questions evaluated and the few-shot pool.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceTask {
    /// The file it was read from.
    pub path: PathBuf,
    /// The questions evaluated, in file order.
    pub questions: Vec<Question>,
    /// The few-shot examples (`"split": "train"`), in file order.
    pub examples: Vec<Question>,
}

impl ChoiceTask {
    /// Reads a JSONL task file; an invalid line is an error naming the file and the line.
    pub fn from_file(path: &Path) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut task = ChoiceTask {
            path: path.to_path_buf(),
            questions: Vec::new(),
            examples: Vec::new(),
        };
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let invalid = |message: String| {
                TrainError::Data(format!("{}:{}: {message}", path.display(), index + 1))
            };
            let question: Question =
                serde_json::from_str(line).map_err(|error| invalid(error.to_string()))?;
            if question.choices.is_empty() {
                return Err(invalid("`choices` is empty".into()));
            }
            if question.gold >= question.choices.len() {
                return Err(invalid(format!(
                    "`gold` {} is not the index of one of the {} choices",
                    question.gold,
                    question.choices.len()
                )));
            }
            if question.split.as_deref() == Some("train") {
                task.examples.push(question);
            } else {
                task.questions.push(question);
            }
        }
        if task.questions.is_empty() {
            return Err(TrainError::Data(format!(
                "{}: no question to evaluate (every line is a few-shot example)",
                path.display()
            )));
        }
        Ok(task)
    }

    /// The prompt of `question` after the first `shots` few-shot examples.
    pub fn prompt(&self, question: &Question, shots: usize) -> Result<String, TrainError> {
        if shots > self.examples.len() {
            return Err(TrainError::Data(format!(
                "{}: {shots} shots asked, the file has {} few-shot examples (\"split\": \"train\")",
                self.path.display(),
                self.examples.len()
            )));
        }
        let mut prompt = String::new();
        for example in &self.examples[..shots] {
            prompt.push_str(&example.context);
            prompt.push(' ');
            prompt.push_str(&example.choices[example.gold]);
            prompt.push_str("\n\n");
        }
        prompt.push_str(&question.context);
        Ok(prompt)
    }
}

/// The result of a multiple-choice evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceReport {
    /// Questions evaluated.
    pub questions: usize,
    /// Share answered right by log-likelihood.
    pub acc: f64,
    /// Its standard error.
    pub acc_stderr: f64,
    /// Share answered right by log-likelihood per byte of the choice.
    pub acc_norm: f64,
    /// Its standard error.
    pub acc_norm_stderr: f64,
    /// Each question's summed continuation log-likelihood of each choice.
    pub log_likelihoods: Vec<Vec<f64>>,
}

/// Evaluates `task` with `shots` few-shot examples, in batches of `batch_rows` rows.
pub fn evaluate_choice(
    model: &Hlat,
    tokenizer: &TextTokenizer,
    task: &ChoiceTask,
    shots: usize,
    batch_rows: usize,
    device: &Device,
) -> Result<ChoiceReport, TrainError> {
    let context = model.config().max_seq_len;
    let encode = |text: &str| {
        tokenizer
            .encode(text, true)
            .map_err(|error| TrainError::Data(error.to_string()))
    };
    let mut requests = Vec::new();
    for (number, question) in task.questions.iter().enumerate() {
        let prompt = task.prompt(question, shots)?;
        let prompt_ids = encode(&prompt)?;
        for choice in &question.choices {
            // The continuation is what the whole adds to the prompt's own encoding.
            let mut tokens = encode(&format!("{prompt} {choice}"))?;
            let continuation = tokens.len().saturating_sub(prompt_ids.len()).max(1);
            if continuation >= context {
                return Err(TrainError::Data(format!(
                    "{}: question {number}: the choice `{choice}` alone has {continuation} \
                     tokens, the model's context is {context}",
                    task.path.display()
                )));
            }
            // Too long: the prompt loses its first tokens, as the harness truncates.
            if tokens.len() > context {
                tokens.drain(..tokens.len() - context);
            }
            let first_scored = tokens.len() - continuation;
            requests.push(ScoreRequest {
                tokens,
                first_scored: first_scored.max(1),
            });
        }
    }
    let scores = log_likelihoods(model, &requests, batch_rows, device)?;
    let mut scores = scores.into_iter();
    let mut right = Vec::with_capacity(task.questions.len());
    let mut right_normalized = Vec::with_capacity(task.questions.len());
    let mut log_likelihoods_per_question = Vec::with_capacity(task.questions.len());
    for question in &task.questions {
        let values: Vec<f64> = scores.by_ref().take(question.choices.len()).collect();
        let normalized: Vec<f64> = values
            .iter()
            .zip(&question.choices)
            .map(|(value, choice)| value / choice.len().max(1) as f64)
            .collect();
        right.push(first_maximum(&values) == question.gold);
        right_normalized.push(first_maximum(&normalized) == question.gold);
        log_likelihoods_per_question.push(values);
    }
    let (acc, acc_stderr) = mean_and_stderr(&right);
    let (acc_norm, acc_norm_stderr) = mean_and_stderr(&right_normalized);
    Ok(ChoiceReport {
        questions: task.questions.len(),
        acc,
        acc_stderr,
        acc_norm,
        acc_norm_stderr,
        log_likelihoods: log_likelihoods_per_question,
    })
}

/// The index of the first largest value (NumPy's `argmax`).
fn first_maximum(values: &[f64]) -> usize {
    let mut best = 0;
    for (index, value) in values.iter().enumerate() {
        if *value > values[best] {
            best = index;
        }
    }
    best
}

/// The mean of 0/1 outcomes and its standard error (sample standard deviation over √n; NaN for
/// one outcome).
pub fn mean_and_stderr(outcomes: &[bool]) -> (f64, f64) {
    let count = outcomes.len() as f64;
    let mean = outcomes.iter().filter(|right| **right).count() as f64 / count;
    let variance = outcomes
        .iter()
        .map(|&right| (f64::from(u8::from(right)) - mean).powi(2))
        .sum::<f64>()
        / (count - 1.0);
    (mean, (variance / count).sqrt())
}
