//! Peers of `hlat bench train` in other frameworks: the same model and step in PyTorch
//! (`LlamaForCausalLM`, eager) and JAX (one `jit`), run by `scripts/bench_peer.py` (embedded in
//! this binary) when the Python packages are installed.

use std::process::Command;

use anyhow::{Context, bail};
use hlat::HlatConfig;
use serde::Deserialize;

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
}

/// Runs the peer script for `framework` with `python` and returns its result; a missing
/// framework is an error that says what to install.
pub fn run(python: &str, framework: Framework, step: &PeerStep<'_>) -> anyhow::Result<PeerResult> {
    let folder = tempfile::tempdir().context("creating a folder for the peer script")?;
    let script = folder.path().join("bench_peer.py");
    std::fs::write(&script, SCRIPT).context("writing the peer script")?;
    let config = folder.path().join("config.json");
    std::fs::write(&config, serde_json::to_vec(step.config)?).context("writing the config")?;
    let output = Command::new(python)
        .arg(&script)
        .args(["--framework", framework.name()])
        .arg("--config")
        .arg(&config)
        .args(["--batch", &step.batch.to_string()])
        .args(["--seq-len", &step.seq_len.to_string()])
        .args(["--warmup", &step.warmup.to_string()])
        .args(["--steps", &step.steps.to_string()])
        .args(["--precision", step.precision])
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
