//! The persistent NEFF cache, driven by the stand-in compiler of `neuron_support` (a shell
//! script written by the tests that plays `neuronx-cc`; it is NOT the Neuron compiler).

use std::path::Path;
use std::process::Command;

use super::neuron_support::Workspace;
use burn_trainium::neuron::{CacheOutcome, NeffCache, NeuronCompiler, NeuronError, NeuronTarget};

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_miss_compiles_once_and_later_calls_hit() {
    let workspace = Workspace::new("hit-miss");
    let (compiler, cache) = (workspace.compiler(), workspace.cache());
    assert_eq!(compiler.version(), "0.0.0+stand-in");

    let first = cache.get_or_compile(&compiler, b"module-a").unwrap();
    assert!(
        matches!(first.outcome, CacheOutcome::Compiled { .. }),
        "{:?}",
        first.outcome
    );
    assert_eq!(first.neff, b"NEFF(module-a)");
    assert_eq!(
        workspace.last_arguments(),
        "--framework XLA --target trn1 --model-type transformer --output model.neff"
    );

    let second = cache.get_or_compile(&compiler, b"module-a").unwrap();
    assert_eq!(second.outcome, CacheOutcome::Hit);
    assert_eq!(second.neff, b"NEFF(module-a)");
    assert_eq!(second.key, first.key);
    // A new cache object on the same folder (another process) hits too.
    let reopened = workspace
        .cache()
        .get_or_compile(&compiler, b"module-a")
        .unwrap();
    assert_eq!(reopened.outcome, CacheOutcome::Hit);
    assert_eq!(workspace.invocations(), 1);

    let other = cache.get_or_compile(&compiler, b"module-b").unwrap();
    assert!(matches!(other.outcome, CacheOutcome::Compiled { .. }));
    assert_eq!(other.neff, b"NEFF(module-b)");
    assert_ne!(other.key, first.key);
    assert_eq!(workspace.invocations(), 2);

    // The entry holds the published files only: no temporary file, no work folder.
    let entry = cache.entry_dir(&first.key);
    assert!(entry.starts_with(workspace.cache_root().join("neuronxcc-0.0.0+stand-in")));
    assert_eq!(
        file_names(&entry),
        [
            "compile_flags.json",
            "model.hlo_module.pb",
            "model.lock",
            "model.log",
            "model.neff"
        ]
    );
    assert_eq!(
        std::fs::read(entry.join("model.hlo_module.pb")).unwrap(),
        b"module-a"
    );
    let flags: Vec<String> =
        serde_json::from_slice(&std::fs::read(entry.join("compile_flags.json")).unwrap()).unwrap();
    assert_eq!(
        flags,
        [
            "--framework",
            "XLA",
            "--target",
            "trn1",
            "--model-type",
            "transformer"
        ]
    );
    assert!(
        std::fs::read_to_string(entry.join("model.log"))
            .unwrap()
            .contains("compiled")
    );
}

#[test]
fn flags_and_target_are_part_of_the_key() {
    let workspace = Workspace::new("keying");
    let cache = workspace.cache();
    let base = workspace.compiler();
    let optimized = NeuronCompiler::new(
        workspace.compiler_path(),
        NeuronTarget::Trn1,
        vec!["-O1".into()],
    )
    .unwrap();
    let trn2 = NeuronCompiler::new(
        workspace.compiler_path(),
        NeuronTarget::Trn2,
        vec!["--model-type".into(), "transformer".into()],
    )
    .unwrap();

    let keys: Vec<_> = [&base, &optimized, &trn2]
        .into_iter()
        .map(|compiler| cache.get_or_compile(compiler, b"same-module").unwrap())
        .map(|cached| {
            assert!(matches!(cached.outcome, CacheOutcome::Compiled { .. }));
            cached.key
        })
        .collect();
    assert_eq!(workspace.invocations(), 3);
    assert_eq!(keys[0].module_hash, keys[1].module_hash);
    assert_eq!(keys[0].module_hash, keys[2].module_hash);
    assert_ne!(keys[0].flags_hash, keys[1].flags_hash);
    assert_ne!(keys[0].flags_hash, keys[2].flags_hash);
    assert!(workspace.last_arguments().contains("--target trn2"));
}

#[test]
fn a_failed_compile_is_remembered_with_its_log() {
    let workspace = Workspace::new("failure");
    let compiler = workspace.compiler();
    let module = b"module with a FAIL marker";

    let error = workspace
        .cache()
        .get_or_compile(&compiler, module)
        .unwrap_err();
    match &error {
        NeuronError::CompileFailed { log, command, .. } => {
            assert!(log.contains("unsupported operator"), "{log}");
            assert!(
                command.contains("--framework XLA --target trn1"),
                "{command}"
            );
        }
        other => panic!("expected CompileFailed, got {other}"),
    }
    assert_eq!(workspace.invocations(), 1);

    let remembered = workspace
        .cache()
        .get_or_compile(&compiler, module)
        .unwrap_err();
    match &remembered {
        NeuronError::RememberedFailure { entry, log } => {
            assert!(log.contains("unsupported operator"), "{log}");
            assert!(entry.join("model.failed.log").is_file());
            assert!(!entry.join("model.neff").exists());
        }
        other => panic!("expected RememberedFailure, got {other}"),
    }
    assert!(
        remembered
            .to_string()
            .contains("--retry_failed_compilation")
    );
    assert_eq!(
        workspace.invocations(),
        1,
        "a remembered failure must not run the compiler"
    );

    // Asked to retry, the cache runs the compiler again (and it fails again).
    let retried = NeffCache::new(workspace.cache_root(), true).get_or_compile(&compiler, module);
    assert!(matches!(retried, Err(NeuronError::CompileFailed { .. })));
    assert_eq!(workspace.invocations(), 2);
}

#[test]
fn two_threads_compile_the_same_module_once() {
    let workspace = Workspace::new("threads");
    let compiler = workspace.compiler();
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    workspace
                        .cache()
                        .get_or_compile(&compiler, b"shared-module")
                        .unwrap()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .collect()
    });
    assert_eq!(workspace.invocations(), 1);
    let compiled = results
        .iter()
        .filter(|cached| matches!(cached.outcome, CacheOutcome::Compiled { .. }))
        .count();
    assert_eq!(compiled, 1);
    assert!(
        results
            .iter()
            .all(|cached| cached.neff == b"NEFF(shared-module)")
    );
}

/// Environment of [`child_process_compile`]: the stand-in compiler and the cache root.
const CHILD_COMPILER_ENV: &str = "HLAT_TEST_NEFF_CHILD_COMPILER";
const CHILD_CACHE_ENV: &str = "HLAT_TEST_NEFF_CHILD_CACHE";

/// Not a test on its own: [`two_processes_compile_the_same_module_once`] runs this test binary
/// twice with the variables above, and this body compiles through the cache and prints what
/// happened. Without the variables it does nothing.
#[test]
fn child_process_compile() {
    let (Ok(compiler), Ok(cache)) = (
        std::env::var(CHILD_COMPILER_ENV),
        std::env::var(CHILD_CACHE_ENV),
    ) else {
        return;
    };
    let compiler = NeuronCompiler::new(compiler, NeuronTarget::Trn1, vec![]).unwrap();
    let cached = NeffCache::new(cache, false)
        .get_or_compile(&compiler, b"module-of-two-processes")
        .unwrap();
    let outcome = match cached.outcome {
        CacheOutcome::Hit => "hit",
        CacheOutcome::Compiled { .. } => "compiled",
    };
    println!(
        "outcome={outcome} neff={}",
        String::from_utf8_lossy(&cached.neff)
    );
}

#[test]
fn two_processes_compile_the_same_module_once() {
    let workspace = Workspace::new("processes");
    let executable = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&executable)
                .args([
                    "neuron_cache::child_process_compile",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_COMPILER_ENV, workspace.compiler_path())
                .env(CHILD_CACHE_ENV, workspace.cache_root())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<String> = children
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(
                output.status.success(),
                "child failed: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            );
            stdout
        })
        .collect();

    assert_eq!(workspace.invocations(), 1, "{outputs:?}");
    let count = |needle: &str| {
        outputs
            .iter()
            .filter(|output| output.contains(needle))
            .count()
    };
    assert_eq!(count("outcome=compiled"), 1, "{outputs:?}");
    assert_eq!(count("outcome=hit"), 1, "{outputs:?}");
    assert_eq!(
        count("neff=NEFF(module-of-two-processes)"),
        2,
        "{outputs:?}"
    );
}

#[test]
fn a_compiler_that_cannot_start_is_reported_and_not_remembered() {
    let workspace = Workspace::new("missing");
    let compiler = workspace.compiler();
    std::fs::remove_file(workspace.compiler_path()).unwrap();
    let error = workspace
        .cache()
        .get_or_compile(&compiler, b"module")
        .unwrap_err();
    assert!(
        matches!(error, NeuronError::CompilerUnavailable { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("stand-in-neuronx-cc"), "{error}");
    let entry = workspace
        .cache()
        .entry_dir(&burn_trainium::neuron::CacheKey::for_compiler(
            b"module", &compiler,
        ));
    assert!(!entry.join("model.failed.log").exists());
}
