//! The persistent compile cache of the `xla` executor, as the NEFF cache is for `neuron` (and
//! JAX's persistent compilation cache for JAX): each compiled program serialized by the PJRT
//! plugin into a folder, under a SHA-256 key of everything the compiled code depends on, so a
//! later process running the same job loads its programs instead of compiling them.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::atomic_write::write_atomically;

/// The environment variable naming the cache folder; `off` turns the cache off. Default:
/// `$XDG_CACHE_HOME/burn-trainium/xla`, else `$HOME/.cache/burn-trainium/xla`.
pub const XLA_CACHE_ENV: &str = "TRAINIUM_XLA_CACHE_DIR";

/// Extension of the cached programs.
const ENTRY_EXTENSION: &str = "pjrt";

/// A folder of serialized PJRT executables for one plugin build and one set of `XLA_FLAGS`.
#[derive(Debug, Clone)]
pub(crate) struct XlaDiskCache {
    folder: PathBuf,
    /// What identifies the plugin build and the compiler settings outside the module.
    fingerprint: Vec<u8>,
}

impl XlaDiskCache {
    /// The cache of programs compiled by the plugin at `plugin`, in the folder the environment
    /// names; `None` when it is turned off or no folder can be found.
    pub fn from_env(plugin: &Path) -> Option<Self> {
        let folder = match std::env::var_os(XLA_CACHE_ENV) {
            Some(value) if value == "off" => return None,
            Some(value) if !value.is_empty() => PathBuf::from(value),
            _ => default_folder()?,
        };
        let xla_flags = std::env::var("XLA_FLAGS").unwrap_or_default();
        Some(Self::new(folder, plugin, &xla_flags))
    }

    /// The cache in `folder` for the plugin at `plugin` compiling with `xla_flags`. The plugin
    /// is identified by its path, size and modification time: a reinstalled plugin starts a new
    /// set of keys (serialized programs are only valid for the build that made them).
    pub fn new(folder: PathBuf, plugin: &Path, xla_flags: &str) -> Self {
        let mut fingerprint = Vec::new();
        let path = plugin
            .canonicalize()
            .unwrap_or_else(|_| plugin.to_path_buf());
        fingerprint.extend_from_slice(path.to_string_lossy().as_bytes());
        if let Ok(metadata) = std::fs::metadata(&path) {
            fingerprint.extend_from_slice(&metadata.len().to_le_bytes());
            if let Ok(modified) = metadata.modified()
                && let Ok(since) = modified.duration_since(std::time::UNIX_EPOCH)
            {
                fingerprint.extend_from_slice(&since.as_nanos().to_le_bytes());
            }
        }
        fingerprint.push(0);
        fingerprint.extend_from_slice(xla_flags.as_bytes());
        Self {
            folder,
            fingerprint,
        }
    }

    /// The file of the program compiled from `module` with `options` (both serialized).
    pub fn entry(&self, module: &[u8], options: &[u8]) -> PathBuf {
        let mut hasher = Sha256::new();
        for part in [&self.fingerprint[..], module, options] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        let key: String = hasher
            .finalize()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        self.folder.join(format!("{key}.{ENTRY_EXTENSION}"))
    }

    /// The serialized program in `entry`, if the cache holds it (an unreadable entry is logged
    /// and treated as absent: the program is compiled again).
    pub fn load(&self, entry: &Path) -> Option<Vec<u8>> {
        match std::fs::read(entry) {
            Ok(bytes) => Some(bytes),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                log::warn!(
                    "xla compile cache: cannot read {}: {error}",
                    entry.display()
                );
                None
            }
        }
    }

    /// Stores a serialized program in `entry` (atomically; a failure is logged, the run goes
    /// on without the cache entry).
    pub fn store(&self, entry: &Path, serialized: &[u8]) {
        let stored = std::fs::create_dir_all(&self.folder)
            .and_then(|()| write_atomically(entry, serialized));
        if let Err(error) = stored {
            log::warn!(
                "xla compile cache: cannot write {}: {error}",
                entry.display()
            );
        }
    }

    /// Removes an entry the plugin could not load.
    pub fn evict(&self, entry: &Path) {
        if let Err(error) = std::fs::remove_file(entry)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            log::warn!(
                "xla compile cache: cannot remove {}: {error}",
                entry.display()
            );
        }
    }
}

/// `$XDG_CACHE_HOME/burn-trainium/xla`, else `$HOME/.cache/burn-trainium/xla`.
fn default_folder() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|value| !value.is_empty())
                .map(|home| PathBuf::from(home).join(".cache"))
        })?;
    Some(base.join("burn-trainium").join("xla"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_module_options_plugin_and_flags() {
        let folder = PathBuf::from("/cache");
        let cache = XlaDiskCache::new(folder.clone(), Path::new("/no/plugin.so"), "");
        let entry = cache.entry(b"module", b"options");
        assert_eq!(entry, cache.entry(b"module", b"options"), "stable");
        assert_eq!(entry.parent(), Some(folder.as_path()));
        assert_eq!(entry.extension().unwrap(), ENTRY_EXTENSION);
        for other in [
            cache.entry(b"module2", b"options"),
            cache.entry(b"module", b"options2"),
            // The boundary between the parts counts.
            cache.entry(b"modul", b"eoptions"),
            XlaDiskCache::new(folder.clone(), Path::new("/other/plugin.so"), "")
                .entry(b"module", b"options"),
            XlaDiskCache::new(folder.clone(), Path::new("/no/plugin.so"), "--flag")
                .entry(b"module", b"options"),
        ] {
            assert_ne!(entry, other);
        }
    }

    #[test]
    fn entries_are_stored_loaded_and_evicted() {
        let folder = tempfile::tempdir().unwrap();
        let cache = XlaDiskCache::new(folder.path().join("xla"), Path::new("/p.so"), "");
        let entry = cache.entry(b"m", b"o");
        assert_eq!(cache.load(&entry), None);
        cache.store(&entry, b"serialized");
        assert_eq!(cache.load(&entry).as_deref(), Some(&b"serialized"[..]));
        cache.evict(&entry);
        assert_eq!(cache.load(&entry), None);
    }
}
