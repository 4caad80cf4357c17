//! Ingest throughput in tokens per second: built-in corpus documents in JSONL, tokenized on all
//! cores into shards, with the built-in tokenizer and with the Llama-2 one.
//!
//! Run with `cargo bench -p hlat-train --bench ingest`.

use std::fs;
use std::hint::black_box;
use std::path::Path;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use hlat_train::data::{IngestConfig, TextTokenizer, builtin_document, default_tokenizer, ingest};

const DOCUMENTS: u64 = 4_000;
const LLAMA2_TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/llama2-tokenizer/tokenizer.json"
);

/// Writes the benchmark corpus as one JSONL file in `folder`.
fn write_corpus(folder: &Path) {
    let lines: String = (0..DOCUMENTS)
        .map(|index| {
            let text = serde_json::to_string(&builtin_document(7, index)).unwrap();
            format!("{{\"text\": {text}}}\n")
        })
        .collect();
    fs::write(folder.join("corpus.jsonl"), lines).unwrap();
}

fn bench_ingest(c: &mut Criterion) {
    let input = tempfile::tempdir().unwrap();
    write_corpus(input.path());
    let tokenizers = [
        ("builtin-512", default_tokenizer().unwrap()),
        (
            "llama2-32000",
            TextTokenizer::from_file(LLAMA2_TOKENIZER).unwrap(),
        ),
    ];
    let mut group = c.benchmark_group("ingest");
    group.sample_size(10);
    for (name, tokenizer) in &tokenizers {
        let run = |out: &Path| {
            let config = IngestConfig {
                show_progress: false,
                ..IngestConfig::new(vec![input.path().to_path_buf()], out.to_path_buf())
            };
            ingest(tokenizer, &config).unwrap()
        };
        let summary = run(tempfile::tempdir().unwrap().path());
        group.throughput(Throughput::Elements(
            summary.train_tokens + summary.validation_tokens,
        ));
        group.bench_function(*name, |b| {
            b.iter_batched(
                || tempfile::tempdir().unwrap(),
                |out| black_box(run(out.path())),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench_ingest);
criterion_main!(benches);
