//! Exact word-by-word encoding of documents for SentencePiece-style BPE tokenizers (Llama 2,
//! Mistral v1, ...), with a per-thread cache of each word's ids.
//!
//! Such a tokenizer has no pre-tokenizer: its normalizer turns every space into `▁` (and puts
//! one `▁` in front of the text) and its BPE model runs over the whole normalized document as
//! one word. The `tokenizers` crate then searches merges over thousands of symbols per document
//! and its word cache never hits. [`PieceEncoder`] cuts the normalized document before every
//! `▁` that follows a character other than `▁` (`▁the▁▁cat` → `▁the`, `▁▁cat`) and encodes each
//! piece on its own, once per thread for frequent ones ([`super::piece_cache`]).
//!
//! Why the ids are the same: BPE starts from one symbol per character (a byte-fallback token
//! `<0xXX>` per byte of a character outside the vocabulary, or the unknown token) and applies
//! the lowest-ranked merge of two adjacent symbols until none applies (ties: leftmost first); a
//! merged token's text is the concatenation of the two texts. At a cut, the text of the symbol
//! on the left always ends with the character before the `▁` (or with the `>` of a byte-fallback
//! token, or the unknown token's last character), not with `▁`, and the text of the symbol on
//! the right always starts with `▁`. If no merge of the model joins a token not ending in `▁` to
//! a token starting with `▁`, no merge ever crosses a cut, so each piece goes through the same
//! merges in the same order whether it stands alone or in the document: the ids are the same.
//! [`PieceEncoder::new`] checks that, and everything else this argument rests on, from the
//! loaded tokenizer itself:
//!
//! - the model is BPE without dropout, without a continuing-subword prefix or end-of-word
//!   suffix (they would change a piece's first or last symbol), without `ignore_merges` (a
//!   whole piece found in the vocabulary would skip merging), with `▁` in its vocabulary, an
//!   unknown token in the vocabulary whose text does not end in `▁` (without one, a character
//!   outside the vocabulary would be dropped and the symbols around it would meet), and one text
//!   per id;
//! - no merge joins a token not ending in `▁` to a token starting with `▁`. A merge's result is a
//!   token, so when no token holds `▁` right after another character (Llama 2's vocabulary holds
//!   none) there is no such merge; otherwise the merges themselves are checked;
//! - the normalizer replaces `" "` with `▁`, alone or with a prepended `▁` (the Llama 2 one), and
//!   there is no pre-tokenizer, truncation or padding (post-processors add special tokens only,
//!   and documents are encoded without them);
//! - every added token is matched on the raw text (`normalized: false`); a document that contains
//!   the text of one anywhere is encoded whole, so that the crate splits it there as it always
//!   does.
//!
//! Any other tokenizer (byte-level BPE such as Llama 3, Qwen or GPT-2, which pre-tokenize into
//! words and hit the crate's own word cache; WordPiece; Unigram) is encoded document by document
//! by the `tokenizers` crate, and [`PieceEncoder::new`] says why.

use std::sync::atomic::{AtomicU64, Ordering};

use aho_corasick::AhoCorasick;
use tokenizers::models::bpe::BPE;
use tokenizers::{Model, ModelWrapper, Tokenizer};

use super::piece_cache::{piece_hash, with_thread_cache};

/// The SentencePiece space, `▁` (U+2581).
pub const SPACE: char = '\u{2581}';
/// Its UTF-8 bytes.
const SPACE_BYTES: [u8; 3] = [0xe2, 0x96, 0x81];

/// Numbers the encoders, so that a thread's cache knows whose pieces it holds.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// Why a tokenizer cannot be encoded piece by piece.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotPieceWise {
    /// The model is not BPE.
    #[error("the model is not BPE")]
    NotBpe,
    /// A BPE setting that changes results with the length of the word.
    #[error("the BPE model has {0}")]
    BpeSetting(&'static str),
    /// `▁` is not a token.
    #[error("`▁` is not in the vocabulary")]
    NoSpaceToken,
    /// Unknown characters would be dropped, or the unknown token ends in `▁`.
    #[error("the unknown token {0}")]
    UnknownToken(String),
    /// Two texts share an id.
    #[error("the vocabulary gives one id to several texts")]
    SharedIds,
    /// A merge crosses a cut.
    #[error("the merge {0:?} + {1:?} joins a token to a following `▁`")]
    MergeAcrossSpace(String, String),
    /// The normalizer is not (only) the SentencePiece space replacement.
    #[error("the normalizer is not `▁` prepended and spaces replaced by `▁`: {0}")]
    Normalizer(String),
    /// Another stage of the pipeline is set.
    #[error("the tokenizer has a {0}")]
    Stage(&'static str),
    /// An added token matched on normalized text.
    #[error("the added token {0:?} is matched on normalized text")]
    NormalizedAddedToken(String),
    /// The model does not serialize as expected.
    #[error("its model does not serialize as a BPE model: {0}")]
    Serialization(String),
}

/// Encodes documents piece by piece with the ids the `tokenizers` crate gives whole documents
/// (see the [module](self) documentation for when that holds).
#[derive(Debug, Clone)]
pub struct PieceEncoder {
    /// Whether the normalizer puts `▁` in front of a non-empty text.
    prepend: bool,
    /// The added tokens' texts, when there are any.
    added: Option<AhoCorasick>,
    /// This encoder's number for the per-thread caches.
    owner: u64,
}

impl PieceEncoder {
    /// An encoder for `tokenizer`, or why its documents must be encoded whole.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, NotPieceWise> {
        let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
            return Err(NotPieceWise::NotBpe);
        };
        check_model(bpe)?;
        let prepend = normalizer_prepends(tokenizer)?;
        if tokenizer.get_pre_tokenizer().is_some() {
            return Err(NotPieceWise::Stage("pre-tokenizer"));
        }
        if tokenizer.get_truncation().is_some() {
            return Err(NotPieceWise::Stage("truncation setting"));
        }
        if tokenizer.get_padding().is_some() {
            return Err(NotPieceWise::Stage("padding setting"));
        }
        let mut added = Vec::new();
        for token in tokenizer.get_added_tokens_decoder().into_values() {
            if token.normalized {
                return Err(NotPieceWise::NormalizedAddedToken(token.content));
            }
            added.push(token.content);
        }
        let added =
            if added.is_empty() {
                None
            } else {
                Some(AhoCorasick::new(&added).map_err(|error| {
                    NotPieceWise::Serialization(format!("added tokens: {error}"))
                })?)
            };
        Ok(Self {
            prepend,
            added,
            owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The ids of `text` without special tokens, as `tokenizer.encode(text, false)` gives them,
    /// or `None` when `text` contains an added token (encode it whole). `tokenizer` must be the
    /// one this encoder was made for.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
    ) -> tokenizers::Result<Option<Vec<u32>>> {
        if let Some(added) = &self.added
            && added.is_match(text)
        {
            return Ok(None);
        }
        let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
            return Err("the piece encoder's tokenizer is not BPE".into());
        };
        let mut ids = Vec::with_capacity(text.len() / 3);
        let bytes = text.as_bytes();
        let mut first = String::new();
        with_thread_cache(self.owner, |cache| {
            let mut start = 0;
            while start < bytes.len() {
                let end = piece_end(bytes, start);
                // A cache key stands for the ids of its normalized text (every space a `▁`),
                // whichever spaces it holds. The first piece's key also gets the prepended `▁`.
                let piece = if start == 0 && self.prepend {
                    first.push(SPACE);
                    first.push_str(&text[..end]);
                    first.as_bytes()
                } else {
                    &bytes[start..end]
                };
                let hash = piece_hash(piece);
                match cache.get(hash, piece) {
                    Some(cached) => ids.extend_from_slice(cached),
                    None => {
                        let piece = std::str::from_utf8(piece).expect("cut at characters");
                        let normalized = piece.replace(' ', "\u{2581}");
                        let from = ids.len();
                        ids.extend(bpe.tokenize(&normalized)?.iter().map(|token| token.id));
                        cache.insert(hash, piece.as_bytes(), &ids[from..]);
                    }
                }
                start = end;
            }
            Ok(Some(ids))
        })
    }
}

/// Where the piece of `text` starting at `start` ends: past the spaces (`" "` or `▁`) it starts
/// with, at the next space or the end. In the normalized text (every space a `▁`), that is a cut
/// before every `▁` that follows another character. Spaces are whole characters, so pieces are
/// too.
fn piece_end(text: &[u8], start: usize) -> usize {
    let mut at = start;
    while at < text.len() {
        if text[at] == b' ' {
            at += 1;
        } else if is_space_mark(text, at) {
            at += SPACE_BYTES.len();
        } else {
            break;
        }
    }
    // The scan of every byte of the corpus: one comparison per byte but for `▁`'s first byte.
    while at < text.len() {
        let byte = text[at];
        if byte == b' ' || (byte == SPACE_BYTES[0] && is_space_mark(text, at)) {
            break;
        }
        at += 1;
    }
    at
}

/// Whether `▁` starts at `at`.
fn is_space_mark(text: &[u8], at: usize) -> bool {
    text.len() - at >= SPACE_BYTES.len() && text[at..at + SPACE_BYTES.len()] == SPACE_BYTES
}

/// Checks the BPE settings and merges (see the [module](self) documentation).
fn check_model(bpe: &BPE) -> Result<(), NotPieceWise> {
    if bpe.dropout.is_some_and(|dropout| dropout > 0.0) {
        return Err(NotPieceWise::BpeSetting("dropout"));
    }
    if bpe
        .continuing_subword_prefix
        .as_ref()
        .is_some_and(|prefix| !prefix.is_empty())
    {
        return Err(NotPieceWise::BpeSetting("a continuing-subword prefix"));
    }
    if bpe
        .end_of_word_suffix
        .as_ref()
        .is_some_and(|suffix| !suffix.is_empty())
    {
        return Err(NotPieceWise::BpeSetting("an end-of-word suffix"));
    }
    if bpe.ignore_merges {
        return Err(NotPieceWise::BpeSetting("ignore_merges"));
    }
    let space = SPACE.to_string();
    if bpe.token_to_id(&space).is_none() {
        return Err(NotPieceWise::NoSpaceToken);
    }
    match &bpe.unk_token {
        None => return Err(NotPieceWise::UnknownToken("is not set".into())),
        Some(unknown) if bpe.token_to_id(unknown).is_none() => {
            return Err(NotPieceWise::UnknownToken(format!(
                "{unknown:?} is not in the vocabulary"
            )));
        }
        Some(unknown) if unknown.ends_with(SPACE) => {
            return Err(NotPieceWise::UnknownToken(format!(
                "{unknown:?} ends in `▁`"
            )));
        }
        Some(_) => {}
    }
    let vocab = bpe.get_vocab();
    let mut ids: Vec<u32> = vocab.values().copied().collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() != vocab.len() {
        return Err(NotPieceWise::SharedIds);
    }
    // Every merge's result is a token, so a merge across a cut leaves a token holding `▁`
    // right after another character. Most vocabularies hold none (Llama 2's), which settles it
    // at once; otherwise the merges themselves are read (serializing the model takes a while).
    if vocab.keys().any(|token| has_space_after_other(token)) {
        check_merges(bpe)?;
    }
    Ok(())
}

/// Whether `token` holds a `▁` right after a character other than `▁`.
fn has_space_after_other(token: &str) -> bool {
    let mut previous = SPACE;
    token.chars().any(|character| {
        let found = character == SPACE && previous != SPACE;
        previous = character;
        found
    })
}

/// Checks that no merge joins a token not ending in `▁` to a token starting with `▁`.
fn check_merges(bpe: &BPE) -> Result<(), NotPieceWise> {
    let serialized = serde_json::to_value(bpe)
        .map_err(|error| NotPieceWise::Serialization(error.to_string()))?;
    let merges = serialized
        .get("merges")
        .and_then(|merges| merges.as_array())
        .ok_or_else(|| NotPieceWise::Serialization("no `merges` list".into()))?;
    for merge in merges {
        let pair = merge
            .as_array()
            .and_then(|pair| match pair.as_slice() {
                [left, right] => Some((left.as_str()?, right.as_str()?)),
                _ => None,
            })
            .ok_or_else(|| NotPieceWise::Serialization(format!("the merge {merge}")))?;
        if !pair.0.ends_with(SPACE) && pair.1.starts_with(SPACE) {
            return Err(NotPieceWise::MergeAcrossSpace(
                pair.0.to_string(),
                pair.1.to_string(),
            ));
        }
    }
    Ok(())
}

/// Whether the normalizer prepends `▁`, when it is the SentencePiece space replacement (with or
/// without the prepended `▁`); an error for any other.
fn normalizer_prepends(tokenizer: &Tokenizer) -> Result<bool, NotPieceWise> {
    let Some(normalizer) = tokenizer.get_normalizer() else {
        return Err(NotPieceWise::Normalizer("none".into()));
    };
    let value = serde_json::to_value(normalizer)
        .map_err(|error| NotPieceWise::Normalizer(error.to_string()))?;
    let replace = serde_json::json!({
        "type": "Replace", "pattern": {"String": " "}, "content": SPACE.to_string()
    });
    let prepend = serde_json::json!({"type": "Prepend", "prepend": SPACE.to_string()});
    let steps = match value.get("type").and_then(|kind| kind.as_str()) {
        Some("Sequence") => value
            .get("normalizers")
            .and_then(|steps| steps.as_array())
            .cloned()
            .unwrap_or_default(),
        _ => vec![value.clone()],
    };
    match steps.as_slice() {
        [only] if *only == replace => Ok(false),
        [first, second]
            if (*first == prepend && *second == replace)
                || (*first == replace && *second == prepend) =>
        {
            Ok(true)
        }
        _ => Err(NotPieceWise::Normalizer(value.to_string())),
    }
}
