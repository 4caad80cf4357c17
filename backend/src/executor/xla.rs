//! The `xla` executor: lowers each segment to one HLO module, compiles it once through a PJRT
//! plugin (`TRAINIUM_PJRT_PLUGIN`), and runs it on one PJRT device. Tensors stay on the device
//! between segments; operations without a lowering run on the host executor one at a time.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use burn_backend::{DType, Shape, TensorData};
use burn_ir::{TensorId, TensorIr};
use trainium_ffi::pjrt::{
    Buffer, Client, CompileOptions, CreateOption, Device, ElementType, LoadedExecutable, Plugin,
    ProgramFormat,
};

use super::device::DeviceExecutor;
use super::{Executor, HostExecutor};
use crate::lower::{self, LowerOptions, LoweredProgram, StructuralKey};
use crate::segment::Segment;
use crate::stats::StatsCounters;
use crate::{BackendError, TrainiumDevice};

/// The environment variable holding the path of the PJRT plugin (a shared library).
pub const PLUGIN_ENV: &str = "TRAINIUM_PJRT_PLUGIN";

/// The environment variable setting how many devices the XLA CPU plugin creates (default 2).
pub const CPU_DEVICES_ENV: &str = "TRAINIUM_PJRT_CPU_DEVICES";

/// How many compiled programs each device keeps.
pub const COMPILE_CACHE_CAPACITY: usize = 256;

/// How many HLO instructions the programs a device keeps may hold together. Compiled code is
/// mapped into the process (the XLA CPU plugin maps a few regions per kernel) and the kernel
/// count grows with the instruction count: without this bound, hundreds of large programs
/// exhaust the process's memory mappings and LLVM aborts.
pub const COMPILE_CACHE_INSTRUCTIONS: usize = 16_384;

const EXECUTOR: &str = "xla";

fn failure(reason: impl ToString) -> BackendError {
    BackendError::Execution {
        executor: EXECUTOR,
        reason: reason.to_string(),
    }
}

/// The plugin and its one client, shared by every `xla` device of the process.
struct Runtime {
    client: Client,
}

/// Loads the plugin named by `TRAINIUM_PJRT_PLUGIN` once and creates its client.
fn runtime() -> Result<Arc<Runtime>, BackendError> {
    static RUNTIMES: OnceLock<Mutex<HashMap<PathBuf, Arc<Runtime>>>> = OnceLock::new();
    let unavailable = |reason: String| BackendError::ExecutorUnavailable {
        executor: EXECUTOR,
        reason,
    };
    let path = std::env::var_os(PLUGIN_ENV)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            unavailable(format!(
                "{PLUGIN_ENV} is not set: point it at a PJRT plugin (for the XLA CPU plugin, run \
                 `../shared/scripts/install-xla-cpu` and use the path it prints)"
            ))
        })?;
    let mut runtimes = RUNTIMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(runtime) = runtimes.get(&path) {
        return Ok(runtime.clone());
    }
    let plugin =
        Plugin::load(&path).map_err(|error| unavailable(format!("{error} (from {PLUGIN_ENV})")))?;
    let cpu_devices = match std::env::var(CPU_DEVICES_ENV) {
        Ok(value) => value
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|count| *count > 0)
            .ok_or_else(|| {
                unavailable(format!(
                    "{CPU_DEVICES_ENV}=`{value}` is not a positive device count"
                ))
            })?,
        Err(_) => 2,
    };
    // Plugins ignore options they do not know: this one only sizes the XLA CPU client.
    let options = [CreateOption {
        name: "cpu_device_count".into(),
        value: cpu_devices,
    }];
    let client = Client::new(&plugin, &options).map_err(|error| unavailable(error.to_string()))?;
    log::info!(
        "PJRT client on {} with {} devices",
        client
            .platform_name()
            .unwrap_or_else(|error| error.to_string()),
        client.devices().len()
    );
    let runtime = Arc::new(Runtime { client });
    runtimes.insert(path, runtime.clone());
    Ok(runtime)
}

/// The PJRT element type of a Burn dtype.
fn element_type(dtype: DType) -> Result<ElementType, BackendError> {
    Ok(match dtype {
        DType::F64 => ElementType::F64,
        DType::F32 | DType::Flex32 => ElementType::F32,
        DType::F16 => ElementType::F16,
        DType::BF16 => ElementType::BF16,
        DType::I64 => ElementType::S64,
        DType::I32 => ElementType::S32,
        DType::I16 => ElementType::S16,
        DType::I8 => ElementType::S8,
        DType::U64 => ElementType::U64,
        DType::U32 => ElementType::U32,
        DType::U16 => ElementType::U16,
        DType::U8 => ElementType::U8,
        DType::Bool(burn_backend::BoolStore::Native | burn_backend::BoolStore::U8) => {
            ElementType::Pred
        }
        other => {
            return Err(BackendError::Unsupported {
                executor: EXECUTOR,
                what: format!("tensors of dtype {other:?}"),
            });
        }
    })
}

/// A tensor held by the device.
struct DeviceTensor {
    buffer: Buffer,
    shape: Shape,
    dtype: DType,
}

/// A compiled program and the module it was compiled from (compared on every hit, so a hash
/// collision can never run the wrong program).
struct CachedProgram {
    module: Vec<u8>,
    executable: Arc<LoadedExecutable>,
    instructions: usize,
    last_use: u64,
}

/// Compiled programs of one device, keyed by structural key, least recently used evicted
/// beyond [`COMPILE_CACHE_CAPACITY`] programs or [`COMPILE_CACHE_INSTRUCTIONS`] instructions.
#[derive(Default)]
struct ProgramCache {
    programs: HashMap<StructuralKey, CachedProgram>,
    instructions: usize,
    clock: u64,
}

impl ProgramCache {
    fn get(&mut self, program: &LoweredProgram) -> Option<Arc<LoadedExecutable>> {
        self.clock += 1;
        let entry = self.programs.get_mut(&program.key)?;
        if entry.module != program.bytes {
            return None;
        }
        entry.last_use = self.clock;
        Some(entry.executable.clone())
    }

    fn insert(&mut self, program: &LoweredProgram, executable: Arc<LoadedExecutable>) {
        let instructions = program
            .module
            .computations
            .iter()
            .map(|computation| computation.instructions.len())
            .sum();
        while !self.programs.is_empty()
            && (self.programs.len() >= COMPILE_CACHE_CAPACITY
                || self.instructions + instructions > COMPILE_CACHE_INSTRUCTIONS)
        {
            let oldest = self
                .programs
                .iter()
                .min_by_key(|(_, entry)| entry.last_use)
                .map(|(key, _)| *key)
                .expect("the cache is not empty");
            if let Some(evicted) = self.programs.remove(&oldest) {
                self.instructions -= evicted.instructions;
            }
        }
        self.instructions += instructions;
        let replaced = self.programs.insert(
            program.key,
            CachedProgram {
                module: program.bytes.clone(),
                executable,
                instructions,
                last_use: self.clock,
            },
        );
        if let Some(replaced) = replaced {
            self.instructions -= replaced.instructions;
        }
    }
}

/// Runs segments as compiled HLO programs on one PJRT device.
pub(crate) struct XlaExecutor {
    device: TrainiumDevice,
    runtime: Arc<Runtime>,
    pjrt_device: Device,
    tensors: HashMap<TensorId, DeviceTensor>,
    cache: ProgramCache,
    counters: Arc<StatsCounters>,
    /// The Threefry key of random tensors drawn on the device (set by `seed`).
    random_key: u64,
    /// Random states handed out so far under `random_key`.
    random_counter: u64,
}

impl XlaExecutor {
    /// Opens `device` (`xla:N` is the N-th addressable device of the plugin's client).
    pub fn new(
        device: &TrainiumDevice,
        counters: Arc<StatsCounters>,
    ) -> Result<Self, BackendError> {
        let runtime = runtime()?;
        let devices = runtime.client.devices();
        let pjrt_device = *devices.get(device.index as usize).ok_or_else(|| BackendError::ExecutorUnavailable {
            executor: EXECUTOR,
            reason: format!(
                "device {device} does not exist: the PJRT client has {} devices (the XLA CPU plugin makes \
                 {CPU_DEVICES_ENV} of them)",
                devices.len()
            ),
        })?;
        Ok(Self {
            device: *device,
            runtime,
            pjrt_device,
            tensors: HashMap::new(),
            cache: ProgramCache::default(),
            counters,
            random_key: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_nanos() as u64),
            random_counter: 0,
        })
    }

    fn upload(&self, data: &TensorData) -> Result<DeviceTensor, BackendError> {
        let element = element_type(data.dtype)?;
        let dims: Vec<i64> = data.shape.iter().map(|&d| d as i64).collect();
        let buffer = self
            .runtime
            .client
            .buffer_from_host(data.as_bytes(), element, &dims, &self.pjrt_device)
            .map_err(failure)?;
        StatsCounters::add(&self.counters.bytes_to_device, data.as_bytes().len() as u64);
        Ok(DeviceTensor {
            buffer,
            shape: data.shape.clone(),
            dtype: data.dtype,
        })
    }

    fn download(&self, id: TensorId) -> Result<TensorData, BackendError> {
        let tensor = self
            .tensors
            .get(&id)
            .ok_or_else(|| failure(format!("tensor {id} is not on {}", self.device)))?;
        let size = tensor.shape.num_elements() * element_type(tensor.dtype)?.size_in_bytes();
        let mut bytes = vec![0u8; size];
        tensor.buffer.copy_to_host(&mut bytes).map_err(failure)?;
        StatsCounters::add(&self.counters.bytes_to_host, size as u64);
        Ok(TensorData::from_bytes_vec(
            bytes,
            tensor.shape.clone(),
            tensor.dtype,
        ))
    }

    /// The executable of `program`, compiled on a cache miss.
    fn executable(
        &mut self,
        program: &LoweredProgram,
    ) -> Result<Arc<LoadedExecutable>, BackendError> {
        if let Some(executable) = self.cache.get(program) {
            StatsCounters::add(&self.counters.cache_hits, 1);
            return Ok(executable);
        }
        if let Err(error) = lower::dump_module(program) {
            log::warn!("could not dump {}: {error}", program.module.name);
        }
        let start = Instant::now();
        let options = CompileOptions::on_device(self.pjrt_device.id);
        let executable = self
            .runtime
            .client
            .compile(&program.bytes, ProgramFormat::Hlo, &options)
            .map_err(|error| failure(format!("compiling {}: {error}", program.module.name)))?;
        let elapsed = start.elapsed();
        StatsCounters::add(&self.counters.compiles, 1);
        StatsCounters::add(&self.counters.compile_micros, elapsed.as_micros() as u64);
        log::info!(
            "{}: compiled {} ({} inputs, {} scalar packs, {} outputs) in {:.1} ms",
            self.device,
            program.module.name,
            program.inputs.len(),
            program.scalars.len(),
            program.outputs.len(),
            elapsed.as_secs_f64() * 1e3
        );
        let executable = Arc::new(executable);
        self.cache.insert(program, executable.clone());
        Ok(executable)
    }

    /// Runs a lowered program: inputs from the device, hoisted scalars uploaded, outputs kept.
    fn execute(&mut self, program: &LoweredProgram) -> Result<(), BackendError> {
        if !program.outputs.is_empty() {
            let executable = self.executable(program)?;
            let scalars = program
                .scalars
                .iter()
                .map(|data| self.upload(data))
                .collect::<Result<Vec<_>, _>>()?;
            let mut scalars = scalars;
            if program.random_draws > 0 {
                let states: Vec<u64> = (0..program.random_draws)
                    .flat_map(|_| {
                        self.random_counter += 1;
                        [self.random_key, self.random_counter]
                    })
                    .collect();
                scalars.push(self.upload(&TensorData::new(states, [2 * program.random_draws]))?);
            }
            let mut arguments = Vec::with_capacity(program.inputs.len() + scalars.len());
            for input in &program.inputs {
                let tensor = self.tensors.get(&input.id).ok_or_else(|| {
                    failure(format!(
                        "input tensor {} is not on {}",
                        input.id, self.device
                    ))
                })?;
                arguments.push(&tensor.buffer);
            }
            arguments.extend(scalars.iter().map(|scalar| &scalar.buffer));
            let outputs = executable
                .execute(&arguments)
                .map_err(|error| failure(format!("running {}: {error}", program.module.name)))?;
            for (tensor, buffer) in program.outputs.iter().zip(outputs) {
                self.tensors.insert(
                    tensor.id,
                    DeviceTensor {
                        buffer,
                        shape: tensor.shape.clone(),
                        dtype: tensor.dtype,
                    },
                );
            }
        }
        for id in &program.released {
            self.tensors.remove(id);
        }
        Ok(())
    }
}

impl Executor for XlaExecutor {
    fn register_data(&mut self, id: TensorId, data: TensorData) -> Result<(), BackendError> {
        self.upload_as(id, &data)
    }

    fn run(&mut self, segment: Segment) -> Result<(), BackendError> {
        let options = LowerOptions {
            random_on_device: true,
        };
        self.run_planned(segment.operations(), &options)
    }

    fn read(&mut self, tensor: &TensorIr) -> Result<TensorData, BackendError> {
        self.read_tensor(tensor)
    }

    fn seed(&mut self, seed: u64) {
        self.random_key = seed;
        self.random_counter = 0;
        // Operations that fall back to the host draw from the host's generator.
        HostExecutor::new().seed(seed);
    }
}

impl DeviceExecutor for XlaExecutor {
    fn device(&self) -> TrainiumDevice {
        self.device
    }

    fn counters(&self) -> &StatsCounters {
        &self.counters
    }

    fn download(&self, id: TensorId) -> Result<TensorData, BackendError> {
        XlaExecutor::download(self, id)
    }

    fn upload_as(&mut self, id: TensorId, data: &TensorData) -> Result<(), BackendError> {
        let tensor = self.upload(data)?;
        self.tensors.insert(id, tensor);
        Ok(())
    }

    fn release(&mut self, id: TensorId) {
        self.tensors.remove(&id);
    }

    fn execute(&mut self, program: &LoweredProgram) -> Result<(), BackendError> {
        XlaExecutor::execute(self, program)
    }
}
