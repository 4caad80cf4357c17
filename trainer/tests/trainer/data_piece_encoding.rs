//! Word-by-word encoding of documents (`hlat_train::data::piece_encoding`): the same ids as the
//! `tokenizers` crate's encoding of whole documents, for the Llama-2 tokenizer and variants of
//! it, and no word-by-word encoding for tokenizers where it would not be exact.

use std::str::FromStr;

use super::fixture;
use hlat_train::data::TextTokenizer;
use hlat_train::data::piece_cache::{
    CACHED_PIECES, MAX_CACHED_PIECE_BYTES, PieceCache, piece_hash, with_thread_cache,
};
use hlat_train::data::piece_encoding::{NotPieceWise, PieceEncoder};
use hlat_train::data::rng::SplitMix64;
use rayon::prelude::*;
use serde_json::{Value, json};
use tokenizers::Tokenizer;

/// The Llama-2 tokenizer.json, as JSON to edit.
fn llama2_json() -> Value {
    serde_json::from_slice(&std::fs::read(fixture("llama2-tokenizer/tokenizer.json")).unwrap())
        .unwrap()
}

fn tokenizer_of(json: &Value) -> TextTokenizer {
    TextTokenizer::from(Tokenizer::from_str(&json.to_string()).unwrap())
}

/// The ids the `tokenizers` crate gives `text` as one document, without special tokens.
fn whole(tokenizer: &TextTokenizer, text: &str) -> Vec<u32> {
    tokenizer
        .inner()
        .encode(text, false)
        .unwrap()
        .get_ids()
        .to_vec()
}

/// Checks that `encode_documents` gives every text the crate's ids, twice (the second time from
/// warm caches), on pools of 1 and 3 threads.
fn assert_same_ids(tokenizer: &TextTokenizer, texts: &[String], what: &str) {
    let expected: Vec<Vec<u32>> = texts.iter().map(|text| whole(tokenizer, text)).collect();
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for round in 0..2 {
            let encoded = pool.install(|| tokenizer.encode_documents(texts).unwrap());
            for ((text, ids), expected) in texts.iter().zip(&encoded).zip(&expected) {
                assert_eq!(
                    ids, expected,
                    "{what}, {threads} threads, round {round}: {text:?}"
                );
            }
        }
    }
}

/// Texts where cutting at spaces could go wrong: the documents of the Llama-2 tokenizer fixture
/// (edge cases and generated text, which `fixtures/regenerate.py` writes with Python's ids), and
/// a few more only this test needs.
fn edge_cases() -> Vec<String> {
    let fixture_documents = test_support::fixtures::expected("llama2-tokenizer")["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|document| document["text"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    let more = [
        "  ",
        "x  ",
        "  leading and trailing  ",
        "several   spaces    between words",
        "\u{2581}\u{2581}",
        "\u{2581}x\u{2581}\u{2581}y \u{2581} z\u{2581} ",
        " \u{2581}the\u{2581}the  the",
        "emoji 🤷‍♀️ 👍🏽",
        "<s>",
        " <unk> ",
        "non\u{a0}breaking\u{a0} space and\u{3000}ideographic",
    ];
    fixture_documents
        .into_iter()
        .chain(more.iter().map(|text| text.to_string()))
        .chain([" ".repeat(70), format!("{} end", "word ".repeat(200))])
        .collect()
}

/// Seeded documents of words, digits, symbols and special tokens' texts between every kind of
/// space, words repeating so that the caches hit.
fn generated(seed: u64, count: usize) -> Vec<String> {
    // Words, digits, symbols and the special tokens' texts (none holds a space).
    let words: Vec<&str> = "the of and model tokens The Model it's don't LLM IL-6 TNF-α café \
                            naïve 日本語 テキスト русский 🚀 ✓ € °C — … 42 3.14 1999 x² <s> </s> \
                            <unk> supercalifragilistic a"
        .split_whitespace()
        .collect();
    const SPACES: [&str; 12] = [
        " ",
        " ",
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\n\n",
        " \n",
        "\u{2581}",
        " \u{2581}",
        "",
    ];
    let mut rng = SplitMix64::new(seed);
    (0..count)
        .map(|_| {
            let mut text = String::new();
            if rng.below(3) == 0 {
                text.push_str(SPACES[rng.below(SPACES.len() as u64) as usize]);
            }
            for _ in 0..rng.below(120) {
                text.push_str(words[rng.below(words.len() as u64) as usize]);
                text.push_str(SPACES[rng.below(SPACES.len() as u64) as usize]);
            }
            text
        })
        .collect()
}

fn all_texts() -> Vec<String> {
    let mut texts = edge_cases();
    texts.extend(generated(37, 300));
    texts
}

#[test]
fn llama2_documents_are_encoded_word_by_word_with_the_crates_ids() {
    let tokenizer = TextTokenizer::from_file(fixture("llama2-tokenizer/tokenizer.json")).unwrap();
    assert!(tokenizer.encodes_documents_piecewise());
    let texts = all_texts();
    assert_same_ids(&tokenizer, &texts, "Llama 2");

    // Documents holding an added token's text are left to the crate, which splits them there;
    // the others are encoded word by word.
    let encoder = PieceEncoder::new(tokenizer.inner()).unwrap();
    for text in &texts {
        let special = ["<s>", "</s>", "<unk>"]
            .iter()
            .any(|token| text.contains(token));
        let ids = encoder.encode(tokenizer.inner(), text).unwrap();
        assert_eq!(ids.is_none(), special, "{text:?}");
        if let Some(ids) = ids {
            assert_eq!(ids, whole(&tokenizer, text), "{text:?}");
        }
    }
}

#[test]
fn more_distinct_words_than_the_cache_holds_keep_the_ids() {
    let tokenizer = TextTokenizer::from_file(fixture("llama2-tokenizer/tokenizer.json")).unwrap();
    // 160,000 distinct words on 2 threads: each thread's cache fills past its bound.
    let texts: Vec<String> = (0..160)
        .map(|document| {
            (0..1000)
                .map(|word| format!("w{}x{}", (document / 2) * 1000 + word, document % 7))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert!(texts.len() * 1000 / 2 > CACHED_PIECES);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let encoded = pool.install(|| tokenizer.encode_documents(&texts).unwrap());
    let expected: Vec<Vec<u32>> = texts
        .par_iter()
        .map(|text| whole(&tokenizer, text))
        .collect();
    assert!(encoded == expected);
}

/// Variants of the Llama-2 tokenizer where word-by-word encoding is still exact.
#[test]
fn exact_variants_are_encoded_word_by_word_with_the_crates_ids() {
    let texts = all_texts();
    let prepend = json!({"type": "Prepend", "prepend": "\u{2581}"});
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let mut variants = Vec::new();
    // Spaces replaced, nothing prepended: the first word has no `▁`.
    let mut json = llama2_json();
    json["normalizer"] = replace.clone();
    variants.push(("no prepended ▁", json));
    // The two normalizers the other way round.
    let mut json = llama2_json();
    json["normalizer"] = json!({"type": "Sequence", "normalizers": [replace, prepend]});
    variants.push(("replace, then prepend", json));
    // No byte fallback: characters outside the vocabulary become <unk>, fused.
    let mut json = llama2_json();
    json["model"]["byte_fallback"] = json!(false);
    variants.push(("no byte fallback", json));
    // No byte fallback and no fusing.
    let mut json = llama2_json();
    json["model"]["byte_fallback"] = json!(false);
    json["model"]["fuse_unk"] = json!(false);
    variants.push(("unfused <unk>", json));
    for (what, json) in variants {
        let tokenizer = tokenizer_of(&json);
        assert!(tokenizer.encodes_documents_piecewise(), "{what}");
        assert_same_ids(&tokenizer, &texts, what);
    }
}

/// Variants of the Llama-2 tokenizer where word-by-word encoding would not be exact, or is not
/// shown to be: they are encoded whole, and say why.
#[test]
fn other_tokenizers_are_encoded_whole_and_say_why() {
    let texts = all_texts();
    // Each variant, and the start of the reason it gives.
    let mut variants = Vec::new();
    let mut json = llama2_json();
    json["pre_tokenizer"] = json!({
        "type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": true
    });
    variants.push((json, "the tokenizer has a pre-tokenizer"));
    let mut json = llama2_json();
    json["normalizer"]["normalizers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "Lowercase"}));
    variants.push((
        json,
        "the normalizer is not `▁` prepended and spaces replaced",
    ));
    let mut json = llama2_json();
    json["model"]["ignore_merges"] = json!(true);
    variants.push((json, "the BPE model has ignore_merges"));
    let mut json = llama2_json();
    json["model"]["unk_token"] = Value::Null;
    variants.push((json, "the unknown token is not set"));
    let mut json = llama2_json();
    json["added_tokens"][2]["normalized"] = json!(true);
    variants.push((
        json,
        "the added token \"</s>\" is matched on normalized text",
    ));
    let mut json = llama2_json();
    json["truncation"] = json!({
        "direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0
    });
    variants.push((json, "the tokenizer has a truncation setting"));
    for (json, expected_reason) in variants {
        let tokenizer = tokenizer_of(&json);
        let reason = PieceEncoder::new(tokenizer.inner())
            .unwrap_err()
            .to_string();
        assert!(reason.starts_with(expected_reason), "{reason}");
        assert!(!tokenizer.encodes_documents_piecewise(), "{reason}");
        let encoded = tokenizer.encode_documents(&texts).unwrap();
        for (text, ids) in texts.iter().zip(&encoded) {
            assert_eq!(ids, &whole(&tokenizer, text), "{reason}: {text:?}");
        }
    }
}

/// A tiny SentencePiece-style tokenizer over `a`, `b`, `▁`, with the merges `merges` and the
/// tokens `extra` that no merge makes.
fn tiny(extra: &[&str], merges: &[[&str; 2]]) -> TextTokenizer {
    let mut vocab = serde_json::Map::new();
    for token in ["<unk>", "\u{2581}", "a", "b"].iter().chain(extra) {
        vocab.insert(token.to_string(), json!(vocab.len()));
    }
    for [left, right] in merges {
        vocab.insert(format!("{left}{right}"), json!(vocab.len()));
    }
    tokenizer_of(&json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": null,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
            "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges
        }
    }))
}

#[test]
fn a_merge_across_a_space_is_found_and_the_document_encoded_whole() {
    // `a` + `▁` merges: a cut before `▁` would separate what the whole document merges.
    let crossing = tiny(&[], &[["a", "\u{2581}"], ["\u{2581}", "b"]]);
    assert_eq!(
        PieceEncoder::new(crossing.inner()).unwrap_err(),
        NotPieceWise::MergeAcrossSpace("a".into(), "\u{2581}".into())
    );
    assert!(!crossing.encodes_documents_piecewise());
    let whole_ids = whole(&crossing, "a b");
    let vocab = crossing.inner().get_vocab(true);
    assert_eq!(whole_ids, [vocab["a\u{2581}"], vocab["b"]]);
    // The pieces `a` and `▁b` on their own give other ids, which the encoder must not return.
    let pieces = [whole(&crossing, "a"), whole(&crossing, " b")].concat();
    assert_eq!(pieces, [vocab["a"], vocab["\u{2581}b"]]);
    assert_eq!(
        crossing.encode_documents(&["a b", "a  b a"]).unwrap(),
        [whole_ids, whole(&crossing, "a  b a")]
    );

    // Without that merge the same tokenizer is encoded word by word, with the crate's ids.
    let texts: Vec<String> = ["a b", "aa  b a", " b ab  ", "ba\u{2581}\u{2581}b", "c a"]
        .iter()
        .map(|text| text.to_string())
        .collect();
    let exact = tiny(
        &[],
        &[["\u{2581}", "b"], ["a", "a"], ["\u{2581}", "\u{2581}"]],
    );
    assert!(exact.encodes_documents_piecewise());
    assert_same_ids(&exact, &texts, "tiny");
    // A token `a▁` that no merge makes: the vocabulary alone cannot rule a crossing merge out,
    // the merges do.
    let unmade = tiny(&["a\u{2581}"], &[["\u{2581}", "b"], ["a", "a"]]);
    assert!(unmade.encodes_documents_piecewise());
    assert_same_ids(&unmade, &texts, "tiny with a token no merge makes");
}

#[test]
fn the_piece_cache_is_bounded_and_per_encoder() {
    let mut cache = PieceCache::default();
    let piece = "\u{2581}word".as_bytes();
    assert_eq!(cache.get(piece_hash(piece), piece), None);
    cache.insert(piece_hash(piece), piece, &[1, 2]);
    assert_eq!(cache.get(piece_hash(piece), piece), Some(&[1, 2][..]));
    // The same hash with other bytes is another piece.
    assert_eq!(cache.get(piece_hash(piece), b"other"), None);
    // Long pieces are not kept.
    let long = vec![b'x'; MAX_CACHED_PIECE_BYTES + 1];
    cache.insert(piece_hash(&long), &long, &[3]);
    assert_eq!(cache.get(piece_hash(&long), &long), None);
    assert_eq!(cache.len(), 1);
    // A full cache starts over.
    for index in 1..CACHED_PIECES {
        let piece = format!("p{index}");
        cache.insert(
            piece_hash(piece.as_bytes()),
            piece.as_bytes(),
            &[index as u32],
        );
    }
    assert_eq!(cache.len(), CACHED_PIECES);
    assert_eq!(cache.get(piece_hash(b"p77"), b"p77"), Some(&[77][..]));
    cache.insert(piece_hash(b"new"), b"new", &[5]);
    assert_eq!(cache.len(), 1);
    assert_eq!(cache.get(piece_hash(b"p77"), b"p77"), None);
    assert_eq!(cache.get(piece_hash(b"new"), b"new"), Some(&[5][..]));

    // A thread's cache holds one encoder's pieces at a time.
    let owner = u64::MAX - 1;
    with_thread_cache(owner, |cache| cache.insert(piece_hash(piece), piece, &[9]));
    let hit = with_thread_cache(owner, |cache| cache.get(piece_hash(piece), piece).is_some());
    assert!(hit);
    let other = with_thread_cache(owner + 1, |cache| cache.is_empty());
    assert!(other);
}
