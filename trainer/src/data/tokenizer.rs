//! Tokenizers: load any Hugging Face `tokenizer.json`, or train a byte-level BPE one.
//!
//! The special tokens (BOS, EOS, padding) are the ones the tokenizer's own files name, as
//! Hugging Face reads them: first the `bos_token`, `eos_token` and `pad_token` of the
//! [`TOKENIZER_CONFIG_FILE`] beside the `tokenizer.json` (a string, an object with the token as
//! `content`, or `null` for none: Qwen2 has no BOS), then the tokenizer itself (the token its
//! post-processor puts before the text for BOS, after it for EOS; its padding settings for
//! padding), and last, for a `tokenizer.json` alone, the usual token names
//! (`<s>`/`</s>`, `<|begin_of_text|>`/`<|end_of_text|>`, `<|endoftext|>`, ...).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rayon::prelude::*;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainer};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

use super::error::DataError;
use super::piece_encoding::PieceEncoder;

/// The special tokens of tokenizers trained by [`TextTokenizer::train_byte_level_bpe`], in id
/// order: padding is 0, BOS is 1 and EOS is 2 (the Llama convention, with padding in place of
/// `<unk>`, which byte-level BPE never needs).
pub const TRAINED_SPECIAL_TOKENS: [&str; 3] = ["<pad>", "<s>", "</s>"];

/// The Hugging Face file beside a `tokenizer.json` that names its special tokens.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// A special token the pipeline uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Bos,
    Eos,
    Pad,
}

impl Role {
    /// The role's name in messages.
    fn name(self) -> &'static str {
        match self {
            Self::Bos => "BOS",
            Self::Eos => "EOS",
            Self::Pad => "padding",
        }
    }

    /// Its key in `tokenizer_config.json`.
    fn key(self) -> &'static str {
        match self {
            Self::Bos => "bos_token",
            Self::Eos => "eos_token",
            Self::Pad => "pad_token",
        }
    }

    /// The usual names of the token, for a `tokenizer.json` that names none.
    fn candidates(self) -> &'static [&'static str] {
        match self {
            Self::Bos => &["<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>"],
            Self::Eos => &["</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"],
            Self::Pad => &["<pad>", "<|pad|>", "[PAD]"],
        }
    }
}

/// What `tokenizer_config.json` says of one special token.
#[derive(Debug, Clone, PartialEq)]
enum Configured {
    /// Nothing (no such key): the tokenizer itself decides.
    Unset,
    /// `null`: the tokenizer has no such token.
    Null,
    /// The token's text.
    Token(String),
}

/// A `tokenizer_config.json`: its text (copied beside token shards) and its special tokens.
#[derive(Debug, Clone)]
struct TokenizerConfig {
    path: PathBuf,
    text: String,
    bos: Configured,
    eos: Configured,
    pad: Configured,
}

impl TokenizerConfig {
    /// Reads the file at `path`, if there is one.
    fn read(path: &Path) -> Result<Option<Self>, DataError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(path, text).map(Some),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(DataError::io(path, error)),
        }
    }

    fn parse(path: &Path, text: String) -> Result<Self, DataError> {
        let bad = |problem: String| DataError::TokenizerConfig {
            path: path.to_path_buf(),
            problem,
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|error| bad(format!("not JSON: {error}")))?;
        let object = value
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        let configured = |role: Role| {
            let key = role.key();
            match object.get(key) {
                None => Ok(Configured::Unset),
                Some(serde_json::Value::Null) => Ok(Configured::Null),
                Some(serde_json::Value::String(token)) => Ok(Configured::Token(token.clone())),
                Some(serde_json::Value::Object(fields)) => match fields.get("content") {
                    Some(serde_json::Value::String(token)) => Ok(Configured::Token(token.clone())),
                    _ => Err(bad(format!(
                        "`{key}` is an object without a string `content`"
                    ))),
                },
                Some(other) => Err(bad(format!(
                    "`{key}` is {other}, not a token (a string, an object with `content`, or null)"
                ))),
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            bos: configured(Role::Bos)?,
            eos: configured(Role::Eos)?,
            pad: configured(Role::Pad)?,
            text,
        })
    }

    fn get(&self, role: Role) -> &Configured {
        match role {
            Role::Bos => &self.bos,
            Role::Eos => &self.eos,
            Role::Pad => &self.pad,
        }
    }
}

/// A tokenizer: a Hugging Face [`Tokenizer`] with the special tokens the pipeline uses.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// The file it was read from, for messages.
    source: Option<PathBuf>,
    /// The `tokenizer_config.json` beside that file, if any.
    config: Option<TokenizerConfig>,
    /// How [`TextTokenizer::encode_documents`] encodes, decided on its first call: piece by
    /// piece when that is exact for this tokenizer, else `None`.
    pieces: OnceLock<Option<PieceEncoder>>,
}

impl From<Tokenizer> for TextTokenizer {
    /// Wraps a loaded Hugging Face tokenizer (one `hlat::hf::load_tokenizer` checked). Without
    /// a `tokenizer_config.json`, its special tokens are those the tokenizer itself shows (see
    /// the [module](self) documentation).
    fn from(inner: Tokenizer) -> Self {
        Self {
            inner,
            source: None,
            config: None,
            pieces: OnceLock::new(),
        }
    }
}

impl TextTokenizer {
    /// Loads a Hugging Face `tokenizer.json`, with the special tokens the
    /// [`TOKENIZER_CONFIG_FILE`] in the same folder names, when there is one. A malformed
    /// `tokenizer_config.json` is an error naming it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, DataError> {
        let path = path.as_ref();
        // The message names the file.
        let inner = hlat::hf::load_tokenizer(path).map_err(|error| DataError::Tokenizer {
            context: "loading".to_string(),
            message: error.to_string(),
        })?;
        let config_path = path
            .parent()
            .unwrap_or(Path::new(""))
            .join(TOKENIZER_CONFIG_FILE);
        Ok(Self {
            inner,
            source: Some(path.to_path_buf()),
            config: TokenizerConfig::read(&config_path)?,
            pieces: OnceLock::new(),
        })
    }

    /// Trains a byte-level BPE tokenizer of `vocab_size` tokens (special tokens included) on
    /// `documents`. It has the [`TRAINED_SPECIAL_TOKENS`], its post-processor puts BOS in front
    /// of every encoded text, and it decodes back to the exact input text.
    pub fn train_byte_level_bpe<S>(documents: &[S], vocab_size: usize) -> Result<Self, DataError>
    where
        S: AsRef<str> + Sync,
    {
        Self::train_byte_level_bpe_streaming(documents.iter().map(AsRef::as_ref), vocab_size)
    }

    /// [`TextTokenizer::train_byte_level_bpe`] on documents as they come: the trainer keeps the
    /// counts of the words it has seen, not the documents.
    pub fn train_byte_level_bpe_streaming<I, S>(
        documents: I,
        vocab_size: usize,
    ) -> Result<Self, DataError>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
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
            .train(&mut trainer, documents)
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
        Ok(Self::from(inner))
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

    /// The text of the [`TOKENIZER_CONFIG_FILE`] read with the tokenizer, if there was one.
    pub fn config_json(&self) -> Option<&str> {
        self.config.as_ref().map(|config| config.text.as_str())
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

    /// Encodes every document, without special tokens, on all cores: the ids of
    /// [`TextTokenizer::encode`]. For a SentencePiece-style BPE tokenizer such as Llama 2's the
    /// documents are encoded word by word with a per-thread cache of the words' ids, where the
    /// tokenizer makes that exact ([`super::piece_encoding`]); otherwise document by document,
    /// without the offsets [`TextTokenizer::encode`] also tracks.
    pub fn encode_documents<S>(&self, documents: &[S]) -> Result<Vec<Vec<u32>>, DataError>
    where
        S: AsRef<str> + Sync,
    {
        let pieces = self.piece_encoder();
        let encoding_error = |error: tokenizers::Error| DataError::Tokenizer {
            context: "encoding".into(),
            message: error.to_string(),
        };
        documents
            .par_iter()
            .map(|document| {
                let document = document.as_ref();
                if let Some(pieces) = pieces
                    && let Some(ids) = pieces
                        .encode(&self.inner, document)
                        .map_err(encoding_error)?
                {
                    return Ok(ids);
                }
                self.inner
                    .encode_fast(document, false)
                    .map(|encoding| encoding.get_ids().to_vec())
                    .map_err(encoding_error)
            })
            .collect()
    }

    /// Whether [`TextTokenizer::encode_documents`] encodes word by word (`true`) or document by
    /// document.
    pub fn encodes_documents_piecewise(&self) -> bool {
        self.piece_encoder().is_some()
    }

    /// The piece encoder, when it is exact for this tokenizer; decided once, and logged.
    fn piece_encoder(&self) -> Option<&PieceEncoder> {
        self.pieces
            .get_or_init(|| match PieceEncoder::new(&self.inner) {
                Ok(encoder) => {
                    log::debug!(
                        "{}: encoding documents word by word with a per-thread cache (exact for \
                         this SentencePiece-style BPE tokenizer)",
                        self.describe()
                    );
                    Some(encoder)
                }
                Err(reason) => {
                    log::debug!(
                        "{}: encoding documents whole with the tokenizers crate: {reason}",
                        self.describe()
                    );
                    None
                }
            })
            .as_ref()
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

    /// The beginning-of-sequence token. An error for tokenizers without one (Qwen2's).
    pub fn bos_id(&self) -> Result<u32, DataError> {
        self.special_id(Role::Bos)
    }

    /// The end-of-sequence token, put after every document when packing.
    pub fn eos_id(&self) -> Result<u32, DataError> {
        self.special_id(Role::Eos)
    }

    /// The padding token.
    pub fn pad_id(&self) -> Result<u32, DataError> {
        self.special_id(Role::Pad)
    }

    /// The id of `role`'s token: the one `tokenizer_config.json` names (`null`: none), else the
    /// one the tokenizer shows (its post-processor; its padding), else the first of the usual
    /// names the vocabulary holds.
    fn special_id(&self, role: Role) -> Result<u32, DataError> {
        if let Some(config) = &self.config {
            match config.get(role) {
                Configured::Token(token) => {
                    return self.inner.token_to_id(token).ok_or_else(|| {
                        DataError::TokenizerConfig {
                            path: config.path.clone(),
                            problem: format!(
                                "its `{}` {token:?} is not a token of {}",
                                role.key(),
                                self.describe()
                            ),
                        }
                    });
                }
                Configured::Null => {
                    return Err(self.missing(
                        role,
                        format!("{} sets `{}` to null", config.path.display(), role.key()),
                    ));
                }
                Configured::Unset => {}
            }
        }
        let shown = match role {
            Role::Bos | Role::Eos => self.post_processor_token(role),
            Role::Pad => self.inner.get_padding().map(|padding| padding.pad_id),
        };
        if let Some(id) = shown {
            return Ok(id);
        }
        let candidates = role.candidates();
        candidates
            .iter()
            .find_map(|token| self.inner.token_to_id(token))
            .ok_or_else(|| {
                let config = match &self.config {
                    Some(config) => format!("{} sets no `{}`", config.path.display(), role.key()),
                    None => format!("no {TOKENIZER_CONFIG_FILE} beside it names one"),
                };
                let shown = match role {
                    Role::Bos | Role::Eos => "its post-processor adds none",
                    Role::Pad => "it sets no padding",
                };
                self.missing(
                    role,
                    format!("{config}, {shown}, and it holds none of {candidates:?}"),
                )
            })
    }

    /// The special token the post-processor's template for one text puts before the text (BOS:
    /// the first) or after it (EOS: the last), as Llama 3's `<|begin_of_text|>`. Read from the
    /// template's `tokenizer.json` form (a `TemplateProcessing`, alone or in a `Sequence`).
    fn post_processor_token(&self, role: Role) -> Option<u32> {
        let processor = serde_json::to_value(self.inner.get_post_processor()?).ok()?;
        let template = find_template(&processor)?;
        let single = template.get("single")?.as_array()?;
        let text = single
            .iter()
            .position(|piece| piece.get("Sequence").is_some())?;
        let special = |piece: &serde_json::Value| {
            piece
                .get("SpecialToken")?
                .get("id")?
                .as_str()
                .map(str::to_owned)
        };
        let name = match role {
            Role::Bos => single[..text].iter().find_map(special),
            _ => single[text + 1..].iter().rev().find_map(special),
        }?;
        match template
            .get("special_tokens")?
            .get(&name)?
            .get("ids")?
            .as_array()?
            .as_slice()
        {
            [id] => id.as_u64().and_then(|id| u32::try_from(id).ok()),
            _ => None,
        }
    }

    /// The tokenizer in messages: its file, if it has one.
    fn describe(&self) -> String {
        match &self.source {
            Some(path) => path.display().to_string(),
            None => "the tokenizer".to_string(),
        }
    }

    fn missing(&self, role: Role, reason: String) -> DataError {
        DataError::MissingSpecialToken {
            tokenizer: self.describe(),
            role: role.name(),
            reason,
        }
    }
}

/// The `TemplateProcessing` of a post-processor in `tokenizer.json` form: itself, or the first
/// one of a `Sequence`.
fn find_template(processor: &serde_json::Value) -> Option<&serde_json::Value> {
    match processor.get("type")?.as_str()? {
        "TemplateProcessing" => Some(processor),
        "Sequence" => processor
            .get("processors")?
            .as_array()?
            .iter()
            .find_map(find_template),
        _ => None,
    }
}
