//! Running out of space in the middle of writing loses nothing: a checkpoint, an export, a merge
//! or an ingest whose write fails stops `hlat` with an error naming the file, leaves every file
//! written before as it was (the previous checkpoint loadable), and the same command succeeds
//! once there is room again (a training run resumes from its checkpoint with the losses of a run
//! never interrupted).
//!
//! The full disk is injected into the `hlat` process alone ([`super::disk_faults`]).

use std::path::{Path, PathBuf};
use std::process::Output;

use test_support::files::snapshot;

use super::disk_faults::{DiskFault, hlat_with};
use super::{NO_VARIABLES, as_strs, fixture, losses, run_flags, succeed_in};

/// `hlat ARGUMENTS` run in `folder` on a disk that is full after `space` bytes.
fn run_with_disk_space(folder: &Path, arguments: &[&str], space: u64) -> Output {
    hlat_with(folder, arguments, &DiskFault::FullAfter(space))
        .output()
        .expect("running hlat")
}

/// Asserts that `output` is a failure whose message names a file under `folder` and the
/// write's error; returns the message.
pub(super) fn failed_naming_a_file_in(output: &Output, folder: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "the write past the limit succeeded"
    );
    assert!(
        stderr.contains(folder) && stderr.contains("No space left on device"),
        "no file of {folder} and its error in: {stderr}"
    );
    stderr
}

/// The bytes of the files of a snapshot.
fn total(files: &std::collections::BTreeMap<PathBuf, Vec<u8>>) -> u64 {
    files.values().map(|bytes| bytes.len() as u64).sum()
}

/// `hlat pretrain` of a short run into `out`, to `max_steps` ([`run_flags`]).
fn pretrain_flags<'a>(out: &'a str, max_steps: &'a str) -> Vec<&'a str> {
    [
        &run_flags("pretrain", "host", max_steps)[..],
        &["--out", out],
    ]
    .concat()
}

#[test]
fn a_checkpoint_out_of_space_keeps_the_previous_one_and_the_run_resumes_from_it() {
    let folder = tempfile::tempdir().unwrap();
    let work = folder.path();
    succeed_in(work, &pretrain_flags("run", "2"), NO_VARIABLES);
    let run = work.join("run");
    let before = snapshot(&run);
    let checkpoint = |files: &std::collections::BTreeMap<PathBuf, Vec<u8>>| {
        files
            .iter()
            .filter(|(path, _)| path.starts_with("checkpoints"))
            .map(|(path, bytes)| (path.clone(), bytes.clone()))
            .collect::<Vec<_>>()
    };

    // Steps 3 and 4 train; the checkpoint of step 4 cannot be written.
    let output = run_with_disk_space(work, &pretrain_flags("run", "4"), total(&before) / 4);
    failed_naming_a_file_in(&output, "run/checkpoints");
    let after = snapshot(&run);
    assert_eq!(
        checkpoint(&after),
        checkpoint(&before),
        "the checkpoint of step 2 changed, or one of step 4 was published"
    );

    let resumed = succeed_in(work, &pretrain_flags("run", "4"), NO_VARIABLES);
    assert!(resumed.contains("trained steps 3..4"), "{resumed}");
    succeed_in(work, &pretrain_flags("whole", "4"), NO_VARIABLES);
    assert_eq!(losses(&run), losses(&work.join("whole")));
}

/// `hlat ARGUMENTS(out)` run from `current_dir` into `WORK/first`, which must succeed; then into
/// `WORK/second` with room for half the bytes of `first`: it must fail naming
/// `second`, leave `first` as it was, and the same command without the limit must then succeed
/// into `second`, with the files of `first`.
fn out_of_space_loses_nothing(
    current_dir: &Path,
    work: &Path,
    arguments: impl Fn(&str) -> Vec<String>,
) {
    let run = |out: &str| arguments(work.join(out).to_str().unwrap());
    succeed_in(current_dir, &as_strs(&run("first")), NO_VARIABLES);
    let first = snapshot(&work.join("first"));
    let output = run_with_disk_space(current_dir, &as_strs(&run("second")), total(&first) / 2);
    failed_naming_a_file_in(&output, "second");
    assert_eq!(
        snapshot(&work.join("first")),
        first,
        "the earlier output changed"
    );
    succeed_in(current_dir, &as_strs(&run("second")), NO_VARIABLES);
    assert_eq!(
        snapshot(&work.join("second")),
        first,
        "the output made after the failure differs from one made without it"
    );
}

#[test]
fn an_export_out_of_space_names_the_file_and_loses_nothing() {
    let folder = tempfile::tempdir().unwrap();
    let model = fixture("hf-tiny-llama");
    out_of_space_loses_nothing(folder.path(), folder.path(), |out| {
        let model = model.to_str().unwrap();
        ["convert", "--from-hf", model, "--to-hf", out]
            .map(String::from)
            .to_vec()
    });
}

#[test]
fn a_merge_out_of_space_names_the_file_and_loses_nothing() {
    let folder = tempfile::tempdir().unwrap();
    out_of_space_loses_nothing(&fixture("mergekit"), folder.path(), |out| {
        ["merge", "--config", "configs/linear.yaml", "--out", out]
            .map(String::from)
            .to_vec()
    });
}

#[test]
fn an_ingest_out_of_space_names_the_file_and_loses_nothing() {
    let folder = tempfile::tempdir().unwrap();
    let corpus = folder.path().join("corpus.jsonl");
    let documents: String = (0..400)
        .map(|index| {
            format!(
                "{{\"text\": \"document {index}: the cat sat on mat {}.\"}}\n",
                index % 13
            )
        })
        .collect();
    std::fs::write(&corpus, documents).unwrap();
    let tokenizer = fixture("chat-llama3/tokenizer.json");
    out_of_space_loses_nothing(folder.path(), folder.path(), |out| {
        let (tokenizer, corpus) = (tokenizer.to_str().unwrap(), corpus.to_str().unwrap());
        [
            "data",
            "ingest",
            "--tokenizer",
            tokenizer,
            "--input",
            corpus,
            "--out",
            out,
        ]
        .map(String::from)
        .to_vec()
    });
}
