//! The `neuron` executor: lowers each segment to the same HLO module as the `xla` executor,
//! compiles it with `neuronx-cc` through the persistent NEFF cache, and runs the NEFF on one
//! NeuronCore through `libnrt`. Tensors stay in device memory between segments; operations
//! without a lowering run on the host executor one at a time.
//!
//! In compile-only mode ([`crate::neuron::compile_only`]) the runtime is never loaded: segments
//! are compiled into the cache and every tensor holds zeros, which is enough to trace a training
//! script ahead of time.
//!
//! Nothing here has run on a NeuronCore yet: see `docs/neuron.md`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use burn_backend::{BoolStore, DType, Shape, TensorData};
use burn_ir::{TensorId, TensorIr};
use trainium_ffi::nrt::{Model, NeuronRuntime, Tensor, TensorPlacement};

use super::device::DeviceExecutor;
use super::{Executor, HostExecutor};
use crate::lower::{self, LowerOptions, LoweredProgram};
use crate::neuron::{
    self, Binding, CacheKey, CacheOutcome, NeffCache, NeuronCompiler, NeuronSettings,
};
use crate::segment::Segment;
use crate::stats::StatsCounters;
use crate::{BackendError, TrainiumDevice};

/// The runtime variable that enables stochastic rounding of BF16 results (read by `nrt_init`).
pub const STOCHASTIC_ROUNDING_ENV: &str = "NEURON_RT_STOCHASTIC_ROUNDING_EN";

/// The runtime variable that restricts which NeuronCores the process may use (read by `nrt_init`).
pub const VISIBLE_CORES_ENV: &str = "NEURON_RT_VISIBLE_CORES";

/// How many NEFFs one NeuronCore keeps loaded; the least recently used is unloaded beyond.
pub const LOADED_MODEL_CAPACITY: usize = 64;

const EXECUTOR: &str = "neuron";

fn failure(reason: impl ToString) -> BackendError {
    BackendError::Execution {
        executor: EXECUTOR,
        reason: reason.to_string(),
    }
}

fn unavailable(reason: impl ToString) -> BackendError {
    BackendError::ExecutorUnavailable {
        executor: EXECUTOR,
        reason: reason.to_string(),
    }
}

/// The bytes of a tensor of `shape` and `dtype` as the lowering lays them out (`Pred` is one
/// byte per element).
fn byte_size(shape: &Shape, dtype: DType) -> Result<usize, BackendError> {
    match dtype {
        DType::QFloat(_) | DType::Bool(BoolStore::U32) => Err(BackendError::Unsupported {
            executor: EXECUTOR,
            what: format!("tensors of dtype {dtype:?}"),
        }),
        _ => Ok(shape.num_elements() * dtype.size()),
    }
}

/// Where a tensor's data lives.
enum Storage {
    /// Device memory of the NeuronCore.
    Device(Tensor<'static>),
    /// Nowhere: compile-only mode, where every tensor reads as zeros.
    Stub,
}

/// A tensor held by the executor.
struct HeldTensor {
    storage: Storage,
    shape: Shape,
    dtype: DType,
}

/// A NEFF loaded on the NeuronCore and how its tensors bind to the module.
struct LoadedModel {
    model: Model<'static>,
    binding: Binding,
    last_use: u64,
}

/// The runtime and core of an executor that runs programs (absent in compile-only mode).
struct Core {
    runtime: &'static NeuronRuntime,
    index: i32,
    models: HashMap<CacheKey, LoadedModel>,
    clock: u64,
}

/// Runs segments as NEFFs on one NeuronCore.
pub(crate) struct NeuronExecutor {
    device: TrainiumDevice,
    compiler: NeuronCompiler,
    cache: NeffCache,
    core: Option<Core>,
    /// Programs compiled in compile-only mode, so later steps skip the cache lookup.
    compiled: HashSet<CacheKey>,
    tensors: HashMap<TensorId, HeldTensor>,
    counters: Arc<StatsCounters>,
}

impl NeuronExecutor {
    /// Opens `device` (`neuron:N` is the N-th NeuronCore visible to the process).
    ///
    /// Needs the compiler (`NEURON_CC`, default `neuronx-cc`) and, unless in compile-only mode,
    /// the Neuron runtime library.
    pub fn new(
        device: &TrainiumDevice,
        counters: Arc<StatsCounters>,
    ) -> Result<Self, BackendError> {
        // The runtime first: on a machine without one, that is the error that matters.
        let core = if neuron::compile_only() {
            None
        } else {
            Some(Self::open_core(device)?)
        };
        let settings = NeuronSettings::from_env().map_err(unavailable)?;
        let compiler = NeuronCompiler::from_settings(&settings).map_err(unavailable)?;
        let cache = NeffCache::from_settings(&settings);
        if core.is_none() {
            log::info!(
                "{device}: compile-only mode, segments are compiled into {} and not run",
                cache.root().display()
            );
        }
        Ok(Self {
            device: *device,
            compiler,
            cache,
            core,
            compiled: HashSet::new(),
            tensors: HashMap::new(),
            counters,
        })
    }

    fn open_core(device: &TrainiumDevice) -> Result<Core, BackendError> {
        let runtime = NeuronRuntime::global().map_err(unavailable)?;
        let visible = runtime.visible_core_count().map_err(unavailable)?;
        if u32::from(device.index) >= visible {
            let restriction = std::env::var(VISIBLE_CORES_ENV)
                .map(|cores| format!(" ({VISIBLE_CORES_ENV}={cores})"))
                .unwrap_or_default();
            return Err(unavailable(format!(
                "device {device} does not exist: {visible} NeuronCores are visible to this process{restriction}"
            )));
        }
        let version = runtime
            .version()
            .map(|version| version.to_string())
            .unwrap_or_else(|error| error.to_string());
        let rounding = std::env::var(STOCHASTIC_ROUNDING_ENV).unwrap_or_else(|_| "unset".into());
        log::info!(
            "{device}: Neuron runtime {version} from {}, {visible} of {} NeuronCores visible, {STOCHASTIC_ROUNDING_ENV}={rounding}",
            runtime.library().path().display(),
            runtime
                .total_core_count()
                .map_or_else(|error| error.to_string(), |count| count.to_string()),
        );
        Ok(Core {
            runtime,
            index: i32::from(device.index),
            models: HashMap::new(),
            clock: 0,
        })
    }

    fn upload(&self, data: &TensorData) -> Result<HeldTensor, BackendError> {
        let shape = data.shape.clone();
        let size = byte_size(&shape, data.dtype)?;
        let storage = match &self.core {
            None => Storage::Stub,
            Some(core) => {
                let bytes = data.as_bytes();
                if bytes.len() != size {
                    return Err(failure(format!(
                        "host data of {:?} {:?} holds {} bytes, expected {size}",
                        shape,
                        data.dtype,
                        bytes.len()
                    )));
                }
                // The runtime refuses empty allocations; an empty tensor still gets one byte.
                let mut tensor = core
                    .runtime
                    .allocate_tensor(TensorPlacement::Device, core.index, size.max(1), "")
                    .map_err(failure)?;
                tensor.write(bytes, 0).map_err(failure)?;
                StatsCounters::add(&self.counters.bytes_to_device, size as u64);
                Storage::Device(tensor)
            }
        };
        Ok(HeldTensor {
            storage,
            shape,
            dtype: data.dtype,
        })
    }

    fn download(&self, id: TensorId) -> Result<TensorData, BackendError> {
        let tensor = self
            .tensors
            .get(&id)
            .ok_or_else(|| failure(format!("tensor {id} is not on {}", self.device)))?;
        let size = byte_size(&tensor.shape, tensor.dtype)?;
        let mut bytes = vec![0u8; size];
        if let Storage::Device(device_tensor) = &tensor.storage {
            device_tensor.read(&mut bytes, 0).map_err(failure)?;
            StatsCounters::add(&self.counters.bytes_to_host, size as u64);
        }
        Ok(TensorData::from_bytes_vec(
            bytes,
            tensor.shape.clone(),
            tensor.dtype,
        ))
    }

    /// The NEFF of `module` (the HLO of `program` with the NEFF tensor names requested): from
    /// the cache, or compiled now.
    fn neff(&self, program: &LoweredProgram, module: &[u8]) -> Result<Vec<u8>, BackendError> {
        if let Err(error) = lower::dump_module(program) {
            log::warn!("could not dump {}: {error}", program.module.name);
        }
        let cached = self
            .cache
            .get_or_compile(&self.compiler, module)
            .map_err(|error| failure(format!("compiling {}: {error}", program.module.name)))?;
        match cached.outcome {
            CacheOutcome::Hit => StatsCounters::add(&self.counters.cache_hits, 1),
            CacheOutcome::Compiled { seconds } => {
                StatsCounters::add(&self.counters.compiles, 1);
                StatsCounters::add(&self.counters.compile_micros, (seconds * 1e6) as u64);
            }
        }
        Ok(cached.neff)
    }

    /// Runs a lowered program: inputs from device memory, hoisted scalars uploaded, outputs kept.
    fn execute(&mut self, program: &LoweredProgram) -> Result<(), BackendError> {
        if !program.outputs.is_empty() {
            let module = neuron::request_neff_names(&program.bytes)
                .map_err(|reason| failure(format!("{}: {reason}", program.module.name)))?;
            let key = CacheKey::for_compiler(&module, &self.compiler);
            if self.core.is_some() {
                self.run_on_core(program, &module, key)?;
            } else {
                if !self.compiled.contains(&key) {
                    self.neff(program, &module)?;
                    self.compiled.insert(key);
                } else {
                    StatsCounters::add(&self.counters.cache_hits, 1);
                }
                for output in &program.outputs {
                    self.tensors.insert(
                        output.id,
                        HeldTensor {
                            storage: Storage::Stub,
                            shape: output.shape.clone(),
                            dtype: output.dtype,
                        },
                    );
                }
            }
        }
        for id in &program.released {
            self.tensors.remove(id);
        }
        Ok(())
    }

    /// Loads the NEFF of `program` on the core unless it is loaded, evicting the least recently
    /// used beyond [`LOADED_MODEL_CAPACITY`].
    fn load(
        &mut self,
        program: &LoweredProgram,
        module: &[u8],
        key: &CacheKey,
    ) -> Result<(), BackendError> {
        let loaded = self
            .core
            .as_ref()
            .is_some_and(|core| core.models.contains_key(key));
        if loaded {
            StatsCounters::add(&self.counters.cache_hits, 1);
            return Ok(());
        }
        let neff = self.neff(program, module)?;
        let core = self.core.as_mut().expect("called with a core");
        if core.models.len() >= LOADED_MODEL_CAPACITY
            && let Some(oldest) = core
                .models
                .iter()
                .min_by_key(|(_, model)| model.last_use)
                .map(|(key, _)| key.clone())
        {
            core.models.remove(&oldest);
        }
        let model = core.runtime.load(&neff, core.index).map_err(|error| {
            failure(format!(
                "loading the NEFF of {} ({key}): {error}",
                program.module.name
            ))
        })?;
        let infos = model.tensor_info().map_err(failure)?;
        let parameters = program.inputs.len() + program.scalars.len();
        let binding = neuron::bind(&infos, parameters, program.outputs.len())
            .map_err(|reason| failure(format!("{} ({key}): {reason}", program.module.name)))?;
        core.models.insert(
            key.clone(),
            LoadedModel {
                model,
                binding,
                last_use: core.clock,
            },
        );
        Ok(())
    }

    fn run_on_core(
        &mut self,
        program: &LoweredProgram,
        module: &[u8],
        key: CacheKey,
    ) -> Result<(), BackendError> {
        self.load(program, module, &key)?;
        let scalars = program
            .scalars
            .iter()
            .map(|data| self.upload(data))
            .collect::<Result<Vec<_>, _>>()?;
        let core = self.core.as_mut().expect("called with a core");
        core.clock += 1;
        let loaded = core.models.get_mut(&key).expect("loaded above");
        loaded.last_use = core.clock;
        let (runtime, index) = (core.runtime, core.index);
        let loaded = &core.models[&key];

        let mut results = Vec::with_capacity(loaded.binding.outputs.len());
        for (output, bound) in program.outputs.iter().zip(&loaded.binding.outputs) {
            let expected = byte_size(&output.shape, output.dtype)?;
            if bound.size != expected {
                return Err(failure(format!(
                    "{}: NEFF output `{}` has {} bytes, tensor {} ({:?} {:?}) needs {expected}",
                    program.module.name,
                    bound.name,
                    bound.size,
                    output.id,
                    output.shape,
                    output.dtype
                )));
            }
            let tensor = runtime
                .allocate_tensor(
                    TensorPlacement::Device,
                    index,
                    bound.size.max(1),
                    &bound.name,
                )
                .map_err(failure)?;
            results.push(tensor);
        }
        {
            let mut inputs = runtime.tensor_set().map_err(failure)?;
            for bound in &loaded.binding.inputs {
                let (held, what) = match program.inputs.get(bound.position) {
                    Some(input) => (
                        self.tensors.get(&input.id).ok_or_else(|| {
                            failure(format!(
                                "input tensor {} is not on {}",
                                input.id, self.device
                            ))
                        })?,
                        format!("tensor {}", input.id),
                    ),
                    None => (
                        &scalars[bound.position - program.inputs.len()],
                        format!("scalar pack {}", bound.position - program.inputs.len()),
                    ),
                };
                let Storage::Device(tensor) = &held.storage else {
                    return Err(failure(format!("{what} has no device memory")));
                };
                let expected = byte_size(&held.shape, held.dtype)?;
                if bound.size != expected {
                    return Err(failure(format!(
                        "{}: NEFF input `{}` has {} bytes, {what} ({:?} {:?}) has {expected}",
                        program.module.name, bound.name, bound.size, held.shape, held.dtype
                    )));
                }
                inputs.add(&bound.name, tensor).map_err(failure)?;
            }
            let mut outputs = runtime.tensor_set().map_err(failure)?;
            for (bound, tensor) in loaded.binding.outputs.iter().zip(&results) {
                outputs.add(&bound.name, tensor).map_err(failure)?;
            }
            runtime
                .execute(&loaded.model, &inputs, &mut outputs)
                .map_err(|error| {
                    failure(format!("running {} ({key}): {error}", program.module.name))
                })?;
        }
        for (output, tensor) in program.outputs.iter().zip(results) {
            self.tensors.insert(
                output.id,
                HeldTensor {
                    storage: Storage::Device(tensor),
                    shape: output.shape.clone(),
                    dtype: output.dtype,
                },
            );
        }
        Ok(())
    }
}

impl Executor for NeuronExecutor {
    fn register_data(&mut self, id: TensorId, data: TensorData) -> Result<(), BackendError> {
        self.upload_as(id, &data)
    }

    fn run(&mut self, segment: Segment) -> Result<(), BackendError> {
        // Random tensors are drawn on the host (LowerOptions::default()).
        self.run_planned(segment.operations(), &LowerOptions::default())
    }

    fn read(&mut self, tensor: &TensorIr) -> Result<TensorData, BackendError> {
        self.read_tensor(tensor)
    }

    fn seed(&mut self, seed: u64) {
        // Random tensors are drawn by the host executor.
        HostExecutor::new().seed(seed);
    }
}

impl DeviceExecutor for NeuronExecutor {
    fn device(&self) -> TrainiumDevice {
        self.device
    }

    fn counters(&self) -> &StatsCounters {
        &self.counters
    }

    fn download(&self, id: TensorId) -> Result<TensorData, BackendError> {
        NeuronExecutor::download(self, id)
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
        NeuronExecutor::execute(self, program)
    }
}
