//! `hlat data` end to end: `encode` against the Llama-2 fixture made by Hugging Face `tokenizers`,
//! and `train-tokenizer` → `ingest` on a small corpus.

use std::io::Write;
use std::process::Stdio;

use super::{fixture, hlat};

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
