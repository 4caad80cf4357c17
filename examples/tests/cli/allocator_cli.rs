//! `hlat` keeps freed memory for reuse unless the user tunes glibc's allocator themselves.

use super::hlat;

/// What `hlat info` logs about the allocator, with `setting` (a variable and its value) in its
/// environment and no other setting of glibc's allocator.
fn allocator_line(setting: Option<(&str, &str)>) -> String {
    let mut command = hlat();
    for (variable, _) in std::env::vars_os() {
        let name = variable.to_string_lossy();
        if name == "GLIBC_TUNABLES" || name.starts_with("MALLOC_") {
            command.env_remove(&variable);
        }
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
    assert_eq!(
        allocator_line(Some(("MALLOC_TOP_PAD_", "0"))),
        "left as MALLOC_TOP_PAD_ sets it"
    );
}
