use std::path::{Path, PathBuf};
use std::sync::Arc;

use libloading::Library;

use super::PjrtError;
use super::error::code_name;
use super::raw::{self, Api};

/// A loaded PJRT plugin: the shared library and its function table.
///
/// The library stays loaded for the life of the value (plugins are usually loaded once per
/// process and never unloaded: XLA does not support being unloaded).
pub struct Plugin {
    api: *const Api,
    path: PathBuf,
    _library: Library,
}

// SAFETY: the PJRT C API is thread-safe; the table is immutable after `GetPjrtApi`.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

/// The PJRT API major version these bindings follow.
const SUPPORTED_MAJOR: i32 = 0;

macro_rules! required_functions {
    ($($field:ident => $name:literal),* $(,)?) => {
        /// Checks that the table holds every function the bindings call.
        fn check_functions(api: &Api, path: &Path) -> Result<(), PjrtError> {
            $(
                let end = std::mem::offset_of!(Api, $field) + std::mem::size_of::<usize>();
                if api.struct_size < end || api.$field.is_none() {
                    return Err(PjrtError::Incompatible {
                        path: path.to_path_buf(),
                        reason: format!(
                            "its API {}.{} lacks {} (table of {} bytes)",
                            api.version.major, api.version.minor, $name, api.struct_size
                        ),
                    });
                }
            )*
            Ok(())
        }
    };
}

required_functions! {
    error_destroy => "PJRT_Error_Destroy",
    error_message => "PJRT_Error_Message",
    error_get_code => "PJRT_Error_GetCode",
    plugin_initialize => "PJRT_Plugin_Initialize",
    event_destroy => "PJRT_Event_Destroy",
    event_await => "PJRT_Event_Await",
    client_create => "PJRT_Client_Create",
    client_destroy => "PJRT_Client_Destroy",
    client_platform_name => "PJRT_Client_PlatformName",
    client_platform_version => "PJRT_Client_PlatformVersion",
    client_addressable_devices => "PJRT_Client_AddressableDevices",
    client_compile => "PJRT_Client_Compile",
    client_buffer_from_host_buffer => "PJRT_Client_BufferFromHostBuffer",
    device_description_id => "PJRT_DeviceDescription_Id",
    device_description_kind => "PJRT_DeviceDescription_Kind",
    device_description_debug_string => "PJRT_DeviceDescription_DebugString",
    device_get_description => "PJRT_Device_GetDescription",
    executable_destroy => "PJRT_Executable_Destroy",
    executable_num_outputs => "PJRT_Executable_NumOutputs",
    loaded_executable_destroy => "PJRT_LoadedExecutable_Destroy",
    loaded_executable_get_executable => "PJRT_LoadedExecutable_GetExecutable",
    loaded_executable_execute => "PJRT_LoadedExecutable_Execute",
    buffer_destroy => "PJRT_Buffer_Destroy",
    buffer_to_host_buffer => "PJRT_Buffer_ToHostBuffer",
}

impl Plugin {
    /// Loads the plugin at `path`, checks its API version and function table, and initializes it.
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<Plugin>, PjrtError> {
        let path = path.as_ref().to_path_buf();
        let load_error = |reason: String| PjrtError::Load {
            path: path.clone(),
            reason,
        };
        if !path.is_file() {
            return Err(load_error("no such file".to_string()));
        }
        // SAFETY: loading a library runs its initializers; a PJRT plugin is such a library and
        // the path was chosen by the user for that purpose.
        let library =
            unsafe { Library::new(&path) }.map_err(|error| load_error(error.to_string()))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get_api =
            unsafe { library.get::<unsafe extern "C" fn() -> *const Api>(b"GetPjrtApi\0") }
                .map_err(|error| load_error(format!("no `GetPjrtApi` symbol: {error}")))?;
        // SAFETY: calling the plugin's entry point, which returns a static table.
        let api = unsafe { get_api() };
        if api.is_null() {
            return Err(load_error("`GetPjrtApi` returned null".to_string()));
        }
        // SAFETY: non-null; the table lives as long as the library.
        let table = unsafe { &*api };
        if table.version.major != SUPPORTED_MAJOR {
            return Err(PjrtError::Incompatible {
                path,
                reason: format!(
                    "API version {}.{} (these bindings speak major version {SUPPORTED_MAJOR})",
                    table.version.major, table.version.minor
                ),
            });
        }
        check_functions(table, &path)?;
        let plugin = Plugin {
            api,
            path,
            _library: library,
        };
        // SAFETY: a valid, zeroed argument struct.
        let mut args = unsafe { raw::args::<raw::PluginInitializeArgs>() };
        plugin.call(
            "PJRT_Plugin_Initialize",
            plugin.api().plugin_initialize,
            &mut args,
        )?;
        log::info!(
            "loaded PJRT plugin {} (API {}.{})",
            plugin.path.display(),
            table.version.major,
            table.version.minor
        );
        Ok(Arc::new(plugin))
    }

    /// The path the plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plugin's PJRT C API version `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        (self.api().version.major, self.api().version.minor)
    }

    /// Whether the plugin's function table reaches the entry at byte `offset` (an entry added
    /// after the table layout these bindings require; use `std::mem::offset_of!(Api, field)`).
    pub(crate) fn has(&self, offset: usize) -> bool {
        let api = self.api();
        api.struct_size >= offset + std::mem::size_of::<usize>()
    }

    pub(crate) fn api(&self) -> &Api {
        // SAFETY: checked non-null at load; static for the life of the library.
        unsafe { &*self.api }
    }

    /// Calls one table function and turns its `PJRT_Error` into a [`PjrtError`].
    pub(crate) fn call<A>(
        &self,
        function: &'static str,
        entry: raw::Call<A>,
        args: &mut A,
    ) -> Result<(), PjrtError> {
        let entry =
            entry.ok_or_else(|| PjrtError::InvalidRequest(format!("{function} is missing")))?;
        // SAFETY: `args` is the argument struct of `entry`, built with `raw::args`.
        let error = unsafe { entry(args) };
        self.check(function, error)
    }

    /// Converts a returned `PJRT_Error*` (null on success), destroying it.
    pub(crate) fn check(
        &self,
        function: &'static str,
        error: *mut raw::PjrtError,
    ) -> Result<(), PjrtError> {
        if error.is_null() {
            return Ok(());
        }
        let api = self.api();
        // SAFETY: valid zeroed argument structs; `error` is a live error owned by us.
        let mut message_args = unsafe { raw::args::<raw::ErrorMessageArgs>() };
        message_args.error = error;
        let mut code_args = unsafe { raw::args::<raw::ErrorGetCodeArgs>() };
        code_args.error = error;
        let mut destroy_args = unsafe { raw::args::<raw::ErrorDestroyArgs>() };
        destroy_args.error = error;
        // SAFETY: the functions were checked present at load.
        let (message, code) = unsafe {
            (api.error_message.expect("checked at load"))(&mut message_args);
            let message = if message_args.message.is_null() {
                String::new()
            } else {
                let bytes = std::slice::from_raw_parts(
                    message_args.message as *const u8,
                    message_args.message_size,
                );
                String::from_utf8_lossy(bytes).into_owned()
            };
            let code_error = (api.error_get_code.expect("checked at load"))(&mut code_args);
            let code = if code_error.is_null() {
                code_args.code
            } else {
                let mut code_destroy = raw::args::<raw::ErrorDestroyArgs>();
                code_destroy.error = code_error;
                (api.error_destroy.expect("checked at load"))(&mut code_destroy);
                2
            };
            (api.error_destroy.expect("checked at load"))(&mut destroy_args);
            (message, code)
        };
        Err(PjrtError::Call {
            function,
            code: code_name(code),
            message,
        })
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = self.api_version();
        write!(
            formatter,
            "Plugin({}, API {major}.{minor})",
            self.path.display()
        )
    }
}
