//! Where the time goes: every phase of a step as a `tracing` span, written as a Chrome/Perfetto
//! trace (`trace.json`, opened by ui.perfetto.dev and chrome://tracing) with a per-phase summary.
//!
//! The backend opens a span for each phase it runs ([`phase`]): capturing an operation,
//! fingerprinting and lowering a segment, compiling or loading a program, host↔device transfers,
//! running a program, collectives run on the host, host fallbacks. The trainer adds the step,
//! data loading, the optimizer, validation and checkpoints. Without [`start`] the spans cost a
//! check of `tracing`'s dispatcher; with it, [`tracing_chrome`] writes the trace and
//! [`PhaseSummary`] adds up each phase's own time (its span's time less its children's), so the
//! phases of the steps add up to the steps' time.
//!
//! ```no_run
//! let profile = burn_trainium::profile::start(std::path::Path::new("profile"))?;
//! // ... train ...
//! let summary = profile.finish()?;
//! println!("{summary}");
//! # Ok::<(), burn_trainium::profile::ProfileError>(())
//! ```

mod summary;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tracing_subscriber::layer::SubscriberExt;

pub use summary::{PhaseSummary, PhaseTime};
use summary::{Recorder, SummaryLayer};

/// The names of the spans of the phases, as the trace and the summary show them.
pub mod phase {
    /// One optimizer step (the trainer).
    pub const STEP: &str = "step";
    /// Waiting for the next micro-batches of the data loader (the trainer).
    pub const DATA: &str = "data";
    /// The optimizer's update (the trainer).
    pub const OPTIMIZER: &str = "optimizer";
    /// A validation pass (the trainer).
    pub const VALIDATION: &str = "validation";
    /// Writing a checkpoint (the trainer).
    pub const CHECKPOINT: &str = "checkpoint";
    /// Capturing one Burn operation into the current segment.
    pub const CAPTURE: &str = "capture";
    /// Fingerprinting a segment (is it a repeat of one lowered before?).
    pub const FINGERPRINT: &str = "fingerprint";
    /// Lowering a segment to HLO.
    pub const LOWER: &str = "lower";
    /// Compiling a program (its span records `cached = true` when it was loaded from a cache on
    /// disk instead; the summary shows those as [`CACHE_LOAD`]).
    pub const COMPILE: &str = "compile";
    /// Loading a compiled program from a cache on disk (a `compile` span that found one).
    pub const CACHE_LOAD: &str = "cache load";
    /// Copying data from the host to the device.
    pub const TO_DEVICE: &str = "transfer to device";
    /// Copying data from the device to the host (it waits for the programs that compute it).
    pub const TO_HOST: &str = "transfer to host";
    /// Running a program (`xla`, `neuron`) or a segment (`host`).
    pub const EXECUTE: &str = "execute";
    /// A collective run on the host executor (on `xla` and `neuron` they run inside programs).
    pub const COLLECTIVE: &str = "collective";
    /// An operation without a lowering, run on the host.
    pub const HOST_FALLBACK: &str = "host fallback";
}

/// Why profiling could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The folder could not be made.
    #[error("{path}: {source}")]
    Folder {
        /// The folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Another `tracing` subscriber is already the process's (profiling starts once per process).
    #[error("a tracing subscriber is already installed in this process: {0}")]
    AlreadyInstalled(String),
    /// The summary could not be written.
    #[error("{path}: {source}")]
    Summary {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// A profile being recorded: keep it alive while the work runs, then [`Profile::finish`].
pub struct Profile {
    folder: PathBuf,
    chrome: Option<tracing_chrome::FlushGuard>,
    recorder: Arc<Mutex<Recorder>>,
}

/// The trace file [`start`] writes into its folder.
pub const TRACE_FILE: &str = "trace.json";
/// The per-phase summary [`Profile::finish`] writes next to it.
pub const SUMMARY_FILE: &str = "summary.json";

/// Records no span, for a process that takes no profile: once a subscriber is installed,
/// tracing no longer writes each span as a log record too (its `log` fallback, which Burn 0.22's
/// server dependencies turn on, logged every compile as "compile; cached=false" at `info`).
/// Does nothing if a subscriber is installed already; [`start`] cannot follow it.
pub fn record_nothing() {
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
}

/// Starts recording every span of this process into `folder` (created if needed): the trace is
/// `folder/trace.json`, the summary `folder/summary.json` (written by [`Profile::finish`]).
pub fn start(folder: &Path) -> Result<Profile, ProfileError> {
    std::fs::create_dir_all(folder).map_err(|source| ProfileError::Folder {
        path: folder.to_path_buf(),
        source,
    })?;
    let (chrome, guard) = tracing_chrome::ChromeLayerBuilder::new()
        .file(folder.join(TRACE_FILE))
        .include_args(true)
        .build();
    let recorder = Arc::new(Mutex::new(Recorder::default()));
    let subscriber = tracing_subscriber::registry()
        .with(chrome)
        .with(SummaryLayer::new(recorder.clone()));
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|error| ProfileError::AlreadyInstalled(error.to_string()))?;
    Ok(Profile {
        folder: folder.to_path_buf(),
        chrome: Some(guard),
        recorder,
    })
}

impl Profile {
    /// The summary of what was recorded so far.
    pub fn summary(&self) -> PhaseSummary {
        lock(&self.recorder).summary()
    }

    /// Waits for the devices served in this process to apply what their clients sent (their
    /// spans close), flushes the trace, writes `summary.json` and returns the summary.
    pub fn finish(mut self) -> Result<PhaseSummary, ProfileError> {
        crate::server::in_process::sync_served();
        if let Some(guard) = self.chrome.take() {
            guard.flush();
            drop(guard);
        }
        let summary = self.summary();
        let path = self.folder.join(SUMMARY_FILE);
        let json = serde_json::to_vec_pretty(&summary).expect("a summary serializes");
        crate::write_atomically(&path, &json)
            .map_err(|source| ProfileError::Summary { path, source })?;
        Ok(summary)
    }
}

fn lock(recorder: &Mutex<Recorder>) -> std::sync::MutexGuard<'_, Recorder> {
    recorder
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
