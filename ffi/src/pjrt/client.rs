use std::ffi::c_char;
use std::ptr::NonNull;
use std::sync::Arc;

use super::event;
use super::key_value::{Callbacks, Distributed};
use super::raw;
use super::{
    Buffer, CompileOptions, ElementType, LoadedExecutable, OptionValue, PjrtError, Plugin,
};

/// The program formats `PJRT_Client_Compile` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramFormat {
    /// A serialized `HloModuleProto`.
    Hlo,
    /// StableHLO, as MLIR text or bytecode.
    Mlir,
}

impl ProgramFormat {
    fn name(self) -> &'static str {
        match self {
            ProgramFormat::Hlo => "hlo",
            ProgramFormat::Mlir => "mlir",
        }
    }
}

/// A client creation option (`PJRT_NamedValue`), e.g. the XLA CPU plugin's `cpu_device_count`
/// or the CUDA plugin's `preallocate`. The CUDA plugin refuses a name or a type it does not
/// expect; the XLA CPU plugin ignores unknown names and aborts on a mistyped known one.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateOption {
    /// The option's name.
    pub name: String,
    /// Its value: a boolean, an integer, a float (passed as `f32`) or a string.
    pub value: OptionValue,
}

impl CreateOption {
    /// The option `name` = `value`.
    pub fn new(name: &str, value: OptionValue) -> Self {
        Self {
            name: name.to_string(),
            value,
        }
    }

    /// The `PJRT_NamedValue` of this option, borrowing its name and string.
    fn named_value(&self) -> raw::NamedValue {
        // SAFETY: a valid zeroed struct.
        let mut named = unsafe { raw::args::<raw::NamedValue>() };
        named.name = self.name.as_ptr() as *const c_char;
        named.name_size = self.name.len();
        named.value_size = 1;
        (named.value_type, named.value) = match &self.value {
            OptionValue::Bool(value) => (raw::NAMED_VALUE_BOOL, union_of(&[u8::from(*value)])),
            OptionValue::Int(value) => (raw::NAMED_VALUE_INT64, union_of(&value.to_ne_bytes())),
            OptionValue::Float(value) => (
                raw::NAMED_VALUE_FLOAT,
                union_of(&(*value as f32).to_ne_bytes()),
            ),
            OptionValue::Text(text) => {
                named.value_size = text.len();
                let pointer = text.as_ptr() as usize;
                (raw::NAMED_VALUE_STRING, union_of(&pointer.to_ne_bytes()))
            }
        };
        named
    }
}

/// The 8 bytes of a C union whose member is `bytes`, stored from its first byte.
fn union_of(bytes: &[u8]) -> u64 {
    let mut union = [0u8; 8];
    union[..bytes.len()].copy_from_slice(bytes);
    u64::from_ne_bytes(union)
}

/// The plugin-side client; destroyed when the last [`Client`], buffer or executable goes.
pub(crate) struct ClientHandle {
    pub(crate) plugin: Arc<Plugin>,
    pub(crate) raw: *mut raw::PjrtClient,
    /// The key-value callbacks' state of a client joining a job: freed after the client.
    key_value: Option<NonNull<Callbacks>>,
}

// SAFETY: PJRT clients are thread-safe.
unsafe impl Send for ClientHandle {}
// SAFETY: as above.
unsafe impl Sync for ClientHandle {}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        // SAFETY: a valid zeroed argument struct; `raw` is owned by this value.
        let mut args = unsafe { raw::args::<raw::ClientDestroyArgs>() };
        args.client = self.raw;
        if let Err(error) = self.plugin.call(
            "PJRT_Client_Destroy",
            self.plugin.api().client_destroy,
            &mut args,
        ) {
            // The client may live on and call the callbacks: their state stays (leaked).
            log::warn!("{error}");
            return;
        }
        if let Some(state) = self.key_value.take() {
            // SAFETY: the client is destroyed, so the plugin no longer calls the callbacks.
            unsafe { Callbacks::free(state) };
        }
    }
}

/// A PJRT client: the devices of one plugin, and what compiles and moves data for them.
#[derive(Clone)]
pub struct Client {
    handle: Arc<ClientHandle>,
    devices: Vec<Device>,
}

/// An addressable device of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    raw: *mut raw::PjrtDevice,
    /// The device id (`PJRT_DeviceDescription_Id`), used in device assignments.
    pub id: i64,
}

// SAFETY: a device handle is owned by its client and valid while the client lives; PJRT devices
// are thread-safe.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Client {
    /// Creates a client of `plugin` with the given creation options.
    pub fn new(plugin: &Arc<Plugin>, options: &[CreateOption]) -> Result<Client, PjrtError> {
        Self::create(plugin, options, None)
    }

    /// Creates a client of `plugin` that joins the other processes of a job: `node_id` and
    /// `num_nodes` are added to `options` and the key-value callbacks point at the job's store.
    /// A plugin that cannot span processes ignores both and makes a client of its own devices
    /// only: compare [`Client::global_devices`] with [`Client::devices`] to tell.
    pub fn joining(
        plugin: &Arc<Plugin>,
        options: &[CreateOption],
        distributed: &Distributed,
    ) -> Result<Client, PjrtError> {
        Self::create(plugin, options, Some(distributed))
    }

    fn create(
        plugin: &Arc<Plugin>,
        options: &[CreateOption],
        distributed: Option<&Distributed>,
    ) -> Result<Client, PjrtError> {
        let mut options = options.to_vec();
        if let Some(distributed) = distributed {
            for (name, value) in [
                ("node_id", distributed.node_id),
                ("num_nodes", distributed.num_nodes),
            ] {
                options.push(CreateOption::new(name, OptionValue::Int(value as i64)));
            }
        }
        let values: Vec<raw::NamedValue> = options.iter().map(CreateOption::named_value).collect();
        // SAFETY: a valid zeroed argument struct; `values` outlives the call.
        let mut args = unsafe { raw::args::<raw::ClientCreateArgs>() };
        args.create_options = values.as_ptr();
        args.num_options = values.len();
        let key_value = distributed.map(|distributed| Callbacks::leak(distributed.store.clone()));
        if let Some(state) = key_value {
            Callbacks::install(state, &mut args);
        }
        if let Err(error) = plugin.call("PJRT_Client_Create", plugin.api().client_create, &mut args)
        {
            if let Some(state) = key_value {
                // SAFETY: no client was made, so nothing calls the callbacks.
                unsafe { Callbacks::free(state) };
            }
            return Err(error);
        }
        let handle = Arc::new(ClientHandle {
            plugin: plugin.clone(),
            raw: args.client,
            key_value,
        });
        let devices = list_devices(&handle, DeviceList::Addressable)?;
        Ok(Client { handle, devices })
    }

    /// Every device of the client, its own and those of the other processes of its job, in
    /// the plugin's order (`PJRT_Client_Devices`).
    pub fn global_devices(&self) -> Result<Vec<Device>, PjrtError> {
        list_devices(&self.handle, DeviceList::Global)
    }

    /// The platform name reported by the plugin (`cpu`, `cuda`, `neuron`, ...).
    pub fn platform_name(&self) -> Result<String, PjrtError> {
        let plugin = &self.handle.plugin;
        // SAFETY: a valid zeroed argument struct.
        let mut args = unsafe { raw::args::<raw::ClientPlatformNameArgs>() };
        args.client = self.handle.raw;
        plugin.call(
            "PJRT_Client_PlatformName",
            plugin.api().client_platform_name,
            &mut args,
        )?;
        // SAFETY: the plugin returned a string of that size owned by the client.
        Ok(unsafe { string(args.platform_name, args.platform_name_size) })
    }

    /// The platform version reported by the plugin (for the CPU plugin, its build; for GPU
    /// plugins, the driver and runtime versions).
    pub fn platform_version(&self) -> Result<String, PjrtError> {
        let plugin = &self.handle.plugin;
        // SAFETY: a valid zeroed argument struct.
        let mut args = unsafe { raw::args::<raw::ClientPlatformVersionArgs>() };
        args.client = self.handle.raw;
        plugin.call(
            "PJRT_Client_PlatformVersion",
            plugin.api().client_platform_version,
            &mut args,
        )?;
        // SAFETY: the plugin returned a string of that size owned by the client.
        Ok(unsafe { string(args.platform_name, args.platform_name_size) })
    }

    /// The kind of `device` (`cpu`, `NVIDIA H100 80GB HBM3`, ...), what the code compiled for it
    /// is specific to.
    pub fn device_kind(&self, device: &Device) -> Result<String, PjrtError> {
        let plugin = &self.handle.plugin;
        let description = device_description(&self.handle, device.raw)?;
        // SAFETY: a valid zeroed argument struct.
        let mut args = unsafe { raw::args::<raw::DeviceDescriptionKindArgs>() };
        args.device_description = description;
        plugin.call(
            "PJRT_DeviceDescription_Kind",
            plugin.api().device_description_kind,
            &mut args,
        )?;
        // SAFETY: the plugin returned a string of that size owned by the device.
        Ok(unsafe { string(args.debug_string, args.debug_string_size) })
    }

    /// The devices this client can run on, in the plugin's order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// A readable description of `device`.
    pub fn describe(&self, device: &Device) -> Result<String, PjrtError> {
        let plugin = &self.handle.plugin;
        let description = device_description(&self.handle, device.raw)?;
        // SAFETY: a valid zeroed argument struct.
        let mut args = unsafe { raw::args::<raw::DeviceDescriptionDebugStringArgs>() };
        args.device_description = description;
        plugin.call(
            "PJRT_DeviceDescription_DebugString",
            plugin.api().device_description_debug_string,
            &mut args,
        )?;
        // SAFETY: the plugin returned a string of that size owned by the device.
        Ok(unsafe { string(args.debug_string, args.debug_string_size) })
    }

    /// Compiles `code` (in `format`) with `options`.
    pub fn compile(
        &self,
        code: &[u8],
        format: ProgramFormat,
        options: &CompileOptions,
    ) -> Result<LoadedExecutable, PjrtError> {
        let plugin = &self.handle.plugin;
        let format = format.name();
        let options = options.encode();
        // SAFETY: valid zeroed argument structs; every pointer outlives the call.
        let mut program = unsafe { raw::args::<raw::Program>() };
        program.code = code.as_ptr() as *const c_char;
        program.code_size = code.len();
        program.format = format.as_ptr() as *const c_char;
        program.format_size = format.len();
        let mut args = unsafe { raw::args::<raw::ClientCompileArgs>() };
        args.client = self.handle.raw;
        args.program = &program;
        args.compile_options = options.as_ptr() as *const c_char;
        args.compile_options_size = options.len();
        plugin.call(
            "PJRT_Client_Compile",
            plugin.api().client_compile,
            &mut args,
        )?;
        LoadedExecutable::new(self.handle.clone(), args.executable)
    }

    /// Loads a program serialized by [`LoadedExecutable::serialize`] (with the same plugin and
    /// compile options), without compiling it again.
    pub fn load_serialized(&self, serialized: &[u8]) -> Result<LoadedExecutable, PjrtError> {
        let plugin = &self.handle.plugin;
        // SAFETY: a valid zeroed argument struct; `serialized` outlives the call.
        let mut args = unsafe { raw::args::<raw::ExecutableDeserializeAndLoadArgs>() };
        args.client = self.handle.raw;
        args.serialized_executable = serialized.as_ptr() as *const c_char;
        args.serialized_executable_size = serialized.len();
        plugin.call(
            "PJRT_Executable_DeserializeAndLoad",
            plugin.api().executable_deserialize_and_load,
            &mut args,
        )?;
        LoadedExecutable::new(self.handle.clone(), args.loaded_executable)
    }

    /// Copies host data (dense, row-major, `dims` of `element_type`) to `device`.
    pub fn buffer_from_host(
        &self,
        data: &[u8],
        element_type: ElementType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer, PjrtError> {
        let elements: i64 = dims.iter().product();
        let expected = elements as usize * element_type.size_in_bytes();
        if dims.iter().any(|dim| *dim < 0) || data.len() != expected {
            return Err(PjrtError::InvalidRequest(format!(
                "{} bytes of host data for a {element_type:?} buffer of dimensions {dims:?} ({expected} bytes)",
                data.len()
            )));
        }
        let plugin = &self.handle.plugin;
        // SAFETY: a valid zeroed argument struct; `data` and `dims` outlive the call, and the
        // semantics ask the plugin to copy the data before returning.
        let mut args = unsafe { raw::args::<raw::BufferFromHostBufferArgs>() };
        args.client = self.handle.raw;
        args.data = data.as_ptr().cast();
        args.element_type = element_type.code();
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = raw::HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL;
        args.device = device.raw;
        plugin.call(
            "PJRT_Client_BufferFromHostBuffer",
            plugin.api().client_buffer_from_host_buffer,
            &mut args,
        )?;
        let buffer = Buffer::new(self.handle.clone(), args.buffer);
        event::wait(
            plugin,
            args.done_with_host_buffer,
            "PJRT_Client_BufferFromHostBuffer",
        )?;
        Ok(buffer)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "Client({:?}, {} devices)",
            self.handle.plugin,
            self.devices.len()
        )
    }
}

fn device_description(
    handle: &ClientHandle,
    device: *mut raw::PjrtDevice,
) -> Result<*mut raw::PjrtDeviceDescription, PjrtError> {
    // SAFETY: a valid zeroed argument struct.
    let mut args = unsafe { raw::args::<raw::DeviceGetDescriptionArgs>() };
    args.device = device;
    handle.plugin.call(
        "PJRT_Device_GetDescription",
        handle.plugin.api().device_get_description,
        &mut args,
    )?;
    Ok(args.device_description)
}

/// Which devices [`list_devices`] lists.
#[derive(Clone, Copy)]
enum DeviceList {
    /// Those this process runs on.
    Addressable,
    /// Those of every process of the client's job.
    Global,
}

fn list_devices(handle: &ClientHandle, list: DeviceList) -> Result<Vec<Device>, PjrtError> {
    let plugin = &handle.plugin;
    // SAFETY: a valid zeroed argument struct.
    let mut args = unsafe { raw::args::<raw::ClientDevicesArgs>() };
    args.client = handle.raw;
    let (function, entry) = match list {
        DeviceList::Addressable => (
            "PJRT_Client_AddressableDevices",
            plugin.api().client_addressable_devices,
        ),
        DeviceList::Global => ("PJRT_Client_Devices", plugin.api().client_devices),
    };
    plugin.call(function, entry, &mut args)?;
    let raw_devices = if args.num_devices == 0 {
        &[][..]
    } else {
        // SAFETY: the plugin returned an array of that length owned by the client.
        unsafe { std::slice::from_raw_parts(args.devices, args.num_devices) }
    };
    raw_devices
        .iter()
        .map(|&device| {
            let description = device_description(handle, device)?;
            // SAFETY: a valid zeroed argument struct.
            let mut id_args = unsafe { raw::args::<raw::DeviceDescriptionIdArgs>() };
            id_args.device_description = description;
            plugin.call(
                "PJRT_DeviceDescription_Id",
                plugin.api().device_description_id,
                &mut id_args,
            )?;
            Ok(Device {
                raw: device,
                id: id_args.id as i64,
            })
        })
        .collect()
}

/// Copies a string returned by the plugin.
///
/// # Safety
/// `text` must point to `size` readable bytes, or be null.
unsafe fn string(text: *const c_char, size: usize) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(text as *const u8, size) };
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of value is sent as `pjrt_c_api.h` lays out `PJRT_NamedValue`: its type code
    /// (`kString` 0, `kInt64` 1, `kFloat` 3, `kBool` 4) and the union member from its first
    /// byte. (The XLA CPU plugin reads an option's value by its type code without checking it:
    /// a mistyped `cpu_device_count` aborts the process; the CUDA plugin refuses it.)
    #[test]
    fn values_are_laid_out_as_the_c_api_reads_them() {
        let first_bytes =
            |named: &raw::NamedValue, count: usize| named.value.to_ne_bytes()[..count].to_vec();
        let flag = CreateOption::new("preallocate", OptionValue::Bool(true)).named_value();
        assert_eq!((flag.value_type, flag.value_size), (4, 1));
        assert_eq!(first_bytes(&flag, 8), [1, 0, 0, 0, 0, 0, 0, 0]);
        let fraction = CreateOption::new("memory_fraction", OptionValue::Float(0.5)).named_value();
        assert_eq!((fraction.value_type, fraction.value_size), (3, 1));
        assert_eq!(first_bytes(&fraction, 4), 0.5f32.to_ne_bytes());
        let count = CreateOption::new("cpu_device_count", OptionValue::Int(-3)).named_value();
        assert_eq!((count.value_type, count.value_size), (1, 1));
        assert_eq!(count.value.to_ne_bytes(), (-3i64).to_ne_bytes());
        let option = CreateOption::new("allocator", OptionValue::Text("cuda_async".into()));
        let text = option.named_value();
        assert_eq!((text.value_type, text.value_size), (0, "cuda_async".len()));
        let OptionValue::Text(value) = &option.value else {
            unreachable!()
        };
        assert_eq!(text.value as usize, value.as_ptr() as usize);
        assert_eq!(text.name_size, "allocator".len());
    }
}
