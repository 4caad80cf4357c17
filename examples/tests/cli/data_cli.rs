//! `hlat data` end to end: `encode` against the Llama-2 fixture made by Hugging Face `tokenizers`,
//! `train-tokenizer` → `ingest` on a small corpus, and `ingest` with the published tokenizers'
//! fixtures (Llama 2, Llama 3, Qwen2) against the ids the Python library gives.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use hlat_train::data::{ShardSet, Split, TokenStream};

use super::{fixture, hlat, short_steps, succeed};

#[test]
fn encode_prints_the_ids_hugging_face_tokenizers_gives() {
    let expected: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixture("llama2-tokenizer/expected.json"))
            .expect("the llama2 tokenizer fixture"),
    )
    .unwrap();
    // One line per case: texts holding a newline are a single case over two lines, so skip them.
    let cases: Vec<&serde_json::Value> = expected["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|case| !case["text"].as_str().unwrap().contains('\n'))
        .collect();
    assert!(cases.len() >= 4);
    let input: String = cases
        .iter()
        .map(|case| format!("{}\n", case["text"].as_str().unwrap()))
        .collect();

    let mut child = hlat()
        .args(["data", "encode", "--tokenizer"])
        .arg(fixture("llama2-tokenizer/tokenizer.json"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), cases.len());
    for (line, case) in lines.iter().zip(cases) {
        assert_eq!(line, &case["ids"], "ids of {:?}", case["text"]);
    }
}

#[test]
fn train_tokenizer_then_ingest_writes_shards() {
    let folder = tempfile::tempdir().unwrap();
    let corpus = folder.path().join("corpus.jsonl");
    let documents: String = (0..200)
        .map(|i| {
            format!(
                "{{\"text\": \"document {i}: the cat {} sat on the mat number {}.\"}}\n",
                i % 7,
                i % 13
            )
        })
        .collect();
    std::fs::write(&corpus, documents).unwrap();
    let tokenizer = folder.path().join("shards/tokenizer.json");
    std::fs::create_dir_all(tokenizer.parent().unwrap()).unwrap();

    let trained = hlat()
        .args(["data", "train-tokenizer", "--vocab-size", "300", "--input"])
        .arg(&corpus)
        .arg("--out")
        .arg(&tokenizer)
        .output()
        .unwrap();
    assert!(
        trained.status.success(),
        "{}",
        String::from_utf8_lossy(&trained.stderr)
    );

    let ingested = hlat()
        .args(["data", "ingest", "--val-fraction", "0.1", "--tokenizer"])
        .arg(&tokenizer)
        .arg("--input")
        .arg(&corpus)
        .arg("--out")
        .arg(folder.path().join("shards"))
        .output()
        .unwrap();
    assert!(
        ingested.status.success(),
        "{}",
        String::from_utf8_lossy(&ingested.stderr)
    );
    let names: Vec<String> = std::fs::read_dir(folder.path().join("shards"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|name| name.starts_with("train-")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|name| name.starts_with("val-")),
        "{names:?}"
    );
}

#[test]
fn encode_with_a_missing_tokenizer_names_the_file() {
    let output = hlat()
        .args([
            "data",
            "encode",
            "--tokenizer",
            "/nonexistent/tokenizer.json",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent/tokenizer.json"), "{stderr}");
}

/// The tokenizer fixtures in the structure of the published ones, each with the ids the Python
/// `tokenizers` library gives for its sample texts.
const PUBLISHED_TOKENIZERS: [&str; 3] = ["llama2-tokenizer", "llama3-tokenizer", "qwen2-tokenizer"];

#[test]
fn ingest_with_published_tokenizers_ends_every_document_with_their_eos() {
    for name in PUBLISHED_TOKENIZERS {
        ingest_fixture_samples(name);
    }
}

/// Reads a JSON file.
fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Ingests the sample texts of fixture `name` (the first as a text file, the others as JSONL
/// lines) and checks the train shards: every document's ids as Python gave them without the
/// special tokens, each followed by the EOS that the fixture's `tokenizer_config.json` names.
/// The expected ids are read from the fixture's files alone, not by `hlat`.
fn ingest_fixture_samples(name: &str) {
    let dir = fixture(name);
    let expected = read_json(&dir.join("expected.json"));
    let config = read_json(&dir.join("tokenizer_config.json"));
    let tokenizer_json = read_json(&dir.join("tokenizer.json"));
    let added = tokenizer_json["added_tokens"].as_array().unwrap();
    // The id of the token the config names under `key` (None for null: Qwen2 has no BOS).
    let special_id = |key: &str| {
        let token = config[key].as_str()?;
        let added = added.iter().find(|added| added["content"] == token);
        Some(
            added.expect("a special token of tokenizer.json")["id"]
                .as_u64()
                .unwrap() as u32,
        )
    };
    let bos = special_id("bos_token");
    let eos = special_id("eos_token").expect("every fixture names its EOS");
    let vocab_size = added
        .iter()
        .map(|added| &added["id"])
        .chain(
            tokenizer_json["model"]["vocab"]
                .as_object()
                .unwrap()
                .values(),
        )
        .map(|id| id.as_u64().unwrap() + 1)
        .max()
        .unwrap();

    let cases = expected["cases"].as_array().unwrap();
    let texts: Vec<&str> = cases
        .iter()
        .map(|case| case["text"].as_str().unwrap())
        .collect();
    let folder = tempfile::tempdir().unwrap();
    let input = folder.path().join("input");
    std::fs::create_dir(&input).unwrap();
    // Files are read in sorted order: a.txt, then b.jsonl.
    std::fs::write(input.join("a.txt"), texts[0]).unwrap();
    let lines: String = texts[1..]
        .iter()
        .map(|text| format!("{}\n", serde_json::json!({ "text": text })))
        .collect();
    std::fs::write(input.join("b.jsonl"), lines).unwrap();
    let out = folder.path().join("shards");
    let text = |path: &Path| path.to_str().unwrap().to_string();
    let stdout = succeed(&[
        "data",
        "ingest",
        "--val-fraction",
        "0",
        "--tokenizer",
        &text(&dir.join("tokenizer.json")),
        "--input",
        &text(&input),
        "--out",
        &text(&out),
    ]);
    assert!(
        stdout.contains(&format!("{} train documents", texts.len())),
        "{name}: {stdout}"
    );

    let mut want = Vec::new();
    for case in cases {
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        // Python's ids hold the post-processor's BOS (Llama); ingest encodes without it.
        let text_ids = match bos {
            Some(bos) => {
                assert_eq!(ids[0], bos, "{name}");
                &ids[1..]
            }
            None => &ids[..],
        };
        want.extend_from_slice(text_ids);
        want.push(eos);
    }
    let shards = ShardSet::open_split(&out, Split::Train).unwrap();
    assert_eq!(u64::from(shards.vocab_size()), vocab_size, "{name}");
    let mut tokens = vec![0; shards.num_tokens()];
    shards.copy_tokens(0, &mut tokens);
    assert_eq!(tokens, want, "{name}");
    assert!(
        ShardSet::open_split(&out, Split::Validation).is_err(),
        "{name}"
    );

    // The folder describes itself: the tokenizer with the config naming its special tokens, and
    // the documents between the EOS tokens decode back to the texts.
    assert_eq!(
        std::fs::read(out.join("tokenizer_config.json")).unwrap(),
        std::fs::read(dir.join("tokenizer_config.json")).unwrap(),
        "{name}"
    );
    let saved = hlat::hf::load_tokenizer(&out.join("tokenizer.json")).unwrap();
    assert_eq!(tokens.last(), Some(&eos), "{name}");
    let decoded: Vec<String> = tokens[..tokens.len() - 1]
        .split(|&token| token == eos)
        .map(|document| saved.decode(document, false).unwrap())
        .collect();
    assert_eq!(decoded, texts, "{name}");

    // A model trains from scratch on the shards (Qwen's tokenizer has no BOS: its EOS stands
    // in, as in Qwen's config.json).
    let run = folder.path().join("run");
    let trained = hlat()
        .args(["pretrain", "--preset", "hlat-test", "--data"])
        .arg(&out)
        .arg("--out")
        .arg(&run)
        .args(["--max-steps", "1", "--seq-len", "8", "--batch-tokens", "16"])
        .args([
            "--micro-batch-rows",
            "2",
            "--eval-every",
            "0",
            "--device",
            "host",
        ])
        .arg("--no-progress")
        .output()
        .unwrap();
    assert!(
        trained.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&trained.stderr)
    );
}

#[test]
fn ingest_with_a_tokenizer_without_eos_names_the_files_and_writes_nothing() {
    let folder = tempfile::tempdir().unwrap();
    let tokenizer = folder.path().join("tokenizer.json");
    std::fs::copy(fixture("qwen2-tokenizer/tokenizer.json"), &tokenizer).unwrap();
    let config = folder.path().join("tokenizer_config.json");
    std::fs::write(&config, r#"{"bos_token": null, "eos_token": null}"#).unwrap();
    let input = folder.path().join("docs.txt");
    std::fs::write(&input, "Some text.").unwrap();
    let out = folder.path().join("shards");
    let output = hlat()
        .args(["data", "ingest", "--tokenizer"])
        .arg(&tokenizer)
        .arg("--input")
        .arg(&input)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{} has no EOS token", tokenizer.display()))
            && stderr.contains(&format!("{} sets `eos_token` to null", config.display())),
        "{stderr}"
    );
    assert!(!out.exists());
}

/// A file of `fixtures/corpus-formats` (made by `fixtures/regenerate_corpus.py`).
fn corpus(name: &str) -> String {
    fixture("corpus-formats")
        .join(name)
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn ingest_reads_parquet_and_compressed_jsonl_with_filters_into_a_megatron_dataset() {
    let folder = tempfile::tempdir().unwrap();
    let out = folder.path().join("out");
    let tokenizer = fixture("llama3-tokenizer/tokenizer.json");
    let stdout = succeed(&[
        "data",
        "ingest",
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--input",
        &corpus("docs.parquet"),
        &corpus("*.jsonl.zst"),
        "--out",
        out.to_str().unwrap(),
        "--text-field",
        "meta.body",
        "--dedup",
        "exact",
        "--min-chars",
        "7",
        "--format",
        "megatron",
        "--val-fraction",
        "0",
        "--threads",
        "2",
        "--no-progress",
    ]);
    // The second file repeats the first: every document of it is a duplicate.
    assert!(
        stdout.contains("35 train documents")
            && stdout.contains("8 shorter than --min-chars, 37 duplicates"),
        "{stdout}"
    );
    assert!(out.join("train.bin").is_file() && out.join("train.idx").is_file());
    assert!(!out.join("val.idx").exists());
    assert!(!out.join("ingest-state.json").exists());
}

/// `hlat data ingest` of `input` with `extra` flags: it fails with status 2, its message names
/// every one of `names`, and the output folder holds nothing.
fn ingest_fails(input: &str, extra: &[&str], names: &[&str]) {
    let folder = tempfile::tempdir().unwrap();
    let out = folder.path().join("out");
    let output = hlat()
        .args(["data", "ingest", "--tokenizer"])
        .arg(fixture("llama3-tokenizer/tokenizer.json"))
        .args(["--input", input, "--out"])
        .arg(&out)
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for name in names {
        assert!(stderr.contains(name), "{name}: {stderr}");
    }
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn bad_inputs_exit_2_naming_the_file_and_leave_nothing() {
    let folder = tempfile::tempdir().unwrap();
    let gz = std::fs::read(corpus("docs.jsonl.gz")).unwrap();
    let truncated = folder.path().join("truncated.jsonl.gz");
    std::fs::write(&truncated, &gz[..gz.len() / 2]).unwrap();
    let truncated = truncated.to_str().unwrap();
    ingest_fails(
        truncated,
        &[],
        &[truncated, "corrupt or truncated gzip data after line"],
    );
    ingest_fails(
        &corpus("docs.parquet"),
        &["--text-field", "body"],
        &[&corpus("docs.parquet"), "no column `body`"],
    );
    ingest_fails(
        &corpus("bad-utf8.parquet"),
        &[],
        &[
            &corpus("bad-utf8.parquet"),
            "row group 1, row 1: invalid UTF-8",
        ],
    );
}

#[test]
fn a_megatron_dataset_written_in_the_reference_layout_trains_as_it_is() {
    let folder = tempfile::tempdir().unwrap();
    let run = folder.path().join("run");
    let output = succeed(
        &[
            &[
                "pretrain",
                "--init-from-hf",
                fixture("hf-tiny-llama").to_str().unwrap(),
                "--data",
                &corpus("megatron/corpus_text_document"),
                "--out",
                run.to_str().unwrap(),
                "--max-steps",
                "2",
                "--device",
                "host",
            ][..],
            &short_steps(),
        ]
        .concat(),
    );
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("\"loss\""), "{output}\n{metrics}");
}

#[test]
fn train_tokenizer_streams_a_sample_of_any_input_format() {
    let folder = tempfile::tempdir().unwrap();
    let out = folder.path().join("tokenizer.json");
    succeed(&[
        "data",
        "train-tokenizer",
        "--vocab-size",
        "300",
        "--input",
        &corpus("docs.parquet"),
        &corpus("docs.jsonl.gz"),
        "--max-documents",
        "50",
        "--max-bytes",
        "100000",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(out.is_file());
}

#[test]
fn bench_ingest_prints_rates_and_the_memory_bound() {
    let stdout = succeed(&[
        "bench",
        "ingest",
        "--input",
        &corpus("docs.jsonl"),
        "--tokenizer",
        fixture("llama3-tokenizer/tokenizer.json").to_str().unwrap(),
        "--scale",
        "2",
    ]);
    assert!(stdout.contains("| hlat data ingest "), "{stdout}");
    assert!(stdout.contains("2× the corpus peaks at"), "{stdout}");
    assert!(stdout.contains("4448"), "the fixture's tokens: {stdout}");
}
