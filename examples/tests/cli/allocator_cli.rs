//! `hlat` keeps freed memory for reuse unless the user tunes glibc's allocator themselves.

use super::hlat;

/// What `hlat info` logs about the allocator, with `variable` set to `value` (or nothing set).
fn allocator_line(setting: Option<(&str, &str)>) -> String {
    let mut command = hlat();
    for variable in [
        "GLIBC_TUNABLES",
        "MALLOC_ARENA_MAX",
        "MALLOC_MMAP_MAX_",
        "MALLOC_TRIM_THRESHOLD_",
    ] {
        command.env_remove(variable);
    }
    if let Some((variable, value)) = setting {
        command.env(variable, value);
    }
    let output = command
        .env("RUST_LOG", "hlat=debug")
        .args(["info", "hlat-tiny"])
        .output()
        .expect("running hlat");
    assert!(output.status.success(), "hlat info failed");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    stderr
        .lines()
        .find_map(|line| {
            line.split_once("allocator: ")
                .map(|(_, rest)| rest.to_string())
        })
        .unwrap_or_else(|| panic!("no allocator line in:\n{stderr}"))
}

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn freed_memory_is_kept_for_reuse_unless_the_user_tunes_the_allocator() {
    assert_eq!(
        allocator_line(None),
        "freed memory is kept for reuse (one arena, no mmap, no trim)"
    );
    assert_eq!(
        allocator_line(Some(("MALLOC_ARENA_MAX", "4"))),
        "left as MALLOC_ARENA_MAX sets it"
    );
    assert_eq!(
        allocator_line(Some(("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0"))),
        "left as GLIBC_TUNABLES sets it"
    );
}
