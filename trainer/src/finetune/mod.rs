//! Supervised fine-tuning (`hlat finetune`): prompt/completion and conversation records
//! ([`records`]) rendered by the tokenizer's chat template ([`chat_template`]) and tokenized,
//! the loss on completion and assistant tokens only, one example per row padded to one bucket
//! length ([`rows`]); full fine-tuning or LoRA (`hlat::lora`) on the pretraining job's machinery.

pub mod chat_template;
pub mod records;
pub mod rows;

pub use chat_template::{ChatTemplate, ChatTemplateError, Message};
pub use records::{RecordsError, SftExample, SftTokenizer};
pub use rows::{SftRows, bucket_len};
