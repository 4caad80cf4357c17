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
//! The trace writes nothing but the compile cache: its checkpoints and metrics (of tensors that
//! read as zeros) go to a scratch folder removed afterwards, never into a run folder, and it
//! prints the programs it traced, compiled, found in the cache and checked, never a loss. `--out
//! DIR` also writes that report into DIR (a folder of `hlat compile`'s own).
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
    CacheOutcome, LintMode, NeffCache, NeuronCompiler, NeuronError, NeuronSettings,
    request_neff_names, set_check_only, set_compile_only,
};
use burn_trainium::{DEVICE_ENV, ExecutorKind, TrainiumDevice, stats};
use clap::Args;
use hlat::checkpoint::run_folder::rank_output;
use prost::Message;
use serde::Serialize;

use super::pretrain::{self, Job, RunArgs};

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
    /// Also write the report (`compile-report.json`: programs traced, compiled, found in the
    /// cache, checked by the lint) into DIR. A training run's folder or another command's is
    /// refused: the trace itself writes nothing but the compile cache (its checkpoints go to a
    /// scratch folder inside DIR, else in TMPDIR, removed afterwards).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The training run to trace: the flags of `hlat pretrain` but `--out`.
    #[command(flatten)]
    pub run: RunArgs,
}

/// The file of [`CompileArgs::out`] that holds the report.
pub const REPORT_FILE: &str = "compile-report.json";

/// What `hlat compile` did, as printed and written to [`REPORT_FILE`].
#[derive(Debug, Default, Serialize)]
struct CompileReport {
    /// `trace` (a training run traced), `check-only` (traced, the lint alone) or `modules`.
    mode: &'static str,
    /// The device traced on (trace modes).
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<String>,
    /// Optimizer steps traced (trace modes).
    #[serde(skip_serializing_if = "Option::is_none")]
    steps: Option<u64>,
    /// Segments the trace handed to the executor (trace modes), most of them repeats.
    #[serde(skip_serializing_if = "Option::is_none")]
    segments: Option<u64>,
    /// Distinct programs: compiled, found in the cache, or (check-only) checked.
    programs: u64,
    /// Programs `neuronx-cc` compiled.
    compiled: u64,
    /// Seconds spent compiling.
    compile_seconds: f64,
    /// Programs found compiled in the NEFF cache.
    found_in_cache: u64,
    /// Programs the Neuron lint checked (every program unless `HLAT_NEURON_LINT=off`).
    checked_by_lint: u64,
    /// Modules that failed to compile (`modules`).
    failed: Vec<String>,
    /// The NEFF cache (not in check-only mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    cache: Option<PathBuf>,
}

impl CompileReport {
    /// Prints the report and writes it into `out`, when given.
    fn publish(&self, out: Option<&Path>) -> anyhow::Result<()> {
        if let (Some(device), Some(steps), Some(segments)) =
            (&self.device, self.steps, self.segments)
        {
            println!(
                "traced {steps} training steps on {device}: {segments} segments, {} distinct \
                 programs (no step ran: no loss was computed)",
                self.programs
            );
        }
        if self.mode == "check-only" {
            println!(
                "{} programs checked: every one within the Neuron compiler's documented \
                 operator rules",
                self.checked_by_lint
            );
        } else {
            println!(
                "{} programs compiled in {:.1} s, {} found in the cache {}; {} checked by the \
                 Neuron lint{}",
                self.compiled,
                self.compile_seconds,
                self.found_in_cache,
                self.cache.as_deref().unwrap_or(Path::new("")).display(),
                self.checked_by_lint,
                if self.failed.is_empty() {
                    String::new()
                } else {
                    format!("; {} failed", self.failed.len())
                }
            );
        }
        if let Some(out) = out {
            std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
            let path = out.join(REPORT_FILE);
            let bytes = serde_json::to_vec_pretty(self).expect("the report serializes");
            burn_trainium::write_atomically(&path, &bytes)
                .with_context(|| format!("writing {}", path.display()))?;
            println!("report: {}", path.display());
        }
        Ok(())
    }
}

/// Runs `hlat compile`.
pub fn run(args: CompileArgs) -> anyhow::Result<()> {
    let job = Job::from_env()?;
    // Each process of a job reports its own programs: rank R into `OUT/ranks/rank-RR`.
    let report_dir = args.out.as_deref().map(|out| rank_output(out, job.rank()));
    if let Some(out) = &args.out {
        super::output_folder::check(out, "compile", None, "--out")?;
        std::fs::create_dir_all(out).with_context(|| format!("--out {}", out.display()))?;
    }
    let report = if args.modules.is_empty() {
        trace_training(args.run, &job, args.check_only, args.out.as_deref())?
    } else {
        compile_modules(&args.modules, args.compile_jobs)?
    };
    if let Some(out) = &args.out {
        super::output_folder::record(out, "compile", None, "--out")?;
    }
    report.publish(report_dir.as_deref())?;
    if !report.failed.is_empty() {
        bail!(
            "{} modules failed to compile: {}",
            report.failed.len(),
            report.failed.join(", ")
        );
    }
    Ok(())
}

/// Traces the training run of `run` with the `neuron` executor in compile-only (or check-only)
/// mode, into a scratch folder removed afterwards: inside `out` when given (the trace's
/// checkpoints are full-size files of zeros, tens of GB for a 7B model, so they go where the user
/// put the report rather than into a small temporary filesystem), else in `TMPDIR`.
fn trace_training(
    mut run: RunArgs,
    job: &Job,
    check_only: bool,
    out: Option<&Path>,
) -> anyhow::Result<CompileReport> {
    let (device, source) = match &run.train.device {
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
    run.train.device = Some(device.to_string());
    let settings = NeuronSettings::from_env()?;
    if check_only {
        set_check_only(true);
    } else {
        set_compile_only(true);
    }
    // The trace's checkpoints and metrics (of tensors that read as zeros) are no one's run.
    let mut scratch = tempfile::Builder::new();
    scratch.prefix(".hlat-compile-scratch-");
    let scratch = match out {
        Some(out) => scratch.tempdir_in(out),
        None => scratch.tempdir(),
    }
    .context("creating the trace's scratch folder")?;
    let mut options = run.options(job, Some(scratch.path().to_path_buf()))?;
    options.config.progress = false;
    log::info!(
        "tracing the training run on {device} in compile-only mode (scratch folder {})",
        scratch.path().display()
    );
    let (summary, trained_on) =
        pretrain::train(&run.train, job, options).context("tracing the training run")?;
    burn_trainium::distributed::leave();
    // The run's device, replicated as the layout asks.
    let stats = stats(&trained_on.unwrap_or(device));
    let programs = stats.compiles + stats.programs_loaded;
    let linted = check_only || settings.lint != LintMode::Off;
    Ok(CompileReport {
        mode: if check_only { "check-only" } else { "trace" },
        device: Some(trained_on.unwrap_or(device).to_string()),
        steps: Some(summary.end_step - summary.start_step),
        segments: Some(stats.segments_run),
        programs,
        compiled: if check_only { 0 } else { stats.compiles },
        compile_seconds: stats.compile_seconds,
        found_in_cache: stats.programs_loaded,
        checked_by_lint: if linted { programs } else { 0 },
        failed: Vec::new(),
        cache: (!check_only).then_some(settings.cache_root),
    })
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
fn compile_modules(paths: &[PathBuf], jobs: usize) -> anyhow::Result<CompileReport> {
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
    let compile_seconds = Mutex::new(0.0);
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
                            *compile_seconds.lock().unwrap_or_else(|p| p.into_inner()) += seconds;
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
    Ok(CompileReport {
        mode: "modules",
        programs: files.len() as u64,
        compiled: compiled as u64,
        compile_seconds: compile_seconds
            .into_inner()
            .unwrap_or_else(|p| p.into_inner()),
        found_in_cache: (files.len() - compiled - failures.len()) as u64,
        // `NeffCache::get_or_compile` compiles without the executor's lint.
        checked_by_lint: 0,
        failed: failures,
        cache: Some(cache.root().to_path_buf()),
        ..CompileReport::default()
    })
}
