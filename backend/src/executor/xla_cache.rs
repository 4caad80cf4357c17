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

/// A folder of serialized PJRT executables, keyed by what the compiled code depends on besides
/// the module and its compile options: the plugin build, `XLA_FLAGS`, and the machine it was
/// compiled for (see [`MachineIdentity`]).
#[derive(Debug, Clone)]
pub(crate) struct XlaDiskCache {
    folder: PathBuf,
    /// What identifies the plugin build, the machine and the compiler settings outside the
    /// module.
    fingerprint: Vec<u8>,
}

/// What code compiled by a PJRT plugin is specific to, besides the plugin build: the platform's
/// name and version, the kinds of the devices, and for the CPU plugin the host's processor model
/// and instruction-set features (a cache shared by machines of other CPUs, or of other GPUs
/// behind the same plugin file, then holds other keys: JAX keys its cache likewise).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MachineIdentity {
    /// `PJRT_Client_PlatformName` and `PJRT_Client_PlatformVersion`.
    pub platform: String,
    /// `PJRT_DeviceDescription_Kind` of each device, in order.
    pub device_kinds: Vec<String>,
    /// The processor model and its feature flags (`/proc/cpuinfo` on Linux), for the CPU
    /// platform.
    pub processor: String,
}

impl MachineIdentity {
    /// This host's processor model and feature flags: the first `model name` and `flags` lines
    /// of `/proc/cpuinfo` (empty elsewhere).
    pub fn host_processor() -> String {
        let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find(|line| line.split(':').next().is_some_and(|key| key.trim() == name))
                .and_then(|line| line.split_once(':'))
                .map(|(_, value)| value.trim().to_string())
                .unwrap_or_default()
        };
        format!("{} | {}", field("model name"), field("flags"))
    }

    /// The identity as key bytes.
    fn key_bytes(&self) -> Vec<u8> {
        let text = format!(
            "platform={}\ndevices={}\nprocessor={}",
            self.platform,
            self.device_kinds.join(","),
            self.processor
        );
        text.into_bytes()
    }
}

impl XlaDiskCache {
    /// The cache of programs compiled by the plugin at `plugin` for `machine`, in the folder
    /// the environment names; `None` when it is turned off or no folder can be found.
    pub fn from_env(plugin: &Path, machine: &MachineIdentity) -> Option<Self> {
        let folder = match std::env::var_os(XLA_CACHE_ENV) {
            Some(value) if value == "off" => return None,
            Some(value) if !value.is_empty() => PathBuf::from(value),
            _ => default_folder()?,
        };
        let xla_flags = std::env::var("XLA_FLAGS").unwrap_or_default();
        Some(Self::new(folder, plugin, machine, &xla_flags))
    }

    /// The cache in `folder` for the plugin at `plugin` compiling for `machine` with
    /// `xla_flags`. The plugin is identified by its path, size and modification time: a
    /// reinstalled plugin starts a new set of keys (serialized programs are only valid for the
    /// build that made them).
    pub fn new(folder: PathBuf, plugin: &Path, machine: &MachineIdentity, xla_flags: &str) -> Self {
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
        fingerprint.extend_from_slice(&machine.key_bytes());
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

    fn machine() -> MachineIdentity {
        MachineIdentity {
            platform: "cpu 0.0.1".into(),
            device_kinds: vec!["cpu".into(); 2],
            processor: "AMD EPYC 9R14 | fpu avx2 avx512f".into(),
        }
    }

    /// Another machine, another plugin build, other flags, another module or options: another
    /// key, so an entry compiled for one is never loaded for the other.
    #[test]
    fn keys_depend_on_module_options_plugin_machine_and_flags() {
        let folder = PathBuf::from("/cache");
        let plugin = Path::new("/no/plugin.so");
        let cache = XlaDiskCache::new(folder.clone(), plugin, &machine(), "");
        let entry = cache.entry(b"module", b"options");
        assert_eq!(entry, cache.entry(b"module", b"options"), "stable");
        assert_eq!(entry.parent(), Some(folder.as_path()));
        assert_eq!(entry.extension().unwrap(), ENTRY_EXTENSION);
        for other in [
            cache.entry(b"module2", b"options"),
            cache.entry(b"module", b"options2"),
            // The boundary between the parts counts.
            cache.entry(b"modul", b"eoptions"),
            XlaDiskCache::new(
                folder.clone(),
                Path::new("/other/plugin.so"),
                &machine(),
                "",
            )
            .entry(b"module", b"options"),
            XlaDiskCache::new(folder.clone(), plugin, &machine(), "--flag")
                .entry(b"module", b"options"),
            XlaDiskCache::new(
                folder.clone(),
                plugin,
                &MachineIdentity {
                    processor: "Intel Xeon 8488C | fpu avx2 avx512f amx_tile".into(),
                    ..machine()
                },
                "",
            )
            .entry(b"module", b"options"),
            XlaDiskCache::new(
                folder.clone(),
                plugin,
                &MachineIdentity {
                    platform: "cpu 0.0.2".into(),
                    ..machine()
                },
                "",
            )
            .entry(b"module", b"options"),
            XlaDiskCache::new(
                folder.clone(),
                plugin,
                &MachineIdentity {
                    device_kinds: vec!["NVIDIA H100".into(); 2],
                    ..machine()
                },
                "",
            )
            .entry(b"module", b"options"),
        ] {
            assert_ne!(entry, other);
        }
    }

    #[test]
    fn entries_are_stored_loaded_and_evicted() {
        let folder = tempfile::tempdir().unwrap();
        let cache = XlaDiskCache::new(
            folder.path().join("xla"),
            Path::new("/p.so"),
            &machine(),
            "",
        );
        let entry = cache.entry(b"m", b"o");
        assert_eq!(cache.load(&entry), None);
        cache.store(&entry, b"serialized");
        assert_eq!(cache.load(&entry).as_deref(), Some(&b"serialized"[..]));
        cache.evict(&entry);
        assert_eq!(cache.load(&entry), None);
    }

    #[test]
    fn the_host_processor_names_its_model_and_features() {
        let processor = MachineIdentity::host_processor();
        if std::path::Path::new("/proc/cpuinfo").is_file() {
            let (model, flags) = processor.split_once(" | ").unwrap();
            assert!(
                !model.is_empty() && flags.split(' ').count() > 5,
                "{processor}"
            );
        }
    }
}
