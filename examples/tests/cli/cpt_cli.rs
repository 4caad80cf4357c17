//! Continual pretraining end to end on the transformers fixture, as
//! `docs/continual-pretraining.md` describes it: import, train on a domain corpus with 1% general
//! data (validation perplexity of both in `metrics.jsonl`, and a plot), export to Hugging Face,
//! merge with the base model, evaluate.

use std::path::Path;

use hlat_train::data::Split;
use hlat_train::data::shard::ShardWriter;
use hlat_train::metrics::StepMetrics;

use super::{fixture, step_flags, succeed};

/// The fixture's vocabulary.
const VOCAB: usize = 1024;

/// Writes a shard folder whose train and validation splits repeat `document` (ids below
/// [`VOCAB`]), separated by the end-of-sequence id 2.
pub(super) fn corpus(folder: &Path, document: &[u32], repeats: usize) {
    std::fs::create_dir_all(folder).unwrap();
    for split in [Split::Train, Split::Validation] {
        let mut writer = ShardWriter::new(folder, split, 1 << 16, VOCAB).unwrap();
        for _ in 0..repeats {
            writer.write(document).unwrap();
            writer.write(&[2]).unwrap();
        }
        writer.commit().unwrap();
    }
}

/// Merges `base` and `other` half and half (mergekit's `linear`, a YAML written to `config`)
/// into `out`; returns `out`.
pub(super) fn merge_halves(base: &str, other: &str, config: &Path, out: &str) -> String {
    succeed(&[
        "merge",
        "--config",
        &merge_config(base, other, config),
        "--out",
        out,
    ]);
    out.to_string()
}

/// Writes to `config` the mergekit configuration of a linear merge of `base` and `other`, half
/// each; returns its path.
pub(super) fn merge_config(base: &str, other: &str, config: &Path) -> String {
    std::fs::write(
        config,
        format!(
            "merge_method: linear\nmodels:\n  - model: {base}\n    parameters:\n      weight: 0.5\n  - model: {other}\n    parameters:\n      weight: 0.5\ndtype: float32\n"
        ),
    )
    .unwrap();
    config.to_str().unwrap().to_string()
}

/// The perplexity line of `hlat eval perplexity`.
pub(super) fn perplexity(output: &str) -> f64 {
    output
        .lines()
        .find_map(|line| line.strip_prefix("perplexity: "))
        .unwrap_or_else(|| panic!("no perplexity in {output}"))
        .parse()
        .unwrap()
}

#[test]
fn continual_pretraining_from_hugging_face_to_a_merged_evaluated_model() {
    let work = tempfile::tempdir().unwrap();
    let path = |name: &str| work.path().join(name);
    let text = |name: &str| path(name).to_str().unwrap().to_string();
    // A domain with a pattern to learn; general text the model should not forget.
    let domain: Vec<u32> = (0..24).map(|i| 100 + (i * 7) % 24).collect();
    let general: Vec<u32> = (0..40u32).map(|i| (i * 389 + 17) % 1000 + 10).collect();
    corpus(&path("domain"), &domain, 400);
    corpus(&path("general"), &general, 200);
    let base = fixture("hf-tiny-llama");
    let base = base.to_str().unwrap();

    let before = perplexity(&succeed(&[
        "eval",
        "perplexity",
        "--model",
        base,
        "--shards",
        &text("domain"),
    ]));
    let run = text("run");
    let data = format!(
        "domain={}:0.99,general={}:0.01",
        text("domain"),
        text("general")
    );
    let output = succeed(
        &[
            &[
                "pretrain",
                "--init-from-hf",
                base,
                "--data",
                &data,
                "--out",
                &run,
                "--max-steps",
                "24",
                "--lr",
                "0.003",
                "--warmup-steps",
                "4",
                "--eval-every",
                "8",
                "--device",
                "host",
                "--no-progress",
            ][..],
            &step_flags("32", "256", "8"),
        ]
        .concat(),
    );
    assert!(output.contains("validation plot:"), "{output}");
    // The chart of both sources, as `hlat` draws it: a 720 × 420 PNG.
    let plot = path("run").join("validation.png");
    assert_eq!(test_support::image::png_size(&plot), (720, 420));

    // Validation perplexity of both corpora against tokens seen.
    let metrics = std::fs::read_to_string(path("run").join("metrics.jsonl")).unwrap();
    let measured: Vec<StepMetrics> = metrics
        .lines()
        .map(|line| serde_json::from_str::<StepMetrics>(line).unwrap())
        .filter(|step| step.val_perplexity_by_source.is_some())
        .collect();
    assert_eq!(measured.len(), 3, "validation at steps 8, 16, 24");
    let of =
        |step: &StepMetrics, source: &str| step.val_perplexity_by_source.as_ref().unwrap()[source];
    let (first, last) = (&measured[0], &measured[2]);
    assert!(last.tokens_seen > first.tokens_seen);
    assert!(
        of(last, "domain") < of(first, "domain") && of(last, "domain") < before,
        "domain perplexity falls: {before} at the start, {} then {}",
        of(first, "domain"),
        of(last, "domain")
    );
    assert!(of(last, "general").is_finite());

    // Export to Hugging Face; Python's safetensors opens it.
    let exported = text("exported");
    succeed(&["convert", "--from", &run, "--to-hf", &exported]);
    let check = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sys\nfrom safetensors.numpy import load_file\nprint(len(load_file(sys.argv[1])))")
        .arg(path("exported").join("model.safetensors"))
        .output()
        .expect("python3 must be installed");
    assert!(
        check.status.success(),
        "Python safetensors could not open the export (scripts/test installs it): {}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&check.stdout).trim(), "21");

    // Merge with the base model, then evaluate the merge on the domain.
    let merged = merge_halves(base, &exported, &path("merge.yaml"), &text("merged"));
    let trained = perplexity(&succeed(&[
        "eval",
        "perplexity",
        "--model",
        &exported,
        "--shards",
        &text("domain"),
    ]));
    let halfway = perplexity(&succeed(&[
        "eval",
        "perplexity",
        "--model",
        &merged,
        "--shards",
        &text("domain"),
    ]));
    assert!(trained < before, "{trained} vs {before}");
    assert!(halfway.is_finite() && halfway > 1.0, "{halfway}");
}
