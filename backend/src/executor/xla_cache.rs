//! The persistent compile cache of the `xla` executor, as the NEFF cache is for `neuron` (and
//! JAX's persistent compilation cache for JAX): each compiled program serialized by the PJRT
//! plugin into a folder, under a SHA-256 key of everything the compiled code depends on, so a
//! later process running the same job loads its programs instead of compiling them.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::atomic_write::write_atomically;

/// The environment variable naming the cache folder; `off` turns the cache off. Default:
/// `$XDG_CACHE_HOME/burn-trainium/xla`, else `$HOME/.cache/burn-trainium/xla`.
pub const XLA_CACHE_ENV: &str = crate::settings::XLA_CACHE_DIR.name;

/// The environment variable bounding the cache's size in bytes: past it, the least recently
/// used entries are removed after each store. Default [`DEFAULT_MAX_BYTES`].
pub const XLA_CACHE_MAX_BYTES_ENV: &str = crate::settings::XLA_CACHE_MAX_BYTES.name;

/// The default bound of the cache's size: 4 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;

/// Extension of the cached programs.
const ENTRY_EXTENSION: &str = "pjrt";

/// Extension of the description beside each program.
const DESCRIPTION_EXTENSION: &str = "json";

/// A folder of serialized PJRT executables, keyed by what the compiled code depends on besides
/// the module and its compile options: the plugin build, `XLA_FLAGS`, and the machine it was
/// compiled for (see [`MachineIdentity`]).
#[derive(Debug, Clone)]
pub(crate) struct XlaDiskCache {
    folder: PathBuf,
    /// What identifies the plugin build, the machine and the compiler settings outside the
    /// module.
    fingerprint: Vec<u8>,
    /// What each entry was made with and for, written beside it (for `hlat cache`).
    description: EntryDescription,
    /// The bound of the folder's size.
    max_bytes: u64,
}

/// What a cached program was compiled with and for, kept beside it as JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryDescription {
    /// The module's name (`segment_<key>`), filled in for each entry.
    pub module: String,
    /// The plugin file.
    pub plugin: String,
    /// The platform's name and version.
    pub platform: String,
    /// The kinds of the devices.
    pub device_kinds: Vec<String>,
    /// The processor model (CPU platform).
    pub processor: String,
    /// `XLA_FLAGS` at compile time.
    pub xla_flags: String,
}

/// What code compiled by a PJRT plugin is specific to, besides the plugin build: the platform's
/// name and version, the kinds of the devices, and for the CPU plugin the host's processor model
/// and instruction-set features (a cache shared by machines of other CPUs, or of other GPUs
/// behind the same plugin file, then holds other keys: JAX keys its cache likewise).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineIdentity {
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
        let folder = match crate::settings::XLA_CACHE_DIR.var_os() {
            Some(value) if value == "off" => return None,
            Some(value) if !value.is_empty() => PathBuf::from(value),
            _ => default_folder()?,
        };
        let xla_flags = crate::settings::XLA_FLAGS.var().unwrap_or_default();
        let mut cache = Self::new(folder, plugin, machine, &xla_flags);
        match crate::settings::XLA_CACHE_MAX_BYTES
            .var()
            .map(|text| text.trim().parse::<u64>())
        {
            Ok(Ok(bytes)) => cache.max_bytes = bytes,
            Ok(Err(error)) => log::warn!(
                "{XLA_CACHE_MAX_BYTES_ENV} is not a byte count ({error}); the cache keeps its \
                 default bound of {DEFAULT_MAX_BYTES} bytes"
            ),
            Err(_) => {}
        }
        Some(cache)
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
        let description = EntryDescription {
            module: String::new(),
            plugin: path.display().to_string(),
            platform: machine.platform.clone(),
            device_kinds: machine.device_kinds.clone(),
            processor: machine
                .processor
                .split(" | ")
                .next()
                .unwrap_or_default()
                .to_string(),
            xla_flags: xla_flags.to_string(),
        };
        Self {
            folder,
            fingerprint,
            description,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }

    /// The folder of XLA GPU's autotuning results and compiled kernels beside this cache's
    /// programs, keyed like them by the plugin, the machine and `XLA_FLAGS` (a reinstalled
    /// plugin or another GPU starts a new one): `gpu-tuning/<key>`.
    pub fn tuning_folder(&self) -> PathBuf {
        let digest = Sha256::digest(&self.fingerprint);
        let key: String = digest[..8]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        self.folder.join("gpu-tuning").join(key)
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
    /// and treated as absent: the program is compiled again). A hit marks the entry as just
    /// used, for the eviction of the least recently used.
    pub fn load(&self, entry: &Path) -> Option<Vec<u8>> {
        match std::fs::read(entry) {
            Ok(bytes) => {
                let touched = std::fs::File::options()
                    .write(true)
                    .open(entry)
                    .and_then(|file| file.set_modified(SystemTime::now()));
                if let Err(error) = touched {
                    log::debug!(
                        "xla compile cache: cannot mark {} used: {error}",
                        entry.display()
                    );
                }
                Some(bytes)
            }
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

    /// Stores the serialized program of module `module` in `entry`, with its description
    /// beside it (atomically; a failure is logged, the run goes on without the cache entry),
    /// then removes the least recently used entries past the cache's bound.
    pub fn store(&self, entry: &Path, module: &str, serialized: &[u8]) {
        let description = EntryDescription {
            module: module.to_string(),
            ..self.description.clone()
        };
        let text = serde_json::to_vec_pretty(&description).expect("descriptions serialize");
        let stored = std::fs::create_dir_all(&self.folder)
            .and_then(|()| write_atomically(&entry.with_extension(DESCRIPTION_EXTENSION), &text))
            .and_then(|()| write_atomically(entry, serialized));
        if let Err(error) = stored {
            log::warn!(
                "xla compile cache: cannot write {}: {error}",
                entry.display()
            );
        }
        match evict_to_bound(&self.folder, self.max_bytes) {
            Ok(0) => {}
            Ok(removed) => log::info!(
                "xla compile cache: {removed} least recently used entries removed to keep {} \
                 under {} bytes",
                self.folder.display(),
                self.max_bytes
            ),
            Err(error) => log::warn!(
                "xla compile cache: cannot bound {}: {error}",
                self.folder.display()
            ),
        }
    }

    /// Removes an entry the plugin could not load.
    pub fn evict(&self, entry: &Path) {
        if let Err(error) = remove_entry(entry) {
            log::warn!(
                "xla compile cache: cannot remove {}: {error}",
                entry.display()
            );
        }
    }
}

/// One cached program: its file, size, last use and description.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheEntry {
    /// The serialized program.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was last stored or loaded.
    pub last_used: SystemTime,
    /// What it was compiled with and for (absent for entries of older versions).
    pub description: Option<EntryDescription>,
}

impl CacheEntry {
    /// Removes the program and its description.
    pub fn remove(&self) -> std::io::Result<()> {
        remove_entry(&self.path)
    }
}

/// Removes the program at `entry` and its description (either may be gone already).
fn remove_entry(entry: &Path) -> std::io::Result<()> {
    for path in [
        entry.to_path_buf(),
        entry.with_extension(DESCRIPTION_EXTENSION),
    ] {
        match std::fs::remove_file(&path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
    }
    Ok(())
}

/// The folder of the `xla` compile cache the environment names ([`XLA_CACHE_ENV`]), `None` when
/// it is turned off or no folder can be found.
pub fn xla_cache_folder() -> Option<PathBuf> {
    match crate::settings::XLA_CACHE_DIR.var_os() {
        Some(value) if value == "off" => None,
        Some(value) if !value.is_empty() => Some(PathBuf::from(value)),
        _ => default_folder(),
    }
}

/// The programs cached in `folder`, most recently used first (an absent folder holds none).
pub fn cache_entries(folder: &Path) -> std::io::Result<Vec<CacheEntry>> {
    let listing = match std::fs::read_dir(folder) {
        Ok(listing) => listing,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut entries = Vec::new();
    for item in listing {
        let path = item?.path();
        if path
            .extension()
            .is_none_or(|extension| extension != ENTRY_EXTENSION)
        {
            continue;
        }
        // Another process may remove it meanwhile.
        let Ok(metadata) = std::fs::metadata(&path) else {
            continue;
        };
        let description = std::fs::read(path.with_extension(DESCRIPTION_EXTENSION))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok());
        entries.push(CacheEntry {
            bytes: metadata.len(),
            last_used: metadata.modified()?,
            path,
            description,
        });
    }
    entries.sort_by(|a, b| b.last_used.cmp(&a.last_used).then(a.path.cmp(&b.path)));
    Ok(entries)
}

/// Removes the least recently used programs of `folder` until the rest hold at most `max_bytes`;
/// returns how many were removed.
pub fn evict_to_bound(folder: &Path, max_bytes: u64) -> std::io::Result<usize> {
    let entries = cache_entries(folder)?;
    let mut kept = 0u64;
    let mut removed = 0;
    for entry in entries {
        if kept + entry.bytes <= max_bytes {
            kept += entry.bytes;
        } else {
            entry.remove()?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// `$XDG_CACHE_HOME/burn-trainium/xla`, else `$HOME/.cache/burn-trainium/xla`.
fn default_folder() -> Option<PathBuf> {
    Some(
        super::plugin_discovery::cache_home()?
            .join("burn-trainium")
            .join("xla"),
    )
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
        // The entry of the same module and options compiled for `other`.
        let on = |other: MachineIdentity| {
            XlaDiskCache::new(folder.clone(), plugin, &other, "").entry(b"module", b"options")
        };
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
            on(MachineIdentity {
                processor: "Intel Xeon 8488C | fpu avx2 avx512f amx_tile".into(),
                ..machine()
            }),
            on(MachineIdentity {
                platform: "cpu 0.0.2".into(),
                ..machine()
            }),
            on(MachineIdentity {
                device_kinds: vec!["NVIDIA H100".into(); 2],
                ..machine()
            }),
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
        cache.store(&entry, "segment_m", b"serialized");
        assert_eq!(cache.load(&entry).as_deref(), Some(&b"serialized"[..]));
        let listed = cache_entries(&folder.path().join("xla")).unwrap();
        assert_eq!(listed.len(), 1);
        let description = listed[0].description.as_ref().unwrap();
        assert_eq!(description.module, "segment_m");
        assert_eq!(description.platform, "cpu 0.0.1");
        assert_eq!(description.processor, "AMD EPYC 9R14");
        cache.evict(&entry);
        assert_eq!(cache.load(&entry), None);
        assert_eq!(cache_entries(&folder.path().join("xla")).unwrap(), []);
    }

    /// Past the bound, the least recently used entries go: a load counts as a use.
    #[test]
    fn eviction_keeps_the_most_recently_used_entries_under_the_bound() {
        let folder = tempfile::tempdir().unwrap();
        let mut cache = XlaDiskCache::new(
            folder.path().to_path_buf(),
            Path::new("/p.so"),
            &machine(),
            "",
        );
        cache.max_bytes = 3 * 100;
        let entries: Vec<PathBuf> = (0..4u8).map(|i| cache.entry(&[i], b"o")).collect();
        let age = |entry: &Path, seconds: u64| {
            let when = SystemTime::now() - std::time::Duration::from_secs(seconds);
            std::fs::File::options()
                .write(true)
                .open(entry)
                .unwrap()
                .set_modified(when)
                .unwrap();
        };
        for (index, entry) in entries.iter().take(3).enumerate() {
            cache.store(entry, "m", &[0; 100]);
            age(entry, 100 - index as u64 * 10);
        }
        // The oldest is used again: the second oldest is now the least recently used.
        assert!(cache.load(&entries[0]).is_some());
        cache.store(&entries[3], "m", &[0; 100]);
        let kept: Vec<PathBuf> = cache_entries(folder.path())
            .unwrap()
            .into_iter()
            .map(|entry| entry.path)
            .collect();
        assert_eq!(kept.len(), 3);
        assert!(!kept.contains(&entries[1]), "{kept:?}");
        assert!(!entries[1].with_extension(DESCRIPTION_EXTENSION).exists());
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
