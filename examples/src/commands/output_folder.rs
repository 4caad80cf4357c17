//! Which `hlat` command an output folder belongs to, so that no command writes into (or prunes)
//! a folder another command made.
//!
//! A command that writes into a folder it may find already there (`pretrain` and `finetune`
//! resume their own runs, `compile` rewrites its report, `data ingest` finishes its own ingest)
//! first [`claim`]s it: a new or empty folder is created and recorded as the command's
//! ([`RECORD_FILE`]); a folder recorded as another command's, or recognised as one (a run folder
//! or a Hugging Face model folder written before folders were recorded), is refused, naming the
//! folder and the command that made it. A folder of the user's own files is taken as it is: no
//! command deletes a file it did not write. Commands that only write new folders (`convert`,
//! `merge`, `data train-tokenizer`) refuse any existing path instead; `bench` replaces its
//! report files, but never inside another command's folder ([`check_file_target`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use hlat::checkpoint::run_folder::RunFolder;
use hlat_train::pretrain::RUN_CONFIG_FILE;
use serde::{Deserialize, Serialize};

use super::pretrain::PRETRAIN_COMMAND;

/// The file in an output folder that records which command made it.
pub const RECORD_FILE: &str = ".hlat-output.json";

/// The `config.json` of a Hugging Face model folder.
const HF_CONFIG_FILE: &str = "config.json";

/// What [`RECORD_FILE`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    /// The command, as typed after `hlat` (`pretrain`, `data ingest`, ...).
    command: String,
    /// The model the folder's run started from (`hlat finetune --model`), when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<PathBuf>,
}

/// Who made an existing folder, as far as can be told.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owner {
    /// A recorded command.
    Recorded(Record),
    /// A training run written before runs were recorded: `hlat pretrain`'s (fine-tuning runs
    /// cannot be told apart from it, and are taken as pretraining runs).
    UnrecordedRun,
    /// A Hugging Face model folder (`config.json`): a model, not any command's work folder.
    ModelFolder,
}

impl Owner {
    fn describe(&self) -> String {
        match self {
            Owner::Recorded(record) => format!("the output of `hlat {}`", record.command),
            Owner::UnrecordedRun => {
                "a training run (of `hlat pretrain`, written before hlat recorded which command \
                 made a folder)"
                    .into()
            }
            Owner::ModelFolder => "a Hugging Face model folder (config.json)".into(),
        }
    }
}

/// Who made `dir`: `None` for a folder that does not exist or holds none of `hlat`'s outputs.
fn owner(dir: &Path) -> anyhow::Result<Option<Owner>> {
    let record_path = dir.join(RECORD_FILE);
    match std::fs::read(&record_path) {
        Ok(bytes) => {
            let record = serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{}: not a record of the command that made the folder",
                    record_path.display()
                )
            })?;
            return Ok(Some(Owner::Recorded(record)));
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error).context(record_path.display().to_string()),
    }
    if RunFolder::is_run(dir) || dir.join(RUN_CONFIG_FILE).is_file() {
        return Ok(Some(Owner::UnrecordedRun));
    }
    if dir.join(HF_CONFIG_FILE).is_file() {
        return Ok(Some(Owner::ModelFolder));
    }
    Ok(None)
}

/// Makes `dir` the output folder of `hlat COMMAND` (creating it when missing) and records it,
/// unless [`check`] refuses it.
pub fn claim(dir: &Path, command: &str, model: Option<&Path>, flag: &str) -> anyhow::Result<()> {
    check(dir, command, model, flag)?;
    record(dir, command, model, flag)
}

/// Refuses `dir` as the output folder of `hlat COMMAND` when another command made it. `model`
/// is the model a training run starts from: a run of `command` recorded with another model is
/// refused too (it would be continued instead). The unrecorded run folders `command` continues
/// (`hlat pretrain`'s) are taken.
pub fn check(dir: &Path, command: &str, model: Option<&Path>, flag: &str) -> anyhow::Result<()> {
    match owner(dir)? {
        None | Some(Owner::UnrecordedRun) if command == PRETRAIN_COMMAND => Ok(()),
        None => Ok(()),
        Some(Owner::Recorded(record)) if record.command == command => {
            let wanted = model.map(absolute).transpose()?;
            match (&record.model, &wanted) {
                (Some(theirs), Some(wanted)) if theirs != wanted => bail!(
                    "{flag} {}: holds the `hlat {command}` run of {}, not of {}; it would be \
                     continued instead of starting from {}: choose a new {flag}",
                    dir.display(),
                    theirs.display(),
                    wanted.display(),
                    wanted.display()
                ),
                _ => Ok(()),
            }
        }
        Some(other) => bail!(
            "{flag} {}: holds {}; `hlat {command}` writes only into a new folder or one of its \
             own, and leaves this one as it is: choose another {flag}",
            dir.display(),
            other.describe()
        ),
    }
}

/// Records `dir` (created when missing) as the output folder of `hlat COMMAND`, run from
/// `model` when it starts from one; a record already there is kept.
pub fn record(dir: &Path, command: &str, model: Option<&Path>, flag: &str) -> anyhow::Result<()> {
    let path = dir.join(RECORD_FILE);
    if path.is_file() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("{flag} {}", dir.display()))?;
    let record = Record {
        command: command.to_owned(),
        model: model.map(absolute).transpose()?,
    };
    let bytes = serde_json::to_vec_pretty(&record).expect("a record serializes");
    burn_trainium::write_atomically(&path, &bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// Refuses a file that `hlat COMMAND` would write (replacing it if it exists) inside a folder
/// another command made: `hlat bench --json runs/t/metrics.jsonl` must not clobber a run.
pub fn check_file_target(file: &Path, command: &str, flag: &str) -> anyhow::Result<()> {
    let folder = match file.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    // A model folder's own files are at its top; a run's are anywhere below it.
    let owners = folder.ancestors().enumerate().map(|(depth, dir)| {
        let owner = owner(dir)?.filter(|owner| depth == 0 || *owner != Owner::ModelFolder);
        anyhow::Ok(owner.map(|owner| (dir, owner)))
    });
    for found in owners {
        if let Some((dir, other)) = found? {
            bail!(
                "{flag} {}: {} holds {}; `hlat {command}` writes its files elsewhere: choose \
                 another {flag}",
                file.display(),
                dir.display(),
                other.describe()
            );
        }
    }
    Ok(())
}

/// `path` made absolute (against the working directory) and, where it exists, canonical: the
/// same model named two ways is one model.
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    match path.canonicalize() {
        Ok(path) => Ok(path),
        Err(_) => std::path::absolute(path).with_context(|| path.display().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_claimed_by_one_command_and_refused_to_the_others() {
        let root = tempfile::tempdir().unwrap();
        let run = root.path().join("run");
        claim(&run, "pretrain", None, "--out").unwrap();
        assert!(run.join(RECORD_FILE).is_file());
        // The same command again (a resume).
        claim(&run, "pretrain", None, "--out").unwrap();
        let error = claim(&run, "finetune", Some(root.path()), "--out")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("run") && error.contains("`hlat pretrain`"),
            "{error}"
        );
        let error = check_file_target(&run.join("metrics.jsonl"), "bench", "--json")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--json") && error.contains("pretrain"),
            "{error}"
        );
        check_file_target(&root.path().join("bench.json"), "bench", "--json").unwrap();
    }

    #[test]
    fn a_file_is_refused_inside_a_run_and_at_the_top_of_a_model_folder() {
        let root = tempfile::tempdir().unwrap();
        let model = root.path().join("model");
        std::fs::create_dir_all(model.join("notes")).unwrap();
        std::fs::write(model.join(HF_CONFIG_FILE), "{}").unwrap();
        assert!(check_file_target(&model.join(HF_CONFIG_FILE), "bench", "--json").is_err());
        check_file_target(&model.join("notes/bench.json"), "bench", "--json").unwrap();
        let run = root.path().join("run");
        claim(&run, "pretrain", None, "--out").unwrap();
        let deep = run.join("checkpoints/step-00000010/state.json");
        assert!(check_file_target(&deep, "bench", "--json").is_err());
    }

    #[test]
    fn a_fine_tuning_run_is_continued_only_from_its_own_model() {
        let root = tempfile::tempdir().unwrap();
        let run = root.path().join("sft");
        let (first, second) = (root.path().join("a"), root.path().join("b"));
        claim(&run, "finetune", Some(&first), "--out").unwrap();
        claim(&run, "finetune", Some(&first), "--out").unwrap();
        let error = claim(&run, "finetune", Some(&second), "--out")
            .unwrap_err()
            .to_string();
        assert!(error.contains(&second.display().to_string()), "{error}");
    }

    #[test]
    fn unrecorded_runs_belong_to_pretraining_and_model_folders_to_nobody() {
        let root = tempfile::tempdir().unwrap();
        let legacy = root.path().join("legacy");
        std::fs::create_dir_all(&legacy).unwrap();
        std::fs::write(legacy.join(RUN_CONFIG_FILE), "").unwrap();
        let error = claim(&legacy, "finetune", None, "--out")
            .unwrap_err()
            .to_string();
        assert!(error.contains("training run"), "{error}");
        claim(&legacy, "pretrain", None, "--out").unwrap();
        assert!(legacy.join(RECORD_FILE).is_file());

        let model = root.path().join("model");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join(HF_CONFIG_FILE), "{}").unwrap();
        for command in ["pretrain", "compile", "data ingest"] {
            let error = claim(&model, command, None, "--out")
                .unwrap_err()
                .to_string();
            assert!(error.contains("Hugging Face model folder"), "{error}");
        }
        assert!(!model.join(RECORD_FILE).exists());

        // A folder of the user's own files is taken as it is.
        let own = root.path().join("own");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(own.join("notes.txt"), "mine").unwrap();
        claim(&own, "data ingest", None, "--out").unwrap();
        assert_eq!(
            std::fs::read_to_string(own.join("notes.txt")).unwrap(),
            "mine"
        );
    }
}
