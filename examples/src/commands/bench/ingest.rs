//! `hlat bench ingest`: `hlat data ingest` against Hugging Face `tokenizers`' `encode_batch` on
//! the same documents, side by side in one run, and the memory bound of ingest.
//!
//! Every row runs in its own child process, its wall time and peak resident memory (`wait4`'s
//! `ru_maxrss`) measured from here: `hlat data ingest` on the inputs (1×), the peer
//! `scripts/bench_ingest_peer.py` (embedded in this binary) on the same inputs with
//! `--with-hf`, and `hlat data ingest` on the inputs listed `--scale` times (the same documents
//! again: no deduplication), whose peak memory should stay within 1.2× of the 1× run. Both
//! count the tokens of every document plus one EOS; the table says whether they agree. Each row
//! also shows the CPU time its process used (user and system, all threads): on a shared machine
//! the wall time of a process that keeps every core busy grows with the others' load, its CPU
//! time much less.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use serde::Deserialize;

/// The peer script, as shipped in the repository.
const PEER: &str = include_str!("../../../../scripts/bench_ingest_peer.py");
/// The peer's exit status when `tokenizers` is not installed.
const MISSING_PEER: i32 = 3;

/// Arguments of `hlat bench ingest`.
#[derive(Args)]
pub struct IngestBenchArgs {
    /// Input files (any format `hlat data ingest` reads; the peer reads JSONL, plain or
    /// compressed, Parquet and text files).
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    /// A Hugging Face tokenizer.json with an EOS token.
    #[arg(long)]
    tokenizer: PathBuf,
    /// The field holding the text in JSONL and Parquet inputs.
    #[arg(long, default_value = "text")]
    text_field: String,
    /// Also ingest the inputs listed this many times, for the memory bound (0 or 1: skip).
    #[arg(long, default_value_t = 4)]
    scale: usize,
    /// Run the Hugging Face `tokenizers` peer.
    #[arg(long)]
    with_hf: bool,
    /// The Python interpreter of the peer.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Threads for both (default: all cores).
    #[arg(long, value_parser = super::super::ranges::at_least_one::<usize>())]
    threads: Option<usize>,
    /// Write the rows as JSON to this file, replaced as `hlat bench train --json` is.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One measured row.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    name: String,
    seconds: f64,
    cpu_seconds: f64,
    documents: u64,
    tokens: u64,
    text_bytes: u64,
    peak_rss_bytes: u64,
    version: String,
}

#[derive(Deserialize)]
struct PeerOutput {
    documents: u64,
    tokens: u64,
    text_bytes: u64,
    version: String,
}

/// What [`measure`] found of a process.
struct Measured {
    seconds: f64,
    /// User and system CPU time, all threads.
    cpu_seconds: f64,
    peak_rss_bytes: u64,
    stdout: String,
    code: i32,
}

/// Runs `command` to its end; returns its wall and CPU seconds, peak resident bytes, standard
/// output and exit status.
fn measure(mut command: Command) -> anyhow::Result<Measured> {
    let start = Instant::now();
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting a measured process")?;
    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout)?;
    let mut status = 0;
    // SAFETY: `rusage` is plain data; wait4 writes it for the child this process started.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if waited != pid {
        bail!(
            "waiting for process {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
    let seconds = start.elapsed().as_secs_f64();
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    let time = |value: libc::timeval| value.tv_sec as f64 + value.tv_usec as f64 * 1e-6;
    Ok(Measured {
        seconds,
        cpu_seconds: time(usage.ru_utime) + time(usage.ru_stime),
        peak_rss_bytes: usage.ru_maxrss as u64 * 1024,
        stdout,
        code,
    })
}

/// The number after `marker` in `text`.
fn number_after(text: &str, marker: &str) -> anyhow::Result<u64> {
    let at = text
        .find(marker)
        .with_context(|| format!("no `{marker}` in {text:?}"))?;
    let digits: String = text[at + marker.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Ok(digits.parse()?)
}

/// `hlat data ingest` of `inputs` into a fresh folder.
fn hlat_row(name: &str, args: &IngestBenchArgs, inputs: &[PathBuf]) -> anyhow::Result<Row> {
    let out = tempfile::tempdir()?;
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["data", "ingest", "--no-progress", "--val-fraction", "0"])
        .arg("--tokenizer")
        .arg(&args.tokenizer)
        .args(["--text-field", &args.text_field])
        .arg("--out")
        .arg(out.path().join("out"))
        .arg("--input")
        .args(inputs);
    if let Some(threads) = args.threads {
        command.args(["--threads", &threads.to_string()]);
    }
    let measured = measure(command)?;
    if measured.code != 0 {
        bail!("hlat data ingest exited with status {}", measured.code);
    }
    let stdout = &measured.stdout;
    let documents = number_after(stdout, ": ")?;
    let tokens = number_after(stdout, "train documents (")?;
    let text_bytes = number_after(stdout, "duplicates; ")?;
    Ok(Row {
        name: name.into(),
        seconds: measured.seconds,
        cpu_seconds: measured.cpu_seconds,
        documents,
        tokens,
        text_bytes,
        peak_rss_bytes: measured.peak_rss_bytes,
        version: format!("hlat {}", env!("CARGO_PKG_VERSION")),
    })
}

/// The Hugging Face peer on `inputs`; `None` when `tokenizers` is not installed.
fn hf_row(args: &IngestBenchArgs, script: &Path) -> anyhow::Result<Option<Row>> {
    let mut command = Command::new(&args.python);
    command
        .arg(script)
        .arg("--tokenizer")
        .arg(&args.tokenizer)
        .args(["--text-field", &args.text_field])
        .arg("--input")
        .args(&args.input);
    if let Some(threads) = args.threads {
        command.env("RAYON_RS_NUM_CPUS", threads.to_string());
        command.env("RAYON_NUM_THREADS", threads.to_string());
    }
    let measured = measure(command)?;
    if measured.code == MISSING_PEER {
        log::warn!("the Hugging Face peer is skipped: `tokenizers` is not installed");
        return Ok(None);
    }
    if measured.code != 0 {
        bail!("the Hugging Face peer exited with status {}", measured.code);
    }
    let stdout = &measured.stdout;
    let output: PeerOutput = serde_json::from_str(stdout.trim())
        .with_context(|| format!("the peer's output {stdout:?}"))?;
    Ok(Some(Row {
        name: "HF tokenizers encode_batch".into(),
        seconds: measured.seconds,
        cpu_seconds: measured.cpu_seconds,
        documents: output.documents,
        tokens: output.tokens,
        text_bytes: output.text_bytes,
        peak_rss_bytes: measured.peak_rss_bytes,
        version: output.version,
    }))
}

/// Runs `hlat bench ingest`.
pub fn run(args: IngestBenchArgs) -> anyhow::Result<()> {
    let mut rows = vec![hlat_row("hlat data ingest", &args, &args.input)?];
    if args.with_hf {
        let folder = tempfile::tempdir()?;
        let script = folder.path().join("bench_ingest_peer.py");
        std::fs::write(&script, PEER)?;
        rows.extend(hf_row(&args, &script)?);
    }
    if args.scale > 1 {
        let repeated: Vec<PathBuf> = (0..args.scale)
            .flat_map(|_| args.input.iter().cloned())
            .collect();
        rows.push(hlat_row(
            &format!("hlat data ingest, {}× corpus", args.scale),
            &args,
            &repeated,
        )?);
    }
    println!(
        "| {:<32} | {:>8} | {:>8} | {:>8} | {:>10} | {:>12} | {:>10} | {:>9} |",
        "", "seconds", "CPU s", "MB/s", "docs/s", "tokens/s", "tokens", "peak MiB"
    );
    for row in &rows {
        println!(
            "| {:<32} | {:>8.2} | {:>8.2} | {:>8.2} | {:>10.0} | {:>12.0} | {:>10} | {:>9.0} |",
            row.name,
            row.seconds,
            row.cpu_seconds,
            row.text_bytes as f64 / 1e6 / row.seconds,
            row.documents as f64 / row.seconds,
            row.tokens as f64 / row.seconds,
            row.tokens,
            row.peak_rss_bytes as f64 / (1 << 20) as f64
        );
    }
    let hlat = &rows[0];
    if let Some(hf) = rows.iter().find(|row| row.name.starts_with("HF")) {
        let speedup = (hlat.text_bytes as f64 / hlat.seconds) / (hf.text_bytes as f64 / hf.seconds);
        let per_cpu =
            (hlat.text_bytes as f64 / hlat.cpu_seconds) / (hf.text_bytes as f64 / hf.cpu_seconds);
        println!(
            "hlat / HF tokenizers: {speedup:.2}× the MB/s (goal ≥ 1.5×), {per_cpu:.2}× the MB per \
             CPU second, {:.2}× the peak memory; tokens {}",
            hlat.peak_rss_bytes as f64 / hf.peak_rss_bytes as f64,
            if hf.tokens == hlat.tokens {
                "equal".to_string()
            } else {
                format!("DIFFER: {} against {}", hlat.tokens, hf.tokens)
            }
        );
    }
    if let Some(scaled) = rows.iter().find(|row| row.name.contains("× corpus")) {
        println!(
            "memory bound: {}× the corpus peaks at {:.2}× the memory of 1× (goal ≤ 1.2×)",
            args.scale,
            scaled.peak_rss_bytes as f64 / hlat.peak_rss_bytes as f64
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
