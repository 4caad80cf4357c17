//! Ingest: text and JSONL into shards and back, the validation split, and every error case.

use std::fs;
use std::path::{Path, PathBuf};

use hlat_train::data::shard::{SHARD_HEADER_BYTES, ShardWriter};
use hlat_train::data::{
    DataError, IngestConfig, ShardSet, Split, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TextTokenizer,
    TokenShard, TokenStream, ingest,
};

fn tokenizer() -> TextTokenizer {
    let sample: Vec<String> = (0..50)
        .map(|i| format!("document {i}: the quick fox.\n"))
        .collect();
    TextTokenizer::train_byte_level_bpe(&sample, 300).unwrap()
}

fn config(inputs: Vec<PathBuf>, out: &Path) -> IngestConfig {
    IngestConfig {
        show_progress: false,
        ..IngestConfig::new(inputs, out.to_path_buf())
    }
}

/// All tokens of a split, or none when it has no shard.
fn split_tokens(folder: &Path, split: Split) -> Vec<u32> {
    match ShardSet::open_split(folder, split) {
        Ok(set) => {
            let mut tokens = vec![0; set.num_tokens()];
            set.copy_tokens(0, &mut tokens);
            tokens
        }
        Err(_) => Vec::new(),
    }
}

/// The decoded documents of a token stream (split at EOS).
fn decode_documents(tokenizer: &TextTokenizer, tokens: &[u32]) -> Vec<String> {
    let eos = tokenizer.eos_id().unwrap();
    assert_eq!(tokens.last(), Some(&eos), "the stream ends with EOS");
    tokens[..tokens.len() - 1]
        .split(|&t| t == eos)
        .map(|document| tokenizer.decode(document).unwrap())
        .collect()
}

#[test]
fn text_and_jsonl_folders_round_trip_through_small_shards() {
    let input = tempfile::tempdir().unwrap();
    fs::create_dir(input.path().join("sub")).unwrap();
    fs::write(
        input.path().join("a.txt"),
        "First document.\nIt has two lines.",
    )
    .unwrap();
    fs::write(
        input.path().join("sub/b.jsonl"),
        "{\"text\": \"Second: ünïcödé\"}\n\n{\"text\": \"Third\", \"id\": 3}\r\n{\"text\": \"\"}\n",
    )
    .unwrap();
    fs::write(input.path().join("ignored.bin"), [0xff, 0xfe]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let tokenizer = tokenizer();
    let summary = ingest(
        &tokenizer,
        &IngestConfig {
            shard_tokens: 5,
            validation_fraction: 0.0,
            ..config(vec![input.path().to_path_buf()], out.path())
        },
    )
    .unwrap();
    assert_eq!(summary.train_documents, 3);
    assert_eq!(
        (summary.validation_documents, summary.validation_tokens),
        (0, 0)
    );
    assert!(summary.validation_shards.is_empty());
    let tokens = split_tokens(out.path(), Split::Train);
    assert_eq!(tokens.len() as u64, summary.train_tokens);
    assert_eq!(summary.train_shards.len(), tokens.len().div_ceil(5));
    assert_eq!(
        decode_documents(&tokenizer, &tokens),
        [
            "First document.\nIt has two lines.",
            "Second: ünïcödé",
            "Third"
        ]
    );
    let shard = TokenShard::open(&summary.train_shards[0]).unwrap();
    assert_eq!((shard.header().token_width, shard.len()), (2, 5));
    assert_eq!(shard.header().vocab_size, 300);
    let names: Vec<String> = fs::read_dir(out.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names
            .iter()
            .all(|name| name == TOKENIZER_FILE
                || name.starts_with("train-") && name.ends_with(".bin")),
        "{names:?}"
    );
    let saved = TextTokenizer::from_file(out.path().join(TOKENIZER_FILE)).unwrap();
    assert_eq!(saved.to_json().unwrap(), tokenizer.to_json().unwrap());
}

#[test]
fn validation_holds_out_whole_documents() {
    let input = tempfile::tempdir().unwrap();
    let lines: String = (0..400)
        .map(|i| format!("{{\"text\": \"document number {i}\"}}\n"))
        .collect();
    fs::write(input.path().join("docs.jsonl"), lines).unwrap();
    let out = tempfile::tempdir().unwrap();
    let tokenizer = tokenizer();
    let summary = ingest(
        &tokenizer,
        &IngestConfig {
            validation_fraction: 0.25,
            ..config(vec![input.path().join("docs.jsonl")], out.path())
        },
    )
    .unwrap();
    assert_eq!(summary.train_documents + summary.validation_documents, 400);
    assert!(
        (70..130).contains(&summary.validation_documents),
        "{summary:?}"
    );
    let mut all = decode_documents(&tokenizer, &split_tokens(out.path(), Split::Train));
    let validation = decode_documents(&tokenizer, &split_tokens(out.path(), Split::Validation));
    assert_eq!(validation.len() as u64, summary.validation_documents);
    all.extend(validation);
    all.sort();
    let mut expected: Vec<String> = (0..400).map(|i| format!("document number {i}")).collect();
    expected.sort();
    assert_eq!(
        all, expected,
        "every document is whole, on one side of the split"
    );
}

#[test]
fn large_vocabularies_use_four_byte_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = ShardWriter::new(dir.path(), Split::Train, 100, 100_000).unwrap();
    writer.write(&[0, 65_535, 65_536, 99_999]).unwrap();
    let error = writer.write(&[100_000]).err().unwrap().to_string();
    assert!(error.contains("100000"), "{error}");
    let paths = writer.commit().unwrap();
    let shard = TokenShard::open(&paths[0]).unwrap();
    assert_eq!(shard.header().token_width, 4);
    assert_eq!(
        fs::metadata(&paths[0]).unwrap().len(),
        SHARD_HEADER_BYTES as u64 + 16
    );
    let mut tokens = [0; 4];
    shard.copy_tokens(0, &mut tokens);
    assert_eq!(tokens, [0, 65_535, 65_536, 99_999]);
}

fn ingest_error(
    files: &[(&str, &[u8])],
    skip_invalid_utf8: bool,
) -> (DataError, PathBuf, tempfile::TempDir) {
    let input = tempfile::tempdir().unwrap();
    for (name, content) in files {
        fs::write(input.path().join(name), content).unwrap();
    }
    let out = tempfile::tempdir().unwrap();
    let error = ingest(
        &tokenizer(),
        &IngestConfig {
            skip_invalid_utf8,
            ..config(vec![input.path().to_path_buf()], out.path())
        },
    )
    .expect_err("ingest fails");
    let leftovers: Vec<_> = fs::read_dir(out.path()).unwrap().collect();
    assert!(
        leftovers.is_empty(),
        "a failed ingest leaves nothing: {leftovers:?}"
    );
    (error, input.path().to_path_buf(), input)
}

#[test]
fn empty_inputs_are_errors() {
    let (error, ..) = ingest_error(&[], false);
    assert!(matches!(error, DataError::EmptyInput(_)), "{error}");
    let (error, ..) = ingest_error(
        &[("a.txt", b""), ("b.jsonl", b"\n{\"text\": \"\"}\n")],
        false,
    );
    assert!(matches!(error, DataError::EmptyInput(_)), "{error}");
}

#[test]
fn invalid_utf8_names_the_file_and_byte_offset_or_is_skipped_and_counted() {
    let bad_text: &[u8] = b"good start \xff bad";
    let bad_jsonl: &[u8] = b"{\"text\": \"fine\"}\n{\"text\": \"bro\xc3\"}\n";
    let (error, input, _keep) = ingest_error(&[("0.txt", b"fine"), ("a.txt", bad_text)], false);
    match error {
        DataError::InvalidUtf8 { path, offset, .. } => {
            assert_eq!((path, offset), (input.join("a.txt"), 11));
        }
        other => panic!("{other}"),
    }
    let (error, input, _keep) = ingest_error(&[("a.jsonl", bad_jsonl)], false);
    match error {
        DataError::InvalidUtf8 { path, offset, .. } => {
            assert_eq!((path, offset), (input.join("a.jsonl"), 17 + 13));
        }
        other => panic!("{other}"),
    }
    // Skipping: the bad documents are left out and counted, the good ones kept.
    let input = tempfile::tempdir().unwrap();
    fs::write(input.path().join("a.txt"), bad_text).unwrap();
    fs::write(input.path().join("b.jsonl"), bad_jsonl).unwrap();
    let out = tempfile::tempdir().unwrap();
    let tokenizer = tokenizer();
    let summary = ingest(
        &tokenizer,
        &IngestConfig {
            skip_invalid_utf8: true,
            validation_fraction: 0.0,
            ..config(vec![input.path().to_path_buf()], out.path())
        },
    )
    .unwrap();
    assert_eq!(summary.skipped_invalid_utf8, 2);
    assert_eq!(
        decode_documents(&tokenizer, &split_tokens(out.path(), Split::Train)),
        ["fine"]
    );
}

#[test]
fn bad_json_lines_name_the_file_and_line() {
    let (error, input, _keep) = ingest_error(
        &[("a.jsonl", b"{\"text\": \"ok\"}\n\n{\"text\": oops}\n")],
        false,
    );
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "{}: line 3: bad JSON",
            input.join("a.jsonl").display()
        )),
        "{message}"
    );
    let (error, ..) = ingest_error(&[("a.jsonl", b"{\"body\": \"x\"}\n")], false);
    assert!(
        error.to_string().contains("line 1: no field `text`"),
        "{error}"
    );
    let (error, ..) = ingest_error(&[("a.jsonl", b"{\"text\": 5}\n")], false);
    assert!(
        error
            .to_string()
            .contains("line 1: field `text` is not a string"),
        "{error}"
    );
}

#[test]
fn an_output_that_holds_shards_is_refused() {
    let input = tempfile::tempdir().unwrap();
    fs::write(input.path().join("a.txt"), "text").unwrap();
    let out = tempfile::tempdir().unwrap();
    let run = || {
        ingest(
            &tokenizer(),
            &config(vec![input.path().join("a.txt")], out.path()),
        )
    };
    run().unwrap();
    let before = fs::read(out.path().join("train-00000.bin")).unwrap();
    assert!(matches!(run(), Err(DataError::OutputExists { .. })));
    assert_eq!(
        fs::read(out.path().join("train-00000.bin")).unwrap(),
        before
    );
}

#[test]
fn an_output_holding_the_same_tokenizer_is_used_and_another_refused() {
    let input = tempfile::tempdir().unwrap();
    fs::write(input.path().join("a.txt"), "text").unwrap();
    let out = tempfile::tempdir().unwrap();
    let tokenizer = tokenizer();
    tokenizer.save(out.path().join(TOKENIZER_FILE)).unwrap();
    ingest(
        &tokenizer,
        &config(vec![input.path().join("a.txt")], out.path()),
    )
    .unwrap();

    let other_out = tempfile::tempdir().unwrap();
    let other = TextTokenizer::train_byte_level_bpe(&["something else entirely"], 270).unwrap();
    other.save(other_out.path().join(TOKENIZER_FILE)).unwrap();
    let error = ingest(
        &tokenizer,
        &config(vec![input.path().join("a.txt")], other_out.path()),
    )
    .expect_err("a different tokenizer is refused");
    assert!(
        error.to_string().contains("a different tokenizer.json"),
        "{error}"
    );
    let left: Vec<_> = fs::read_dir(other_out.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "only the tokenizer that was there");
}

#[test]
fn the_config_beside_the_tokenizer_names_the_separator_and_goes_with_the_shards() {
    // Llama 3's tokenizer with Llama 3 Instruct's EOS: <|eot_id|> (1002), not <|end_of_text|>.
    let source = tempfile::tempdir().unwrap();
    fs::copy(
        super::fixture("llama3-tokenizer/tokenizer.json"),
        source.path().join(TOKENIZER_FILE),
    )
    .unwrap();
    let instruct = r#"{"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}}"#;
    fs::write(source.path().join(TOKENIZER_CONFIG_FILE), instruct).unwrap();
    let tokenizer = TextTokenizer::from_file(source.path().join(TOKENIZER_FILE)).unwrap();
    let input = tempfile::tempdir().unwrap();
    fs::write(
        input.path().join("a.jsonl"),
        "{\"text\": \"First document.\"}\n{\"text\": \"Second: ünïcödé 🚀\"}\n",
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let run = |out: &Path| {
        ingest(
            &tokenizer,
            &IngestConfig {
                validation_fraction: 0.0,
                ..config(vec![input.path().to_path_buf()], out)
            },
        )
    };
    run(out.path()).unwrap();
    let tokens = split_tokens(out.path(), Split::Train);
    assert_eq!(tokens.iter().filter(|&&token| token == 1002).count(), 2);
    assert!(!tokens.contains(&1001) && !tokens.contains(&1000));
    // The folder's tokenizer reads back with the same special tokens.
    assert_eq!(
        fs::read_to_string(out.path().join(TOKENIZER_CONFIG_FILE)).unwrap(),
        instruct
    );
    let saved = TextTokenizer::from_file(out.path().join(TOKENIZER_FILE)).unwrap();
    assert_eq!(saved.eos_id().unwrap(), 1002);
    assert_eq!(
        decode_documents(&saved, &tokens),
        ["First document.", "Second: ünïcödé 🚀"]
    );

    // A folder holding another config (one that would name other tokens) is refused, and so is
    // any config for a tokenizer read without one.
    let other_out = tempfile::tempdir().unwrap();
    fs::write(
        other_out.path().join(TOKENIZER_CONFIG_FILE),
        r#"{"eos_token": "<|end_of_text|>"}"#,
    )
    .unwrap();
    let error = run(other_out.path()).expect_err("another config is refused");
    assert!(
        error.to_string().contains("tokenizer_config.json"),
        "{error}"
    );
    let error = ingest(
        &self::tokenizer(),
        &config(vec![input.path().to_path_buf()], other_out.path()),
    )
    .expect_err("a config without its tokenizer is refused");
    assert!(matches!(error, DataError::OutputExists { .. }), "{error}");
    let left: Vec<_> = fs::read_dir(other_out.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "only the config that was there");
}

fn shard_error(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train-00000.bin");
    fs::write(&path, bytes).unwrap();
    let error = TokenShard::open(&path).err().expect("the shard is refused");
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    message
}

fn header(version: u32, width: u32, count: u64, vocab: u32) -> Vec<u8> {
    let mut bytes = b"HLATTOKS".to_vec();
    bytes.extend(version.to_le_bytes());
    bytes.extend(width.to_le_bytes());
    bytes.extend(count.to_le_bytes());
    bytes.extend(vocab.to_le_bytes());
    bytes.extend(0u32.to_le_bytes());
    bytes
}

#[test]
fn shards_with_a_wrong_header_or_length_are_refused() {
    let good = [header(1, 2, 3, 300), vec![0; 6]].concat();
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("good.bin"), &good).unwrap();
    assert_eq!(
        TokenShard::open(dir.path().join("good.bin")).unwrap().len(),
        3
    );

    assert!(shard_error(&good[..20]).contains("shorter than the 32-byte header"));
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert!(shard_error(&bad_magic).contains("magic"));
    assert!(shard_error(&[header(2, 2, 3, 300), vec![0; 6]].concat()).contains("version 2"));
    assert!(shard_error(&[header(1, 3, 2, 300), vec![0; 6]].concat()).contains("token width 3"));
    let truncated = shard_error(&good[..good.len() - 1]);
    assert!(
        truncated.contains("3 tokens of 2 bytes") && truncated.contains("5 bytes"),
        "{truncated}"
    );
    assert!(shard_error(&[header(1, 2, 4, 300), vec![0; 6]].concat()).contains("4 tokens"));
    assert!(shard_error(&[header(1, 2, 0, 0)].concat()).contains("vocabulary of 0 tokens"));
}

#[test]
fn shards_holding_an_id_outside_their_vocabulary_are_refused_on_open() {
    // Ids 0, 299, 300 in a vocabulary of 300: the third is one past the end.
    let ids = |width: u32, ids: &[u32]| -> Vec<u8> {
        ids.iter()
            .flat_map(|&id| match width {
                2 => (id as u16).to_le_bytes().to_vec(),
                _ => id.to_le_bytes().to_vec(),
            })
            .collect()
    };
    for width in [2, 4] {
        let bytes = [header(1, width, 3, 300), ids(width, &[0, 299, 300])].concat();
        let message = shard_error(&bytes);
        assert!(
            message.contains("token 2")
                && message.contains("id 300")
                && message.contains("vocabulary of 300"),
            "{message}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in-range.bin");
        fs::write(
            &path,
            [header(1, width, 2, 300), ids(width, &[0, 299])].concat(),
        )
        .unwrap();
        assert_eq!(TokenShard::open(&path).unwrap().len(), 2);
    }
}

#[test]
fn shard_sets_read_across_shards_and_check_vocabularies() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = ShardWriter::new(dir.path(), Split::Validation, 3, 50).unwrap();
    writer.write(&(0..10).collect::<Vec<u32>>()).unwrap();
    assert_eq!(writer.commit().unwrap().len(), 4);
    let set = ShardSet::open_split(dir.path(), Split::Validation).unwrap();
    let mut middle = [0; 6];
    set.copy_tokens(2, &mut middle);
    assert_eq!(middle, [2, 3, 4, 5, 6, 7]);
    assert!(matches!(
        ShardSet::open_split(dir.path(), Split::Train),
        Err(DataError::EmptyInput(_))
    ));
    let mut other = ShardWriter::new(dir.path(), Split::Train, 3, 60).unwrap();
    other.write(&[1]).unwrap();
    let paths = [
        set.shards()[0].path().to_path_buf(),
        other.commit().unwrap().remove(0),
    ];
    let error = ShardSet::open(&paths).err().unwrap().to_string();
    assert!(error.contains("vocabulary size 60 differs"), "{error}");
}
