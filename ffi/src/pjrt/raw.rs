//! The C layout of the PJRT API (`xla/pjrt/c/pjrt_c_api.h`): the function table and the argument
//! structs of the functions this crate calls.
//!
//! Every argument struct starts with its own size. A plugin rejects a struct smaller than the
//! layout it was built with and accepts a larger one, so the structs below follow the layout of
//! PJRT C API 0.90 (accepted by later plugins); fields added since then are zero-filled `_tail`
//! words, which mean "not set" in every version.

#![allow(missing_docs)]

use std::ffi::{c_char, c_void};

/// Opaque handles owned by the plugin.
pub enum PjrtError {}
pub enum PjrtClient {}
pub enum PjrtDevice {}
pub enum PjrtDeviceDescription {}
pub enum PjrtEvent {}
pub enum PjrtExecutable {}
pub enum PjrtLoadedExecutable {}
pub enum PjrtBuffer {}

/// A function of the table that returns an error (null on success).
pub type Call<A> = Option<unsafe extern "C" fn(*mut A) -> *mut PjrtError>;
/// A function of the table that cannot fail.
pub type VoidCall<A> = Option<unsafe extern "C" fn(*mut A)>;
/// A slot of the table this crate never calls.
pub type Unused = *const c_void;

/// `PJRT_Api_Version`.
#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub major: i32,
    pub minor: i32,
}

/// `PJRT_Api`, up to the last function this crate calls (the table only grows at its end).
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub version: ApiVersion,
    pub error_destroy: VoidCall<ErrorDestroyArgs>,
    pub error_message: VoidCall<ErrorMessageArgs>,
    pub error_get_code: Call<ErrorGetCodeArgs>,
    pub plugin_initialize: Call<PluginInitializeArgs>,
    pub plugin_attributes: Unused,
    pub event_destroy: Call<EventArgs>,
    pub event_is_ready: Unused,
    pub event_error: Unused,
    pub event_await: Call<EventArgs>,
    pub event_on_ready: Unused,
    pub client_create: Call<ClientCreateArgs>,
    pub client_destroy: Call<ClientDestroyArgs>,
    pub client_platform_name: Call<ClientPlatformNameArgs>,
    pub client_process_index: Unused,
    pub client_platform_version: Call<ClientPlatformVersionArgs>,
    pub client_devices: Call<ClientDevicesArgs>,
    pub client_addressable_devices: Call<ClientDevicesArgs>,
    pub client_lookup_device: Unused,
    pub client_lookup_addressable_device: Unused,
    pub client_addressable_memories: Unused,
    pub client_compile: Call<ClientCompileArgs>,
    pub client_default_device_assignment: Unused,
    pub client_buffer_from_host_buffer: Call<BufferFromHostBufferArgs>,
    pub device_description_id: Call<DeviceDescriptionIdArgs>,
    pub device_description_process_index: Unused,
    pub device_description_attributes: Unused,
    pub device_description_kind: Call<DeviceDescriptionKindArgs>,
    pub device_description_debug_string: Call<DeviceDescriptionDebugStringArgs>,
    pub device_description_to_string: Unused,
    pub device_get_description: Call<DeviceGetDescriptionArgs>,
    pub device_is_addressable: Unused,
    pub device_local_hardware_id: Unused,
    pub device_addressable_memories: Unused,
    pub device_default_memory: Unused,
    pub device_memory_stats: Unused,
    pub memory_id: Unused,
    pub memory_kind: Unused,
    pub memory_debug_string: Unused,
    pub memory_to_string: Unused,
    pub memory_addressable_by_devices: Unused,
    pub executable_destroy: Call<ExecutableDestroyArgs>,
    pub executable_name: Unused,
    pub executable_num_replicas: Unused,
    pub executable_num_partitions: Unused,
    pub executable_num_outputs: Call<ExecutableNumOutputsArgs>,
    pub executable_size_of_generated_code_in_bytes: Unused,
    pub executable_get_cost_analysis: Unused,
    pub executable_output_memory_kinds: Unused,
    pub executable_optimized_program: Unused,
    pub executable_serialize: Call<ExecutableSerializeArgs>,
    pub loaded_executable_destroy: Call<LoadedExecutableDestroyArgs>,
    pub loaded_executable_get_executable: Call<LoadedExecutableGetExecutableArgs>,
    pub loaded_executable_addressable_devices: Unused,
    pub loaded_executable_delete: Unused,
    pub loaded_executable_is_deleted: Unused,
    pub loaded_executable_execute: Call<ExecuteArgs>,
    pub executable_deserialize_and_load: Call<ExecutableDeserializeAndLoadArgs>,
    pub loaded_executable_fingerprint: Unused,
    pub buffer_destroy: Call<BufferDestroyArgs>,
    pub buffer_element_type: Unused,
    pub buffer_dimensions: Unused,
    pub buffer_unpadded_dimensions: Unused,
    pub buffer_dynamic_dimension_indices: Unused,
    pub buffer_get_memory_layout: Unused,
    pub buffer_on_device_size_in_bytes: Unused,
    pub buffer_device: Unused,
    pub buffer_memory: Unused,
    pub buffer_delete: Unused,
    pub buffer_is_deleted: Unused,
    pub buffer_copy_to_device: Unused,
    pub buffer_to_host_buffer: Call<BufferToHostBufferArgs>,
    pub buffer_is_on_cpu: Unused,
    pub buffer_ready_event: Unused,
    pub buffer_unsafe_pointer: Unused,
    pub buffer_increase_external_reference_count: Unused,
    pub buffer_decrease_external_reference_count: Unused,
    pub buffer_opaque_device_memory_data_pointer: Unused,
    pub copy_to_device_stream_destroy: Unused,
    pub copy_to_device_stream_add_chunk: Unused,
    pub copy_to_device_stream_total_bytes: Unused,
    pub copy_to_device_stream_granule_size: Unused,
    pub copy_to_device_stream_current_bytes: Unused,
    pub topology_description_create: Unused,
    pub topology_description_destroy: Unused,
    pub topology_description_platform_name: Unused,
    pub topology_description_platform_version: Unused,
    pub topology_description_get_device_descriptions: Unused,
    pub topology_description_serialize: Unused,
    pub topology_description_attributes: Unused,
    pub compile: Unused,
    pub executable_output_element_types: Unused,
    pub executable_output_dimensions: Unused,
    pub buffer_copy_to_memory: Unused,
    pub client_create_view_of_device_buffer: Unused,
    pub executable_fingerprint: Unused,
    pub client_topology_description: Unused,
    /// Optional: read only when the plugin's table reaches it (see `Plugin::has`).
    pub executable_get_compiled_memory_stats: Call<ExecutableGetCompiledMemoryStatsArgs>,
}

#[repr(C)]
pub struct ErrorDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub error: *mut PjrtError,
}

#[repr(C)]
pub struct ErrorMessageArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub error: *const PjrtError,
    pub message: *const c_char,
    pub message_size: usize,
}

#[repr(C)]
pub struct ErrorGetCodeArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub error: *const PjrtError,
    pub code: i32,
}

#[repr(C)]
pub struct PluginInitializeArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
}

/// The arguments of `PJRT_Event_Await` and `PJRT_Event_Destroy`.
#[repr(C)]
pub struct EventArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub event: *mut PjrtEvent,
}

/// `PJRT_NamedValue_Type`: `kString`.
pub const NAMED_VALUE_STRING: i32 = 0;
/// `PJRT_NamedValue_Type`: `kInt64`.
pub const NAMED_VALUE_INT64: i32 = 1;
/// `PJRT_NamedValue_Type`: `kFloat` (an `f32`).
pub const NAMED_VALUE_FLOAT: i32 = 3;
/// `PJRT_NamedValue_Type`: `kBool`.
pub const NAMED_VALUE_BOOL: i32 = 4;

/// `PJRT_NamedValue`: `value` is the C union of `string_value` (a pointer), `int64_value`,
/// `float_value` and `bool_value`, each stored from the union's first byte.
#[repr(C)]
pub struct NamedValue {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub name: *const c_char,
    pub name_size: usize,
    pub value_type: i32,
    pub value: u64,
    pub value_size: usize,
}

#[repr(C)]
pub struct ClientCreateArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub create_options: *const NamedValue,
    pub num_options: usize,
    pub kv_get_callback: Call<KeyValueGetArgs>,
    pub kv_get_user_arg: *mut c_void,
    pub kv_put_callback: Call<KeyValuePutArgs>,
    pub kv_put_user_arg: *mut c_void,
    pub client: *mut PjrtClient,
    pub kv_try_get_callback: Call<KeyValueTryGetArgs>,
    pub kv_try_get_user_arg: *mut c_void,
}

/// `PJRT_CallbackError`: makes a `PJRT_Error` for a callback to return.
pub type CallbackError =
    Option<unsafe extern "C" fn(code: i32, message: *const c_char, size: usize) -> *mut PjrtError>;

/// `PJRT_KeyValueGetCallback_ValueDeleter`.
pub type ValueDeleter = Option<unsafe extern "C" fn(value: *mut c_char)>;

/// `PJRT_KeyValueGetCallback_Args`.
#[repr(C)]
pub struct KeyValueGetArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub key: *const c_char,
    pub key_size: usize,
    pub timeout_in_ms: i32,
    pub callback_error: *const CallbackError,
    pub user_arg: *mut c_void,
    pub value: *mut c_char,
    pub value_size: usize,
    pub value_deleter_callback: ValueDeleter,
}

/// `PJRT_KeyValueTryGetCallback_Args`.
#[repr(C)]
pub struct KeyValueTryGetArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub key: *const c_char,
    pub key_size: usize,
    pub callback_error: *const CallbackError,
    pub user_arg: *mut c_void,
    pub value: *mut c_char,
    pub value_size: usize,
    pub value_deleter_callback: ValueDeleter,
}

/// `PJRT_KeyValuePutCallback_Args`.
#[repr(C)]
pub struct KeyValuePutArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub key: *const c_char,
    pub key_size: usize,
    pub value: *const c_char,
    pub value_size: usize,
    pub callback_error: *const CallbackError,
    pub user_arg: *mut c_void,
}

/// `PJRT_Error_Code` values the key-value callbacks return (absl's status codes).
pub const ERROR_CODE_DEADLINE_EXCEEDED: i32 = 4;
/// `PJRT_Error_Code_NOT_FOUND`.
pub const ERROR_CODE_NOT_FOUND: i32 = 5;
/// `PJRT_Error_Code_INTERNAL`.
pub const ERROR_CODE_INTERNAL: i32 = 13;
/// `PJRT_Error_Code_UNAVAILABLE`.
pub const ERROR_CODE_UNAVAILABLE: i32 = 14;

#[repr(C)]
pub struct ClientDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PjrtClient,
}

#[repr(C)]
pub struct ClientPlatformNameArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PjrtClient,
    pub platform_name: *const c_char,
    pub platform_name_size: usize,
}

/// `PJRT_Client_PlatformVersion_Args`: the same layout as the platform name's.
pub type ClientPlatformVersionArgs = ClientPlatformNameArgs;

#[repr(C)]
pub struct ClientDevicesArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PjrtClient,
    pub devices: *const *mut PjrtDevice,
    pub num_devices: usize,
}

#[repr(C)]
pub struct Program {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub code: *const c_char,
    pub code_size: usize,
    pub format: *const c_char,
    pub format_size: usize,
}

#[repr(C)]
pub struct ClientCompileArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PjrtClient,
    pub program: *const Program,
    pub compile_options: *const c_char,
    pub compile_options_size: usize,
    pub executable: *mut PjrtLoadedExecutable,
}

/// `PJRT_HostBufferSemantics_kImmutableOnlyDuringCall`: the plugin copies the data during the call.
pub const HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: i32 = 0;

#[repr(C)]
pub struct BufferFromHostBufferArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PjrtClient,
    pub data: *const c_void,
    pub element_type: i32,
    pub dims: *const i64,
    pub num_dims: usize,
    pub byte_strides: *const i64,
    pub num_byte_strides: usize,
    pub host_buffer_semantics: i32,
    pub device: *mut PjrtDevice,
    pub memory: *mut c_void,
    pub device_layout: *mut c_void,
    pub done_with_host_buffer: *mut PjrtEvent,
    pub buffer: *mut PjrtBuffer,
}

#[repr(C)]
pub struct DeviceGetDescriptionArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device: *mut PjrtDevice,
    pub device_description: *mut PjrtDeviceDescription,
}

#[repr(C)]
pub struct DeviceDescriptionIdArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device_description: *mut PjrtDeviceDescription,
    pub id: i32,
}

#[repr(C)]
pub struct DeviceDescriptionDebugStringArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device_description: *mut PjrtDeviceDescription,
    pub debug_string: *const c_char,
    pub debug_string_size: usize,
}

/// `PJRT_DeviceDescription_Kind_Args`: the same layout as the debug string's.
pub type DeviceDescriptionKindArgs = DeviceDescriptionDebugStringArgs;

#[repr(C)]
pub struct ExecutableDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PjrtExecutable,
}

/// `PJRT_Executable_GetCompiledMemoryStats_Args` (the device fields, the host ones, then the
/// peak and total added later: plugins of API 0.106 require the peak).
#[repr(C)]
pub struct ExecutableGetCompiledMemoryStatsArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PjrtExecutable,
    pub generated_code_size_in_bytes: i64,
    pub argument_size_in_bytes: i64,
    pub output_size_in_bytes: i64,
    pub alias_size_in_bytes: i64,
    pub temp_size_in_bytes: i64,
    pub host_generated_code_size_in_bytes: i64,
    pub host_argument_size_in_bytes: i64,
    pub host_output_size_in_bytes: i64,
    pub host_alias_size_in_bytes: i64,
    pub host_temp_size_in_bytes: i64,
    pub peak_memory_in_bytes: i64,
    pub total_size_in_bytes: i64,
}

#[repr(C)]
pub struct ExecutableNumOutputsArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PjrtExecutable,
    pub num_outputs: usize,
}

#[repr(C)]
pub struct LoadedExecutableDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PjrtLoadedExecutable,
}

/// An executable's serialization, owned by the plugin until its deleter runs.
pub enum PjrtSerializedExecutable {}

/// `PJRT_Executable_Serialize_Args`.
#[repr(C)]
pub struct ExecutableSerializeArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *const PjrtExecutable,
    pub serialized_bytes: *const c_char,
    pub serialized_bytes_size: usize,
    pub serialized_executable: *mut PjrtSerializedExecutable,
    pub serialized_executable_deleter: Option<unsafe extern "C" fn(*mut PjrtSerializedExecutable)>,
}

/// `PJRT_Executable_DeserializeAndLoad_Args` (the compile-option override and load options
/// added after 0.90 stay zero: not set).
#[repr(C)]
pub struct ExecutableDeserializeAndLoadArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PjrtClient,
    pub serialized_executable: *const c_char,
    pub serialized_executable_size: usize,
    pub loaded_executable: *mut PjrtLoadedExecutable,
    pub _tail: [usize; 3],
}

#[repr(C)]
pub struct LoadedExecutableGetExecutableArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub loaded_executable: *mut PjrtLoadedExecutable,
    pub executable: *mut PjrtExecutable,
}

/// `PJRT_ExecuteOptions`: no send/receive callbacks, launch id 0, every input donatable.
#[repr(C)]
pub struct ExecuteOptions {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub send_callbacks: *mut c_void,
    pub recv_callbacks: *mut c_void,
    pub num_send_ops: usize,
    pub num_recv_ops: usize,
    pub launch_id: i32,
    pub _tail: [usize; 7],
}

#[repr(C)]
pub struct ExecuteArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PjrtLoadedExecutable,
    pub options: *mut ExecuteOptions,
    pub argument_lists: *const *const *mut PjrtBuffer,
    pub num_devices: usize,
    pub num_args: usize,
    pub output_lists: *const *mut *mut PjrtBuffer,
    pub device_complete_events: *mut *mut PjrtEvent,
    pub execute_device: *mut PjrtDevice,
}

#[repr(C)]
pub struct BufferDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut PjrtBuffer,
}

#[repr(C)]
pub struct BufferToHostBufferArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub src: *mut PjrtBuffer,
    pub host_layout: *mut c_void,
    pub dst: *mut c_void,
    pub dst_size: usize,
    pub event: *mut PjrtEvent,
}

/// Returns a zeroed argument struct whose `struct_size` is set.
///
/// # Safety
/// `T` must be one of the `#[repr(C)]` argument structs above: plain data, first field
/// `struct_size: usize`, for which all-zero bytes are a valid value.
pub unsafe fn args<T>() -> T {
    // SAFETY: the caller guarantees that zero bytes are a valid `T`.
    let mut value: T = unsafe { std::mem::zeroed() };
    // SAFETY: every argument struct starts with `struct_size: usize`.
    unsafe { *(&mut value as *mut T as *mut usize) = std::mem::size_of::<T>() };
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_the_header() {
        assert_eq!(offset_of!(Api, version) + offset_of!(ApiVersion, major), 32);
        assert_eq!(offset_of!(Api, error_destroy), 40);
        assert_eq!(offset_of!(Api, event_await), 104);
        assert_eq!(offset_of!(Api, client_create), 120);
        assert_eq!(offset_of!(Api, client_addressable_devices), 168);
        assert_eq!(offset_of!(Api, client_compile), 200);
        assert_eq!(offset_of!(Api, client_buffer_from_host_buffer), 216);
        assert_eq!(offset_of!(Api, client_platform_name), 136);
        assert_eq!(offset_of!(Api, client_platform_version), 152);
        assert_eq!(offset_of!(Api, device_description_kind), 248);
        assert_eq!(offset_of!(Api, device_description_debug_string), 256);
        assert_eq!(offset_of!(Api, device_get_description), 272);
        assert_eq!(offset_of!(Api, executable_destroy), 360);
        assert_eq!(offset_of!(Api, executable_num_outputs), 392);
        assert_eq!(offset_of!(Api, loaded_executable_destroy), 440);
        assert_eq!(offset_of!(Api, loaded_executable_execute), 480);
        assert_eq!(offset_of!(Api, buffer_destroy), 504);
        assert_eq!(offset_of!(Api, buffer_to_host_buffer), 600);
        assert_eq!(size_of::<ClientCreateArgs>(), 88);
        assert_eq!(size_of::<ClientCompileArgs>(), 56);
        assert_eq!(size_of::<Program>(), 48);
        assert_eq!(size_of::<BufferFromHostBufferArgs>(), 120);
        assert_eq!(size_of::<ExecuteArgs>(), 80);
        assert_eq!(size_of::<ExecuteOptions>(), 112);
        assert_eq!(size_of::<BufferToHostBufferArgs>(), 56);
        assert_eq!(size_of::<NamedValue>(), 56);
        assert_eq!(size_of::<ErrorMessageArgs>(), 40);
        assert_eq!(size_of::<EventArgs>(), 24);
    }
}
