use std::sync::Arc;

use super::client::ClientHandle;
use super::{PjrtError, event, raw};

/// A device buffer (`PJRT_Buffer`), destroyed on drop.
pub struct Buffer {
    client: Arc<ClientHandle>,
    raw: *mut raw::PjrtBuffer,
}

// SAFETY: PJRT buffers are thread-safe handles; the client outlives them through the `Arc`.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl Buffer {
    pub(crate) fn new(client: Arc<ClientHandle>, raw: *mut raw::PjrtBuffer) -> Buffer {
        Buffer { client, raw }
    }

    pub(crate) fn raw(&self) -> *mut raw::PjrtBuffer {
        self.raw
    }

    /// Copies the whole buffer into `destination` (dense, row-major) and waits for the copy.
    pub fn copy_to_host(&self, destination: &mut [u8]) -> Result<(), PjrtError> {
        let plugin = &self.client.plugin;
        // SAFETY: a valid zeroed argument struct; `destination` outlives the wait below.
        let mut args = unsafe { raw::args::<raw::BufferToHostBufferArgs>() };
        args.src = self.raw;
        args.dst = destination.as_mut_ptr().cast();
        args.dst_size = destination.len();
        plugin.call(
            "PJRT_Buffer_ToHostBuffer",
            plugin.api().buffer_to_host_buffer,
            &mut args,
        )?;
        event::wait(plugin, args.event, "PJRT_Buffer_ToHostBuffer")
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let plugin = &self.client.plugin;
        // SAFETY: a valid zeroed argument struct; `raw` is owned by this value.
        let mut args = unsafe { raw::args::<raw::BufferDestroyArgs>() };
        args.buffer = self.raw;
        if let Err(error) = plugin.call(
            "PJRT_Buffer_Destroy",
            plugin.api().buffer_destroy,
            &mut args,
        ) {
            log::warn!("{error}");
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "Buffer({:p})", self.raw)
    }
}
