//! Preference records as TRL reads them, one JSON object per line: `{"prompt", "chosen",
//! "rejected"}`, each plain text, or conversational (`prompt` a list of messages, `chosen` and
//! `rejected` lists of the assistant's messages, rendered by the tokenizer's chat template). A
//! record without a prompt, or whose prompt is not of its completions' kind (UltraFeedback's
//! string prompt beside whole conversations), has its prompt extracted from `chosen` and
//! `rejected` as TRL's `maybe_extract_prompt` extracts it ([`extract_prompt`]).
//! Each becomes a [`PreferenceExample`]: the chosen and the rejected sequence, each its prompt's
//! tokens then its completion's, tokenized exactly as TRL 1.16 tokenizes them for the method
//! (`DPOTrainer._prepare_dataset` for DPO, `ORPOTrainer.tokenize_row` for ORPO). A bad record is
//! a [`RecordsError`] naming the file and the line.

use std::path::Path;

use tokenizers::Tokenizer;

use crate::finetune::records::{parse_messages, read_records};
use crate::finetune::{ChatTemplate, Message, RecordsError};

/// The preference methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignMethod {
    /// Direct preference optimisation against a frozen reference.
    Dpo,
    /// Odds-ratio preference optimisation, on top of the SFT loss, without a reference.
    Orpo,
}

/// One side of a preference pair: the token ids of its prompt then its completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferenceSequence {
    /// Prompt and completion ids.
    pub ids: Vec<u32>,
    /// How many of `ids` are the prompt's (the rest, the completion, is scored).
    pub prompt_len: usize,
}

impl PreferenceSequence {
    /// The completion's ids.
    pub fn completion(&self) -> &[u32] {
        &self.ids[self.prompt_len..]
    }
}

/// A preference pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferenceExample {
    /// The preferred sequence.
    pub chosen: PreferenceSequence,
    /// The other one.
    pub rejected: PreferenceSequence,
    /// The record's line in its file.
    pub line: usize,
}

/// How records become tokens.
pub struct PreferenceTokenizer<'a> {
    /// The model's tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// The chat template, needed by conversational records.
    pub template: Option<&'a ChatTemplate>,
    /// The beginning-of-sequence id ORPO puts before a prompt that lacks it (none when the
    /// tokenizer has none, as Qwen's, and TRL then adds nothing).
    pub bos_id: Option<u32>,
    /// The end-of-sequence id and its text.
    pub eos: (u32, &'a str),
    /// Whose tokenization to follow.
    pub method: AlignMethod,
}

/// A record's problem, before the file and line are known.
type RecordResult<T> = Result<T, String>;

/// The fields of a record: plain text, or conversational.
enum Fields {
    Text {
        prompt: String,
        chosen: String,
        rejected: String,
    },
    Conversation {
        prompt: Vec<Message>,
        chosen: Vec<Message>,
        rejected: Vec<Message>,
    },
}

impl PreferenceTokenizer<'_> {
    /// The examples of a JSONL file (blank lines skipped).
    pub fn read_file(&self, path: &Path) -> Result<Vec<PreferenceExample>, RecordsError> {
        read_records(path, |value, number| {
            let record = |message: String| RecordsError::at(path, number, message);
            let fields = fields(&value).map_err(record)?;
            let (chosen, rejected) = match fields {
                Fields::Text {
                    prompt,
                    chosen,
                    rejected,
                } => self.text_pair(&prompt, &chosen, &rejected),
                Fields::Conversation {
                    prompt,
                    chosen,
                    rejected,
                } => {
                    let template = self.template.ok_or_else(|| RecordsError::NoTemplate {
                        path: path.to_path_buf(),
                        line: number,
                    })?;
                    self.conversation_pair(template, &prompt, &chosen, &rejected)?
                }
            }
            .map_err(record)?;
            Ok(PreferenceExample {
                chosen,
                rejected,
                line: number,
            })
        })
    }

    fn encode(&self, text: &str, special: bool) -> RecordResult<Vec<u32>> {
        self.tokenizer
            .encode(text, special)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|error| format!("tokenizing: {error}"))
    }

    /// A plain-text pair. DPO appends the EOS text to each completion, encodes the prompt and
    /// each prompt + completion with the special tokens (BOS), and cuts both where the prompt's
    /// encoding stops agreeing with either (a token merged across the boundary starts the
    /// completion). ORPO goes through [`Self::orpo_pair`].
    fn text_pair(
        &self,
        prompt: &str,
        chosen: &str,
        rejected: &str,
    ) -> RecordResult<(PreferenceSequence, PreferenceSequence)> {
        if self.method == AlignMethod::Orpo {
            return self.orpo_pair(prompt, chosen, rejected);
        }
        let eos_text = self.eos.1;
        let with_eos = |text: &str| {
            if text.ends_with(eos_text) {
                text.to_string()
            } else {
                format!("{text}{eos_text}")
            }
        };
        let prompt_ids = self.encode(prompt, true)?;
        let chosen_ids = self.encode(&format!("{prompt}{}", with_eos(chosen)), true)?;
        let rejected_ids = self.encode(&format!("{prompt}{}", with_eos(rejected)), true)?;
        Ok(split_at_prompt(&prompt_ids, chosen_ids, rejected_ids))
    }

    /// A conversational pair, rendered by `template`. DPO encodes the prompt rendered with the
    /// generation prompt and each full conversation (the template writes its special tokens),
    /// cut as [`Self::text_pair`] cuts, with no EOS added. ORPO renders them to text first: the
    /// prompt is the longest common prefix of the three renderings, each completion the rest
    /// of its conversation.
    fn conversation_pair(
        &self,
        template: &ChatTemplate,
        prompt: &[Message],
        chosen: &[Message],
        rejected: &[Message],
    ) -> Result<RecordResult<(PreferenceSequence, PreferenceSequence)>, RecordsError> {
        let joined = |completion: &[Message]| -> Vec<Message> {
            prompt.iter().chain(completion).cloned().collect()
        };
        let prompt_text = template.render(prompt, true)?;
        let chosen_text = template.render(&joined(chosen), false)?;
        let rejected_text = template.render(&joined(rejected), false)?;
        Ok(match self.method {
            AlignMethod::Dpo => (|| {
                let prompt_ids = self.encode(&prompt_text, false)?;
                let chosen_ids = self.encode(&chosen_text, false)?;
                let rejected_ids = self.encode(&rejected_text, false)?;
                Ok(split_at_prompt(&prompt_ids, chosen_ids, rejected_ids))
            })(),
            AlignMethod::Orpo => {
                let common = common_prefix(prompt_text.as_bytes(), chosen_text.as_bytes()).min(
                    common_prefix(prompt_text.as_bytes(), rejected_text.as_bytes()),
                );
                let common = floor_char_boundary(&prompt_text, common);
                let prompt_text = &prompt_text[..common];
                self.orpo_pair(
                    prompt_text,
                    &chosen_text[common..],
                    &rejected_text[common..],
                )
            }
        })
    }

    /// ORPO's pair (`tokenize_row`): the prompt and each prompt + answer encoded without special
    /// tokens; an answer starts where the prompt's encoding ends, one token earlier when the
    /// last prompt token merged with the answer's first; BOS goes before each prompt and EOS after
    /// each answer unless already there.
    fn orpo_pair(
        &self,
        prompt: &str,
        chosen: &str,
        rejected: &str,
    ) -> RecordResult<(PreferenceSequence, PreferenceSequence)> {
        let prompt_ids = self.encode(prompt, false)?;
        let side = |answer: &str| -> RecordResult<PreferenceSequence> {
            let full = self.encode(&format!("{prompt}{answer}"), false)?;
            let mut start = prompt_ids.len().min(full.len());
            if full[..start] != prompt_ids[..] {
                start = start.saturating_sub(1);
            }
            let mut ids = Vec::with_capacity(full.len() + 2);
            if let Some(bos_id) = self.bos_id
                && full[..start].first() != Some(&bos_id)
            {
                ids.push(bos_id);
            }
            ids.extend(&full[..start]);
            let prompt_len = ids.len();
            ids.extend(&full[start..]);
            if ids.len() == prompt_len || ids.last() != Some(&self.eos.0) {
                ids.push(self.eos.0);
            }
            Ok(PreferenceSequence { ids, prompt_len })
        };
        let (chosen, rejected) = (side(chosen)?, side(rejected)?);
        if chosen.prompt_len.abs_diff(rejected.prompt_len) > 1 {
            return Err(
                "the prompt tokenizes differently before the chosen and the rejected \
                 completions (by more than one token)"
                    .into(),
            );
        }
        Ok((chosen, rejected))
    }
}

/// Both sequences cut where `prompt` stops agreeing with either: the prompt is the shorter common
/// prefix, the rest of each its completion.
fn split_at_prompt(
    prompt: &[u32],
    chosen: Vec<u32>,
    rejected: Vec<u32>,
) -> (PreferenceSequence, PreferenceSequence) {
    let prompt_len = common_prefix(prompt, &chosen).min(common_prefix(prompt, &rejected));
    (
        PreferenceSequence {
            ids: chosen,
            prompt_len,
        },
        PreferenceSequence {
            ids: rejected,
            prompt_len,
        },
    )
}

/// The length of the common prefix of `a` and `b`.
fn common_prefix<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The largest char boundary of `text` at or below `index`.
fn floor_char_boundary(text: &str, mut index: usize) -> usize {
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// A record's fields: three strings, or a prompt conversation and two of the assistant's; an
/// implicit prompt (or one of the other kind) is extracted from the completions.
fn fields(value: &serde_json::Value) -> RecordResult<Fields> {
    use serde_json::Value;
    let field = |name: &str| {
        value.get(name).ok_or_else(|| {
            format!(
                "missing `{name}`: a preference record is {{\"prompt\", \"chosen\", \"rejected\"}} \
                 or {{\"chosen\", \"rejected\"}} with the prompt implicit in both"
            )
        })
    };
    let (chosen, rejected) = (field("chosen")?, field("rejected")?);
    let messages =
        |name: &str, value| parse_messages(value).map_err(|message| format!("`{name}`: {message}"));
    match (value.get("prompt"), chosen, rejected) {
        (Some(Value::String(prompt)), Value::String(chosen), Value::String(rejected)) => {
            Ok(Fields::Text {
                prompt: prompt.clone(),
                chosen: chosen.clone(),
                rejected: rejected.clone(),
            })
        }
        (Some(prompt @ Value::Array(_)), Value::Array(_), Value::Array(_)) => {
            let completion = |name: &str, value| -> RecordResult<Vec<Message>> {
                let messages = messages(name, value)?;
                if messages.iter().any(|message| message.role != "assistant") {
                    return Err(format!("`{name}` must hold the assistant's messages only"));
                }
                Ok(messages)
            };
            Ok(Fields::Conversation {
                prompt: messages("prompt", prompt)?,
                chosen: completion("chosen", chosen)?,
                rejected: completion("rejected", rejected)?,
            })
        }
        (_, Value::String(chosen), Value::String(rejected)) => {
            let chosen: Vec<char> = chosen.chars().collect();
            let rejected: Vec<char> = rejected.chars().collect();
            let at = extract_prompt(&chosen, &rejected, |c| *c == ' ')?;
            let text = |chars: &[char]| chars.iter().collect::<String>();
            Ok(Fields::Text {
                prompt: text(&chosen[..at]),
                chosen: text(&chosen[at..]),
                rejected: text(&rejected[at..]),
            })
        }
        (_, Value::Array(_), Value::Array(_)) => {
            let chosen = messages("chosen", chosen)?;
            let rejected = messages("rejected", rejected)?;
            let at = extract_prompt(&chosen, &rejected, |_| false)?;
            Ok(Fields::Conversation {
                prompt: chosen[..at].to_vec(),
                chosen: chosen[at..].to_vec(),
                rejected: rejected[at..].to_vec(),
            })
        }
        _ => Err(
            "`chosen` and `rejected` must be two strings or two lists of messages, and `prompt` \
             (when given) a string or a list of messages"
                .into(),
        ),
    }
}

/// Where TRL's `extract_prompt` ends the prompt implicit in `chosen` and `rejected` (characters
/// of plain text, or messages): at the first item where they differ, one item earlier when the
/// item before it is a space (`is_space`; the space goes to the completions); when neither
/// differs within the shorter, at its last item (TRL's loop variable after the loop). A
/// difference at the very first item leaves the prompt empty (TRL would look at the last item
/// through Python's index -1).
pub fn extract_prompt<T: PartialEq>(
    chosen: &[T],
    rejected: &[T],
    is_space: impl Fn(&T) -> bool,
) -> RecordResult<usize> {
    let shorter = chosen.len().min(rejected.len());
    if shorter == 0 {
        return Err(
            "no prompt to extract: `chosen` or `rejected` is empty (give a `prompt`)".into(),
        );
    }
    let Some(at) = (0..shorter).find(|&index| chosen[index] != rejected[index]) else {
        return Ok(shorter - 1);
    };
    Ok(if at > 0 && is_space(&chosen[at - 1]) {
        at - 1
    } else {
        at
    })
}
