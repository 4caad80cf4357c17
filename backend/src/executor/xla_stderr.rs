//! The XLA CPU plugin's spurious warnings on loading a cached program.
//!
//! On a host with AVX-512, XLA's CPU compiler adds the LLVM tuning features `+prefer-no-gather`
//! and `+prefer-no-scatter` to every program's target features (`EnableFeaturesIfAVX512`,
//! `xla/backends/cpu/target_machine_options.cc`). When a serialized program is loaded,
//! `cpu_aot_loader.cc` checks each `+feature` against the host's CPUID features, which never
//! hold tuning features, and logs an ERROR for each of the two on the very machine that
//! compiled it (it loads and runs the program all the same). Newer XLA skips `prefer-` and
//! `fast-` features in that check. Until the plugin has that fix, loads from the compile cache
//! run with the process's stderr captured, and every line but those (a tuning feature, which
//! says nothing about the instruction set) is written back: a real mismatch, a feature the host
//! lacks, is still shown. The cache key holds the host's processor model and features, so an
//! entry only loads on a machine of the same processor anyway.

use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::sync::Mutex;

/// One redirection of the process's stderr at a time.
static REDIRECTED: Mutex<()> = Mutex::new(());

/// Whether `line` is the loader's ERROR about a tuning feature (`+prefer-…`, `+fast-…`).
pub(crate) fn is_spurious_feature_warning(line: &str) -> bool {
    const PREFIX: &str = "Loading XLA:CPU AOT result. Target machine feature +";
    let Some(start) = line.find(PREFIX) else {
        return false;
    };
    let feature = &line[start + PREFIX.len()..];
    line.contains("cpu_aot_loader")
        && (feature.starts_with("prefer-") || feature.starts_with("fast-"))
}

/// Runs `load` with the process's stderr captured in a temporary file, then writes back every
/// captured line but the spurious ones ([`is_spurious_feature_warning`]). If stderr cannot be
/// redirected, `load` runs as it is.
pub(crate) fn without_spurious_feature_warnings<T>(load: impl FnOnce() -> T) -> T {
    let _one_at_a_time = REDIRECTED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let Ok(mut capture) = tempfile::tempfile() else {
        return load();
    };
    let _ = std::io::stderr().flush();
    // SAFETY: plain descriptor calls; fd 2 is restored below before anything else writes.
    let saved = unsafe { libc::dup(2) };
    if saved < 0 || unsafe { libc::dup2(capture.as_raw_fd(), 2) } < 0 {
        if saved >= 0 {
            // SAFETY: `saved` is a descriptor this function opened.
            unsafe { libc::close(saved) };
        }
        return load();
    }
    let result = load();
    // SAFETY: `saved` is the original stderr, duplicated above.
    unsafe {
        libc::dup2(saved, 2);
        libc::close(saved);
    }
    let mut captured = String::new();
    let read = capture
        .rewind()
        .and_then(|()| capture.read_to_string(&mut captured));
    if read.is_ok() {
        write_back(&captured);
    }
    result
}

/// Writes the captured text to stderr, the spurious lines left out.
fn write_back(captured: &str) {
    let mut dropped = 0;
    let mut stderr = std::io::stderr().lock();
    for line in captured.lines() {
        if is_spurious_feature_warning(line) {
            dropped += 1;
        } else {
            let _ = writeln!(stderr, "{line}");
        }
    }
    if dropped > 0 {
        log::debug!(
            "xla compile cache: {dropped} spurious tuning-feature warnings of the plugin left out"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tuning_feature_warnings_are_spurious() {
        let line = |feature: &str| {
            format!(
                "E0000 00:00:1796288309.401216   21942 cpu_aot_loader.cc:195] Loading XLA:CPU AOT \
                 result. Target machine feature +{feature} is not  supported on the host machine. \
                 Machine type used for XLA:CPU compilation doesn't match"
            )
        };
        assert!(is_spurious_feature_warning(&line("prefer-no-gather")));
        assert!(is_spurious_feature_warning(&line("prefer-no-scatter")));
        assert!(is_spurious_feature_warning(&line("fast-gather")));
        // A feature the host lacks is a real mismatch.
        assert!(!is_spurious_feature_warning(&line("avx512f")));
        assert!(!is_spurious_feature_warning(&line("amx-tile")));
        assert!(!is_spurious_feature_warning("E0000 some other error"));
    }
}
