//! `hlat compile`: fills the Neuron compile cache ahead of time, like `neuron_parallel_compile`.
//!
//! Two ways, both without a NeuronCore:
//! - with the flags of `hlat pretrain` (on `--device neuron[:N]`, else `TRAINIUM_DEVICE` when it
//!   names a `neuron` device, else `neuron:0`), the training run is traced in compile-only mode:
//!   every segment is lowered, checked by the Neuron lint and compiled into the cache, nothing
//!   runs and every tensor reads as zeros; with `--check-only` the modules are only checked by
//!   the lint, and no compiler is needed;
//! - with `--modules`, serialized HLO modules (e.g. the `*.hlo.pb` files of a
//!   `TRAINIUM_DUMP_DIR`) are compiled into the cache, several at a time.
//!
//! The compiler, flags, target and cache come from `NEURON_CC`, `NEURON_CC_FLAGS`,
//! `HLAT_NEURON_TARGET` and `NEURON_COMPILE_CACHE_URL`, as for the `neuron` executor, so the
//! later training run finds every program in the cache.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, bail};
use burn_trainium::hlo::HloModuleProto;
use burn_trainium::neuron::{
    CacheOutcome, NeffCache, NeuronCompiler, NeuronError, NeuronSettings, request_neff_names,
    set_check_only, set_compile_only,
};
use burn_trainium::{DEVICE_ENV, ExecutorKind, TrainiumDevice, stats};
use clap::Args;
use prost::Message;

use super::pretrain::{self, PretrainArgs};

/// Arguments of `hlat compile`.
#[derive(Args)]
pub struct CompileArgs {
    /// Serialized HLO modules to compile instead of tracing a training run: `.hlo.pb` files,
    /// or folders searched (not recursively) for them.
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub modules: Vec<PathBuf>,
    /// Only check every module against the Neuron compiler's documented operator rules (the
    /// lint), without compiling: no `neuronx-cc` is needed. A violation fails the run, naming
    /// the operator, the rule and the Burn operation it came from (whatever `HLAT_NEURON_LINT`
    /// says). Attention is checked in its portable lowering: the SDK's flash-kernel calls need
    /// the SDK's tracer.
    #[arg(long, conflicts_with = "modules")]
    pub check_only: bool,
    /// How many compiler processes run at once with `--modules` (each can use several GB).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub compile_jobs: usize,
    /// The training run to trace: the same flags as `hlat pretrain`.
    #[command(flatten)]
    pub pretrain: PretrainArgs,
}

/// Runs `hlat compile`.
pub fn run(args: CompileArgs) -> anyhow::Result<()> {
    if args.modules.is_empty() {
        trace_training(args.pretrain, args.check_only)
    } else {
        compile_modules(&args.modules, args.compile_jobs)
    }
}

/// Runs `hlat pretrain` with the `neuron` executor in compile-only (or check-only) mode.
fn trace_training(mut pretrain: PretrainArgs, check_only: bool) -> anyhow::Result<()> {
    let (device, source) = match &pretrain.train.device {
        Some(text) => (text.parse::<TrainiumDevice>()?, "--device"),
        None if std::env::var_os(DEVICE_ENV).is_some_and(|value| !value.is_empty()) => {
            (TrainiumDevice::from_env()?, DEVICE_ENV)
        }
        None => (TrainiumDevice::neuron(0), "the default"),
    };
    if device.executor != ExecutorKind::Neuron {
        bail!(
            "`hlat compile` traces the training run on a `neuron` device, but {source} selects \
             `{device}`: pass --device neuron (or pass --modules)"
        );
    }
    pretrain.train.device = Some(device.to_string());
    if check_only {
        set_check_only(true);
    } else {
        set_compile_only(true);
    }
    log::info!("tracing the training run on {device} in compile-only mode");
    // The run's device, replicated as the layout asks.
    let device = pretrain::run(pretrain)
        .context("tracing the training run")?
        .unwrap_or(device);
    let stats = stats(&device);
    if check_only {
        println!(
            "{} programs checked: every one within the Neuron compiler's documented operator rules",
            stats.compiles
        );
        return Ok(());
    }
    let settings = NeuronSettings::from_env()?;
    println!(
        "{} programs compiled in {:.1} s, {} found in the cache {}",
        stats.compiles,
        stats.compile_seconds,
        stats.cache_hits,
        settings.cache_root.display()
    );
    Ok(())
}

/// The `.hlo.pb` files named by `paths` (files as given, folders searched one level).
fn module_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("reading {}", path.display()))?
                .map(|entry| entry.map(|entry| entry.path()))
                .collect::<Result<_, _>>()
                .with_context(|| format!("reading {}", path.display()))?;
            found.retain(|file| file.to_string_lossy().ends_with(".hlo.pb"));
            if found.is_empty() {
                bail!("{} holds no `.hlo.pb` file", path.display());
            }
            found.sort();
            files.extend(found);
        } else if path.is_file() {
            files.push(path.clone());
        } else {
            bail!("{} does not exist", path.display());
        }
    }
    Ok(files)
}

/// Compiles every module of `paths` into the cache with `jobs` compiles at a time.
fn compile_modules(paths: &[PathBuf], jobs: usize) -> anyhow::Result<()> {
    let files = module_files(paths)?;
    let settings = NeuronSettings::from_env()?;
    let compiler = NeuronCompiler::from_settings(&settings)?;
    let cache = NeffCache::from_settings(&settings);
    println!(
        "compiling {} modules with {} (neuronx-cc {}, target {}) into {}",
        files.len(),
        settings.compiler.display(),
        compiler.version(),
        compiler.target(),
        cache.root().display()
    );
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let compiled = AtomicUsize::new(0);
    let compile_one = |file: &Path| -> Result<CacheOutcome, NeuronError> {
        let module = std::fs::read(file).map_err(|source| NeuronError::Io {
            action: "read",
            path: file.to_path_buf(),
            source,
        })?;
        // The executor compiles modules with the NEFF tensor names requested: so must this.
        let invalid = |reason: String| NeuronError::InvalidSetting {
            name: "--modules",
            value: file.display().to_string(),
            reason,
        };
        let mut module = HloModuleProto::decode(module.as_slice())
            .map_err(|error| invalid(format!("not an HLO module: {error}")))?;
        request_neff_names(&mut module).map_err(invalid)?;
        cache
            .get_or_compile(&compiler.for_module(&module), &module.encode_to_vec())
            .map(|cached| cached.outcome)
    };
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, files.len()) {
            scope.spawn(|| {
                while let Some(file) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                    match compile_one(file) {
                        Ok(CacheOutcome::Hit) => println!("{}: in the cache", file.display()),
                        Ok(CacheOutcome::Compiled { seconds }) => {
                            compiled.fetch_add(1, Ordering::Relaxed);
                            println!("{}: compiled in {seconds:.1} s", file.display());
                        }
                        Err(error) => {
                            eprintln!("{}: {error}", file.display());
                            let mut failures = failures.lock().unwrap_or_else(|p| p.into_inner());
                            failures.push(file.display().to_string());
                        }
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    let compiled = compiled.into_inner();
    println!(
        "{compiled} compiled, {} already in the cache, {} failed",
        files.len() - compiled - failures.len(),
        failures.len()
    );
    if !failures.is_empty() {
        bail!(
            "{} modules failed to compile: {}",
            failures.len(),
            failures.join(", ")
        );
    }
    Ok(())
}
