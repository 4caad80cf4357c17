//! No command writes into, or prunes, another command's folder: `hlat compile` traces a run
//! without touching the run folder its flags would once have written (and the run then resumes
//! as if never interrupted), and every command with an output folder or file refuses a training
//! run's folder, leaving it byte for byte as it was.

use std::path::Path;
use std::process::Output;

use test_support::files::snapshot;

use super::{NO_VARIABLES, fixture, losses, run_flags, run_in, succeed_in};

/// Asserts that `output` is an error (exit 2) naming every one of `names`.
fn refused(output: Output, names: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for name in names {
        assert!(stderr.contains(name), "no `{name}` in: {stderr}");
    }
}

#[test]
fn compile_leaves_a_trained_run_as_it_was_and_the_run_resumes_as_if_uninterrupted() {
    let folder = tempfile::tempdir().unwrap();
    let work = folder.path();
    // Trained into the folder `hlat pretrain` and `hlat compile` once both defaulted to.
    succeed_in(work, &run_flags("pretrain", "host", "4"), NO_VARIABLES);
    let run = work.join("runs/hlat-test");
    let trained = snapshot(&run);
    assert!(
        trained
            .keys()
            .any(|file| file.starts_with("checkpoints/step-00000004"))
    );

    let missing = Path::new("/nonexistent/neuronx-cc");
    let checked = succeed_in(
        work,
        &[&run_flags("compile", "neuron", "8")[..], &["--check-only"]].concat(),
        &[("NEURON_CC", missing)],
    );
    assert!(
        checked.contains("traced 8 training steps on neuron:0"),
        "{checked}"
    );
    assert!(
        checked.contains("programs checked: every one within"),
        "{checked}"
    );
    assert_eq!(
        snapshot(&run),
        trained,
        "the check-only trace changed the run"
    );

    let compiler = test_support::stand_in::compiler(work);
    let cache = work.join("cache");
    let compiled = succeed_in(
        work,
        &[
            &run_flags("compile", "neuron", "8")[..],
            &["--out", "report"],
        ]
        .concat(),
        &[
            ("NEURON_CC", &compiler),
            ("NEURON_COMPILE_CACHE_URL", &cache),
        ],
    );
    assert!(compiled.contains(" programs compiled in "), "{compiled}");
    assert_eq!(snapshot(&run), trained, "the compile changed the run");
    // The trace's scratch folder, inside the report's, is gone.
    let mut left: Vec<String> = std::fs::read_dir(work.join("report"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, [".hlat-output.json", "compile-report.json"]);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.join("report/compile-report.json")).unwrap())
            .unwrap();
    assert_eq!(report["steps"], 8, "{report}");
    let programs = report["programs"].as_u64().unwrap();
    assert!(programs > 0, "{report}");
    assert_eq!(report["compiled"].as_u64().unwrap(), programs, "{report}");
    assert_eq!(
        report["checked_by_lint"].as_u64().unwrap(),
        programs,
        "{report}"
    );
    // Nothing printed was computed by a program that did not run.
    for output in [&checked, &compiled] {
        for invented in [
            "trained steps",
            "validation loss",
            "perplexity",
            "checkpoint:",
        ] {
            assert!(!output.contains(invented), "{invented}: {output}");
        }
    }

    // The run folder itself as the report's folder: refused, naming it.
    refused(
        run_in(
            work,
            &[
                &run_flags("compile", "neuron", "8")[..],
                &["--check-only", "--out", "runs/hlat-test"],
            ]
            .concat(),
            &[("NEURON_CC", missing)],
        ),
        &["--out runs/hlat-test", "`hlat pretrain`"],
    );
    assert_eq!(snapshot(&run), trained);

    // The run continues from its own step 4 with the losses of a run never interrupted.
    let resumed = succeed_in(work, &run_flags("pretrain", "host", "8"), NO_VARIABLES);
    assert!(resumed.contains("trained steps 5..8"), "{resumed}");
    succeed_in(
        work,
        &[&run_flags("pretrain", "host", "8")[..], &["--out", "whole"]].concat(),
        NO_VARIABLES,
    );
    let whole = losses(&work.join("whole"));
    assert_eq!(whole.len(), 8);
    assert_eq!(losses(&run), whole);
}

#[test]
fn every_command_refuses_a_training_run_folder_and_leaves_it_as_it_was() {
    let folder = tempfile::tempdir().unwrap();
    let work = folder.path();
    succeed_in(
        work,
        &[&run_flags("pretrain", "host", "2")[..], &["--out", "run"]].concat(),
        NO_VARIABLES,
    );
    let run = work.join("run");
    let trained = snapshot(&run);
    let records = work.join("records.jsonl");
    std::fs::write(
        &records,
        "{\"prompt\": \"Hi\", \"completion\": \" there\"}\n",
    )
    .unwrap();
    let text = |path: &Path| path.to_str().unwrap().to_owned();
    let (model, tokenizer) = (
        text(&fixture("hf-tiny-llama3")),
        text(&fixture("chat-llama3/tokenizer.json")),
    );
    let run_text = text(&run);
    let mergekit = fixture("mergekit");
    let attempts: Vec<(Vec<&str>, Option<&Path>)> = vec![
        // Fine-tuning a model into a pretraining run would continue that run instead.
        (
            vec![
                "finetune",
                "--model",
                &model,
                "--data",
                "records.jsonl",
                "--out",
                "run",
            ],
            None,
        ),
        (
            vec![
                "data",
                "ingest",
                "--tokenizer",
                &tokenizer,
                "--input",
                "records.jsonl",
                "--out",
                "run",
            ],
            None,
        ),
        (vec!["convert", "--from-hf", &model, "--to-hf", "run"], None),
        (vec!["convert", "--from-hf", &model, "--to", "run"], None),
        (
            vec![
                "merge",
                "--config",
                "configs/linear.yaml",
                "--out",
                &run_text,
            ],
            Some(&mergekit),
        ),
        (vec!["bench", "ops", "--json", "run/metrics.jsonl"], None),
        (
            vec!["bench", "train", "--json", "run/checkpoints/newest"],
            None,
        ),
    ];
    for (arguments, cwd) in attempts {
        let output = run_in(cwd.unwrap_or(work), &arguments, NO_VARIABLES);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{arguments:?}: {stderr}");
        assert!(stderr.contains("run"), "{arguments:?}: {stderr}");
        assert_eq!(snapshot(&run), trained, "{arguments:?} changed the run");
    }
    // What a benchmark replaces, it says.
    let help = succeed_in(work, &["bench", "train", "--help"], NO_VARIABLES);
    assert!(help.contains("a file there is replaced"), "{help}");
}
