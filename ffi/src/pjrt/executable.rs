use std::ptr;
use std::sync::Arc;

use super::client::ClientHandle;
use super::{Buffer, PjrtError, Plugin, event, raw};

/// What a compiled program needs on one device, in bytes, as the compiler's buffer assignment
/// counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompiledMemoryStats {
    /// The program's arguments.
    pub argument_bytes: u64,
    /// Its outputs.
    pub output_bytes: u64,
    /// Output bytes that reuse argument buffers.
    pub alias_bytes: u64,
    /// Scratch memory during a run: the intermediate values (for a training step, mostly the
    /// activations kept for the backward pass).
    pub temp_bytes: u64,
}

/// A compiled program loaded on its device (`PJRT_LoadedExecutable`), destroyed on drop.
pub struct LoadedExecutable {
    client: Arc<ClientHandle>,
    raw: *mut raw::PjrtLoadedExecutable,
    num_outputs: usize,
}

// SAFETY: PJRT executables are thread-safe handles; the client outlives them through the `Arc`.
unsafe impl Send for LoadedExecutable {}
// SAFETY: as above.
unsafe impl Sync for LoadedExecutable {}

impl LoadedExecutable {
    pub(crate) fn new(
        client: Arc<ClientHandle>,
        raw: *mut raw::PjrtLoadedExecutable,
    ) -> Result<Self, PjrtError> {
        let mut executable = LoadedExecutable {
            client,
            raw,
            num_outputs: 0,
        };
        executable.num_outputs = executable.query_num_outputs()?;
        Ok(executable)
    }

    fn query_num_outputs(&self) -> Result<usize, PjrtError> {
        self.with_executable(|plugin, executable| {
            // SAFETY: a valid zeroed argument struct.
            let mut count = unsafe { raw::args::<raw::ExecutableNumOutputsArgs>() };
            count.executable = executable;
            plugin.call(
                "PJRT_Executable_NumOutputs",
                plugin.api().executable_num_outputs,
                &mut count,
            )?;
            Ok(count.num_outputs)
        })
    }

    /// The compiler's memory accounting of the program on one device (from buffer assignment,
    /// without running it); `None` when the plugin's API predates it.
    pub fn compiled_memory_stats(&self) -> Result<Option<CompiledMemoryStats>, PjrtError> {
        let plugin = &self.client.plugin;
        if !plugin.has(std::mem::offset_of!(
            raw::Api,
            executable_get_compiled_memory_stats
        )) {
            return Ok(None);
        }
        self.with_executable(|plugin, executable| {
            // SAFETY: a valid zeroed argument struct.
            let mut stats = unsafe { raw::args::<raw::ExecutableGetCompiledMemoryStatsArgs>() };
            stats.executable = executable;
            plugin.call(
                "PJRT_Executable_GetCompiledMemoryStats",
                plugin.api().executable_get_compiled_memory_stats,
                &mut stats,
            )?;
            let bytes = |value: i64| u64::try_from(value).unwrap_or(0);
            Ok(Some(CompiledMemoryStats {
                argument_bytes: bytes(stats.argument_size_in_bytes),
                output_bytes: bytes(stats.output_size_in_bytes),
                alias_bytes: bytes(stats.alias_size_in_bytes),
                temp_bytes: bytes(stats.temp_size_in_bytes),
            }))
        })
    }

    /// The plugin's serialization of the compiled program, for [`super::Client::load_serialized`]
    /// in a later process (the format belongs to the plugin and its version).
    pub fn serialize(&self) -> Result<Vec<u8>, PjrtError> {
        self.with_executable(|plugin, executable| {
            // SAFETY: a valid zeroed argument struct.
            let mut args = unsafe { raw::args::<raw::ExecutableSerializeArgs>() };
            args.executable = executable;
            plugin.call(
                "PJRT_Executable_Serialize",
                plugin.api().executable_serialize,
                &mut args,
            )?;
            let bytes = if args.serialized_bytes.is_null() {
                Vec::new()
            } else {
                // SAFETY: the plugin returned that many bytes, alive until the deleter runs.
                unsafe {
                    std::slice::from_raw_parts(
                        args.serialized_bytes.cast::<u8>(),
                        args.serialized_bytes_size,
                    )
                }
                .to_vec()
            };
            if let Some(deleter) = args.serialized_executable_deleter {
                // SAFETY: called once, on the serialization the plugin handed over.
                unsafe { deleter(args.serialized_executable) };
            }
            Ok(bytes)
        })
    }

    /// Runs `query` on the `PJRT_Executable` behind this loaded executable, then releases it.
    fn with_executable<T>(
        &self,
        query: impl FnOnce(&Plugin, *mut raw::PjrtExecutable) -> Result<T, PjrtError>,
    ) -> Result<T, PjrtError> {
        let plugin = &self.client.plugin;
        // SAFETY: valid zeroed argument structs.
        let mut get = unsafe { raw::args::<raw::LoadedExecutableGetExecutableArgs>() };
        get.loaded_executable = self.raw;
        plugin.call(
            "PJRT_LoadedExecutable_GetExecutable",
            plugin.api().loaded_executable_get_executable,
            &mut get,
        )?;
        let result = query(plugin, get.executable);
        let mut destroy = unsafe { raw::args::<raw::ExecutableDestroyArgs>() };
        destroy.executable = get.executable;
        plugin.call(
            "PJRT_Executable_Destroy",
            plugin.api().executable_destroy,
            &mut destroy,
        )?;
        result
    }

    /// The number of buffers one execution returns.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Runs the program once on the device it was compiled for and waits for it to finish.
    ///
    /// The arguments stay valid unless the program donates them (input/output aliasing).
    pub fn execute(&self, arguments: &[&Buffer]) -> Result<Vec<Buffer>, PjrtError> {
        let mut outputs = self.execute_replicated(&[arguments.to_vec()])?;
        Ok(outputs.remove(0))
    }

    /// Runs the program once on every replica it was compiled for (`arguments[r]` on replica
    /// `r`'s device) and waits for all of them. Returns each replica's outputs.
    pub fn execute_replicated(
        &self,
        arguments: &[Vec<&Buffer>],
    ) -> Result<Vec<Vec<Buffer>>, PjrtError> {
        let plugin = &self.client.plugin;
        let replicas = arguments.len();
        let num_args = arguments.first().map_or(0, Vec::len);
        if arguments.iter().any(|list| list.len() != num_args) {
            return Err(PjrtError::InvalidRequest(
                "every replica needs the same number of arguments".into(),
            ));
        }
        let argument_lists: Vec<Vec<*mut raw::PjrtBuffer>> = arguments
            .iter()
            .map(|list| list.iter().map(|buffer| buffer.raw()).collect())
            .collect();
        let argument_pointers: Vec<*const *mut raw::PjrtBuffer> =
            argument_lists.iter().map(|list| list.as_ptr()).collect();
        let mut outputs: Vec<Vec<*mut raw::PjrtBuffer>> =
            vec![vec![ptr::null_mut(); self.num_outputs]; replicas];
        let output_pointers: Vec<*mut *mut raw::PjrtBuffer> =
            outputs.iter_mut().map(|list| list.as_mut_ptr()).collect();
        let mut complete_events = vec![ptr::null_mut::<raw::PjrtEvent>(); replicas];
        // SAFETY: valid zeroed argument structs; every array outlives the call and the waits.
        let mut options = unsafe { raw::args::<raw::ExecuteOptions>() };
        let mut args = unsafe { raw::args::<raw::ExecuteArgs>() };
        args.executable = self.raw;
        args.options = &mut options;
        args.argument_lists = argument_pointers.as_ptr();
        args.num_devices = replicas;
        args.num_args = num_args;
        args.output_lists = output_pointers.as_ptr();
        args.device_complete_events = complete_events.as_mut_ptr();
        plugin.call(
            "PJRT_LoadedExecutable_Execute",
            plugin.api().loaded_executable_execute,
            &mut args,
        )?;
        // Own every returned buffer before waiting, so that none leaks if a wait fails.
        let buffers: Vec<Vec<Buffer>> = outputs
            .into_iter()
            .map(|list| {
                list.into_iter()
                    .filter(|buffer| !buffer.is_null())
                    .map(|buffer| Buffer::new(self.client.clone(), buffer))
                    .collect()
            })
            .collect();
        for event in complete_events {
            event::wait(plugin, event, "PJRT_LoadedExecutable_Execute")?;
        }
        if let Some(short) = buffers.iter().find(|list| list.len() != self.num_outputs) {
            return Err(PjrtError::InvalidRequest(format!(
                "the executable returned {} buffers, {} expected",
                short.len(),
                self.num_outputs
            )));
        }
        Ok(buffers)
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let plugin = &self.client.plugin;
        // SAFETY: a valid zeroed argument struct; `raw` is owned by this value.
        let mut args = unsafe { raw::args::<raw::LoadedExecutableDestroyArgs>() };
        args.executable = self.raw;
        if let Err(error) = plugin.call(
            "PJRT_LoadedExecutable_Destroy",
            plugin.api().loaded_executable_destroy,
            &mut args,
        ) {
            log::warn!("{error}");
        }
    }
}
