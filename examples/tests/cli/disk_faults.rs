//! Disk faults injected into one `hlat` process: a small library preloaded into it
//! (`disk_faults/disk_faults.c`, built once per test run with the C compiler Rust links with)
//! makes the writes to regular files fail past a number of bytes (a full disk), fail or slow down
//! under a folder, or stall for good at a file or a rename, as its variables ask ([`DiskFault`]),
//! on any machine and without a file system of its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::hlat;

/// A fault the preloaded library injects.
pub(super) enum DiskFault<'a> {
    /// The disk is full after this many bytes written to regular files.
    FullAfter(u64),
    /// Every write to a file whose path contains this text fails with ENOSPC.
    FailUnder(&'a str),
    /// The first write to a file whose path contains this text creates the marker file and then
    /// never returns.
    StallWrite { path: &'a str, marker: &'a Path },
    /// The first rename of a path ending with this text creates the marker file and then never
    /// returns.
    StallRename { path: &'a str, marker: &'a Path },
    /// Every write to a file whose path contains this text first waits this many milliseconds.
    SlowUnder { path: &'a str, millis: u64 },
}

/// The preloaded library, built once per test run.
fn library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let folder = tempfile::tempdir().unwrap().keep();
        let source = folder.join("disk_faults.c");
        std::fs::write(&source, include_str!("disk_faults/disk_faults.c")).unwrap();
        let library = folder.join("disk_faults.so");
        let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let built = Command::new(&compiler)
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&library)
            .arg(&source)
            .arg("-ldl")
            .output()
            .unwrap_or_else(|error| panic!("running the C compiler `{compiler}`: {error}"));
        assert!(
            built.status.success(),
            "building {}: {}",
            source.display(),
            String::from_utf8_lossy(&built.stderr)
        );
        library
    })
}

/// The variables that set `fault` up in a process.
pub(super) fn variables(fault: &DiskFault<'_>) -> Vec<(&'static str, String)> {
    let text = |path: &Path| path.to_string_lossy().into_owned();
    let mut variables = vec![("LD_PRELOAD", text(library()))];
    variables.extend(match fault {
        DiskFault::FullAfter(bytes) => vec![("HLAT_TEST_DISK_BYTES", bytes.to_string())],
        DiskFault::FailUnder(path) => vec![("HLAT_TEST_FAIL_PATH", path.to_string())],
        DiskFault::StallWrite { path, marker } => vec![
            ("HLAT_TEST_STALL_PATH", path.to_string()),
            ("HLAT_TEST_STALL_MARKER", text(marker)),
        ],
        DiskFault::StallRename { path, marker } => vec![
            ("HLAT_TEST_STALL_RENAME", path.to_string()),
            ("HLAT_TEST_STALL_MARKER", text(marker)),
        ],
        DiskFault::SlowUnder { path, millis } => vec![
            ("HLAT_TEST_SLOW_PATH", path.to_string()),
            ("HLAT_TEST_SLOW_MS", millis.to_string()),
        ],
    });
    variables
}

/// `hlat ARGUMENTS` in `folder`, without `TRAINIUM_DEVICE`, with `fault` injected.
pub(super) fn hlat_with(folder: &Path, arguments: &[&str], fault: &DiskFault<'_>) -> Command {
    let mut command = hlat();
    command
        .current_dir(folder)
        .args(arguments)
        .env_remove(burn_trainium::DEVICE_ENV)
        .envs(variables(fault));
    command
}
