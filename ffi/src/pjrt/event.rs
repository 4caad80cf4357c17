use std::sync::Arc;

use super::raw;
use super::{PjrtError, Plugin};

/// A `PJRT_Event`: completion of asynchronous work (a transfer, an execution).
pub(crate) struct Event {
    plugin: Arc<Plugin>,
    raw: *mut raw::PjrtEvent,
}

impl Event {
    /// Takes ownership of `raw`; `None` when the plugin returned no event.
    pub(crate) fn from_raw(plugin: &Arc<Plugin>, raw: *mut raw::PjrtEvent) -> Option<Event> {
        (!raw.is_null()).then(|| Event {
            plugin: plugin.clone(),
            raw,
        })
    }

    /// Blocks until the event is ready and returns its error status.
    pub(crate) fn wait(self, function: &'static str) -> Result<(), PjrtError> {
        // SAFETY: a valid zeroed argument struct.
        let mut args = unsafe { raw::args::<raw::EventArgs>() };
        args.event = self.raw;
        self.plugin
            .call(function, self.plugin.api().event_await, &mut args)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: a valid zeroed argument struct; `raw` is owned by this value.
        let mut args = unsafe { raw::args::<raw::EventArgs>() };
        args.event = self.raw;
        if let Err(error) = self.plugin.call(
            "PJRT_Event_Destroy",
            self.plugin.api().event_destroy,
            &mut args,
        ) {
            log::warn!("{error}");
        }
    }
}

/// Waits for an optional event returned by a call.
pub(crate) fn wait(
    plugin: &Arc<Plugin>,
    raw: *mut raw::PjrtEvent,
    function: &'static str,
) -> Result<(), PjrtError> {
    match Event::from_raw(plugin, raw) {
        Some(event) => event.wait(function),
        None => Ok(()),
    }
}
