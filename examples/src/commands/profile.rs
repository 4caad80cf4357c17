//! `--profile DIR` on every `hlat` command: [`burn_trainium::profile`] started before the command
//! and its summary printed after it; benchmark workers record into folders of their own.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Context;
use burn_trainium::profile::{self, Profile};

/// The folder this process records its profile into, when it does.
static FOLDER: OnceLock<PathBuf> = OnceLock::new();

/// Starts recording into `folder`.
pub fn start(folder: &Path) -> anyhow::Result<Profile> {
    let started =
        profile::start(folder).with_context(|| format!("--profile {}", folder.display()))?;
    FOLDER.get_or_init(|| folder.to_path_buf());
    Ok(started)
}

/// Stops recording, writes the summary and prints it.
pub fn finish(profile: Profile) -> anyhow::Result<()> {
    let summary = profile.finish()?;
    if let Some(folder) = FOLDER.get() {
        println!(
            "profile: {} (per phase: {})",
            folder.join(profile::TRACE_FILE).display(),
            folder.join(profile::SUMMARY_FILE).display()
        );
    }
    print!("{summary}");
    Ok(())
}

/// The `--profile` flag a benchmark worker named `name` records with (a folder of its own in
/// this process's), when this process records one.
pub fn worker_flag(name: &str) -> Vec<String> {
    let Some(folder) = FOLDER.get() else {
        return Vec::new();
    };
    // "the recurrent task, cold, on xla" records into `the-recurrent-task-cold-on-xla`.
    let name = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    vec![
        "--profile".to_string(),
        folder.join(name).display().to_string(),
    ]
}
