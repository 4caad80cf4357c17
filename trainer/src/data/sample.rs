//! A sample of documents streamed from the inputs, for training a tokenizer
//! (`hlat data train-tokenizer`): the first documents in input order, up to a number of
//! documents and of bytes, read on a thread while the trainer counts their words, so that memory
//! holds the word counts and a bounded queue of documents, never the corpus.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc;

use super::documents::{Item, ReadOptions, for_each_item};
use super::error::DataError;
use super::inputs::list_input_files;
use super::tokenizer::TextTokenizer;

/// Documents queued between the reader and the trainer.
const QUEUE: usize = 1024;

/// How much of the inputs to read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleLimits {
    /// The most documents; `None` for all.
    pub max_documents: Option<u64>,
    /// The most bytes of text (the document that crosses the limit is the last); `None` for
    /// all.
    pub max_bytes: Option<u64>,
}

/// What a sample held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleSummary {
    /// Documents trained on.
    pub documents: u64,
    /// Bytes of their text.
    pub bytes: u64,
    /// Documents skipped as invalid UTF-8.
    pub skipped_invalid_utf8: u64,
}

/// Trains a byte-level BPE tokenizer of `vocab_size` tokens on a sample of the documents of
/// `inputs` (files, folders, glob patterns; any input format).
pub fn train_tokenizer_on_sample(
    inputs: &[PathBuf],
    options: &ReadOptions,
    limits: SampleLimits,
    vocab_size: usize,
) -> Result<(TextTokenizer, SampleSummary), DataError> {
    let files = list_input_files(inputs)?;
    let (sender, receiver) = mpsc::sync_channel::<String>(QUEUE);
    let bytes_read = Arc::new(AtomicU64::new(0));
    let (trained, read) = std::thread::scope(|scope| {
        let reader = scope.spawn(move || {
            let mut summary = SampleSummary::default();
            for file in &files {
                let flow = for_each_item(file, options, &bytes_read, |item| {
                    let text = match item {
                        Item::Text(text) => text,
                        Item::InvalidUtf8 => {
                            summary.skipped_invalid_utf8 += 1;
                            return Ok(ControlFlow::Continue(()));
                        }
                    };
                    summary.documents += 1;
                    summary.bytes += text.len() as u64;
                    let full = limits
                        .max_documents
                        .is_some_and(|max| summary.documents >= max)
                        || limits.max_bytes.is_some_and(|max| summary.bytes >= max);
                    if sender.send(text).is_err() || full {
                        return Ok(ControlFlow::Break(()));
                    }
                    Ok(ControlFlow::Continue(()))
                })?;
                if flow.is_break() {
                    break;
                }
            }
            Ok::<_, DataError>(summary)
        });
        let trained =
            TextTokenizer::train_byte_level_bpe_streaming(receiver.into_iter(), vocab_size);
        (
            trained,
            reader.join().expect("the reader thread does not panic"),
        )
    });
    // A reading error explains a training failure (the trainer saw the documents stop).
    let summary = read?;
    if summary.documents == 0 {
        return Err(DataError::EmptyInput(format!(
            "no document with text in {inputs:?} ({} skipped as invalid UTF-8)",
            summary.skipped_invalid_utf8
        )));
    }
    Ok((trained?, summary))
}
