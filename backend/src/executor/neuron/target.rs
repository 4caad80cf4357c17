//! The `neuron` target of the device executor: each lowered module (the same HLO the `xla`
//! target compiles, with the NEFF tensor names requested) is compiled by `neuronx-cc` through the
//! persistent NEFF cache and loaded on the NeuronCores of the device, one per replica. A NEFF
//! with collectives is loaded on each core with `nrt_load_collectives` as one rank of the
//! replicas, and the replicas run concurrently, as the collectives need.
//!
//! In a job of several processes ([`crate::distributed`]) each process drives its own replicas
//! on the NeuronCores it sees (`NEURON_RT_VISIBLE_CORES`, see [`process_environment`]), and loads
//! a NEFF with collectives as the global rank of each replica among every replica of the job, so
//! the Neuron collectives connect the processes (over EFA between nodes).
//!
//! In compile-only mode ([`super::compile_only`]) the runtime is never loaded: modules are
//! compiled into the cache and every tensor reads as zeros, which is enough to trace a training
//! script ahead of time.
//!
//! Nothing here has run on a NeuronCore yet: see `docs/neuron.md`.

use std::sync::Arc;
use std::time::Instant;

use burn_backend::{BoolStore, DType, Shape, TensorData};
use prost::Message;
use trainium_ffi::nrt::{Model, NeuronRuntime, NrtError, NrtStatus, Tensor, TensorPlacement};

use super::job::agree_on_root_comm_id;
use super::lint::{LINT_ENV, LintMode, lint_module};
use super::{
    Binding, CacheKey, CacheOutcome, FLASH_ATTENTION_ENV, FlashAttention, KernelTracer, NeffCache,
    NeuronCompiler, NeuronSettings, bind, check_only, compile_only, request_neff_names,
};
use crate::distributed::ReplicaSpan;
use crate::executor::{CacheLimits, CompileOutcome, Target};
use crate::lower::{
    AttentionLowering, FusedAttentionLowering, LowerOptions, LoweredProgram, OperatorRules,
};
use crate::stats::{StatsCounters, counters};
use crate::{BackendError, TrainiumDevice};

/// The runtime variable that enables stochastic rounding of BF16 results (read by `nrt_init`).
pub const STOCHASTIC_ROUNDING_ENV: &str = crate::settings::NEURON_RT_STOCHASTIC_ROUNDING.name;

/// The runtime variable that restricts which NeuronCores the process may use (read by `nrt_init`).
pub const VISIBLE_CORES_ENV: &str = crate::settings::NEURON_RT_VISIBLE_CORES.name;

/// The runtime variable naming the `host:port` where the ranks of a collective program meet
/// (read by the Neuron collectives library; the first process of a multi-node job serves it).
pub const ROOT_COMM_ID_ENV: &str = crate::settings::NEURON_RT_ROOT_COMM_ID.name;

/// How many NEFFs one device keeps loaded; the least recently used is unloaded beyond.
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

/// One replica's copy of a tensor.
pub(crate) enum NeuronBuffer {
    /// Device memory of the replica's NeuronCore.
    Device(Tensor<'static>),
    /// Nowhere: compile-only mode, where every tensor reads as zeros.
    Stub,
}

// SAFETY: a buffer is only touched by the thread of its replica (`launch` hands replica `r`'s
// arguments to thread `r` alone); the runtime handle it wraps may move between threads.
unsafe impl Sync for NeuronBuffer {}

/// A NEFF ready to run: loaded on every replica's core (none in compile-only mode), and how its
/// tensors bind to the module.
pub(crate) struct NeuronProgram {
    key: CacheKey,
    models: Vec<Model<'static>>,
    binding: Option<Binding>,
}

// SAFETY: as for `NeuronBuffer`: `launch` runs model `r` on thread `r` only.
unsafe impl Sync for NeuronProgram {}

/// The NeuronCores of a device, one per replica (absent in compile-only mode).
struct Cores {
    runtime: &'static NeuronRuntime,
    /// The device's statistics (runs that finished with non-finite values are counted).
    counters: Arc<StatsCounters>,
    /// Where each of this process's replicas runs.
    placements: Vec<CorePlacement>,
    /// Replicas of the device over every process of the job.
    global_replicas: u32,
}

/// Where one replica of this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CorePlacement {
    /// The NeuronCore, numbered among those visible to this process.
    core: i32,
    /// The replica's rank among every replica of the job (the collectives' global device id).
    global_rank: u32,
}

/// The cores of `span`'s replicas of `device`: `neuron:N` with R replicas in one process runs on
/// cores N to N + R − 1; a process of a job runs its replicas on the cores it sees from 0 on (its
/// [`process_environment`] made them the device's cores of this process).
fn placements(device: &TrainiumDevice, span: &ReplicaSpan) -> Vec<CorePlacement> {
    let first_core = match span.spans_processes() {
        true => 0,
        false => i32::from(device.index),
    };
    (0..span.local)
        .map(|replica| CorePlacement {
            core: first_core + replica as i32,
            global_rank: (span.first + replica) as u32,
        })
        .collect()
}

/// How an execution that returned finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completion {
    /// Every value finite.
    Finite,
    /// The runtime saw NaN or infinity (status 1003): the outputs are written and hold them.
    NonFinite,
}

/// What the status of `nrt_execute` means. Status 1003 (`NRT_EXEC_COMPLETED_WITH_NUM_ERR`) is
/// not a failure: the program ran to the end and its outputs hold the non-finite values, which
/// the trainer sees in the loss or gradient norm and answers by skipping the step.
fn completion(executed: Result<(), NrtError>) -> Result<Completion, NrtError> {
    match executed {
        Ok(()) => Ok(Completion::Finite),
        Err(NrtError::Status {
            status: NrtStatus::ExecCompletedWithNumericalErrors,
            ..
        }) => Ok(Completion::NonFinite),
        Err(error) => Err(error),
    }
}

/// The `neuron` target: the compiler, the NEFF cache and the cores.
pub(crate) struct NeuronCores {
    compiler: NeuronCompiler,
    cache: NeffCache,
    cores: Option<Cores>,
    lint: LintMode,
}

/// The kernel tracer `settings` ask for, if the SDK's flash kernel is to be used and can be:
/// with `auto`, a tracer that does not find the SDK's kernels leaves attention to HLO operations
/// (logged); with `on`, it fails the executor.
fn kernel_tracer(
    settings: &NeuronSettings,
    device: &TrainiumDevice,
) -> Result<Option<KernelTracer>, BackendError> {
    if settings.flash_attention == FlashAttention::Off {
        return Ok(None);
    }
    let tracer = match &settings.kernel_tracer {
        Some(executable) => Ok(KernelTracer::new(executable, settings.target)),
        None => KernelTracer::default_script(&settings.cache_root, settings.target),
    };
    match tracer.and_then(|tracer| tracer.probe().map(|()| tracer)) {
        Ok(tracer) => {
            log::info!("{device}: attention runs as the Neuron SDK's flash kernel where it can");
            Ok(Some(tracer))
        }
        Err(error) if settings.flash_attention == FlashAttention::On => Err(unavailable(error)),
        Err(error) => {
            log::info!(
                "{device}: attention is lowered with HLO operations ({FLASH_ATTENTION_ENV}=auto \
                 and no flash kernel): {error}"
            );
            Ok(None)
        }
    }
}

impl NeuronCores {
    /// Opens `device` (`neuron:N` is the N-th NeuronCore visible to the process, `neuron:A-B`
    /// cores A to B).
    ///
    /// Needs the compiler (`NEURON_CC`, default `neuronx-cc`) and, unless in compile-only mode,
    /// the Neuron runtime library. `span` says which of the device's replicas this process holds.
    pub fn open(device: &TrainiumDevice, span: &ReplicaSpan) -> Result<Self, BackendError> {
        if let Some(job) = span.distributed() {
            agree_on_root_comm_id(device, job.node_id)
                .map_err(|reason| unavailable(format!("{device}: {reason}")))?;
        }
        // The runtime first: on a machine without one, that is the error that matters.
        let cores = if compile_only() {
            None
        } else {
            Some(open_cores(device, span)?)
        };
        let settings = NeuronSettings::current().map_err(unavailable)?;
        let compiler = if check_only() {
            NeuronCompiler::absent(settings.target)
        } else {
            NeuronCompiler::from_settings(&settings)
                .map_err(unavailable)?
                .with_kernel_tracer(kernel_tracer(&settings, device)?)
        };
        let cache = NeffCache::from_settings(&settings);
        if cores.is_none() {
            log::info!(
                "{device}: compile-only mode, segments are compiled into {} and not run",
                cache.root().display()
            );
        }
        Ok(Self {
            compiler,
            cache,
            cores,
            // Check-only mode exists to report violations: it never lets one pass.
            lint: if check_only() {
                LintMode::Error
            } else {
                settings.lint
            },
        })
    }

    /// Checks `program`'s module against the Neuron lint: its violations refuse the compile
    /// (or are logged, as [`LINT_ENV`] says).
    fn lint(&self, program: &LoweredProgram) -> Result<(), BackendError> {
        if self.lint == LintMode::Off {
            return Ok(());
        }
        let violations = lint_module(&program.module);
        if violations.is_empty() {
            return Ok(());
        }
        if self.lint == LintMode::Warn {
            for violation in &violations {
                log::warn!("{violation}");
            }
            return Ok(());
        }
        let shown: Vec<String> = violations.iter().take(5).map(ToString::to_string).collect();
        let more = violations.len().saturating_sub(shown.len());
        Err(failure(format!(
            "{} is not compiled: {} violation(s) of the operator rules neuronx-cc documents \
             ({LINT_ENV}=warn compiles it anyway):\n  {}{}",
            program.module.name,
            violations.len(),
            shown.join("\n  "),
            if more > 0 {
                format!("\n  ... and {more} more")
            } else {
                String::new()
            }
        )))
    }
}

fn open_cores(device: &TrainiumDevice, span: &ReplicaSpan) -> Result<Cores, BackendError> {
    // The ranks of a collective program meet where this variable says (read by the runtime).
    if device.replicas > 1
        && crate::settings::NEURON_RT_ROOT_COMM_ID
            .var_os()
            .is_none_or(|value| value.is_empty())
    {
        return Err(unavailable(format!(
            "{device} runs collectives across its NeuronCores: set {ROOT_COMM_ID_ENV}=HOST:PORT \
             (on one node, localhost:61234; `hlat` sets that default itself)"
        )));
    }
    let runtime = NeuronRuntime::global().map_err(unavailable)?;
    let visible = runtime.visible_core_count().map_err(unavailable)?;
    let placements = placements(device, span);
    let last = placements
        .last()
        .map_or(0, |placement| placement.core as u32);
    if last >= visible {
        let restriction = crate::settings::NEURON_RT_VISIBLE_CORES
            .var()
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
    let rounding = crate::settings::NEURON_RT_STOCHASTIC_ROUNDING
        .var()
        .unwrap_or_else(|_| "unset".into());
    log::info!(
        "{device}: Neuron runtime {version} from {}, {visible} of {} NeuronCores visible, \
         {STOCHASTIC_ROUNDING_ENV}={rounding}",
        runtime.library().path().display(),
        runtime
            .total_core_count()
            .map_or_else(|error| error.to_string(), |count| count.to_string()),
    );
    Ok(Cores {
        runtime,
        counters: counters(device),
        placements,
        global_replicas: span.total as u32,
    })
}

impl NeuronCores {
    /// Loads `neff` on every replica's core: with `nrt_load_collectives` as the replica's global
    /// rank among the job's replicas when the program communicates, else with `nrt_load`.
    fn load(
        &self,
        cores: &Cores,
        neff: &[u8],
        program: &LoweredProgram,
        key: &CacheKey,
    ) -> Result<(Vec<Model<'static>>, Binding), BackendError> {
        let models = cores
            .placements
            .iter()
            .map(|&CorePlacement { core, global_rank }| {
                let loaded = if program.collectives > 0 {
                    cores
                        .runtime
                        .load_collectives(neff, core, global_rank, cores.global_replicas)
                } else {
                    cores.runtime.load(neff, core)
                };
                loaded.map_err(|error| {
                    failure(format!(
                        "loading the NEFF of {} ({key}) on NeuronCore {core}: {error}",
                        program.module.name
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let infos = models[0].tensor_info().map_err(failure)?;
        let parameters =
            program.inputs.len() + program.scalars.len() + usize::from(program.replica_index);
        let binding = bind(&infos, parameters, program.outputs.len())
            .map_err(|reason| failure(format!("{} ({key}): {reason}", program.module.name)))?;
        Ok((models, binding))
    }

    /// Runs `program` on one replica's core with `arguments` (that replica's parameters).
    fn run_replica(
        cores: &Cores,
        replica: usize,
        compiled: &NeuronProgram,
        binding: &Binding,
        program: &LoweredProgram,
        arguments: &[&NeuronBuffer],
    ) -> Result<Vec<NeuronBuffer>, BackendError> {
        let (runtime, core) = (cores.runtime, cores.placements[replica].core);
        let key = &compiled.key;
        let mut results = Vec::with_capacity(binding.outputs.len());
        for (output, bound) in program.outputs.iter().zip(&binding.outputs) {
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
            results.push(
                runtime
                    .allocate_tensor(
                        TensorPlacement::Device,
                        core,
                        bound.size.max(1),
                        &bound.name,
                    )
                    .map_err(failure)?,
            );
        }
        let mut inputs = runtime.tensor_set().map_err(failure)?;
        for bound in &binding.inputs {
            let NeuronBuffer::Device(tensor) = arguments[bound.position] else {
                return Err(failure(format!(
                    "parameter {} has no device memory",
                    bound.position
                )));
            };
            if bound.size != tensor.size() {
                return Err(failure(format!(
                    "{}: NEFF input `{}` has {} bytes, parameter {} has {}",
                    program.module.name,
                    bound.name,
                    bound.size,
                    bound.position,
                    tensor.size()
                )));
            }
            inputs.add(&bound.name, tensor).map_err(failure)?;
        }
        let mut outputs = runtime.tensor_set().map_err(failure)?;
        for (bound, tensor) in binding.outputs.iter().zip(&results) {
            outputs.add(&bound.name, tensor).map_err(failure)?;
        }
        let executed = runtime.execute(&compiled.models[replica], &inputs, &mut outputs);
        let completion = completion(executed).map_err(|error| {
            failure(format!(
                "running {} ({key}) on NeuronCore {core}: {error}",
                program.module.name
            ))
        })?;
        if completion == Completion::NonFinite {
            log::warn!(
                "{} ({key}) on NeuronCore {core} finished with NaN or infinite values \
                 (NRT_EXEC_COMPLETED_WITH_NUM_ERR); its outputs are kept",
                program.module.name
            );
            StatsCounters::add(&cores.counters.non_finite_runs, 1);
        }
        drop((inputs, outputs));
        Ok(results.into_iter().map(NeuronBuffer::Device).collect())
    }
}

impl Target for NeuronCores {
    type Buffer = NeuronBuffer;
    type Program = NeuronProgram;

    const EXECUTOR: &'static str = EXECUTOR;
    const CACHE_LIMITS: CacheLimits = CacheLimits {
        programs: LOADED_MODEL_CAPACITY,
        instructions: usize::MAX,
        mapped_share: None,
    };

    fn lower_options(&self) -> LowerOptions {
        // Random tensors are drawn on the host.
        let (attention, fused_attention) = match self.compiler.kernel_tracer() {
            Some(_) => (
                AttentionLowering::NeuronFlash,
                FusedAttentionLowering::NeuronFlash,
            ),
            None => (AttentionLowering::Portable, FusedAttentionLowering::Blocked),
        };
        LowerOptions {
            attention,
            fused_attention,
            rules: OperatorRules::Neuron,
            ..LowerOptions::default()
        }
    }

    fn upload(&mut self, replica: usize, data: &TensorData) -> Result<NeuronBuffer, BackendError> {
        let size = byte_size(data.shape(), data.dtype())?;
        let Some(cores) = &self.cores else {
            return Ok(NeuronBuffer::Stub);
        };
        let bytes = data.as_bytes();
        if bytes.len() != size {
            return Err(failure(format!(
                "host data of {:?} {:?} holds {} bytes, expected {size}",
                data.shape(),
                data.dtype(),
                bytes.len()
            )));
        }
        // The runtime refuses empty allocations; an empty tensor still gets one byte.
        let mut tensor = cores
            .runtime
            .allocate_tensor(
                TensorPlacement::Device,
                cores.placements[replica].core,
                size.max(1),
                "",
            )
            .map_err(failure)?;
        tensor.write(bytes, 0).map_err(failure)?;
        Ok(NeuronBuffer::Device(tensor))
    }

    fn download(
        &self,
        buffer: &NeuronBuffer,
        shape: &Shape,
        dtype: DType,
    ) -> Result<TensorData, BackendError> {
        let mut bytes = vec![0u8; byte_size(shape, dtype)?];
        if let NeuronBuffer::Device(tensor) = buffer {
            tensor.read(&mut bytes, 0).map_err(failure)?;
        }
        Ok(TensorData::from_bytes_vec(bytes, shape.clone(), dtype))
    }

    fn compile(
        &mut self,
        program: &LoweredProgram,
    ) -> Result<(NeuronProgram, CompileOutcome), BackendError> {
        self.lint(program)?;
        if check_only() {
            let key = CacheKey::for_compiler(&program.bytes, &self.compiler);
            let program = NeuronProgram {
                key,
                models: Vec::new(),
                binding: None,
            };
            return Ok((program, CompileOutcome::Compiled { seconds: 0.0 }));
        }
        let mut module = (*program.module).clone();
        request_neff_names(&mut module)
            .map_err(|reason| failure(format!("{}: {reason}", program.module.name)))?;
        let compiler = self.compiler.for_module(&module);
        let module = module.encode_to_vec();
        let key = CacheKey::for_compiler(&module, &compiler);
        let start = Instant::now();
        let cached = self
            .cache
            .get_or_compile(&compiler, &module)
            .map_err(|error| failure(format!("compiling {}: {error}", program.module.name)))?;
        let outcome = match cached.outcome {
            CacheOutcome::Hit => CompileOutcome::Cached,
            CacheOutcome::Compiled { seconds } => CompileOutcome::Compiled { seconds },
        };
        let (models, binding) = match &self.cores {
            Some(cores) => {
                let (models, binding) = self.load(cores, &cached.neff, program, &key)?;
                (models, Some(binding))
            }
            None => (Vec::new(), None),
        };
        log::debug!(
            "{}: NEFF {key} ready in {:.1} s",
            program.module.name,
            start.elapsed().as_secs_f64()
        );
        Ok((
            NeuronProgram {
                key,
                models,
                binding,
            },
            outcome,
        ))
    }

    fn launch(
        &mut self,
        compiled: &NeuronProgram,
        program: &LoweredProgram,
        arguments: Vec<Vec<&NeuronBuffer>>,
    ) -> Result<Vec<Vec<NeuronBuffer>>, BackendError> {
        let (Some(cores), Some(binding)) = (&self.cores, &compiled.binding) else {
            return Ok(arguments
                .iter()
                .map(|_| program.outputs.iter().map(|_| NeuronBuffer::Stub).collect())
                .collect());
        };
        if arguments.len() == 1 {
            return Ok(vec![Self::run_replica(
                cores,
                0,
                compiled,
                binding,
                program,
                &arguments[0],
            )?]);
        }
        // The ranks of a collective wait for each other: every replica runs on its own thread.
        std::thread::scope(|scope| {
            let runs: Vec<_> = arguments
                .iter()
                .enumerate()
                .map(|(replica, arguments)| {
                    scope.spawn(move || {
                        Self::run_replica(cores, replica, compiled, binding, program, arguments)
                    })
                })
                .collect();
            runs.into_iter()
                .map(|run| {
                    run.join()
                        .map_err(|_| failure("a replica's execution thread panicked"))?
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numerical_errors_complete_the_run_and_other_statuses_fail_it() {
        let status = |status| {
            Err(NrtError::Status {
                call: "nrt_execute",
                status,
            })
        };
        assert_eq!(completion(Ok(())).unwrap(), Completion::Finite);
        assert_eq!(
            completion(status(NrtStatus::ExecCompletedWithNumericalErrors)).unwrap(),
            Completion::NonFinite
        );
        for failed in [NrtStatus::Failure, NrtStatus::Invalid, NrtStatus::Resource] {
            assert!(completion(status(failed)).is_err(), "{failed:?}");
        }
    }
}
