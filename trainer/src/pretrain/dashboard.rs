//! Burn's terminal dashboard for `hlat pretrain`, where it can draw.

use std::io::IsTerminal;

use burn::train::Interrupter;
use burn::train::renderer::tui::TuiMetricsRendererWrapper;

/// Burn's dashboard owns the terminal while it draws: log lines below warnings are held back
/// until it closes (`metrics.jsonl` and Burn's metric logs keep every value).
pub(super) struct Dashboard {
    /// The log level to restore when the dashboard closes.
    level: log::LevelFilter,
}

impl Dashboard {
    /// The dashboard, when `wanted` and standard output is a terminal.
    pub(super) fn open(wanted: bool) -> Option<Self> {
        if !wanted || !std::io::stdout().is_terminal() {
            return None;
        }
        let level = log::max_level();
        log::set_max_level(level.min(log::LevelFilter::Warn));
        Some(Self { level })
    }

    /// Burn's renderer; `q` or Ctrl-C in it stops training through `interrupter` (the run then
    /// saves a checkpoint).
    pub(super) fn renderer(&self, interrupter: Interrupter) -> TuiMetricsRendererWrapper {
        TuiMetricsRendererWrapper::new(interrupter, None)
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        log::set_max_level(self.level);
    }
}
