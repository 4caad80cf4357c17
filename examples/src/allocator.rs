//! How this process's allocator keeps freed memory: for reuse, instead of handing it back.
//!
//! A training step allocates the same large buffers every time (logits, their gradients, the
//! XLA CPU runtime's scratch buffer of hundreds of MiB). glibc serves such allocations with
//! `mmap` and unmaps them on `free`, and worker threads allocate from arenas that always do so
//! for large sizes: every step then faults every page of those buffers in again, and the kernel
//! zeroes each one. Measured on bench-tiny (4 × 256 tokens, `hlat bench train`, side by side):
//! 1.5 million page faults in a run of 8 steps on `xla` and 1.6 million in a run of 4 on `host`,
//! 0.3 million with the settings below, and steps 15–30% faster, peak memory within the runs'
//! own spread.
//!
//! So `hlat` asks glibc, before any thread exists, for one arena, no `mmap` for allocations and
//! no trimming: freed memory stays in the process and the next step reuses it. The process's
//! resident memory then stays at its peak instead of falling after it. One arena serialises
//! allocations between threads: measured on 2 cores only; on a machine with many cores whose
//! threads allocate a lot (the `host` executor), `MALLOC_ARENA_MAX=N` may serve better. A user's
//! own `MALLOC_*` or `GLIBC_TUNABLES` setting wins: then nothing is changed.

/// The environment variables through which a user tunes glibc's allocator themselves.
const USER_SETTINGS: [&str; 4] = [
    "GLIBC_TUNABLES",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_MAX_",
    "MALLOC_TRIM_THRESHOLD_",
];

/// What [`keep_freed_memory`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocatorPolicy {
    /// glibc was set to keep freed memory for reuse.
    KeepFreed,
    /// The user's own setting (the variable named) was left in force.
    UserSetting(&'static str),
    /// This C library has no such settings.
    Unavailable,
}

impl std::fmt::Display for AllocatorPolicy {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllocatorPolicy::KeepFreed => {
                formatter.write_str("freed memory is kept for reuse (one arena, no mmap, no trim)")
            }
            AllocatorPolicy::UserSetting(variable) => {
                write!(formatter, "left as {variable} sets it")
            }
            AllocatorPolicy::Unavailable => {
                formatter.write_str("unchanged (this C library has no such settings)")
            }
        }
    }
}

/// Makes freed memory stay in the process for reuse (see the module documentation). Call it
/// first thing in `main`, before any thread exists: arenas are chosen per thread.
pub fn keep_freed_memory() -> AllocatorPolicy {
    if let Some(variable) = USER_SETTINGS
        .into_iter()
        .find(|variable| std::env::var_os(variable).is_some())
    {
        return AllocatorPolicy::UserSetting(variable);
    }
    set_glibc_policy()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_glibc_policy() -> AllocatorPolicy {
    // SAFETY: mallopt only changes glibc's allocator parameters; it is called before any other
    // thread exists, so no allocation runs concurrently.
    let accepted = unsafe {
        [
            libc::mallopt(libc::M_ARENA_MAX, 1),
            libc::mallopt(libc::M_MMAP_MAX, 0),
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX),
        ]
    };
    if accepted.iter().all(|&status| status == 1) {
        AllocatorPolicy::KeepFreed
    } else {
        AllocatorPolicy::Unavailable
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_glibc_policy() -> AllocatorPolicy {
    AllocatorPolicy::Unavailable
}
