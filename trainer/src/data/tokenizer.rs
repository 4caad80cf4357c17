//! Tokenizers: load any Hugging Face `tokenizer.json`, or train a byte-level BPE one.

use std::path::Path;

use rayon::prelude::*;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainer};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

use super::error::DataError;

/// The special tokens of tokenizers trained by [`TextTokenizer::train_byte_level_bpe`], in id
/// order: padding is 0, BOS is 1 and EOS is 2 (the Llama convention, with padding in place of
/// `<unk>`, which byte-level BPE never needs).
pub const TRAINED_SPECIAL_TOKENS: [&str; 3] = ["<pad>", "<s>", "</s>"];

const BOS_CANDIDATES: &[&str] = &["<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>"];
const EOS_CANDIDATES: &[&str] = &["</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"];
const PAD_CANDIDATES: &[&str] = &["<pad>", "<|pad|>", "[PAD]"];

/// A tokenizer: a Hugging Face [`Tokenizer`] with the special tokens the pipeline uses.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
}

impl From<Tokenizer> for TextTokenizer {
    /// Wraps a loaded Hugging Face tokenizer (one `hlat::hf::load_tokenizer` checked).
    fn from(inner: Tokenizer) -> Self {
        Self { inner }
    }
}

impl TextTokenizer {
    /// Loads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, DataError> {
        let path = path.as_ref();
        // The message names the file.
        let inner = hlat::hf::load_tokenizer(path).map_err(|error| DataError::Tokenizer {
            context: "loading".to_string(),
            message: error.to_string(),
        })?;
        Ok(Self { inner })
    }

    /// Trains a byte-level BPE tokenizer of `vocab_size` tokens (special tokens included) on
    /// `documents`. It has the [`TRAINED_SPECIAL_TOKENS`], its post-processor puts BOS in front
    /// of every encoded text, and it decodes back to the exact input text.
    pub fn train_byte_level_bpe<S>(documents: &[S], vocab_size: usize) -> Result<Self, DataError>
    where
        S: AsRef<str> + Sync,
    {
        let alphabet = ByteLevel::alphabet();
        let minimum = TRAINED_SPECIAL_TOKENS.len() + alphabet.len();
        if vocab_size < minimum {
            return Err(DataError::setting(
                "vocabulary size",
                format!(
                    "{vocab_size} is below the {minimum} tokens of the byte alphabet and the special tokens"
                ),
            ));
        }
        let byte_level = ByteLevel::default().add_prefix_space(false);
        let mut inner = Tokenizer::new(BPE::default());
        inner
            .with_pre_tokenizer(Some(byte_level))
            .with_decoder(Some(byte_level));
        let mut trainer: TrainerWrapper = BpeTrainer::builder()
            .vocab_size(vocab_size)
            .min_frequency(0)
            .show_progress(false)
            .initial_alphabet(alphabet.into_iter().collect())
            .special_tokens(
                TRAINED_SPECIAL_TOKENS
                    .iter()
                    .map(|token| AddedToken::from(*token, true))
                    .collect(),
            )
            .build()
            .into();
        let training_error = |error: tokenizers::Error| DataError::Tokenizer {
            context: "training".into(),
            message: error.to_string(),
        };
        inner
            .train(&mut trainer, documents.iter().map(AsRef::as_ref))
            .map_err(training_error)?;
        let bos = TRAINED_SPECIAL_TOKENS[1];
        let bos_id = inner
            .token_to_id(bos)
            .expect("trained tokenizers hold their special tokens");
        let post_processor = TemplateProcessing::builder()
            .try_single(format!("{bos} $A"))
            .and_then(|builder| builder.try_pair(format!("{bos} $A {bos} $B")))
            .map_err(|message| DataError::Tokenizer {
                context: "building the post-processor".into(),
                message,
            })?
            .special_tokens(vec![(bos, bos_id)])
            .build()
            .map_err(|error| DataError::Tokenizer {
                context: "building the post-processor".into(),
                message: error.to_string(),
            })?;
        inner.with_post_processor(Some(post_processor));
        Ok(Self { inner })
    }

    /// Saves the tokenizer as a Hugging Face `tokenizer.json`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), DataError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json()?).map_err(|error| DataError::io(path, error))
    }

    /// The Hugging Face tokenizer underneath.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// The tokenizer in Hugging Face `tokenizer.json` form.
    pub fn to_json(&self) -> Result<String, DataError> {
        self.inner
            .to_string(true)
            .map_err(|error| DataError::Tokenizer {
                context: "serializing".into(),
                message: error.to_string(),
            })
    }

    /// The ids of `text`; with `add_special_tokens` the post-processor's tokens (Llama: BOS) are
    /// added as the tokenizer defines.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, DataError> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|error| DataError::Tokenizer {
                context: "encoding".into(),
                message: error.to_string(),
            })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Encodes every document, without special tokens, on all cores.
    pub fn encode_documents<S>(&self, documents: &[S]) -> Result<Vec<Vec<u32>>, DataError>
    where
        S: AsRef<str> + Sync,
    {
        documents
            .par_iter()
            .map(|document| self.encode(document.as_ref(), false))
            .collect()
    }

    /// The text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        self.inner
            .decode(ids, false)
            .map_err(|error| DataError::Tokenizer {
                context: "decoding".into(),
                message: error.to_string(),
            })
    }

    /// The number of token ids, added and special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The beginning-of-sequence token.
    pub fn bos_id(&self) -> Result<u32, DataError> {
        self.special_id("BOS", BOS_CANDIDATES)
    }

    /// The end-of-sequence token, put after every document when packing.
    pub fn eos_id(&self) -> Result<u32, DataError> {
        self.special_id("EOS", EOS_CANDIDATES)
    }

    /// The padding token.
    pub fn pad_id(&self) -> Result<u32, DataError> {
        self.special_id("padding", PAD_CANDIDATES)
    }

    /// The id of the first of `candidates` the vocabulary holds.
    fn special_id(
        &self,
        role: &'static str,
        candidates: &'static [&'static str],
    ) -> Result<u32, DataError> {
        candidates
            .iter()
            .find_map(|token| self.inner.token_to_id(token))
            .ok_or(DataError::MissingSpecialToken { role, candidates })
    }
}
