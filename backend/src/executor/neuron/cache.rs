use core::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::compiler::{MODULE_FILE, NEFF_FILE};
use super::kernels::has_kernel_requests;
use super::{NeuronCompiler, NeuronError, NeuronSettings};
use crate::executor::atomic_write::write_atomically;

/// The compiler output of a successful compile, kept beside the NEFF.
const COMPILE_LOG_FILE: &str = "model.log";
/// The compiler output of a failed compile; its presence marks the failure.
const FAILED_LOG_FILE: &str = "model.failed.log";
/// The flags of the compile, as a JSON array (like Neuron's own cache).
const FLAGS_FILE: &str = "compile_flags.json";
/// The file locked while an entry is being compiled.
const LOCK_FILE: &str = "model.lock";

/// Identifies one compile: the module bytes, the flags and the compiler version.
///
/// It names the entry's folder `neuronxcc-VERSION/MODULE_MODULEHASH+FLAGSHASH`, the layout of
/// the Neuron persistent cache (20 hex digits of the module's SHA-256, 8 of the flags').
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The compiler version.
    pub compiler_version: String,
    /// The first 20 hex digits of the SHA-256 of the module bytes.
    pub module_hash: String,
    /// The first 8 hex digits of the SHA-256 of the flags, each followed by a NUL byte.
    pub flags_hash: String,
}

/// The first `digits` hex digits of the SHA-256 of `parts`, one after the other.
pub(super) fn sha256_hex(parts: &[&[u8]], digits: usize) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    hex[..digits].to_string()
}

impl CacheKey {
    /// The key of compiling `module` with `flags` by compiler `compiler_version`.
    pub fn new(module: &[u8], flags: &[String], compiler_version: &str) -> Self {
        let flag_parts: Vec<&[u8]> = flags
            .iter()
            .flat_map(|flag| [flag.as_bytes(), b"\0"])
            .collect();
        Self {
            compiler_version: compiler_version.to_string(),
            module_hash: sha256_hex(&[module], 20),
            flags_hash: sha256_hex(&flag_parts, 8),
        }
    }

    /// The key of compiling `module` with `compiler`: its flags, and for a module holding kernel
    /// requests the kernel tracer that turns them into the SDK's calls.
    pub fn for_compiler(module: &[u8], compiler: &NeuronCompiler) -> Self {
        let mut flags = compiler.flags();
        if let Some(tracer) = compiler.kernel_tracer()
            && has_kernel_requests(module)
        {
            flags.push(format!("kernel tracer: {}", tracer.identity()));
        }
        Self::new(module, &flags, compiler.version())
    }

    /// The entry's folder, relative to the cache root.
    pub fn relative_dir(&self) -> PathBuf {
        Path::new(&format!("neuronxcc-{}", self.compiler_version))
            .join(format!("MODULE_{}+{}", self.module_hash, self.flags_hash))
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}", self.relative_dir().display())
    }
}

/// Where a NEFF came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheOutcome {
    /// It was in the cache.
    Hit,
    /// This call compiled it, in `seconds`.
    Compiled {
        /// Wall-clock seconds spent in the compiler.
        seconds: f64,
    },
}

/// A NEFF obtained from the cache.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedNeff {
    /// The entry's key.
    pub key: CacheKey,
    /// The NEFF bytes.
    pub neff: Vec<u8>,
    /// Whether it was compiled by this call.
    pub outcome: CacheOutcome,
}

/// A persistent folder of compiled NEFFs shared by every process of the machine.
///
/// Each entry is a folder (see [`CacheKey`]) holding `model.hlo_module.pb`,
/// `compile_flags.json`, `model.log` and `model.neff` after a successful compile, or
/// `model.failed.log` after a failed one. Files are published atomically (written to a
/// temporary name, then renamed), `model.neff` last, and an entry is compiled under an exclusive
/// file lock (`model.lock`, released by the system even if the process dies), so two processes
/// never compile the same module at once: the second waits and then finds the NEFF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeffCache {
    root: PathBuf,
    retry_failed: bool,
}

enum EntryState {
    Compiled(Vec<u8>),
    Failed(String),
    Missing,
}

impl NeffCache {
    /// A cache rooted at `root` (created on first use). With `retry_failed`, a remembered failure
    /// is compiled again instead of reported.
    pub fn new(root: impl Into<PathBuf>, retry_failed: bool) -> Self {
        Self {
            root: root.into(),
            retry_failed,
        }
    }

    /// The cache configured by `settings`.
    pub fn from_settings(settings: &NeuronSettings) -> Self {
        Self::new(&settings.cache_root, settings.retry_failed)
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder of the entry `key`.
    pub fn entry_dir(&self, key: &CacheKey) -> PathBuf {
        self.root.join(key.relative_dir())
    }

    fn state(&self, dir: &Path) -> Result<EntryState, NeuronError> {
        let neff = dir.join(NEFF_FILE);
        match std::fs::read(&neff) {
            Ok(bytes) => return Ok(EntryState::Compiled(bytes)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(NeuronError::io("read", neff)(error)),
        }
        let failed = dir.join(FAILED_LOG_FILE);
        match std::fs::read_to_string(&failed) {
            Ok(log) => Ok(EntryState::Failed(log)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(EntryState::Missing),
            Err(error) => Err(NeuronError::io("read", failed)(error)),
        }
    }

    /// Whether the entry already decides the result: the NEFF, or the remembered failure.
    fn settled(&self, key: &CacheKey, dir: &Path) -> Result<Option<CachedNeff>, NeuronError> {
        match self.state(dir)? {
            EntryState::Compiled(neff) => Ok(Some(CachedNeff {
                key: key.clone(),
                neff,
                outcome: CacheOutcome::Hit,
            })),
            EntryState::Failed(_) if self.retry_failed => Ok(None),
            EntryState::Failed(log) => Err(NeuronError::RememberedFailure {
                entry: dir.to_path_buf(),
                log,
            }),
            EntryState::Missing => Ok(None),
        }
    }

    /// The NEFF of `module`, from the cache or compiled now with `compiler` and published.
    ///
    /// A compile rejected by the compiler is remembered with its output and reported again by
    /// later calls without running the compiler. A compiler that cannot be started is not
    /// remembered.
    pub fn get_or_compile(
        &self,
        compiler: &NeuronCompiler,
        module: &[u8],
    ) -> Result<CachedNeff, NeuronError> {
        let key = CacheKey::for_compiler(module, compiler);
        let dir = self.entry_dir(&key);
        if let Some(found) = self.settled(&key, &dir)? {
            log::debug!("NEFF cache hit: {key}");
            return Ok(found);
        }
        std::fs::create_dir_all(&dir).map_err(NeuronError::io("create", &dir))?;
        let _lock = lock_entry(&dir)?;
        if let Some(found) = self.settled(&key, &dir)? {
            log::debug!("NEFF cache hit after waiting: {key}");
            return Ok(found);
        }
        remove_if_present(&dir.join(FAILED_LOG_FILE))?;

        let work_dir = dir.join(format!("work-{}", std::process::id()));
        if work_dir.exists() {
            std::fs::remove_dir_all(&work_dir).map_err(NeuronError::io("remove", &work_dir))?;
        }
        let started = Instant::now();
        let compiled = compiler.compile(module, &work_dir);
        let seconds = started.elapsed().as_secs_f64();
        let published = match compiled {
            Ok(compiled) => {
                publish(&dir.join(MODULE_FILE), module)?;
                let flags = serde_json::to_vec(&compiler.flags())
                    .expect("a list of strings is always JSON");
                publish(&dir.join(FLAGS_FILE), &flags)?;
                publish(&dir.join(COMPILE_LOG_FILE), compiled.log.as_bytes())?;
                publish(&dir.join(NEFF_FILE), &compiled.neff)?;
                log::info!("compiled {key} in {seconds:.1} s");
                Ok(CachedNeff {
                    key,
                    neff: compiled.neff,
                    outcome: CacheOutcome::Compiled { seconds },
                })
            }
            Err(error @ NeuronError::CompileFailed { .. }) => {
                publish(&dir.join(MODULE_FILE), module)?;
                publish(&dir.join(FAILED_LOG_FILE), error.to_string().as_bytes())?;
                Err(error)
            }
            Err(error) => Err(error),
        };
        std::fs::remove_dir_all(&work_dir).map_err(NeuronError::io("remove", &work_dir))?;
        published
    }
}

/// Takes the entry's exclusive lock, waiting for another compiler of the same entry if needed.
fn lock_entry(dir: &Path) -> Result<File, NeuronError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(NeuronError::io("open", &path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => {
            log::info!(
                "another process is compiling {}; waiting for it",
                dir.display()
            );
            file.lock().map_err(NeuronError::io("lock", &path))?;
            Ok(file)
        }
        Err(TryLockError::Error(error)) => Err(NeuronError::io("lock", path)(error)),
    }
}

fn remove_if_present(path: &Path) -> Result<(), NeuronError> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(NeuronError::io("remove", path)(error))
        }
        _ => Ok(()),
    }
}

/// Writes `bytes` to `path` atomically (see [`write_atomically`]).
pub(crate) fn publish(path: &Path, bytes: &[u8]) -> Result<(), NeuronError> {
    write_atomically(path, bytes).map_err(NeuronError::io("publish", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_neuron_cache_layout() {
        let flags = vec!["--framework".to_string(), "XLA".to_string()];
        let key = CacheKey::new(b"abc", &flags, "2.16.345.0+69131dd3");
        // SHA-256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad.
        assert_eq!(key.module_hash, "ba7816bf8f01cfea4141");
        // SHA-256("--framework\0XLA\0") starts with 95168e4f (Python's hashlib).
        assert_eq!(key.flags_hash, "95168e4f");
        assert_eq!(
            key.to_string(),
            "neuronxcc-2.16.345.0+69131dd3/MODULE_ba7816bf8f01cfea4141+95168e4f"
        );
        assert_ne!(key, CacheKey::new(b"abc", &flags, "2.16.346.0"));
        assert_ne!(key, CacheKey::new(b"abd", &flags, "2.16.345.0+69131dd3"));
        assert_ne!(
            key,
            CacheKey::new(b"abc", &flags[..1], "2.16.345.0+69131dd3")
        );
    }

    #[test]
    fn publish_replaces_whole_files_and_leaves_no_temporaries() {
        let dir = std::env::temp_dir().join(format!("neff-publish-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.neff");
        publish(&path, b"first").unwrap();
        publish(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["model.neff"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
