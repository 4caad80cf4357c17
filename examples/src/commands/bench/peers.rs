//! Peers in other frameworks, run by `scripts/bench_peer.py` (embedded in this binary) when the
//! Python packages are installed: for `hlat bench train` the same model and step in PyTorch
//! (`LlamaForCausalLM`, eager) and JAX (one `jit`); for `hlat bench generate` Hugging Face
//! `generate` on the same model shape; for `hlat bench cnn` the same small CNN in PyTorch eager.

use std::process::Command;

use anyhow::{Context, bail};
use hlat::HlatConfig;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// The peer script, as shipped in the repository.
const SCRIPT: &str = include_str!("../../../../scripts/bench_peer.py");

/// The exit status of the script when its framework is not installed.
const MISSING_FRAMEWORK: i32 = 3;

/// A framework the peer script can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    /// PyTorch with Hugging Face transformers.
    PyTorch,
    /// JAX.
    Jax,
}

impl Framework {
    /// The name on the script's command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Framework::PyTorch => "pytorch",
            Framework::Jax => "jax",
        }
    }
}

/// The allocator settings a peer runs with: hlat's by default, so that a comparison measures the
/// compilers rather than glibc's defaults (see `crate::allocator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PeerAllocator {
    /// hlat's own: one arena, no mmap, no trim (`MALLOC_ARENA_MAX=1`, ...).
    Hlat,
    /// glibc's defaults (any `MALLOC_*` or `GLIBC_TUNABLES` of this process removed).
    Default,
}

impl PeerAllocator {
    /// Sets `command`'s environment for these settings.
    fn apply(self, command: &mut Command) {
        match self {
            PeerAllocator::Hlat => {
                command.envs(crate::allocator::glibc_environment());
            }
            PeerAllocator::Default => {
                for (variable, _) in std::env::vars_os() {
                    if variable
                        .to_str()
                        .is_some_and(crate::allocator::is_glibc_setting)
                    {
                        command.env_remove(variable);
                    }
                }
            }
        }
    }

    /// The settings, as the benchmark's "what ran" list says them.
    pub fn describe(self) -> String {
        match self {
            PeerAllocator::Hlat => {
                let variables: Vec<String> = crate::allocator::glibc_environment()
                    .into_iter()
                    .map(|(variable, value)| format!("{variable}={value}"))
                    .collect();
                format!("hlat's ({})", variables.join(" "))
            }
            PeerAllocator::Default => "glibc's defaults".to_string(),
        }
    }

    /// How a table row names the peer: the framework alone on hlat's terms, with the allocator
    /// otherwise.
    pub fn row_name(self, framework: Framework) -> String {
        match self {
            PeerAllocator::Hlat => framework.name().to_string(),
            PeerAllocator::Default => format!("{} (glibc default allocator)", framework.name()),
        }
    }
}

/// What the script prints.
#[derive(Debug, Clone, Deserialize)]
pub struct PeerResult {
    /// Median seconds per step.
    pub median_step_seconds: f64,
    /// Compiles (JAX: the one `jit` compile, before the warmup).
    pub compiles: u64,
    /// Seconds spent compiling.
    pub compile_seconds: f64,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: u64,
    /// Resident memory before the first step (the model and the batch; JAX's optimizer state
    /// too), bytes.
    #[serde(default)]
    pub resident_at_start_bytes: u64,
    /// The loss of the last step.
    pub final_loss: f64,
    /// Framework versions.
    pub version: String,
}

/// The shape of the step a peer runs.
pub struct PeerStep<'a> {
    /// The model.
    pub config: &'a HlatConfig,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Untimed steps.
    pub warmup: usize,
    /// Timed steps.
    pub steps: usize,
    /// `f32` or `bf16-mixed`.
    pub precision: &'a str,
    /// The allocator settings it runs with.
    pub allocator: PeerAllocator,
    /// The device PyTorch trains on (`cpu` or `cuda`).
    pub device: &'a str,
    /// Whether PyTorch's model is wrapped in `torch.compile`.
    pub compiled: bool,
}

/// Runs the peer script for `framework` with `python` and returns its result; a missing
/// framework is an error that says what to install.
pub fn run(python: &str, framework: Framework, step: &PeerStep<'_>) -> anyhow::Result<PeerResult> {
    let mut arguments = vec![
        ("--batch", step.batch.to_string()),
        ("--seq-len", step.seq_len.to_string()),
        ("--warmup", step.warmup.to_string()),
        ("--steps", step.steps.to_string()),
        ("--precision", step.precision.to_string()),
    ];
    if framework == Framework::PyTorch {
        arguments.push(("--device", step.device.to_string()));
        if step.compiled {
            arguments.push(("--compile", "1".to_string()));
        }
    }
    run_script(
        python,
        framework,
        Some(step.config),
        &arguments,
        step.allocator,
    )
}

/// The greedy generation the transformers row of `hlat bench generate` runs.
pub struct GenerationRun<'a> {
    /// The model.
    pub config: &'a HlatConfig,
    /// Prompt tokens (the script makes the same prompt as the Rust backends).
    pub prompt_len: usize,
    /// New tokens per run.
    pub new_tokens: usize,
    /// Untimed runs.
    pub warmup: usize,
    /// Timed runs.
    pub runs: usize,
}

/// What the script prints for a generation.
#[derive(Debug, Clone, Deserialize)]
pub struct GenerationResult {
    /// Median seconds to the first new token's logits.
    pub prefill_seconds: f64,
    /// Median seconds per new token after the first.
    pub decode_seconds_per_token: f64,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: u64,
    /// Framework versions.
    pub version: String,
}

/// Times Hugging Face `generate` (greedy, KV cache) with the peer script.
pub fn run_generation(python: &str, run: &GenerationRun<'_>) -> anyhow::Result<GenerationResult> {
    let arguments = [
        ("--task", "generate".to_string()),
        ("--batch", "1".to_string()),
        ("--seq-len", run.prompt_len.to_string()),
        ("--new-tokens", run.new_tokens.to_string()),
        ("--warmup", run.warmup.to_string()),
        ("--steps", run.runs.to_string()),
        ("--precision", "f32".to_string()),
    ];
    run_script(
        python,
        Framework::PyTorch,
        Some(run.config),
        &arguments,
        PeerAllocator::Hlat,
    )
}

/// The CNN training the PyTorch row of `hlat bench cnn` runs.
pub struct CnnStep {
    /// Images per step.
    pub batch: usize,
    /// The seed of the generated images (`hlat::vision::generated_batch`).
    pub seed: u64,
    /// Untimed steps after the first.
    pub warmup: usize,
    /// Timed steps.
    pub steps: usize,
    /// Adam's learning rate.
    pub learning_rate: f64,
}

/// What the script prints for the CNN.
#[derive(Debug, Clone, Deserialize)]
pub struct CnnResult {
    /// Seconds of the first step.
    pub first_step_seconds: f64,
    /// Median seconds per timed step.
    pub median_step_seconds: f64,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: u64,
    /// The loss of the last step.
    pub final_loss: f64,
    /// Framework versions.
    pub version: String,
}

/// Times the CNN's training step in PyTorch eager with the peer script.
pub fn run_cnn(python: &str, step: &CnnStep) -> anyhow::Result<CnnResult> {
    let arguments = [
        ("--task", "cnn".to_string()),
        ("--batch", step.batch.to_string()),
        ("--seed", step.seed.to_string()),
        ("--warmup", step.warmup.to_string()),
        ("--steps", step.steps.to_string()),
        ("--lr", step.learning_rate.to_string()),
        ("--precision", "f32".to_string()),
    ];
    run_script(
        python,
        Framework::PyTorch,
        None,
        &arguments,
        PeerAllocator::Hlat,
    )
}

/// Runs the peer script for `framework` (on `config`, for the language-model tasks) with
/// `arguments` and parses the JSON line it prints; a missing framework is an error that says
/// what to install.
fn run_script<T: DeserializeOwned>(
    python: &str,
    framework: Framework,
    config: Option<&HlatConfig>,
    arguments: &[(&str, String)],
    allocator: PeerAllocator,
) -> anyhow::Result<T> {
    let folder = tempfile::tempdir().context("creating a folder for the peer script")?;
    let script = folder.path().join("bench_peer.py");
    std::fs::write(&script, SCRIPT).context("writing the peer script")?;
    let mut command = Command::new(python);
    allocator.apply(&mut command);
    command.arg(&script).args(["--framework", framework.name()]);
    if let Some(config) = config {
        let config_path = folder.path().join("config.json");
        std::fs::write(&config_path, serde_json::to_vec(config)?).context("writing the config")?;
        command.arg("--config").arg(&config_path);
    }
    for (flag, value) in arguments {
        command.args([*flag, value.as_str()]);
    }
    let output = command
        .output()
        .with_context(|| format!("starting `{python}` for the {} peer", framework.name()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(MISSING_FRAMEWORK) {
        bail!("not installed: {}", stderr.trim());
    }
    if !output.status.success() {
        bail!(
            "the {} peer failed ({}): {}",
            framework.name(),
            output.status,
            stderr.trim()
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .last()
        .with_context(|| format!("the {} peer printed no result", framework.name()))?;
    serde_json::from_str(line)
        .with_context(|| format!("parsing the {} peer's result `{line}`", framework.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On hlat's terms a peer gets hlat's allocator settings as glibc's variables; the rows say
    /// which terms they ran on.
    #[test]
    fn peers_run_on_hlats_allocator_terms_unless_asked_otherwise() {
        let mut command = Command::new("true");
        PeerAllocator::Hlat.apply(&mut command);
        let set: Vec<(String, String)> = command
            .get_envs()
            .filter_map(|(name, value)| {
                Some((name.to_str()?.to_string(), value?.to_str()?.to_string()))
            })
            .collect();
        for expected in [
            ("MALLOC_ARENA_MAX", "1"),
            ("MALLOC_MMAP_MAX_", "0"),
            ("MALLOC_TRIM_THRESHOLD_", "2147483647"),
        ] {
            assert!(
                set.iter()
                    .any(|(name, value)| (name.as_str(), value.as_str()) == expected),
                "{set:?}"
            );
        }
        assert_eq!(PeerAllocator::Hlat.row_name(Framework::PyTorch), "pytorch");
        assert_eq!(
            PeerAllocator::Default.row_name(Framework::Jax),
            "jax (glibc default allocator)"
        );
        assert!(
            PeerAllocator::Hlat
                .describe()
                .contains("MALLOC_ARENA_MAX=1")
        );
    }
}
