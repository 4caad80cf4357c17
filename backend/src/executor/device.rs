//! The executor of targets that run lowered programs on devices (`xla`, `neuron`): it owns the
//! tensors held on the device, the compile cache, the counters, random states, module dumps and
//! host fallbacks, and asks its [`Target`] only for what differs: upload, download, compile and
//! launch. Replicated devices are handled here once: every tensor holds one buffer per replica,
//! a program runs with one argument list per replica.
//!
//! A device spanning the processes of a job ([`crate::distributed`]) holds this process's
//! replicas only: its programs are lowered for every replica of the job (collectives name global
//! replicas), data given for every replica keeps this process's share, and a read of every
//! replica gathers the other processes' through the job's exchange.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use burn_backend::{DType, Shape, TensorData};
use burn_ir::{OperationIr, TensorId, TensorIr, TensorStatus};

use super::fallback::{HOST_FALLBACK_ENV, HostFallback};
use super::plan_cache::PlanCache;
use super::program_cache::{CacheLimits, ProgramCache};
use super::{Executor, HostExecutor};
use crate::capture::{FingerprintedSegment, Segment};
use crate::distributed::ReplicaSpan;
use crate::lower::{self, LowerOptions, LoweredProgram, OperatorRules, Step};
use crate::per_device::PerDevice;
use crate::profile::phase;
use crate::stats::StatsCounters;
use crate::{BackendError, TrainiumDevice};

/// How a program reached the executor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum CompileOutcome {
    /// Compiled now, in `seconds`.
    Compiled { seconds: f64 },
    /// Found compiled in a cache outside the process (the NEFF cache, the `xla` persistent
    /// cache).
    Cached,
}

/// What differs between the targets of [`DeviceExecutor`].
pub(crate) trait Target: Send {
    /// One replica's copy of a tensor in device memory.
    type Buffer: Send;
    /// A program compiled and ready to launch on every replica.
    type Program: Send + Sync;

    /// The executor's name in errors and logs.
    const EXECUTOR: &'static str;
    /// How many compiled programs the executor keeps.
    const CACHE_LIMITS: CacheLimits;

    /// Whether a run of `computing` operations producing `computed_elements` elements should be
    /// a program of its own though no segment cap is reached (consulted only when no cap was
    /// set): a target that compiles long programs slowly cuts them where that costs nothing at
    /// run time.
    fn cuts_early(&self, _computing: usize, _computed_elements: u64) -> bool {
        false
    }

    /// The lowering choices of this target.
    fn lower_options(&self) -> LowerOptions;

    /// Copies host data into the memory of replica `replica`.
    fn upload(&mut self, replica: usize, data: &TensorData) -> Result<Self::Buffer, BackendError>;

    /// Copies one replica's buffer of a tensor of `shape` and `dtype` to the host.
    fn download(
        &self,
        buffer: &Self::Buffer,
        shape: &Shape,
        dtype: DType,
    ) -> Result<TensorData, BackendError>;

    /// Compiles `program` for every replica.
    fn compile(
        &mut self,
        program: &LoweredProgram,
    ) -> Result<(Self::Program, CompileOutcome), BackendError>;

    /// Runs `compiled` once on every replica; `arguments[r]` are replica `r`'s parameters in the
    /// order of `program`'s module. Returns each replica's outputs.
    fn launch(
        &mut self,
        compiled: &Self::Program,
        program: &LoweredProgram,
        arguments: Vec<Vec<&Self::Buffer>>,
    ) -> Result<Vec<Vec<Self::Buffer>>, BackendError>;

    /// The scratch memory one run of `compiled` needs on a replica, as the compiler's buffer
    /// assignment counts it (its intermediate values), when the target can tell.
    fn scratch_bytes(&self, _compiled: &Self::Program) -> Option<u64> {
        None
    }
}

/// A tensor held on the device: one buffer per replica.
struct DeviceTensor<Buffer> {
    replicas: Vec<Buffer>,
    shape: Shape,
    dtype: DType,
}

/// Operator rules chosen for devices in code, in place of their executor's own.
static OPERATOR_RULES: PerDevice<OperatorRules> = PerDevice::new();

/// Makes the programs `device` lowers from now on keep to `rules` instead of its executor's
/// ([`OperatorRules::Xla`] for `xla`, [`OperatorRules::Neuron`] for `neuron`): for a Neuron
/// compiler that accepts `replica-id` (with `HLAT_NEURON_LINT=warn`, since the lint refuses it),
/// or to run the Neuron lowering on the XLA CPU plugin and compare what it computes.
pub fn set_operator_rules(device: &TrainiumDevice, rules: OperatorRules) {
    OPERATOR_RULES.set(device, rules);
}

/// A compiled program with the scratch memory one run of it needs on a replica (as the target
/// reports it once, when it is compiled or loaded).
struct ReadyProgram<Program> {
    program: Program,
    scratch_bytes: Option<u64>,
}

/// Runs segments of one (possibly replicated) device as compiled programs of a [`Target`].
pub(crate) struct DeviceExecutor<T: Target> {
    device: TrainiumDevice,
    /// The replicas this process holds.
    span: ReplicaSpan,
    target: T,
    tensors: HashMap<TensorId, DeviceTensor<T::Buffer>>,
    programs: ProgramCache<ReadyProgram<T::Program>>,
    /// The plans of segments seen before, by fingerprint, lowered under `rules`.
    plans: PlanCache,
    /// The operator rules the cached plans were lowered under.
    rules: Option<OperatorRules>,
    /// The operation kinds kept on the host (`TRAINIUM_HOST_OPERATIONS`), as the plans were made.
    host_kinds: &'static [String],
    counters: Arc<StatsCounters>,
    /// The Threefry key of random tensors drawn on the device (set by `seed`).
    random_key: u64,
    /// Random states handed out so far under `random_key`.
    random_counter: u64,
}

impl<T: Target> DeviceExecutor<T> {
    /// An executor of `span`'s replicas of `device` running on `target`.
    pub fn new(
        device: &TrainiumDevice,
        span: ReplicaSpan,
        target: T,
        counters: Arc<StatsCounters>,
    ) -> Self {
        Self {
            device: *device,
            span,
            target,
            tensors: HashMap::new(),
            programs: ProgramCache::new(T::CACHE_LIMITS),
            plans: PlanCache::default(),
            rules: None,
            host_kinds: &[],
            counters,
            random_key: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_nanos() as u64),
            random_counter: 0,
        }
    }

    /// The replicas held in this process.
    fn replicas(&self) -> usize {
        self.span.local
    }

    fn failure(&self, reason: impl ToString) -> BackendError {
        BackendError::Execution {
            executor: T::EXECUTOR,
            reason: reason.to_string(),
        }
    }

    fn held(&self, id: TensorId) -> Result<&DeviceTensor<T::Buffer>, BackendError> {
        self.tensors
            .get(&id)
            .ok_or_else(|| self.failure(format!("tensor {id} is not on {}", self.device)))
    }

    /// Uploads `data[r]` to replica `r` (or `data[0]` to every replica) and keeps it as `id`.
    fn store(&mut self, id: TensorId, data: &[TensorData]) -> Result<(), BackendError> {
        let _span = tracing::info_span!(phase::TO_DEVICE).entered();
        let mut replicas = Vec::with_capacity(self.replicas());
        for replica in 0..self.replicas() {
            let replica_data = data.get(replica).unwrap_or(&data[0]);
            replicas.push(self.target.upload(replica, replica_data)?);
            StatsCounters::add(
                &self.counters.bytes_to_device,
                replica_data.as_bytes().len() as u64,
            );
        }
        self.tensors.insert(
            id,
            DeviceTensor {
                replicas,
                shape: data[0].shape().clone(),
                dtype: data[0].dtype(),
            },
        );
        Ok(())
    }

    /// Copies replica `replica` of tensor `id` to the host.
    fn download(&self, id: TensorId, replica: usize) -> Result<TensorData, BackendError> {
        let _span = tracing::info_span!(phase::TO_HOST).entered();
        let tensor = self.held(id)?;
        let data = self
            .target
            .download(&tensor.replicas[replica], &tensor.shape, tensor.dtype)?;
        StatsCounters::add(&self.counters.bytes_to_host, data.as_bytes().len() as u64);
        Ok(data)
    }

    /// The program of `lowered`: from the cache, or compiled now.
    /// Each program counts towards the largest scratch memory whenever it is used, so that
    /// statistics reset before a step report that step's programs, compiled now or before.
    fn compiled(
        &mut self,
        lowered: &LoweredProgram,
    ) -> Result<Arc<ReadyProgram<T::Program>>, BackendError> {
        if let Some(ready) = self.programs.get(lowered) {
            StatsCounters::add(&self.counters.cache_hits, 1);
            self.count_scratch(&ready);
            return Ok(ready);
        }
        if let Err(error) = lower::dump_module(lowered) {
            log::warn!("could not dump {}: {error}", lowered.module.name);
        }
        let span = tracing::info_span!(phase::COMPILE, cached = false).entered();
        let (program, outcome) = self.target.compile(lowered)?;
        if matches!(outcome, CompileOutcome::Cached) {
            span.record("cached", true);
        }
        drop(span);
        let scratch_bytes = self.target.scratch_bytes(&program);
        match outcome {
            CompileOutcome::Compiled { seconds } => {
                StatsCounters::add(&self.counters.compiles, 1);
                StatsCounters::add(&self.counters.compile_micros, (seconds * 1e6) as u64);
                log::info!(
                    "{}: compiled {} ({} inputs, {} scalar packs, {} outputs, {} collectives) in \
                     {:.1} ms",
                    self.device,
                    lowered.module.name,
                    lowered.inputs.len(),
                    lowered.scalars.len(),
                    lowered.outputs.len(),
                    lowered.collectives,
                    seconds * 1e3
                );
            }
            CompileOutcome::Cached => {
                StatsCounters::add(&self.counters.cache_hits, 1);
                StatsCounters::add(&self.counters.programs_loaded, 1);
            }
        }
        let ready = self.programs.insert(
            lowered,
            ReadyProgram {
                program,
                scratch_bytes,
            },
        );
        self.count_scratch(&ready);
        Ok(ready)
    }

    /// Raises the device's largest scratch memory to what `ready` needs.
    fn count_scratch(&self, ready: &ReadyProgram<T::Program>) {
        if let Some(bytes) = ready.scratch_bytes {
            StatsCounters::raise(&self.counters.largest_scratch_bytes, bytes);
        }
    }

    /// Runs a lowered program: inputs from the device, hoisted scalars and random states
    /// uploaded, outputs kept, released inputs freed.
    fn execute(&mut self, lowered: &LoweredProgram) -> Result<(), BackendError> {
        if !lowered.outputs.is_empty() {
            let compiled = self.compiled(lowered)?;
            let states = (lowered.random_draws > 0).then(|| {
                let states: Vec<u64> = (0..lowered.random_draws)
                    .flat_map(|_| {
                        self.random_counter += 1;
                        [self.random_key, self.random_counter]
                    })
                    .collect();
                TensorData::new(states, [2 * lowered.random_draws])
            });
            let uploading = tracing::info_span!(phase::TO_DEVICE).entered();
            let mut uploaded = Vec::with_capacity(self.replicas());
            for replica in 0..self.replicas() {
                // The replica's own global index, after the scalars, where the program asks.
                let index = lowered
                    .replica_index
                    .then(|| TensorData::new(vec![(self.span.first + replica) as i32], [1]));
                let buffers = lowered
                    .scalars
                    .iter()
                    .chain(&index)
                    .chain(&states)
                    .map(|data| self.target.upload(replica, data))
                    .collect::<Result<Vec<_>, _>>()?;
                uploaded.push(buffers);
            }
            drop(uploading);
            let mut arguments = Vec::with_capacity(self.replicas());
            for (replica, extra) in uploaded.iter().enumerate() {
                let mut list = Vec::with_capacity(lowered.inputs.len() + extra.len());
                for input in &lowered.inputs {
                    let tensor = self.tensors.get(&input.id).ok_or_else(|| {
                        self.failure(format!(
                            "input tensor {} of {} is not on {}",
                            input.id, lowered.module.name, self.device
                        ))
                    })?;
                    list.push(&tensor.replicas[replica]);
                }
                list.extend(extra.iter());
                arguments.push(list);
            }
            let outputs = {
                let _span = tracing::info_span!(phase::EXECUTE).entered();
                self.target.launch(&compiled.program, lowered, arguments)?
            };
            self.keep_outputs(&lowered.outputs, outputs)?;
            StatsCounters::add(&self.counters.collectives, lowered.collectives as u64);
            StatsCounters::add(&self.counters.collective_bytes, lowered.collective_bytes);
        }
        for id in &lowered.released {
            self.tensors.remove(id);
        }
        Ok(())
    }

    /// Keeps per-replica results (`outputs[r][i]` is replica `r`'s buffer of `tensors[i]`).
    fn keep_outputs(
        &mut self,
        tensors: &[TensorIr],
        outputs: Vec<Vec<T::Buffer>>,
    ) -> Result<(), BackendError> {
        if outputs.len() != self.replicas()
            || outputs.iter().any(|replica| replica.len() != tensors.len())
        {
            return Err(self.failure(format!(
                "the program returned {} replicas of {:?} outputs, {} replicas of {} expected",
                outputs.len(),
                outputs.iter().map(Vec::len).collect::<Vec<_>>(),
                self.replicas(),
                tensors.len()
            )));
        }
        let mut per_tensor: Vec<Vec<T::Buffer>> = tensors.iter().map(|_| Vec::new()).collect();
        for replica in outputs {
            for (index, buffer) in replica.into_iter().enumerate() {
                per_tensor[index].push(buffer);
            }
        }
        for (tensor, replicas) in tensors.iter().zip(per_tensor) {
            self.tensors.insert(
                tensor.id,
                DeviceTensor {
                    replicas,
                    shape: tensor.shape.clone(),
                    dtype: tensor.dtype,
                },
            );
        }
        Ok(())
    }

    /// Runs one operation that has no lowering on the host, replica by replica: inputs copied
    /// off the device, outputs copied back, ended inputs released. Counted in `host_fallbacks`
    /// and by kind; `TRAINIUM_HOST_FALLBACK` says whether it warns (once per kind), fails or
    /// runs silently.
    fn run_on_host(&mut self, operation: &OperationIr) -> Result<(), BackendError> {
        let _span = tracing::info_span!(phase::HOST_FALLBACK).entered();
        if let OperationIr::Custom(custom) = operation {
            return Err(BackendError::Unsupported {
                executor: T::EXECUTOR,
                what: format!("custom operation `{}` (it has no lowering)", custom.id),
            });
        }
        let kind = lower::operation_name(operation);
        let shapes: Vec<Vec<usize>> = operation
            .inputs()
            .map(|input| input.shape.to_vec())
            .collect();
        let policy = super::fallback::host_fallback_of(&self.device);
        if policy == HostFallback::Error {
            return Err(BackendError::Unsupported {
                executor: T::EXECUTOR,
                what: format!(
                    "{kind} (inputs {shapes:?}) has no lowering and {HOST_FALLBACK_ENV}=error \
                     keeps it off the host (allow or warn run it there)"
                ),
            });
        }
        let first = {
            let mut by_kind = self
                .counters
                .fallbacks_by_kind
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let count = by_kind.entry(kind.clone()).or_default();
            *count += 1;
            *count == 1
        };
        if first && policy == HostFallback::Warn {
            log::warn!(
                "{}: {kind} (inputs {shapes:?}) has no lowering: it runs on the host, its inputs \
                 copied off the device and back, once per call (further ones are counted in \
                 burn_trainium::host_fallbacks_by_kind; {HOST_FALLBACK_ENV}=error refuses them, \
                 =allow silences this). Please report it: docs/xla-coverage.md lists what is \
                 lowered.",
                self.device
            );
        }
        let mut segment = Segment::default();
        segment.push(operation.clone());
        let boundary = segment.boundary();
        let mut results: Vec<Vec<TensorData>> =
            boundary.outputs.iter().map(|_| Vec::new()).collect();
        for replica in 0..self.replicas() {
            let mut host = HostExecutor::new(ReplicaSpan::local(1));
            for input in &boundary.inputs {
                host.register_data(input.id, self.download(input.id, replica)?)?;
            }
            host.run(segment.clone())?;
            for (output, result) in boundary.outputs.iter().zip(&mut results) {
                let readable = TensorIr {
                    status: TensorStatus::ReadOnly,
                    ..output.clone()
                };
                result.push(host.read(&readable)?);
            }
        }
        for (output, data) in boundary.outputs.iter().zip(results) {
            self.store(output.id, &data)?;
        }
        for id in &boundary.released_inputs {
            self.tensors.remove(id);
        }
        StatsCounters::add(&self.counters.host_fallbacks, 1);
        log::debug!(
            "{}: ran {} on the host",
            self.device,
            lower::operation_name(operation)
        );
        Ok(())
    }
}

impl<T: Target> DeviceExecutor<T> {
    /// The steps of a segment: those of the plan kept for its fingerprint when it has one,
    /// otherwise lowered (and the plan kept for the next segment like it).
    fn prepare(&mut self, operations: &[OperationIr]) -> Result<Vec<Step>, BackendError> {
        let defaults = self.target.lower_options();
        let options = LowerOptions {
            replicas: self.span.total,
            rules: OPERATOR_RULES.get(&self.device).unwrap_or(defaults.rules),
            ..defaults
        };
        let host_kinds = super::fallback::host_operations_of(&self.device);
        let rules_changed = self.rules.replace(options.rules) != Some(options.rules);
        if rules_changed || host_kinds != self.host_kinds {
            // Plans lowered under other rules, or with other kinds kept on the host, would run
            // other programs.
            self.plans = PlanCache::default();
            self.host_kinds = host_kinds;
        }
        let fingerprinted = match tracing::info_span!(phase::FINGERPRINT)
            .in_scope(|| FingerprintedSegment::of(operations))
        {
            Ok(fingerprinted) => Some(fingerprinted),
            Err(error) => {
                log::debug!("{}: {error}; the segment is lowered each time", self.device);
                None
            }
        };
        if let Some(fingerprinted) = &fingerprinted
            && let Some(steps) = self.plans.steps(fingerprinted, operations)
        {
            StatsCounters::add(&self.counters.segments_reused, 1);
            return Ok(steps);
        }
        let steps = tracing::info_span!(phase::LOWER)
            .in_scope(|| lower::plan_segment_keeping_on_host(operations, &options, self.host_kinds))
            .map_err(|error| self.failure(error))?;
        if let Some(fingerprinted) = &fingerprinted
            && !self.plans.insert(fingerprinted, &steps)
        {
            log::debug!(
                "{}: a segment of {} operations is lowered each time (its scalars cannot be \
                 traced to their operands)",
                self.device,
                operations.len()
            );
        }
        Ok(steps)
    }
}

impl<T: Target> Executor for DeviceExecutor<T> {
    fn register_data(&mut self, id: TensorId, data: TensorData) -> Result<(), BackendError> {
        self.store(id, &[data])
    }

    fn register_replicas(
        &mut self,
        id: TensorId,
        data: Vec<TensorData>,
    ) -> Result<(), BackendError> {
        // Data for every replica of the device (this process keeps its share), or one for all.
        let data = match data.len() {
            1 => data,
            given if given == self.span.total => self.span.local_share(data),
            given => {
                return Err(self.failure(format!(
                    "data for {given} replicas of {}, which has {}",
                    self.device, self.span.total
                )));
            }
        };
        self.store(id, &data)
    }

    fn run(&mut self, segment: Segment) -> Result<(), BackendError> {
        let start = Instant::now();
        let steps = self.prepare(segment.operations())?;
        StatsCounters::add_elapsed(&self.counters.prepare_micros, start);
        for step in steps {
            match step {
                Step::Program(program) => self.execute(&program)?,
                Step::Fallback(operation) => self.run_on_host(&operation)?,
            }
        }
        Ok(())
    }

    fn read(&mut self, tensor: &TensorIr) -> Result<TensorData, BackendError> {
        let data = self.download(tensor.id, 0)?;
        if tensor.status == TensorStatus::ReadWrite {
            self.tensors.remove(&tensor.id);
        }
        Ok(data)
    }

    fn read_replicas(&mut self, tensor: &TensorIr) -> Result<Vec<TensorData>, BackendError> {
        let (_, local) = self.read_local_replicas(tensor, self.replicas())?;
        self.span.gather(local).map_err(|error| self.failure(error))
    }

    fn read_local_replicas(
        &mut self,
        tensor: &TensorIr,
        count: usize,
    ) -> Result<(usize, Vec<TensorData>), BackendError> {
        let local = (0..self.replicas().min(count))
            .map(|replica| self.download(tensor.id, replica))
            .collect::<Result<Vec<_>, _>>()?;
        if tensor.status == TensorStatus::ReadWrite {
            self.tensors.remove(&tensor.id);
        }
        Ok((self.span.first, local))
    }

    fn cuts_early(&self, computing: usize, computed_elements: u64) -> bool {
        self.target.cuts_early(computing, computed_elements)
    }

    fn seed(&mut self, seed: u64) {
        self.random_key = seed;
        self.random_counter = 0;
        // Operations that fall back to the host draw from the host's generator.
        HostExecutor::new(ReplicaSpan::local(1)).seed(seed);
    }
}
