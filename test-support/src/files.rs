//! Finding files by name under a folder.

use std::path::{Path, PathBuf};

/// Every file named `name` under `root`, at any depth, sorted.
pub fn files_named(root: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.file_name().is_some_and(|file| file == name) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Every HLO module (`model.hlo_module.pb`) of the NEFF cache under `root`, sorted.
pub fn cached_modules(root: &Path) -> Vec<PathBuf> {
    files_named(root, burn_trainium::neuron::MODULE_FILE)
}
