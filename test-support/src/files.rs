//! Finding and reading the files under a folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every file under `root`, at any depth, sorted.
pub fn all_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Every file named `name` under `root`, at any depth, sorted.
pub fn files_named(root: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = all_files(root);
    found.retain(|path| path.file_name().is_some_and(|file| file == name));
    found
}

/// The bytes of every file under `root`, by path relative to it: two snapshots are equal when
/// the folder holds the same files with the same contents.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    all_files(root)
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            (path.strip_prefix(root).unwrap().to_path_buf(), bytes)
        })
        .collect()
}

/// Every HLO module (`model.hlo_module.pb`) of the NEFF cache under `root`, sorted.
pub fn cached_modules(root: &Path) -> Vec<PathBuf> {
    files_named(root, burn_trainium::neuron::MODULE_FILE)
}
