//! How this process's allocator keeps freed memory: for reuse, instead of handing it back.
//!
//! A training step allocates the same large buffers every time (logits, their gradients, the
//! XLA CPU runtime's scratch buffer of hundreds of MiB). glibc serves such allocations with
//! `mmap` and unmaps them on `free`, and worker threads allocate from arenas that always do so
//! for large sizes: every step then faults every page of those buffers in again, and the kernel
//! zeroes each one. docs/performance.md gives the measurements (bench-tiny, side by side: several times
//! fewer page faults, steps 1.3–1.4× faster).
//!
//! So `hlat` asks glibc, before any thread exists, for one arena, no `mmap` for allocations and
//! no trimming: freed memory stays in the process and the next step reuses it. The process's
//! resident memory then stays at its peak instead of falling after it. One arena serialises
//! allocations between threads: measured on 2 cores only; on a machine with many cores whose
//! threads allocate a lot (the `host` executor), `MALLOC_ARENA_MAX=N` may serve better. A user's
//! own setting of glibc's allocator (`GLIBC_TUNABLES`, or any `MALLOC_*` variable) wins: then
//! nothing is changed.

/// The environment variable of glibc's tunables.
const TUNABLES: &str = "GLIBC_TUNABLES";
/// The prefix of glibc's allocator variables (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_MAX_`, ...).
const MALLOC_PREFIX: &str = "MALLOC_";

/// What [`keep_freed_memory`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocatorPolicy {
    /// glibc was set to keep freed memory for reuse.
    KeepFreed,
    /// The user's own setting (the variable named) was left in force.
    UserSetting(String),
    /// glibc refused the parameters named; the others were set.
    Refused(Vec<&'static str>),
    /// This C library has no such settings.
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
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
            AllocatorPolicy::Refused(parameters) => {
                write!(formatter, "glibc refused {}", parameters.join(", "))
            }
            #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
            AllocatorPolicy::Unavailable => {
                formatter.write_str("unchanged (this C library has no such settings)")
            }
        }
    }
}

/// Makes freed memory stay in the process for reuse (see the module documentation). Call it
/// first thing in `main`, before any thread exists: arenas are chosen per thread.
pub fn keep_freed_memory() -> AllocatorPolicy {
    // The first in name order, so the message does not depend on the environment's order.
    if let Some(variable) = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| is_glibc_setting(name))
        .min()
    {
        return AllocatorPolicy::UserSetting(variable);
    }
    set_glibc_policy()
}

/// hlat's glibc allocator parameters: `mallopt`'s name, glibc's environment variable for the
/// same parameter (what a child process such as a benchmark peer is given), and the value.
const PARAMETERS: [(&str, &str, i32); 3] = [
    ("M_ARENA_MAX", "MALLOC_ARENA_MAX", 1),
    ("M_MMAP_MAX", "MALLOC_MMAP_MAX_", 0),
    ("M_TRIM_THRESHOLD", "MALLOC_TRIM_THRESHOLD_", i32::MAX),
];

/// hlat's allocator settings as glibc's environment variables, for a child process to run on
/// the same terms (`MALLOC_ARENA_MAX=1`, ...).
pub fn glibc_environment() -> Vec<(&'static str, String)> {
    PARAMETERS
        .iter()
        .map(|&(_, variable, value)| (variable, value.to_string()))
        .collect()
}

/// Whether a variable is one of glibc's allocator settings (what a child process started on
/// glibc's defaults must not inherit).
pub fn is_glibc_setting(variable: &str) -> bool {
    variable == TUNABLES || variable.starts_with(MALLOC_PREFIX)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_glibc_policy() -> AllocatorPolicy {
    let options = [libc::M_ARENA_MAX, libc::M_MMAP_MAX, libc::M_TRIM_THRESHOLD];
    let refused: Vec<&'static str> = PARAMETERS
        .into_iter()
        .zip(options)
        // SAFETY: mallopt only changes glibc's allocator parameters; it is called before any
        // other thread exists, so no allocation runs concurrently.
        .filter(|&((_, _, value), option)| unsafe { libc::mallopt(option, value) } != 1)
        .map(|((name, _, _), _)| name)
        .collect();
    if refused.is_empty() {
        AllocatorPolicy::KeepFreed
    } else {
        AllocatorPolicy::Refused(refused)
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_glibc_policy() -> AllocatorPolicy {
    AllocatorPolicy::Unavailable
}
