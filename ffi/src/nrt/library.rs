//! Finding and opening `libnrt`, and resolving the functions this binding calls.

use std::fmt;
use std::path::{Path, PathBuf};

use super::raw::Api;
use super::{LoadAttempt, NrtError};

/// The environment variable naming a folder that holds `libnrt.so.1`.
pub const LIB_DIR_ENV: &str = "NEURON_RT_LIB_DIR";

/// Where the Neuron SDK installs `libnrt` on a trn1/trn2 instance.
pub const DEFAULT_LIB_DIR: &str = "/opt/aws/neuron/lib";

/// The file names tried in each folder, in order.
pub const LIB_NAMES: [&str; 2] = ["libnrt.so.1", "libnrt.so"];

/// The candidates tried by [`NeuronLibrary::load`], in order: `lib_dir`, [`DEFAULT_LIB_DIR`], then
/// the bare names for the dynamic loader's own search path.
pub fn library_candidates(lib_dir: Option<&Path>) -> Vec<PathBuf> {
    let folders = lib_dir.into_iter().chain([Path::new(DEFAULT_LIB_DIR)]);
    let mut candidates: Vec<PathBuf> = folders
        .flat_map(|folder| LIB_NAMES.map(|name| folder.join(name)))
        .collect();
    candidates.extend(LIB_NAMES.map(PathBuf::from));
    candidates
}

/// An opened `libnrt` and the functions resolved from it.
pub struct NeuronLibrary {
    pub(crate) api: Api,
    path: PathBuf,
    // Keeps the functions in `api` mapped; declared last so it is dropped last.
    _library: libloading::Library,
}

impl fmt::Debug for NeuronLibrary {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("NeuronLibrary")
            .field("path", &self.path)
            .finish()
    }
}

impl NeuronLibrary {
    /// Opens the first loadable candidate of [`library_candidates`] and resolves every function.
    ///
    /// The error lists every candidate tried with the loader's message.
    pub fn load(lib_dir: Option<&Path>) -> Result<Self, NrtError> {
        let mut searched = Vec::new();
        for candidate in library_candidates(lib_dir) {
            // SAFETY: libnrt's initializers only set up its own state.
            match unsafe { libloading::Library::new(&candidate) } {
                Ok(library) => return Self::resolve(library, candidate),
                Err(error) => searched.push(LoadAttempt {
                    candidate,
                    reason: error.to_string(),
                }),
            }
        }
        Err(NrtError::NotFound { searched })
    }

    /// Opens the library from `NEURON_RT_LIB_DIR` or the default places.
    pub fn load_from_env() -> Result<Self, NrtError> {
        let lib_dir = std::env::var_os(LIB_DIR_ENV).filter(|value| !value.is_empty());
        Self::load(lib_dir.as_deref().map(Path::new))
    }

    /// Where the library was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn resolve(library: libloading::Library, path: PathBuf) -> Result<Self, NrtError> {
        let shown = path.display().to_string();
        let lookup = Lookup {
            library: &library,
            shown: &shown,
        };
        let api = Api {
            init: lookup.function("nrt_init")?,
            close: lookup.function("nrt_close")?,
            get_version: lookup.function("nrt_get_version")?,
            get_total_core_count: lookup
                .either("nrt_get_total_vnc_count", "nrt_get_total_nc_count")?,
            get_visible_core_count: lookup
                .either("nrt_get_visible_vnc_count", "nrt_get_visible_nc_count")?,
            load: lookup.function("nrt_load")?,
            load_collectives: lookup.function("nrt_load_collectives")?,
            unload: lookup.function("nrt_unload")?,
            get_model_tensor_info: lookup.function("nrt_get_model_tensor_info")?,
            free_model_tensor_info: lookup.function("nrt_free_model_tensor_info")?,
            allocate_tensor_set: lookup.function("nrt_allocate_tensor_set")?,
            destroy_tensor_set: lookup.function("nrt_destroy_tensor_set")?,
            add_tensor_to_tensor_set: lookup.function("nrt_add_tensor_to_tensor_set")?,
            execute: lookup.function("nrt_execute")?,
            tensor_allocate: lookup.function("nrt_tensor_allocate")?,
            tensor_free: lookup.function("nrt_tensor_free")?,
            tensor_read: lookup.function("nrt_tensor_read")?,
            tensor_write: lookup.function("nrt_tensor_write")?,
            tensor_get_size: lookup.function("nrt_tensor_get_size")?,
        };
        log::info!("loaded the Neuron runtime from {shown}");
        Ok(Self {
            api,
            path,
            _library: library,
        })
    }
}

/// Resolves functions of an opened library, naming the library in errors.
struct Lookup<'a> {
    library: &'a libloading::Library,
    shown: &'a str,
}

impl Lookup<'_> {
    /// The function `name`, typed as the field it is stored in (the header's declaration).
    fn function<T: Copy>(&self, name: &'static str) -> Result<T, NrtError> {
        // SAFETY: every `T` used is the exact C signature `nrt.h` declares for `name`.
        unsafe { self.library.get::<T>(name.as_bytes()) }
            .map(|symbol| *symbol)
            .map_err(|error| NrtError::MissingSymbol {
                library: self.shown.to_string(),
                symbol: name,
                reason: error.to_string(),
            })
    }

    /// `current`, or `deprecated` in runtimes older than it: `nrt_get_*_vnc_count` replaced
    /// `nrt_get_*_nc_count`, with the same signature.
    fn either<T: Copy>(
        &self,
        current: &'static str,
        deprecated: &'static str,
    ) -> Result<T, NrtError> {
        self.function(current).or_else(|_| {
            log::debug!(
                "{} has no `{current}`, using the deprecated `{deprecated}`",
                self.shown
            );
            self.function(deprecated)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_the_documented_order() {
        let candidates = library_candidates(Some(Path::new("/custom")));
        let shown: Vec<_> = candidates
            .iter()
            .map(|path| path.display().to_string())
            .collect();
        assert_eq!(
            shown,
            [
                "/custom/libnrt.so.1",
                "/custom/libnrt.so",
                "/opt/aws/neuron/lib/libnrt.so.1",
                "/opt/aws/neuron/lib/libnrt.so",
                "libnrt.so.1",
                "libnrt.so",
            ]
        );
        assert_eq!(library_candidates(None).len(), 4);
    }

    #[test]
    fn missing_library_error_lists_every_path_searched() {
        let empty = std::env::temp_dir().join(format!("nrt-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        match NeuronLibrary::load(Some(&empty)) {
            Err(NrtError::NotFound { searched }) => {
                assert_eq!(searched.len(), 6);
                let message = NrtError::NotFound { searched }.to_string();
                for candidate in library_candidates(Some(&empty)) {
                    let candidate = candidate.display().to_string();
                    assert!(
                        message.contains(&candidate),
                        "{candidate} missing from {message}"
                    );
                }
                assert!(message.contains(LIB_DIR_ENV), "{message}");
            }
            Err(other) => panic!("expected NotFound, got {other}"),
            Ok(library) => eprintln!(
                "a libnrt is installed at {}; nothing to check",
                library.path().display()
            ),
        }
        std::fs::remove_dir_all(&empty).unwrap();
    }
}
