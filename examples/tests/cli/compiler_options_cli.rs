//! `TRAINIUM_XLA_COMPILER_OPTIONS`: XLA compiler options for the `xla` executor's programs,
//! keyed into the persistent compile cache, and refused by name when the plugin does not know one.

use std::path::Path;

use burn_trainium::{COMPILER_OPTIONS_ENV, DEVICE_ENV, XLA_CACHE_ENV};

use super::{fixture, hlat, require_plugin};

/// Runs greedy generation on `xla:0` with `options` (or none), compiling into `cache`.
fn generate(options: Option<&str>, cache: &Path) -> std::process::Output {
    require_plugin();
    let model = fixture("hf-tiny-llama");
    let mut command = hlat();
    command
        .env(DEVICE_ENV, "xla:0")
        .env(XLA_CACHE_ENV, cache)
        .env_remove(COMPILER_OPTIONS_ENV);
    if let Some(options) = options {
        command.env(COMPILER_OPTIONS_ENV, options);
    }
    command
        .args(["generate", "--model", model.to_str().unwrap()])
        .args(["--prompt-ids", "1,2,3", "--format", "ids"])
        .args(["--max-new-tokens", "3"])
        .output()
        .expect("running hlat")
}

/// The programs in the persistent compile cache (one file each).
fn cached_programs(cache: &Path) -> usize {
    std::fs::read_dir(cache).map_or(0, |entries| entries.count())
}

#[test]
fn compiler_options_compile_programs_of_their_own_with_the_same_results() {
    let cache = tempfile::tempdir().unwrap();
    let plain = generate(None, cache.path());
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let programs = cached_programs(cache.path());
    assert!(
        programs > 0,
        "generation compiled no program into the cache"
    );
    // The tiny model's programs are programs of small tensors: without options of the user's
    // they compile with these, so asking for them compiles nothing new.
    let small_tensor_options = "xla_cpu_use_fusion_emitters=false,xla_backend_optimization_level=0";
    let same = generate(Some(small_tensor_options), cache.path());
    assert!(
        same.status.success(),
        "{}",
        String::from_utf8_lossy(&same.stderr)
    );
    assert_eq!(cached_programs(cache.path()), programs);

    let tuned = generate(Some("xla_cpu_use_fusion_emitters=false"), cache.path());
    assert!(
        tuned.status.success(),
        "{}",
        String::from_utf8_lossy(&tuned.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&tuned.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "compiler options must not change the greedy ids"
    );
    assert_eq!(
        cached_programs(cache.path()),
        2 * programs,
        "with compiler options every program is compiled anew, under a key of its own"
    );
}

#[test]
fn unknown_or_malformed_compiler_options_are_refused_by_name() {
    let cache = tempfile::tempdir().unwrap();
    // The plugin's own refusal, and this project's for a pair without a value.
    for (options, named) in [
        (
            "xla_no_such_option=true",
            "No such compile option: 'xla_no_such_option'",
        ),
        (
            "xla_cpu_use_fusion_emitters",
            "`xla_cpu_use_fusion_emitters` is not NAME=VALUE",
        ),
    ] {
        let output = generate(Some(options), cache.path());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{options}: {stderr}");
        assert!(
            stderr.contains(COMPILER_OPTIONS_ENV) && stderr.contains(named),
            "{options}: the message must name the variable and `{named}`:\n{stderr}"
        );
    }
}
