//! Running out of space in the middle of writing loses nothing: a checkpoint, an export, a merge
//! or an ingest whose write fails stops `hlat` with an error naming the file, leaves every file
//! written before as it was (the previous checkpoint loadable), and the same command succeeds
//! once there is room again (a training run resumes from its checkpoint with the losses of a run
//! never interrupted).
//!
//! The failure is injected with a file-size limit on the `hlat` process (`RLIMIT_FSIZE`, its
//! SIGXFSZ ignored): a write past it fails with EFBIG where a full disk fails it with ENOSPC,
//! through the same paths, on any machine and without a file system of its own.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use test_support::files::snapshot;

use super::{NO_VARIABLES, as_strs, fixture, hlat, losses, run_flags, succeed_in};

/// `hlat ARGUMENTS` run in `folder`, unable to write any file past `limit` bytes.
fn run_with_file_limit(folder: &Path, arguments: &[&str], limit: u64) -> Output {
    let mut command = hlat();
    command
        .current_dir(folder)
        .args(arguments)
        .env_remove(burn_trainium::DEVICE_ENV);
    // SAFETY: between fork and exec the closure only calls async-signal-safe functions
    // (`signal`, `setrlimit`) and builds no Rust values that allocate.
    unsafe {
        command.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let bounded = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &bounded) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    command.output().expect("running hlat")
}

/// Asserts that `output` is a failure whose message names a file under `folder` and the
/// write's error; returns the message.
fn failed_naming_a_file_in(output: &Output, folder: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "the write past the limit succeeded"
    );
    assert!(
        stderr.contains(folder) && stderr.contains("File too large"),
        "no file of {folder} and its error in: {stderr}"
    );
    stderr
}

/// The size of the largest file of a snapshot.
fn largest(files: &std::collections::BTreeMap<PathBuf, Vec<u8>>) -> u64 {
    files
        .values()
        .map(|bytes| bytes.len() as u64)
        .max()
        .unwrap()
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
    let output = run_with_file_limit(work, &pretrain_flags("run", "4"), largest(&before) / 2);
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
/// `WORK/second` unable to write a file past half the largest of `first`: it must fail naming
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
    let output = run_with_file_limit(current_dir, &as_strs(&run("second")), largest(&first) / 2);
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
