//! The runtime version reported by `nrt_get_version`.

use std::fmt;

/// The runtime version reported by `nrt_get_version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// Major, minor, patch and maintenance numbers.
    pub numbers: [u64; 4],
    /// The free-form detail string.
    pub detail: String,
    /// The git hash the runtime was built from.
    pub git_hash: String,
}

impl fmt::Display for RuntimeVersion {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [major, minor, patch, maintenance] = self.numbers;
        write!(formatter, "{major}.{minor}.{patch}.{maintenance}")
    }
}
