//! `hlat cache`: lists and prunes the compile caches: the `xla` executor's programs
//! (`TRAINIUM_XLA_CACHE_DIR`) and the Neuron compiler's NEFFs (`NEURON_COMPILE_CACHE_URL`).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use burn_trainium::neuron::NeuronSettings;
use burn_trainium::xla_cache::{CacheEntry, cache_entries, evict_to_bound, xla_cache_folder};
use clap::Args;

/// Arguments of `hlat cache`.
#[derive(Args)]
pub struct CacheArgs {
    /// Remove the entries not used for this many days (fractions allowed).
    #[arg(long, value_name = "DAYS", value_parser = super::ranges::positive)]
    pub older_than: Option<f64>,
    /// Remove every entry.
    #[arg(long, conflicts_with = "older_than")]
    pub clear: bool,
    /// Remove the least recently used `xla` entries until the rest hold at most this many bytes.
    #[arg(long, value_name = "BYTES")]
    pub max_bytes: Option<u64>,
}

/// Runs `hlat cache`.
pub fn run(args: CacheArgs) -> anyhow::Result<()> {
    let cutoff = match (args.clear, args.older_than) {
        (true, _) => Some(SystemTime::now() + Duration::from_secs(1)),
        (false, Some(days)) => Some(SystemTime::now() - Duration::from_secs_f64(days * 86_400.0)),
        (false, None) => None,
    };
    match xla_cache_folder() {
        Some(folder) => xla(&folder, cutoff, args.max_bytes)?,
        None => println!("xla compile cache: off"),
    }
    let neuron = NeuronSettings::from_env()?.cache_root;
    neff(&neuron, cutoff)
}

/// Lists the `xla` cache in `folder`, after removing its entries last used before `cutoff` and
/// those past `max_bytes`.
fn xla(folder: &Path, cutoff: Option<SystemTime>, max_bytes: Option<u64>) -> anyhow::Result<()> {
    let listing = || cache_entries(folder).with_context(|| format!("reading {}", folder.display()));
    let mut removed = 0;
    if let Some(cutoff) = cutoff {
        for entry in listing()?.iter().filter(|entry| entry.last_used < cutoff) {
            entry
                .remove()
                .with_context(|| format!("removing {}", entry.path.display()))?;
            removed += 1;
        }
    }
    if let Some(max_bytes) = max_bytes {
        removed += evict_to_bound(folder, max_bytes)
            .with_context(|| format!("bounding {}", folder.display()))?;
    }
    let entries = listing()?;
    let total: u64 = entries.iter().map(|entry| entry.bytes).sum();
    println!(
        "xla compile cache {}: {} entries, {total} bytes{}",
        folder.display(),
        entries.len(),
        removed_note(removed)
    );
    for entry in &entries {
        println!("  {}", describe(entry));
    }
    Ok(())
}

/// One line about an `xla` entry: key, size, last use, what it was compiled for.
fn describe(entry: &CacheEntry) -> String {
    let key = entry
        .path
        .file_stem()
        .map(|stem| stem.to_string_lossy()[..16.min(stem.len())].to_string())
        .unwrap_or_default();
    let made_for = match &entry.description {
        Some(description) => format!(
            "{} on {} [{}] ({}), {}",
            description.module,
            description.platform,
            description.device_kinds.join(","),
            description.processor,
            description.plugin
        ),
        None => "(no description)".to_string(),
    };
    format!(
        "{key}  {:>10} bytes  used {} ago  {made_for}",
        entry.bytes,
        ago(entry.last_used)
    )
}

/// How long ago `time` was, in the largest whole unit.
fn ago(time: SystemTime) -> String {
    let seconds = SystemTime::now()
        .duration_since(time)
        .unwrap_or_default()
        .as_secs();
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min", seconds / 60),
        3600..86_400 => format!("{} h", seconds / 3600),
        _ => format!("{} d", seconds / 86_400),
    }
}

fn removed_note(removed: usize) -> String {
    match removed {
        0 => String::new(),
        count => format!(" ({count} removed)"),
    }
}

/// Lists the NEFF cache under `root` (one folder per compile, `neuronxcc-VERSION/MODULE_...`),
/// after removing the entries last changed before `cutoff`.
fn neff(root: &Path, cutoff: Option<SystemTime>) -> anyhow::Result<()> {
    let mut entries: Vec<(PathBuf, u64, SystemTime)> = Vec::new();
    let versions = match std::fs::read_dir(root) {
        Ok(versions) => versions,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            println!("Neuron compile cache {}: empty", root.display());
            return Ok(());
        }
        Err(error) => return Err(error).with_context(|| format!("reading {}", root.display())),
    };
    for version in versions {
        let version = version?.path();
        if !version.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&version)? {
            let entry = entry?.path();
            if !entry.is_dir() {
                continue;
            }
            let mut bytes = 0;
            let mut newest = SystemTime::UNIX_EPOCH;
            for file in std::fs::read_dir(&entry)? {
                let metadata = file?.metadata()?;
                bytes += metadata.len();
                newest = newest.max(metadata.modified()?);
            }
            entries.push((entry, bytes, newest));
        }
    }
    let mut removed = 0;
    if let Some(cutoff) = cutoff {
        for (path, _, changed) in entries.iter().filter(|(_, _, changed)| *changed < cutoff) {
            std::fs::remove_dir_all(path)
                .with_context(|| format!("removing {}", path.display()))?;
            removed += 1;
            log::debug!("removed {} (changed {} ago)", path.display(), ago(*changed));
        }
        entries.retain(|(_, _, changed)| *changed >= cutoff);
    }
    let total: u64 = entries.iter().map(|(_, bytes, _)| bytes).sum();
    println!(
        "Neuron compile cache {}: {} entries, {total} bytes{}",
        root.display(),
        entries.len(),
        removed_note(removed)
    );
    for (path, bytes, changed) in &entries {
        let relative = path.strip_prefix(root).unwrap_or(path);
        println!(
            "  {}  {bytes:>10} bytes  changed {} ago",
            relative.display(),
            ago(*changed)
        );
    }
    Ok(())
}
