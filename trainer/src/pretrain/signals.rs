//! [`StopOnSignal`]: SIGTERM (what Slurm and torchrun send before they kill a job) and SIGINT
//! (Ctrl-C) stop a run as `q` on the dashboard does: at the next step boundary, with a checkpoint
//! of the step reached and the write under way completed before the process ends. A second
//! signal ends the process at once (exit status 1), as it would have without the handler.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;

use burn::train::Interrupter;
use signal_hook::SigId;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

use crate::error::TrainError;

/// Stops a run's Learner through its interrupter on SIGTERM or SIGINT, while it lives.
pub(super) struct StopOnSignal {
    handle: Handle,
    thread: Option<JoinHandle<()>>,
    /// The handlers that end the process at a second signal, removed with the rest.
    flags: Vec<SigId>,
}

impl StopOnSignal {
    /// Installs the handlers for the run `interrupter` stops.
    pub fn install(interrupter: Interrupter) -> Result<Self, TrainError> {
        let failed = |source: std::io::Error| {
            TrainError::Device(format!(
                "installing the SIGTERM and SIGINT handlers: {source}"
            ))
        };
        let stopping = Arc::new(AtomicBool::new(false));
        let mut flags = Vec::new();
        for signal in [SIGTERM, SIGINT] {
            // Exits at once when the flag is already set: the second signal.
            flags.push(
                signal_hook::flag::register_conditional_shutdown(signal, 1, Arc::clone(&stopping))
                    .map_err(failed)?,
            );
            flags.push(signal_hook::flag::register(signal, Arc::clone(&stopping)).map_err(failed)?);
        }
        let mut signals = Signals::new([SIGTERM, SIGINT]).map_err(failed)?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("stop-on-signal".into())
            .spawn(move || {
                if let Some(signal) = signals.forever().next() {
                    let name = if signal == SIGTERM {
                        "SIGTERM"
                    } else {
                        "SIGINT"
                    };
                    log::info!(
                        "{name}: stopping after this step with a checkpoint (again to stop at once)"
                    );
                    interrupter.stop(Some(&format!("{name} received")));
                }
            })
            .map_err(failed)?;
        Ok(Self {
            handle,
            thread: Some(thread),
            flags,
        })
    }
}

impl Drop for StopOnSignal {
    fn drop(&mut self) {
        for id in self.flags.drain(..) {
            signal_hook::low_level::unregister(id);
        }
        self.handle.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
