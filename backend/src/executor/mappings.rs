//! How much of the kernel's limit on memory mappings this process uses (Linux): compiled XLA
//! CPU programs map a few regions per kernel, and a process past the limit aborts in LLVM.

use std::sync::OnceLock;

/// The share of the kernel's limit on memory mappings (`vm.max_map_count`) this process holds,
/// where both can be read (Linux); `None` elsewhere.
pub(crate) fn mapping_share() -> Option<f64> {
    let limit = max_mappings()?;
    let maps = std::fs::read("/proc/self/maps").ok()?;
    let held = maps.iter().filter(|&&byte| byte == b'\n').count();
    Some(held as f64 / limit as f64)
}

/// `vm.max_map_count`, read once.
fn max_mappings() -> Option<u64> {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()?
            .trim()
            .parse()
            .ok()
            .filter(|&limit| limit > 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_linux_process_holds_a_small_share_of_its_mappings() {
        let share = mapping_share().expect("Linux exposes both");
        // A test process holds some mappings (its binary, libraries, stacks), far from the limit.
        assert!(share > 0.0 && share < 0.5, "{share}");
    }
}
