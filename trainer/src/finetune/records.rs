//! Supervised fine-tuning records as TRL reads them, one JSON object per line:
//! `{"prompt": "...", "completion": "..."}` (the completion ends with the tokenizer's EOS) or
//! `{"messages": [{"role": "...", "content": "..."}, ...]}` (rendered by the tokenizer's chat
//! template). Each becomes an [`SftExample`]: its token ids and which of them are trained on
//! (the completion and EOS; each assistant message's text, as the template renders it). A bad
//! record is a [`RecordsError`] naming the file and the line.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use super::chat_template::{ChatTemplate, ChatTemplateError, Message};

/// The roles a message may have.
pub const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// What can go wrong turning a JSONL file of records (fine-tuning's, or preference pairs,
/// `crate::align`) into examples.
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    /// A record that cannot be trained on, at `path:line`.
    #[error("{}:{line}: {message}", path.display())]
    Record {
        /// The data file.
        path: PathBuf,
        /// The record's line (1-based).
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The data file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file holds no record.
    #[error("{}: no records", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// Conversations need a chat template and the tokenizer has none.
    #[error(
        "{}:{line}: a conversation record needs a chat template: the tokenizer's \
         tokenizer_config.json has no `chat_template`; give one with --chat-template FILE",
        path.display()
    )]
    NoTemplate {
        /// The data file.
        path: PathBuf,
        /// The first conversation's line.
        line: usize,
    },
    /// The chat template failed.
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
}

impl RecordsError {
    /// The record at `path:line` is wrong: `message` says how.
    pub fn at(path: &Path, line: usize, message: String) -> Self {
        Self::Record {
            path: path.to_path_buf(),
            line,
            message,
        }
    }
}

/// One training example: token ids and, for each, whether its prediction counts in the loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    /// The token ids.
    pub ids: Vec<u32>,
    /// `trained[i]`: the loss includes predicting `ids[i]` from `ids[..i]` (never the first).
    pub trained: Vec<bool>,
    /// The record's line in its file.
    pub line: usize,
}

impl SftExample {
    /// The tokens the loss counts.
    pub fn trained_tokens(&self) -> usize {
        self.trained.iter().filter(|&&t| t).count()
    }
}

/// How records become tokens.
pub struct SftTokenizer<'a> {
    /// The model's tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// The chat template, needed by `messages` records.
    pub template: Option<&'a ChatTemplate>,
    /// The id appended to a completion.
    pub eos_id: u32,
}

/// A record's problem, before the file and line are known.
type RecordResult<T> = Result<T, String>;

impl SftTokenizer<'_> {
    /// The examples of a JSONL file (blank lines skipped).
    pub fn read_file(&self, path: &Path) -> Result<Vec<SftExample>, RecordsError> {
        read_records(path, |value, number| {
            let record = |message: String| RecordsError::at(path, number, message);
            let example = match (value.get("messages"), self.template) {
                (Some(_), None) => {
                    return Err(RecordsError::NoTemplate {
                        path: path.to_path_buf(),
                        line: number,
                    });
                }
                (Some(messages), Some(template)) => {
                    let messages = parse_messages(messages).map_err(record)?;
                    self.conversation(&messages, template)
                        .map_err(|error| match error {
                            ConversationError::Record(message) => record(message),
                            ConversationError::Template(error) => RecordsError::Template(error),
                        })?
                }
                (None, _) => {
                    let text = |field: &str| -> RecordResult<&str> {
                        match value.get(field) {
                            Some(serde_json::Value::String(text)) => Ok(text),
                            Some(_) => Err(format!("`{field}` must be a string")),
                            None => Err(format!(
                                "missing `{field}`: a record is {{\"prompt\", \"completion\"}} \
                                 or {{\"messages\"}}"
                            )),
                        }
                    };
                    let prompt = text("prompt").map_err(record)?;
                    let completion = text("completion").map_err(record)?;
                    self.prompt_completion(prompt, completion).map_err(record)?
                }
            };
            Ok(SftExample {
                line: number,
                ..example
            })
        })
    }

    fn encode(&self, text: &str, special: bool) -> RecordResult<tokenizers::Encoding> {
        self.tokenizer
            .encode(text, special)
            .map_err(|error| format!("tokenizing: {error}"))
    }

    /// `prompt` then `completion` and EOS, trained on the completion and EOS: the prompt encoded
    /// with the tokenizer's special tokens (BOS), the completion as the tokens that encoding
    /// prompt and completion together adds (encoded alone when that encoding does not start with
    /// the prompt's), as TRL does.
    pub fn prompt_completion(&self, prompt: &str, completion: &str) -> RecordResult<SftExample> {
        let prompt_ids = self.encode(prompt, true)?.get_ids().to_vec();
        let full = self
            .encode(&format!("{prompt}{completion}"), true)?
            .get_ids()
            .to_vec();
        let completion_ids = if full.starts_with(&prompt_ids) {
            full[prompt_ids.len()..].to_vec()
        } else {
            self.encode(completion, false)?.get_ids().to_vec()
        };
        if completion_ids.is_empty() {
            return Err(format!(
                "the completion {completion:?} tokenizes to nothing: there is nothing to train on"
            ));
        }
        let mut ids = prompt_ids;
        let mut trained = vec![false; ids.len()];
        ids.extend(&completion_ids);
        ids.push(self.eos_id);
        trained.resize(ids.len(), true);
        trained[0] = false;
        Ok(SftExample {
            ids,
            trained,
            line: 0,
        })
    }

    /// A conversation rendered by the template (whose text carries its own special tokens, so
    /// none is added), trained on the tokens of each assistant message: the text between the
    /// rendering of the messages before it with `add_generation_prompt` and the rendering
    /// through it (its content and what closes the turn).
    fn conversation(
        &self,
        messages: &[Message],
        template: &ChatTemplate,
    ) -> Result<SftExample, ConversationError> {
        let text = template.render(messages, false)?;
        let mut spans = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            if message.role != "assistant" {
                continue;
            }
            let start = template.render(&messages[..index], true)?;
            let end = template.render(&messages[..=index], false)?;
            if !text.starts_with(&start) || !text.starts_with(&end) || end.len() < start.len() {
                return Err(ConversationError::Record(format!(
                    "the chat template does not render message {index} as a continuation of the \
                     ones before it, so its tokens cannot be told apart"
                )));
            }
            spans.push(start.len()..end.len());
        }
        if spans.is_empty() {
            return Err(ConversationError::Record(
                "no assistant message: there is nothing to train on".into(),
            ));
        }
        let encoding = self
            .encode(&text, false)
            .map_err(ConversationError::Record)?;
        let ids = encoding.get_ids().to_vec();
        let trained: Vec<bool> = encoding
            .get_offsets()
            .iter()
            .enumerate()
            .map(|(position, &(start, _))| {
                position > 0 && spans.iter().any(|span| span.contains(&start))
            })
            .collect();
        if !trained.iter().any(|&t| t) {
            return Err(ConversationError::Record(
                "the assistant messages tokenize to nothing: there is nothing to train on".into(),
            ));
        }
        Ok(SftExample {
            ids,
            trained,
            line: 0,
        })
    }
}

/// The records of the JSONL file `path`, one JSON object per line (blank lines skipped), each
/// made by `record` from its value and its line (1-based): an error names the file and the line
/// of the first bad one; a file without records is [`RecordsError::Empty`].
pub fn read_records<T>(
    path: &Path,
    mut record: impl FnMut(serde_json::Value, usize) -> Result<T, RecordsError>,
) -> Result<Vec<T>, RecordsError> {
    let text = std::fs::read_to_string(path).map_err(|source| RecordsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut records = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let number = index + 1;
        let value = serde_json::from_str(line).map_err(|error| {
            RecordsError::at(path, number, format!("not a JSON object: {error}"))
        })?;
        records.push(record(value, number)?);
    }
    if records.is_empty() {
        return Err(RecordsError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(records)
}

enum ConversationError {
    Record(String),
    Template(ChatTemplateError),
}

impl From<ChatTemplateError> for ConversationError {
    fn from(error: ChatTemplateError) -> Self {
        ConversationError::Template(error)
    }
}

/// The `messages` of a record: objects with a known `role` and a string `content`.
pub fn parse_messages(value: &serde_json::Value) -> RecordResult<Vec<Message>> {
    let items = value
        .as_array()
        .ok_or("`messages` must be a list of {\"role\", \"content\"} objects")?;
    if items.is_empty() {
        return Err("`messages` is empty".into());
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let role = item
                .get("role")
                .and_then(|role| role.as_str())
                .ok_or_else(|| format!("message {index} has no string `role`"))?;
            if !ROLES.contains(&role) {
                return Err(format!(
                    "message {index} has the unknown role `{role}` (expected system, user or \
                     assistant)"
                ));
            }
            let content = item
                .get("content")
                .and_then(|content| content.as_str())
                .ok_or_else(|| format!("message {index} has no string `content`"))?;
            Ok(Message {
                role: role.to_string(),
                content: content.to_string(),
            })
        })
        .collect()
}
