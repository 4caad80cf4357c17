//! Finding a PJRT plugin when `TRAINIUM_PJRT_PLUGIN` names none, the way JAX finds its plugins:
//! first those of the installed Python packages (`jax_plugins/<name>/*.so`, the namespace JAX's
//! CUDA plugins install into, and the Neuron SDK's `libneuronxla`), then the XLA CPU plugin that
//! `scripts/install-xla-cpu` put in its cache (the newest version there).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A plugin found, and where it was found (for the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FoundPlugin {
    pub path: PathBuf,
    pub source: String,
}

/// The first plugin in `site_packages` (in order), else the newest in the installer's cache
/// under `cache_home` (`$XDG_CACHE_HOME` or `~/.cache`).
pub(crate) fn discover(
    site_packages: &[PathBuf],
    cache_home: Option<&Path>,
) -> Option<FoundPlugin> {
    for site in site_packages {
        let mut found: Vec<PathBuf> = shared_libraries(&site.join("libneuronxla"));
        if let Ok(plugins) = std::fs::read_dir(site.join("jax_plugins")) {
            let mut folders: Vec<PathBuf> = plugins.flatten().map(|entry| entry.path()).collect();
            folders.sort();
            for folder in folders {
                found.extend(shared_libraries(&folder));
            }
        }
        if let Some(path) = found.into_iter().find(|path| {
            path.file_name().is_some_and(|name| {
                name.to_string_lossy().contains("pjrt") || name.to_string_lossy().contains("plugin")
            })
        }) {
            return Some(FoundPlugin {
                path,
                source: format!("the Python packages in {}", site.display()),
            });
        }
    }
    let root = cache_home?.join("burn-trainium");
    let mut installs: Vec<PathBuf> = std::fs::read_dir(&root)
        .ok()?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name().is_some_and(|name| {
                name.to_string_lossy().starts_with("xla-cpu-")
                    && !name.to_string_lossy().contains(".partial")
            })
        })
        .collect();
    // Versions are dates (2026.6.23): the newest sorts last once each part is a number.
    installs.sort_by_key(|path| version_key(path));
    installs.into_iter().rev().find_map(|install| {
        let library = install
            .join("fastatomstruct_xla_cpu")
            .join("libpjrt_cpu.so");
        library.is_file().then(|| FoundPlugin {
            path: library,
            source: "scripts/install-xla-cpu's cache".to_string(),
        })
    })
}

/// The numeric parts of an install folder's version (`xla-cpu-2026.6.23` → `[2026, 6, 23]`).
fn version_key(path: &Path) -> Vec<u64> {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
        .trim_start_matches("xla-cpu-")
        .split('.')
        .map(|part| part.parse().unwrap_or(0))
        .collect()
}

/// The `.so` files of `folder`, sorted (none if it does not exist).
fn shared_libraries(folder: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(folder)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|extension| extension == "so"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// The folders the `python3` on `PATH` imports from (`sys.path`: `PYTHONPATH`, the virtual
/// environment's and the system's site-packages, the user's), where JAX looks for plugin
/// packages (none without a `python3`).
pub(crate) fn python_site_packages() -> Vec<PathBuf> {
    let script = "import sys\nfor p in sys.path:\n    print(p)";
    Command::new("python3")
        .args(["-c", script])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| {
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter(|line| !line.is_empty())
                .map(PathBuf::from)
                .filter(|path| path.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// `$XDG_CACHE_HOME`, else `~/.cache`.
pub(crate) fn cache_home() -> Option<PathBuf> {
    crate::settings::XDG_CACHE_HOME
        .var_os()
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            crate::settings::HOME
                .var_os()
                .filter(|value| !value.is_empty())
                .map(|home| PathBuf::from(home).join(".cache"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    #[test]
    fn python_plugins_come_first_then_the_newest_install() {
        let root = tempfile::tempdir().unwrap();
        let site = root.path().join("site-packages");
        let cache = root.path().join("cache");
        let install = |version: &str| {
            cache
                .join("burn-trainium")
                .join(format!("xla-cpu-{version}"))
                .join("fastatomstruct_xla_cpu/libpjrt_cpu.so")
        };
        assert_eq!(discover(std::slice::from_ref(&site), Some(&cache)), None);
        touch(&install("2026.6.9"));
        touch(&install("2026.6.23"));
        std::fs::create_dir_all(cache.join("burn-trainium/xla-cpu-2027.1.1.partial.x")).unwrap();
        let found = discover(std::slice::from_ref(&site), Some(&cache)).unwrap();
        assert_eq!(found.path, install("2026.6.23"));
        assert!(found.source.contains("install-xla-cpu"));
        let cuda = site.join("jax_plugins/xla_cuda12/xla_cuda_plugin.so");
        touch(&cuda);
        touch(&site.join("jax_plugins/xla_cuda12/libother.so"));
        let found = discover(std::slice::from_ref(&site), Some(&cache)).unwrap();
        assert_eq!(found.path, cuda);
        assert!(found.source.contains("Python packages"));
    }
}
