//! Corpus inputs against `fixtures/corpus-formats` (made by `fixtures/regenerate_corpus.py` with
//! Hugging Face `tokenizers`, pyarrow, gzip, zstandard and numpy): the same documents as
//! Parquet, gzip and zstd JSONL and plain JSONL ingest to the ids Python gives plus one EOS per
//! document, into identical shards; nested text fields; bad inputs; filters; Megatron indexed
//! datasets both ways; resuming; the streamed tokenizer sample.

use std::fs;
use std::path::{Path, PathBuf};

use hlat_train::data::megatron;
use hlat_train::data::sample::{SampleLimits, train_tokenizer_on_sample};
use hlat_train::data::{
    DataError, Dedup, IngestConfig, IngestSummary, OutputFormat, ShardSet, Split, TextField,
    TextTokenizer, TokenStream, ingest,
};

use super::fixture;

fn corpus(name: &str) -> PathBuf {
    fixture("corpus-formats").join(name)
}

fn expected() -> serde_json::Value {
    serde_json::from_slice(&fs::read(corpus("expected.json")).unwrap()).unwrap()
}

fn tokenizer() -> TextTokenizer {
    TextTokenizer::from_file(fixture("llama3-tokenizer/tokenizer.json")).unwrap()
}

/// Every document's ids as Python gave them, each followed by EOS.
fn expected_stream() -> Vec<u32> {
    let expected = expected();
    let eos = expected["eos_id"].as_u64().unwrap() as u32;
    let mut stream = Vec::new();
    for ids in expected["ids"].as_array().unwrap() {
        let ids: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
        stream.extend(ids);
        stream.push(eos);
    }
    assert_eq!(
        stream.len() as u64,
        expected["total_tokens"].as_u64().unwrap()
    );
    stream
}

/// The texts of docs.jsonl, in order.
fn texts() -> Vec<String> {
    fs::read_to_string(corpus("docs.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            value["text"].as_str().unwrap().to_string()
        })
        .collect()
}

fn config(inputs: Vec<PathBuf>, out: &Path) -> IngestConfig {
    IngestConfig {
        show_progress: false,
        validation_fraction: 0.0,
        ..IngestConfig::new(inputs, out.to_path_buf())
    }
}

fn split_tokens(folder: &Path, split: Split) -> Vec<u32> {
    let set = ShardSet::open_split(folder, split).unwrap();
    let mut tokens = vec![0; set.num_tokens()];
    set.copy_tokens(0, &mut tokens);
    tokens
}

/// Every file of a folder, by name, with its bytes.
fn folder_bytes(folder: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(folder)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                fs::read(&path).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_format_ingests_to_the_ids_of_hugging_face_tokenizers_in_identical_shards() {
    let tokenizer = tokenizer();
    let want = expected_stream();
    let scratch = tempfile::tempdir().unwrap();
    // gzip content under a name that says nothing of it: found by its magic bytes.
    let disguised = scratch.path().join("part-0001.jsonl");
    fs::copy(corpus("docs.jsonl.gz"), &disguised).unwrap();
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        ("jsonl", corpus("docs.jsonl"), "text"),
        ("jsonl.gz", corpus("docs.jsonl.gz"), "text"),
        ("jsonl.zst", corpus("docs.jsonl.zst"), "text"),
        ("gzip by magic", disguised, "text"),
        ("parquet, 6 row groups", corpus("docs.parquet"), "text"),
        ("parquet zstd", corpus("docs-zstd.parquet"), "text"),
        ("nested jsonl", corpus("docs.jsonl.zst"), "meta.body"),
        ("nested parquet", corpus("docs.parquet"), "meta.body"),
    ];
    let mut first: Option<Vec<(String, Vec<u8>)>> = None;
    for (name, input, field) in cases {
        let out = scratch.path().join(name.replace([' ', ','], "_"));
        let summary = ingest(
            &tokenizer,
            &IngestConfig {
                text_field: TextField::parse(field).unwrap(),
                shard_tokens: 1000,
                ..config(vec![input], &out)
            },
        )
        .unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(summary.train_documents, 40, "{name}");
        assert_eq!(summary.train_tokens, want.len() as u64, "{name}");
        assert_eq!(split_tokens(&out, Split::Train), want, "{name}");
        let files = folder_bytes(&out);
        assert!(files.len() > 3, "{name}: several shards");
        match &first {
            None => first = Some(files),
            Some(first) => assert!(first == &files, "{name}: the same files"),
        }
    }
}

#[test]
fn mixed_inputs_folders_and_glob_patterns_in_one_run() {
    let tokenizer = tokenizer();
    let want = expected_stream();
    let scratch = tempfile::tempdir().unwrap();
    let input = scratch.path().join("input");
    fs::create_dir_all(input.join("sub")).unwrap();
    fs::copy(corpus("docs.parquet"), input.join("a.parquet")).unwrap();
    fs::copy(corpus("docs.jsonl.gz"), input.join("sub/b.jsonl.gz")).unwrap();
    fs::write(input.join("c.txt"), "A plain text document.").unwrap();
    fs::write(input.join("ignored.csv"), "not,read").unwrap();
    let out = scratch.path().join("folder");
    let summary = ingest(&tokenizer, &config(vec![input.clone()], &out)).unwrap();
    // Sorted: a.parquet, c.txt, sub/b.jsonl.gz.
    let text = tokenizer.encode("A plain text document.", false).unwrap();
    let eos = tokenizer.eos_id().unwrap();
    let mut stream = want.clone();
    stream.extend(&text);
    stream.push(eos);
    stream.extend(&want);
    assert_eq!(summary.train_documents, 81);
    assert_eq!(split_tokens(&out, Split::Train), stream);

    let pattern = scratch.path().join("input/**/*.jsonl.gz");
    let out = scratch.path().join("glob");
    let summary = ingest(&tokenizer, &config(vec![pattern], &out)).unwrap();
    assert_eq!(summary.train_documents, 40);
    let pattern = scratch.path().join("input/*.nothing");
    let error = ingest(
        &tokenizer,
        &config(vec![pattern], &scratch.path().join("none")),
    )
    .unwrap_err();
    assert!(error.to_string().contains("matches no file"), "{error}");
}

#[test]
fn the_output_does_not_depend_on_threads_or_batches() {
    let tokenizer = tokenizer();
    let scratch = tempfile::tempdir().unwrap();
    let run = |name: &str, threads: usize, batch_bytes: usize| {
        let out = scratch.path().join(name);
        ingest(
            &tokenizer,
            &IngestConfig {
                threads: Some(threads),
                batch_bytes,
                shard_tokens: 700,
                validation_fraction: 0.2,
                ..config(vec![corpus("docs.parquet")], &out)
            },
        )
        .unwrap();
        folder_bytes(&out)
    };
    let one = run("one", 1, 1 << 20);
    assert!(one.iter().any(|(name, _)| name.starts_with("val-")));
    assert!(one == run("three", 3, 1 << 20));
    assert!(one == run("small-batches", 2, 500));
}

/// The error of ingesting `input` into a fresh folder, which must be left without output.
fn ingest_error(input: PathBuf, field: &str) -> DataError {
    let out = tempfile::tempdir().unwrap();
    let error = ingest(
        &tokenizer(),
        &IngestConfig {
            text_field: TextField::parse(field).unwrap(),
            batch_bytes: 100,
            ..config(vec![input], out.path())
        },
    )
    .unwrap_err();
    let left: Vec<_> = fs::read_dir(out.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "{error}: a failed ingest leaves nothing: {left:?}"
    );
    error
}

#[test]
fn bad_inputs_name_the_file_and_the_line_or_row_group() {
    let scratch = tempfile::tempdir().unwrap();
    let gz = fs::read(corpus("docs.jsonl.gz")).unwrap();
    let truncated = scratch.path().join("truncated.jsonl.gz");
    fs::write(&truncated, &gz[..gz.len() * 2 / 3]).unwrap();
    match ingest_error(truncated.clone(), "text") {
        DataError::Decompress {
            path, compression, ..
        } => assert_eq!((path, compression), (truncated, "gzip")),
        other => panic!("{other}"),
    }

    let mut zst = fs::read(corpus("docs.jsonl.zst")).unwrap();
    let middle = zst.len() / 2;
    for byte in &mut zst[middle..middle + 16] {
        *byte ^= 0x5a;
    }
    let corrupt = scratch.path().join("corrupt.jsonl.zst");
    fs::write(&corrupt, &zst).unwrap();
    match ingest_error(corrupt.clone(), "text") {
        DataError::Decompress {
            path, compression, ..
        } => {
            assert_eq!((path, compression), (corrupt, "zstd"))
        }
        other => panic!("{other}"),
    }
    let zst = fs::read(corpus("docs.jsonl.zst")).unwrap();
    let cut = scratch.path().join("cut.jsonl.zst");
    fs::write(&cut, &zst[..zst.len() - 10]).unwrap();
    let error = ingest_error(cut.clone(), "text");
    assert!(
        matches!(&error, DataError::Decompress { path, .. } if path == &cut),
        "{error}"
    );

    let error = ingest_error(corpus("docs.parquet"), "body");
    match &error {
        DataError::BadParquet {
            path, row_group, ..
        } => {
            assert_eq!((path, *row_group), (&corpus("docs.parquet"), None));
            assert!(error.to_string().contains("no column `body`"), "{error}");
            assert!(error.to_string().contains("meta.body"), "{error}");
        }
        other => panic!("{other}"),
    }
    let error = ingest_error(corpus("docs.parquet"), "id");
    assert!(error.to_string().contains("not strings"), "{error}");
    let error = ingest_error(corpus("docs.jsonl.gz"), "meta.nothing");
    assert!(
        matches!(&error, DataError::BadJsonLine { line: 1, .. }),
        "{error}"
    );

    match ingest_error(corpus("bad-utf8.parquet"), "text") {
        DataError::InvalidUtf8 {
            path,
            location,
            offset,
        } => {
            assert_eq!(path, corpus("bad-utf8.parquet"));
            assert_eq!((location.as_str(), offset), ("row group 1, row 1: ", 3));
        }
        other => panic!("{other}"),
    }
    let parquet = fs::read(corpus("docs.parquet")).unwrap();
    let short = scratch.path().join("short.parquet");
    fs::write(&short, &parquet[..parquet.len() / 2]).unwrap();
    let error = ingest_error(short.clone(), "text");
    assert!(
        matches!(&error, DataError::BadParquet { path, .. } if path == &short),
        "{error}"
    );
    let fake = scratch.path().join("fake.parquet");
    fs::write(&fake, "{\"text\": \"json\"}\n").unwrap();
    let error = ingest_error(fake, "text");
    assert!(error.to_string().contains("PAR1"), "{error}");

    // A bad line in a compressed file names the line.
    let lines = b"{\"text\": \"fine\"}\n{\"text\": \"bro\xc3\"}\n";
    let bad = scratch.path().join("bad.jsonl.gz");
    fs::write(&bad, gzip(lines)).unwrap();
    match ingest_error(bad.clone(), "text") {
        DataError::InvalidUtf8 {
            path,
            location,
            offset,
        } => assert_eq!(
            (path, location.as_str(), offset),
            (bad, "line 2: ", 17 + 13)
        ),
        other => panic!("{other}"),
    }
}

/// `bytes` compressed by gzip.
fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn exact_dedup_and_min_chars_skip_and_count() {
    let tokenizer = tokenizer();
    let texts = texts();
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("filtered");
    let summary = ingest(
        &tokenizer,
        &IngestConfig {
            dedup: Dedup::Exact,
            min_chars: 7,
            ..config(vec![corpus("docs.parquet")], &out)
        },
    )
    .unwrap();
    let mut kept: Vec<&String> = Vec::new();
    let (mut short, mut duplicates) = (0, 0);
    for text in &texts {
        if text.chars().count() < 7 {
            short += 1;
        } else if kept.contains(&text) {
            duplicates += 1;
        } else {
            kept.push(text);
        }
    }
    assert_eq!(
        (short, duplicates),
        (4, 1),
        "the fixture's 4 `Short.` and one repeat"
    );
    assert_eq!(
        (
            summary.skipped_short,
            summary.skipped_duplicates,
            summary.train_documents
        ),
        (short, duplicates, kept.len() as u64)
    );
    let eos = tokenizer.eos_id().unwrap();
    let mut want = Vec::new();
    for text in kept {
        want.extend(tokenizer.encode(text, false).unwrap());
        want.push(eos);
    }
    assert_eq!(split_tokens(&out, Split::Train), want);

    // Without the length filter, only the first `Short.` is kept of four.
    let out = scratch.path().join("dedup");
    let summary = ingest(
        &tokenizer,
        &IngestConfig {
            dedup: Dedup::Exact,
            ..config(vec![corpus("docs.jsonl.gz")], &out)
        },
    )
    .unwrap();
    assert_eq!(
        (summary.skipped_duplicates, summary.train_documents),
        (4, 36)
    );
}

#[test]
fn a_megatron_dataset_written_by_the_reference_layout_reads_as_its_ids() {
    let prefix = corpus("megatron/corpus_text_document");
    let want = expected_stream();
    assert_eq!(split_tokens(&prefix, Split::Train), want);
    let set = ShardSet::open_split(&prefix, Split::Train).unwrap();
    assert_eq!(set.vocab_size(), *want.iter().max().unwrap() + 1);
    let error = ShardSet::open_split(&prefix, Split::Validation)
        .err()
        .unwrap();
    assert!(error.to_string().contains("no validation split"), "{error}");

    // Damaged copies are refused, naming the file.
    let scratch = tempfile::tempdir().unwrap();
    let copy = scratch.path().join("copy");
    let idx = fs::read(megatron::with_suffix(&prefix, "idx")).unwrap();
    let bin = fs::read(megatron::with_suffix(&prefix, "bin")).unwrap();
    fs::write(megatron::with_suffix(&copy, "bin"), &bin[..bin.len() - 2]).unwrap();
    fs::write(megatron::with_suffix(&copy, "idx"), &idx).unwrap();
    let error = ShardSet::open_split(&copy, Split::Train).err().unwrap();
    assert!(
        matches!(&error, DataError::BadMegatron { path, .. } if path.ends_with("copy.bin")),
        "{error}"
    );
    fs::write(megatron::with_suffix(&copy, "bin"), &bin).unwrap();
    fs::write(megatron::with_suffix(&copy, "idx"), &idx[..idx.len() - 8]).unwrap();
    let error = ShardSet::open_split(&copy, Split::Train).err().unwrap();
    assert!(
        matches!(&error, DataError::BadMegatron { path, .. } if path.ends_with("copy.idx")),
        "{error}"
    );
    let mut other_dtype = idx.clone();
    other_dtype[17] = 7; // float32
    fs::write(megatron::with_suffix(&copy, "idx"), &other_dtype).unwrap();
    let error = ShardSet::open_split(&copy, Split::Train).err().unwrap();
    assert!(error.to_string().contains("dtype code 7"), "{error}");
}

#[test]
fn ingest_format_megatron_writes_the_reference_layout_and_reads_back_equal() {
    let tokenizer = tokenizer();
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("megatron");
    let summary = ingest(
        &tokenizer,
        &IngestConfig {
            format: OutputFormat::Megatron,
            ..config(vec![corpus("docs.jsonl.zst")], &out)
        },
    )
    .unwrap();
    assert_eq!(
        summary.train_shards,
        vec![out.join("train.bin"), out.join("train.idx")]
    );
    assert!(summary.validation_shards.is_empty());
    // Byte for byte the dataset numpy wrote in Megatron's layout.
    let reference = corpus("megatron/corpus_text_document");
    for suffix in ["bin", "idx"] {
        assert!(
            fs::read(out.join(format!("train.{suffix}"))).unwrap()
                == fs::read(megatron::with_suffix(&reference, suffix)).unwrap(),
            "train.{suffix}"
        );
    }
    // As a folder (train and val prefixes) and as a prefix.
    assert_eq!(split_tokens(&out, Split::Train), expected_stream());
    assert_eq!(
        split_tokens(&out.join("train"), Split::Train),
        expected_stream()
    );

    // With a validation split, both read back as the shards of the same ingest.
    let run = |name: &str, format| {
        let out = scratch.path().join(name);
        ingest(
            &tokenizer,
            &IngestConfig {
                format,
                validation_fraction: 0.25,
                ..config(vec![corpus("docs.parquet")], &out)
            },
        )
        .unwrap();
        (
            split_tokens(&out, Split::Train),
            split_tokens(&out, Split::Validation),
        )
    };
    let shards = run("shards", OutputFormat::Shards);
    assert!(!shards.1.is_empty());
    assert_eq!(run("megatron-split", OutputFormat::Megatron), shards);
}

fn resumable(out: &Path, format: OutputFormat, interrupt: Option<u64>) -> IngestConfig {
    IngestConfig {
        format,
        dedup: Dedup::Exact,
        validation_fraction: 0.2,
        shard_tokens: 600,
        batch_bytes: 1500,
        interrupt_after_batches: interrupt,
        ..config(vec![corpus("docs.parquet"), corpus("docs.jsonl.gz")], out)
    }
}

#[test]
fn a_killed_ingest_started_again_continues_to_the_same_output() {
    let tokenizer = tokenizer();
    let scratch = tempfile::tempdir().unwrap();
    for format in [OutputFormat::Shards, OutputFormat::Megatron] {
        let whole = scratch.path().join(format!("{format:?}-whole"));
        let want: IngestSummary = ingest(&tokenizer, &resumable(&whole, format, None)).unwrap();
        let out = scratch.path().join(format!("{format:?}-resumed"));
        let error = ingest(&tokenizer, &resumable(&out, format, Some(3))).unwrap_err();
        assert!(matches!(error, DataError::Interrupted(3)), "{error}");
        assert!(out.join("ingest-state.json").is_file());
        // Another command is refused, naming the state file, and leaves it as it was.
        let other = IngestConfig {
            min_chars: 5,
            ..resumable(&out, format, None)
        };
        let error = ingest(&tokenizer, &other).unwrap_err();
        assert!(error.to_string().contains("ingest-state.json"), "{error}");
        // Killed again further on, then finished.
        let error = ingest(&tokenizer, &resumable(&out, format, Some(2))).unwrap_err();
        assert!(matches!(error, DataError::Interrupted(2)), "{error}");
        let summary = ingest(&tokenizer, &resumable(&out, format, None)).unwrap();
        assert!(summary.resumed_after_documents > 0);
        assert_eq!(
            IngestSummary {
                resumed_after_documents: 0,
                train_shards: Vec::new(),
                validation_shards: Vec::new(),
                ..summary.clone()
            },
            IngestSummary {
                train_shards: Vec::new(),
                validation_shards: Vec::new(),
                ..want.clone()
            },
            "{format:?}"
        );
        assert!(folder_bytes(&out) == folder_bytes(&whole), "{format:?}");
        // Finished: started again, it is refused as complete output.
        let error = ingest(&tokenizer, &resumable(&out, format, None)).unwrap_err();
        assert!(matches!(error, DataError::OutputExists { .. }), "{error}");
    }
}

#[test]
fn the_tokenizer_trains_on_a_streamed_sample() {
    let texts = texts();
    let options = Default::default();
    let inputs = vec![corpus("docs.parquet")];
    let limits = SampleLimits {
        max_documents: Some(10),
        max_bytes: None,
    };
    let (streamed, sample) = train_tokenizer_on_sample(&inputs, &options, limits, 400).unwrap();
    assert_eq!(sample.documents, 10);
    let reference = TextTokenizer::train_byte_level_bpe(&texts[..10], 400).unwrap();
    assert_eq!(streamed.to_json().unwrap(), reference.to_json().unwrap());

    let bytes: u64 = texts[..5].iter().map(|text| text.len() as u64).sum();
    let limits = SampleLimits {
        max_documents: None,
        max_bytes: Some(bytes - 1),
    };
    let (streamed, sample) =
        train_tokenizer_on_sample(&[corpus("docs.jsonl.zst")], &options, limits, 400).unwrap();
    assert_eq!((sample.documents, sample.bytes), (5, bytes));
    let reference = TextTokenizer::train_byte_level_bpe(&texts[..5], 400).unwrap();
    assert_eq!(streamed.to_json().unwrap(), reference.to_json().unwrap());
}
