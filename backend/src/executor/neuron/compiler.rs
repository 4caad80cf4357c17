use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::kernels::{KernelTracer, with_kernels};
use super::precision::flags_for_module;
use super::{NeuronError, NeuronSettings, NeuronTarget};
use crate::hlo::HloModuleProto;

/// The file name of the HLO module handed to the compiler, as in Neuron's own cache.
pub const MODULE_FILE: &str = "model.hlo_module.pb";
/// The file name of the compiled NEFF.
pub const NEFF_FILE: &str = "model.neff";

/// Drives `neuronx-cc compile --framework XLA` on serialized HLO modules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeuronCompiler {
    executable: PathBuf,
    target: NeuronTarget,
    flags: Vec<String>,
    version: String,
    kernels: Option<KernelTracer>,
}

/// A successful compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledNeff {
    /// The NEFF bytes.
    pub neff: Vec<u8>,
    /// What the compiler printed.
    pub log: String,
}

/// What a command printed: its standard output, then its standard error.
pub(super) fn printed(output: &Output) -> String {
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !stderr.trim().is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&stderr);
    }
    text
}

/// The version in `neuronx-cc --version` output: the last word of the first line that mentions a
/// version (`NeuronX Compiler version 2.16.345.0+69131dd3`), restricted to characters that are
/// safe in a folder name.
fn parse_version(output: &str) -> Option<String> {
    let line = output
        .lines()
        .find(|line| line.to_ascii_lowercase().contains("version"))?;
    let word = line.split_whitespace().last()?;
    let version: String = word
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_'))
        .collect();
    (!version.is_empty() && !version.eq_ignore_ascii_case("version")).then_some(version)
}

/// A relative path with a folder (`bin/neuronx-cc`) made absolute, since compiles run in a work
/// folder; a bare name (`neuronx-cc`) stays as is, for a search of `PATH`.
fn resolve_executable(executable: PathBuf) -> Result<PathBuf, NeuronError> {
    if executable.is_absolute() || executable.components().count() < 2 {
        return Ok(executable);
    }
    std::path::absolute(&executable).map_err(NeuronError::io("resolve", executable))
}

impl NeuronCompiler {
    /// A driver for `executable`; runs `executable --version` once, since the version is part of
    /// every cache key.
    pub fn new(
        executable: impl Into<PathBuf>,
        target: NeuronTarget,
        flags: Vec<String>,
    ) -> Result<Self, NeuronError> {
        let executable = resolve_executable(executable.into())?;
        let output = run(Command::new(&executable).arg("--version")).map_err(|error| {
            NeuronError::CompilerUnavailable {
                executable: executable.clone(),
                reason: error.to_string(),
            }
        })?;
        let text = printed(&output);
        let version = parse_version(&text)
            .filter(|_| output.status.success())
            .ok_or_else(|| NeuronError::CompilerVersion {
                executable: executable.clone(),
                output: format!("{} ({})", text.trim(), output.status),
            })?;
        log::info!(
            "Neuron compiler {} version {version}, target {target}",
            executable.display()
        );
        Ok(Self {
            executable,
            target,
            flags,
            version,
            kernels: None,
        })
    }

    /// A driver that never runs a compiler, for check-only mode ([`super::check_only`]): its
    /// version is `none`, and no module is compiled with it.
    pub fn absent(target: NeuronTarget) -> Self {
        Self {
            executable: PathBuf::from("(no compiler: check-only mode)"),
            target,
            flags: Vec::new(),
            version: "none".into(),
            kernels: None,
        }
    }

    /// The driver configured by `settings`.
    pub fn from_settings(settings: &NeuronSettings) -> Result<Self, NeuronError> {
        Self::new(
            &settings.compiler,
            settings.target,
            settings.compiler_flags.clone(),
        )
    }

    /// The driver for compiling `module`: the configured flags plus those its precision needs
    /// (`--auto-cast none` for f32 matrix multiplications, see `precision.rs`).
    pub fn for_module(&self, module: &HloModuleProto) -> Self {
        Self {
            flags: flags_for_module(&self.flags, module),
            ..self.clone()
        }
    }

    /// The driver with `tracer` turning kernel requests into the SDK's calls before each compile
    /// (see `kernels.rs`); without one, a module holding a request fails to compile.
    pub fn with_kernel_tracer(self, tracer: Option<KernelTracer>) -> Self {
        Self {
            kernels: tracer,
            ..self
        }
    }

    /// The kernel tracer, if the driver has one.
    pub fn kernel_tracer(&self) -> Option<&KernelTracer> {
        self.kernels.as_ref()
    }

    /// The compiler's version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The compile target.
    pub fn target(&self) -> NeuronTarget {
        self.target
    }

    /// Every flag of a compile, in command line order: `--framework XLA --target T` then the
    /// configured flags. With the module and the version, they determine the NEFF.
    pub fn flags(&self) -> Vec<String> {
        let mut flags = vec![
            "--framework".to_string(),
            "XLA".to_string(),
            "--target".to_string(),
            self.target.name().to_string(),
        ];
        flags.extend(self.flags.iter().cloned());
        flags
    }

    /// Compiles `module` (a serialized `HloModuleProto`) in `work_dir`, which is created if needed
    /// and holds the module, the NEFF and the compiler's own log files afterwards. Kernel requests
    /// in the module are first replaced by the SDK's calls (see [`Self::with_kernel_tracer`]).
    ///
    /// Runs `neuronx-cc compile model.hlo_module.pb --framework XLA --target T FLAGS --output
    /// model.neff` with `work_dir` as the working folder. On failure the error carries the
    /// command line and everything the compiler printed.
    pub fn compile(&self, module: &[u8], work_dir: &Path) -> Result<CompiledNeff, NeuronError> {
        // The work folder first: the cache removes it after a failure, the tracer's included.
        std::fs::create_dir_all(work_dir).map_err(NeuronError::io("create", work_dir))?;
        let module = with_kernels(module, self.kernels.as_ref())?;
        let module_path = work_dir.join(MODULE_FILE);
        std::fs::write(&module_path, &module).map_err(NeuronError::io("write", &module_path))?;
        let neff_path = work_dir.join(NEFF_FILE);
        let mut command = Command::new(&self.executable);
        command
            .current_dir(work_dir)
            .arg("compile")
            .arg(MODULE_FILE)
            .args(self.flags())
            .arg("--output")
            .arg(NEFF_FILE);
        let shown = format!(
            "{} compile {MODULE_FILE} {} --output {NEFF_FILE}",
            self.executable.display(),
            self.flags().join(" ")
        );
        log::info!(
            "compiling {} ({} bytes): {shown}",
            module_path.display(),
            module.len()
        );
        let output = run(&mut command).map_err(|error| NeuronError::CompilerUnavailable {
            executable: self.executable.clone(),
            reason: error.to_string(),
        })?;
        let log = printed(&output);
        if !output.status.success() {
            return Err(NeuronError::CompileFailed {
                status: output.status.to_string(),
                module: module_path,
                command: shown,
                log,
            });
        }
        match std::fs::read(&neff_path) {
            Ok(neff) => Ok(CompiledNeff { neff, log }),
            Err(error) => Err(NeuronError::CompileFailed {
                status: format!(
                    "{} but {} could not be read: {error}",
                    output.status,
                    neff_path.display()
                ),
                module: module_path,
                command: shown,
                log,
            }),
        }
    }
}

/// Runs `command` to completion. A start that fails with "text file busy" (the executable was
/// just written, and another thread of this process forked while the file was open) is retried
/// a few times: the condition lasts only until that fork's child runs its own program.
fn run(command: &mut Command) -> std::io::Result<std::process::Output> {
    let mut attempts = 0;
    loop {
        match command.output() {
            Err(error)
                if error.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 20 =>
            {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_the_version_line() {
        let output = "NeuronX Compiler version 2.16.345.0+69131dd3\n\nPython version 3.10.12\n";
        assert_eq!(
            parse_version(output).as_deref(),
            Some("2.16.345.0+69131dd3")
        );
        assert_eq!(parse_version("neuronx-cc: version\n"), None);
        assert_eq!(parse_version("usage: neuronx-cc\n"), None);
    }

    #[test]
    fn relative_compiler_paths_survive_the_work_folder() {
        let bare = resolve_executable(PathBuf::from("neuronx-cc")).unwrap();
        assert_eq!(bare, PathBuf::from("neuronx-cc"));
        let relative = resolve_executable(PathBuf::from("bin/neuronx-cc")).unwrap();
        assert_eq!(
            relative,
            std::env::current_dir().unwrap().join("bin/neuronx-cc")
        );
        let absolute = resolve_executable(PathBuf::from("/opt/cc")).unwrap();
        assert_eq!(absolute, PathBuf::from("/opt/cc"));
    }

    #[test]
    fn a_missing_compiler_is_named() {
        let error =
            NeuronCompiler::new("/nonexistent/neuronx-cc", NeuronTarget::Trn1, vec![]).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("/nonexistent/neuronx-cc") && message.contains("NEURON_CC"),
            "{message}"
        );
    }
}
