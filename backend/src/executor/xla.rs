//! The `xla` target: each segment lowered to one HLO module, compiled once through a PJRT plugin
//! (`TRAINIUM_PJRT_PLUGIN`) for every replica of the device, and run on its PJRT devices.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use burn_backend::{DType, Shape, TensorData};
use trainium_ffi::pjrt::{
    Buffer, Client, CompileOptions, CreateOption, Device, Distributed, ElementType,
    LoadedExecutable, OptionValue, Plugin, ProgramFormat,
};

use super::plugin_kind::PluginKind;
use super::xla_cache::{MachineIdentity, XlaDiskCache};
use super::{CacheLimits, CompileOutcome, Target};
use crate::distributed::{ReplicaSpan, share};
use crate::lower::{Donation, FusedAttentionLowering, LowerOptions, LoweredProgram};
use crate::{BackendError, TrainiumDevice};

/// The environment variable holding the path of the PJRT plugin (a shared library).
pub const PLUGIN_ENV: &str = crate::settings::PJRT_PLUGIN.name;

/// The environment variable setting how many devices the XLA CPU plugin creates.
pub const CPU_DEVICES_ENV: &str = crate::settings::PJRT_CPU_DEVICES.name;

/// The environment variable holding XLA compiler options for every program of the `xla`
/// executor, `NAME=VALUE` pairs separated by commas (fields of XLA's `DebugOptions`, as JAX's
/// `compiler_options`), e.g. `xla_cpu_use_fusion_emitters=false,xla_backend_optimization_level=0`.
/// Unlike `XLA_FLAGS` they apply to this executor's compiles alone, and the persistent compile
/// cache keys programs by them.
pub const COMPILER_OPTIONS_ENV: &str = crate::settings::XLA_COMPILER_OPTIONS.name;

/// A program whose instructions produce at most this many elements each on average is one of
/// small tensors ([`holds_small_tensors`]).
pub(crate) const SMALL_TENSOR_ELEMENTS: f64 = 16_384.0;

/// Whether `module`'s instructions produce small tensors: at most [`SMALL_TENSOR_ELEMENTS`]
/// elements on average (parameters, constants and tuples left out). Such a program (an unrolled
/// recurrent step of thousands of operations on a batch of a few vectors) runs at the speed of
/// its kernels' launches, not of their code, so it is compiled with [`small_tensor_options`]:
/// measured on the unrolled LSTM step of `hlat bench unrolled` (9,124 operations cut at 2,048),
/// 9.4 s of compiling instead of 43.0 s for steady steps of 99.2 vs 97.8 ms; on bench-tiny's
/// large tensors the same options would make steps 1.6 to 2 times slower, and are not used.
pub(crate) fn holds_small_tensors(module: &crate::hlo::HloModuleProto) -> bool {
    let (mut instructions, mut elements) = (0u64, 0f64);
    for instruction in module
        .computations
        .iter()
        .flat_map(|computation| &computation.instructions)
    {
        let Some(shape) = &instruction.shape else {
            continue;
        };
        if !shape.tuple_shapes.is_empty()
            || matches!(
                instruction.opcode.as_str(),
                "parameter" | "constant" | "tuple" | "get-tuple-element"
            )
        {
            continue;
        }
        instructions += 1;
        elements += shape.dimensions.iter().product::<i64>().max(1) as f64;
    }
    instructions > 0 && elements / instructions as f64 <= SMALL_TENSOR_ELEMENTS
}

/// The operations after which a segment of small tensors (at most 16,384 elements produced per
/// operation on average) runs as a program of its own on `xla`, unless a segment cap is set
/// (`TRAINIUM_SEGMENT_CAP`, [`set_segment_cap`](crate::set_segment_cap)). Such programs run at
/// the speed of their kernels' launches, and their compile time grows faster than their length:
/// measured side by side on the unrolled LSTM step of `hlat bench unrolled` (9,124 operations,
/// 2026-12-02, docs/performance.md), one program compiled in 62.0 s in all with steady steps of 140.5 ms,
/// five programs cut at 2,048 operations in 9.9 s with steps of 99.0 ms. Larger tensors
/// (bench-tiny, HLAT) keep one program per segment, which lets the compiler fuse across the
/// whole step.
pub const SMALL_TENSOR_SEGMENT_CAP: usize = 2_048;

/// The XLA compiler options of programs of small tensors, unless `TRAINIUM_XLA_COMPILER_OPTIONS`
/// sets options of its own: no fusion emitters, no LLVM optimization.
fn small_tensor_options() -> Vec<(String, OptionValue)> {
    vec![
        (
            "xla_cpu_use_fusion_emitters".into(),
            OptionValue::Bool(false),
        ),
        ("xla_backend_optimization_level".into(), OptionValue::Int(0)),
    ]
}

/// How many devices the XLA CPU plugin creates unless `TRAINIUM_PJRT_CPU_DEVICES` says.
pub const DEFAULT_CPU_DEVICES: i64 = 4;

/// How many compiled programs each device keeps.
pub const COMPILE_CACHE_CAPACITY: usize = 256;

/// How many HLO instructions the programs a device keeps may hold together, a bound on the
/// memory of their compiled code. It must hold every program of a training loop, or each step
/// loads them again from the persistent cache (0.5 to 3 s each): Burn's modern-lstm as written
/// compiles 17 programs of 81,790 instructions together at its CLI test's sizes, more than the
/// 65,536 a device once kept. Memory mappings bound it earlier ([`COMPILE_CACHE_MAPPED_SHARE`]).
pub const COMPILE_CACHE_INSTRUCTIONS: usize = 1 << 20;

/// The share of the kernel's limit on memory mappings (`vm.max_map_count`, 65,530 by default)
/// the process may hold once a device keeps a program. Compiled code is mapped into the process
/// (the XLA CPU plugin maps a few regions per kernel): without a bound, hundreds of large
/// programs exhaust the mappings and LLVM aborts (seen in Burn's LU tests at no bound); 10
/// programs of about 1,900 instructions left the process at 2,300–3,400 mappings.
const COMPILE_CACHE_MAPPED_SHARE: f64 = 0.5;

const EXECUTOR: &str = "xla";

fn failure(reason: impl ToString) -> BackendError {
    BackendError::Execution {
        executor: EXECUTOR,
        reason: reason.to_string(),
    }
}

fn unavailable(reason: String) -> BackendError {
    BackendError::ExecutorUnavailable {
        executor: EXECUTOR,
        reason,
    }
}

/// The plugin and its one client, shared by every `xla` device of the process, with the
/// persistent compile cache of its programs.
struct Runtime {
    client: Client,
    disk_cache: Option<XlaDiskCache>,
    /// `TRAINIUM_XLA_COMPILER_OPTIONS`, for every compile.
    compiler_options: Vec<(String, OptionValue)>,
    /// The plugin's family: programs of small tensors are cut short and compiled cheaply on a
    /// CPU plugin, where that was measured to pay, and left whole on a GPU.
    kind: PluginKind,
    /// How the fused attention is lowered for this plugin's platform.
    fused_attention: FusedAttentionLowering,
}

/// How the fused attention is lowered for the PJRT platform `platform` (`cpu`, `cuda`, `rocm`,
/// `neuron`): as cuDNN's flash attention on CUDA (or anywhere `TRAINIUM_FUSED_ATTENTION=cudnn`
/// asks for it), blocked HLO elsewhere.
fn fused_attention_lowering(platform: &str) -> FusedAttentionLowering {
    let asked = crate::attention::fused_attention_from_env();
    if platform.eq_ignore_ascii_case("cuda")
        || asked.is_ok_and(|setting| setting == crate::attention::FusedAttentionSetting::Cudnn)
    {
        FusedAttentionLowering::Cudnn
    } else {
        FusedAttentionLowering::Blocked
    }
}

impl Runtime {
    /// Whether programs of small tensors get [`small_tensor_options`] and
    /// [`SMALL_TENSOR_SEGMENT_CAP`]: CPU plugins' kernel launches and compile times, not a GPU's.
    fn cuts_small_programs(&self) -> bool {
        self.kind != PluginKind::Gpu
    }
}

/// XLA GPU's option naming the folder of its per-fusion autotuning results.
const AUTOTUNE_CACHE_OPTION: &str = "xla_gpu_per_fusion_autotune_cache_dir";
/// XLA GPU's option naming the file of its compiled kernels.
const KERNEL_CACHE_OPTION: &str = "xla_gpu_kernel_cache_file";

/// The options that keep a GPU plugin's autotuning results and compiled kernels in `cache`'s
/// [`XlaDiskCache::tuning_folder`], so that a program the cache does not hold (another length or
/// layout of the same model) reuses the tuning and kernels of the programs before it instead of
/// autotuning every product again. Only for a GPU plugin with a cache, and only the options
/// `given` (`TRAINIUM_XLA_COMPILER_OPTIONS`) does not set.
fn gpu_tuning_options(
    kind: PluginKind,
    cache: Option<&XlaDiskCache>,
    given: &[(String, OptionValue)],
) -> Vec<(String, OptionValue)> {
    let (PluginKind::Gpu, Some(cache)) = (kind, cache) else {
        return Vec::new();
    };
    let folder = cache.tuning_folder();
    [
        (AUTOTUNE_CACHE_OPTION, folder.join("autotune")),
        (KERNEL_CACHE_OPTION, folder.join("kernels.bin")),
    ]
    .into_iter()
    .filter(|(name, _)| !given.iter().any(|(set, _)| set == name))
    .map(|(name, path)| {
        let text = path.to_string_lossy().into_owned();
        (name.to_string(), OptionValue::Text(text))
    })
    .collect()
}

/// The compiler options of `TRAINIUM_XLA_COMPILER_OPTIONS`'s value `text` (empty: none).
fn parse_compiler_options(text: &str) -> Result<Vec<(String, OptionValue)>, BackendError> {
    parse_options(COMPILER_OPTIONS_ENV, text)
}

/// The client create options of a plugin of `kind`: its defaults, replaced or added to by
/// `TRAINIUM_PJRT_CREATE_OPTIONS`'s value `text`.
fn create_options(
    kind: PluginKind,
    cpu_devices: i64,
    text: &str,
) -> Result<Vec<CreateOption>, BackendError> {
    let mut options = kind.default_create_options(cpu_devices);
    for (name, value) in parse_options(crate::settings::PJRT_CREATE_OPTIONS.name, text)? {
        options.retain(|option| option.name != name);
        options.push(CreateOption { name, value });
    }
    Ok(options)
}

/// The `NAME=VALUE,...` options of `variable`'s value `text` (empty: none).
fn parse_options(
    variable: &'static str,
    text: &str,
) -> Result<Vec<(String, OptionValue)>, BackendError> {
    let invalid = |reason: String| BackendError::InvalidSetting {
        variable,
        value: text.to_string(),
        reason,
    };
    let mut options: Vec<(String, OptionValue)> = Vec::new();
    for entry in text
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
    {
        let (name, value) = match entry.split_once('=') {
            Some((name, value)) if !name.trim().is_empty() && !value.trim().is_empty() => {
                (name.trim(), value.trim())
            }
            _ => return Err(invalid(format!("`{entry}` is not NAME=VALUE"))),
        };
        if options.iter().any(|(known, _)| known == name) {
            return Err(invalid(format!("`{name}` is given twice")));
        }
        options.push((name.to_string(), OptionValue::from_text(value)));
    }
    Ok(options)
}

/// A program the plugin compiles in milliseconds, to try the compiler options on.
const PROBE_PROGRAM: &str = r#"
func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %a, %a : tensor<2xf32>
  return %0 : tensor<2xf32>
}
"#;

/// The plugin path and CPU device count from the values of `TRAINIUM_PJRT_PLUGIN` and
/// `TRAINIUM_PJRT_CPU_DEVICES`.
fn settings(
    plugin: Option<OsString>,
    cpu_devices: Option<String>,
) -> Result<(PathBuf, i64), BackendError> {
    let path = match plugin.filter(|value| !value.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => {
            let found = super::plugin_discovery::discover(
                &super::plugin_discovery::python_site_packages(),
                super::plugin_discovery::cache_home().as_deref(),
            )
            .ok_or_else(|| {
                unavailable(format!(
                    "{PLUGIN_ENV} is not set and no PJRT plugin was found (in the Python \
                     packages' jax_plugins or libneuronxla, or installed by \
                     `scripts/install-xla-cpu`): run `scripts/install-xla-cpu` from this \
                     repository, or point {PLUGIN_ENV} at a plugin"
                ))
            })?;
            log::info!(
                "{PLUGIN_ENV} is not set: using the PJRT plugin {} found in {}",
                found.path.display(),
                found.source
            );
            found.path
        }
    };
    let cpu_devices = match cpu_devices {
        Some(value) => value
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|count| *count > 0)
            .ok_or_else(|| {
                unavailable(format!(
                    "{CPU_DEVICES_ENV}=`{value}` is not a positive device count"
                ))
            })?,
        None => DEFAULT_CPU_DEVICES,
    };
    Ok((path, cpu_devices))
}

/// Loads the plugin named by `TRAINIUM_PJRT_PLUGIN` once and creates its client: one of this
/// process's devices, or one joining the processes of a job (`distributed`).
fn runtime(distributed: Option<&Distributed>) -> Result<Arc<Runtime>, BackendError> {
    /// The runtimes by plugin path, and whether the client joined a job.
    type Runtimes = HashMap<(PathBuf, bool), Arc<Runtime>>;
    static RUNTIMES: OnceLock<Mutex<Runtimes>> = OnceLock::new();
    let (path, cpu_devices) = settings(
        crate::settings::PJRT_PLUGIN.var_os(),
        crate::settings::PJRT_CPU_DEVICES.value(),
    )?;
    let mut runtimes = RUNTIMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let key = (path, distributed.is_some());
    if let Some(runtime) = runtimes.get(&key) {
        return Ok(runtime.clone());
    }
    let path = &key.0;
    let plugin =
        Plugin::load(path).map_err(|error| unavailable(format!("{error} (from {PLUGIN_ENV})")))?;
    let kind = PluginKind::of(path);
    let options = create_options(
        kind,
        cpu_devices,
        &crate::settings::PJRT_CREATE_OPTIONS
            .var()
            .unwrap_or_default(),
    )?;
    log::info!(
        "creating the PJRT client of {} with {}",
        path.display(),
        options
            .iter()
            .map(|option| format!("{}={:?}", option.name, option.value))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let client = match distributed {
        None => Client::new(&plugin, &options),
        Some(distributed) => Client::joining(&plugin, &options, distributed),
    }
    .map_err(|error| unavailable(error.to_string()))?;
    let device_kind = client
        .devices()
        .first()
        .map(|device| {
            client
                .device_kind(device)
                .unwrap_or_else(|error| error.to_string())
        })
        .unwrap_or_default();
    log::info!(
        "PJRT client on {} ({}) with {} devices of kind `{device_kind}`",
        client
            .platform_name()
            .unwrap_or_else(|error| error.to_string()),
        kind.describe(),
        client.devices().len()
    );
    let options_text = crate::settings::XLA_COMPILER_OPTIONS
        .var()
        .unwrap_or_default();
    let compiler_options = parse_compiler_options(&options_text)?;
    if !compiler_options.is_empty() {
        // An unknown name would otherwise surface at the first segment, mid-job.
        let device = client.devices().first().ok_or_else(|| {
            unavailable(format!(
                "the PJRT client at {} has no devices",
                path.display()
            ))
        })?;
        let mut probe = CompileOptions::on_device(device.id);
        probe.compiler_options = compiler_options.clone();
        if let Err(error) = client.compile(PROBE_PROGRAM.as_bytes(), ProgramFormat::Mlir, &probe) {
            return Err(BackendError::InvalidSetting {
                variable: COMPILER_OPTIONS_ENV,
                value: options_text,
                reason: format!("the plugin refuses them: {error}"),
            });
        }
        log::info!("XLA compiler options: {options_text}");
    }
    let disk_cache = XlaDiskCache::from_env(path, &machine_identity(&client));
    let fused_attention = fused_attention_lowering(&client.platform_name().unwrap_or_default());
    if fused_attention == FusedAttentionLowering::Cudnn {
        log::info!("the fused attention runs as cuDNN's flash attention where cuDNN computes it");
    }
    let runtime = Arc::new(Runtime {
        client,
        disk_cache,
        compiler_options,
        kind,
        fused_attention,
    });
    runtimes.insert(key, runtime.clone());
    Ok(runtime)
}

/// What the code `client` compiles is specific to (see [`MachineIdentity`]); a part the plugin
/// cannot report is left empty, and logged.
fn machine_identity(client: &Client) -> MachineIdentity {
    let report = |what: &str, result: Result<String, trainium_ffi::pjrt::PjrtError>| {
        result.unwrap_or_else(|error| {
            log::debug!("the PJRT plugin does not report its {what}: {error}");
            String::new()
        })
    };
    let name = report("platform name", client.platform_name());
    let version = report("platform version", client.platform_version());
    let device_kinds = client
        .devices()
        .iter()
        .map(|device| report("device kind", client.device_kind(device)))
        .collect();
    let processor = if name == "cpu" {
        MachineIdentity::host_processor()
    } else {
        String::new()
    };
    MachineIdentity {
        platform: format!("{name} {version}"),
        device_kinds,
        processor,
    }
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

/// The `xla` target of the device executor: PJRT buffers and loaded executables on the
/// consecutive PJRT devices of a (replicated) device.
pub(crate) struct XlaTarget {
    runtime: Arc<Runtime>,
    /// The PJRT device of each of this process's replicas.
    devices: Vec<Device>,
    /// The PJRT device id of every replica of the device, over every process of its job.
    assignment: Vec<i64>,
}

impl XlaTarget {
    /// Opens `device` (`xla:N` is the N-th addressable device of the plugin's client, `xla:A-B`
    /// devices A to B).
    ///
    /// A device spanning the processes of a job needs a plugin that joins them: its client is
    /// created with the job's node id, node count and key-value store, and each process drives
    /// its replicas on its own devices.
    pub fn open(device: &TrainiumDevice, span: &ReplicaSpan) -> Result<Self, BackendError> {
        let distributed = span.distributed();
        if let Some(distributed) = &distributed {
            let (path, _) = settings(
                crate::settings::PJRT_PLUGIN.var_os(),
                crate::settings::PJRT_CPU_DEVICES.value(),
            )?;
            let variable =
                |name: &str| crate::settings::named(name).and_then(|known| known.value());
            if let Some(reason) = PluginKind::of(&path).job_environment_error(
                distributed.node_id,
                distributed.num_nodes,
                span.local,
                variable,
            ) {
                return Err(unavailable(reason));
            }
        }
        let runtime = runtime(distributed.as_ref())?;
        let available = runtime.client.devices();
        let devices = (0..span.local)
            .map(|replica| {
                let index = usize::from(device.index) + replica;
                available.get(index).copied().ok_or_else(|| BackendError::ExecutorUnavailable {
                    executor: EXECUTOR,
                    reason: format!(
                        "device {device} does not exist: the PJRT client has {} devices (the XLA \
                         CPU plugin makes {CPU_DEVICES_ENV} of them, default {DEFAULT_CPU_DEVICES})",
                        available.len()
                    ),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let own: Vec<i64> = devices.iter().map(|device| device.id).collect();
        let assignment = match &distributed {
            None => own,
            Some(distributed) => job_assignment(&runtime.client, device, distributed, own)?,
        };
        Ok(Self {
            runtime,
            devices,
            assignment,
        })
    }
}

/// The PJRT device ids of every replica of `device` over the processes of its job: `own` are
/// this process's; each process publishes its own in the job's store and reads the others', so
/// the assignment is the same everywhere. A plugin that did not join the job (every device it
/// reports is this process's) is an error that says so.
fn job_assignment(
    client: &Client,
    device: &TrainiumDevice,
    distributed: &Distributed,
    own: Vec<i64>,
) -> Result<Vec<i64>, BackendError> {
    let global = client
        .global_devices()
        .map_err(|error| unavailable(error.to_string()))?;
    if global.len() <= client.devices().len() {
        let platform = client
            .platform_name()
            .unwrap_or_else(|error| error.to_string());
        return Err(BackendError::Unsupported {
            executor: EXECUTOR,
            what: format!(
                "{device} across the {} processes of a job: the `{platform}` PJRT plugin did \
                 not join them (it reports {} devices, all of this process; the XLA CPU plugin \
                 takes no node id, node count or key-value store and has no collectives \
                 between processes); use a `host` or `neuron` device, or one process per job",
                distributed.num_nodes,
                global.len()
            ),
        });
    }
    let key = format!("burn-trainium/{device}/device-ids");
    let text = own.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let every = share(&key, text.as_bytes())
        .map_err(|error| unavailable(format!("{device}: exchanging device ids: {error}")))?;
    let mut assignment = Vec::new();
    for (rank, value) in every.iter().enumerate() {
        let value = String::from_utf8_lossy(value);
        for id in value.split(',') {
            assignment.push(id.parse::<i64>().map_err(|_| {
                unavailable(format!(
                    "{device}: rank {rank} published device ids `{value}` under `{key}`"
                ))
            })?);
        }
    }
    let mut distinct = assignment.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let expected = own.len() * distributed.num_nodes;
    if assignment.len() != expected || distinct.len() != expected {
        return Err(unavailable(format!(
            "{device}: the job's processes hold devices {assignment:?}, not {expected} distinct \
             ones ({} per process): were they all started with the same layout?",
            own.len()
        )));
    }
    log::info!("{device}: replicas on PJRT devices {assignment:?} over the job's processes");
    Ok(assignment)
}

impl Target for XlaTarget {
    type Buffer = Buffer;
    type Program = LoadedExecutable;

    const EXECUTOR: &'static str = EXECUTOR;
    const CACHE_LIMITS: CacheLimits = CacheLimits {
        programs: COMPILE_CACHE_CAPACITY,
        instructions: COMPILE_CACHE_INSTRUCTIONS,
        mapped_share: Some(COMPILE_CACHE_MAPPED_SHARE),
    };

    fn cuts_early(&self, computing: usize, computed_elements: u64) -> bool {
        self.runtime.cuts_small_programs()
            && computing >= SMALL_TENSOR_SEGMENT_CAP
            && computed_elements as f64 / computing as f64 <= SMALL_TENSOR_ELEMENTS
    }

    fn lower_options(&self) -> LowerOptions {
        LowerOptions {
            random_on_device: true,
            donation: Donation::InPlace,
            fused_attention: self.runtime.fused_attention,
            ..LowerOptions::default()
        }
    }

    fn upload(&mut self, replica: usize, data: &TensorData) -> Result<Buffer, BackendError> {
        let element = element_type(data.dtype())?;
        let dims: Vec<i64> = data.shape().iter().map(|&d| d as i64).collect();
        self.runtime
            .client
            .buffer_from_host(data.as_bytes(), element, &dims, &self.devices[replica])
            .map_err(failure)
    }

    fn download(
        &self,
        buffer: &Buffer,
        shape: &Shape,
        dtype: DType,
    ) -> Result<TensorData, BackendError> {
        let size = shape.num_elements() * element_type(dtype)?.size_in_bytes();
        let mut bytes = vec![0u8; size];
        buffer.copy_to_host(&mut bytes).map_err(failure)?;
        Ok(TensorData::from_bytes_vec(bytes, shape.clone(), dtype))
    }

    fn compile(
        &mut self,
        program: &LoweredProgram,
    ) -> Result<(LoadedExecutable, CompileOutcome), BackendError> {
        let start = Instant::now();
        let mut options = CompileOptions::replicated(&self.assignment);
        options.compiler_options = match self.runtime.compiler_options.is_empty() {
            true if self.runtime.cuts_small_programs() && holds_small_tensors(&program.module) => {
                small_tensor_options()
            }
            _ => self.runtime.compiler_options.clone(),
        };
        options.compiler_options.extend(gpu_tuning_options(
            self.runtime.kind,
            self.runtime.disk_cache.as_ref(),
            &self.runtime.compiler_options,
        ));
        log::debug!(
            "{}: compiler options {:?}",
            program.module.name,
            options.compiler_options
        );
        let cached = self.runtime.disk_cache.as_ref().map(|cache| {
            let entry = cache.entry(&program.bytes, &options.encode());
            (cache, entry)
        });
        if let Some((cache, entry)) = &cached
            && let Some(serialized) = cache.load(entry)
        {
            let loaded = super::xla_stderr::without_spurious_feature_warnings(|| {
                self.runtime.client.load_serialized(&serialized)
            });
            match loaded {
                Ok(executable) => {
                    log::debug!("{}: loaded from {}", program.module.name, entry.display());
                    return Ok((executable, CompileOutcome::Cached));
                }
                Err(error) => {
                    log::warn!(
                        "xla compile cache: {} does not load ({error}); compiling {} again",
                        entry.display(),
                        program.module.name
                    );
                    cache.evict(entry);
                }
            }
        }
        let executable = self
            .runtime
            .client
            .compile(&program.bytes, ProgramFormat::Hlo, &options)
            .map_err(|error| failure(format!("compiling {}: {error}", program.module.name)))?;
        let seconds = start.elapsed().as_secs_f64();
        if let Some((cache, entry)) = &cached {
            match executable.serialize() {
                Ok(serialized) => cache.store(entry, &program.module.name, &serialized),
                Err(error) => log::warn!(
                    "xla compile cache: the plugin cannot serialize {}: {error}",
                    program.module.name
                ),
            }
        }
        Ok((executable, CompileOutcome::Compiled { seconds }))
    }

    fn launch(
        &mut self,
        executable: &LoadedExecutable,
        program: &LoweredProgram,
        arguments: Vec<Vec<&Buffer>>,
    ) -> Result<Vec<Vec<Buffer>>, BackendError> {
        executable
            .execute_replicated(&arguments)
            .map_err(|error| failure(format!("running {}: {error}", program.module.name)))
    }

    fn scratch_bytes(&self, compiled: &LoadedExecutable) -> Option<u64> {
        match compiled.compiled_memory_stats() {
            Ok(stats) => stats.map(|stats| stats.temp_bytes),
            Err(error) => {
                log::warn!("the plugin's compiled memory statistics failed: {error}");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlo::{HloComputationProto, HloInstructionProto, HloModuleProto, ShapeProto};

    /// A module whose instructions produce arrays of `dims` (and one parameter of a large one).
    fn module_of(dims: &[&[i64]]) -> HloModuleProto {
        let instruction = |opcode: &str, dimensions: &[i64]| HloInstructionProto {
            opcode: opcode.into(),
            shape: Some(ShapeProto {
                dimensions: dimensions.to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut instructions = vec![instruction("parameter", &[1 << 20])];
        instructions.extend(dims.iter().map(|dims| instruction("add", dims)));
        HloModuleProto {
            computations: vec![HloComputationProto {
                instructions,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn only_cuda_platforms_lower_the_fused_attention_to_cudnn() {
        assert_eq!(
            fused_attention_lowering("cuda"),
            FusedAttentionLowering::Cudnn
        );
        for platform in ["cpu", "rocm", "neuron", ""] {
            assert_eq!(
                fused_attention_lowering(platform),
                FusedAttentionLowering::Blocked,
                "{platform}"
            );
        }
    }

    #[test]
    fn programs_of_small_tensors_are_told_apart_by_their_mean_output() {
        // An LSTM cell on 8 sequences of width 64: gates of 8 x 256, states of 8 x 64.
        assert!(holds_small_tensors(&module_of(&[
            &[8, 256],
            &[8, 64],
            &[8, 64]
        ])));
        // A 4 x 256-token transformer step: hidden states of 1024 x 64 and logits.
        assert!(!holds_small_tensors(&module_of(&[
            &[1024, 64],
            &[1024, 512]
        ])));
        // The mean, not the largest: one large tensor among many small ones stays small.
        let mut many: Vec<&[i64]> = vec![&[8, 64]; 100];
        many.push(&[1024, 512]);
        assert!(holds_small_tensors(&module_of(&many)));
        // Parameters alone say nothing.
        assert!(!holds_small_tensors(&module_of(&[])));
        assert!(holds_small_tensors(&module_of(&[&[
            SMALL_TENSOR_ELEMENTS as i64
        ]])));
        assert!(!holds_small_tensors(&module_of(&[&[
            SMALL_TENSOR_ELEMENTS as i64 + 1
        ]])));
    }

    #[test]
    fn compiler_options_are_name_value_pairs() {
        assert_eq!(parse_compiler_options("").unwrap(), vec![]);
        assert_eq!(
            parse_compiler_options(" a=true, b=2 ,").unwrap(),
            vec![
                ("a".to_string(), OptionValue::Bool(true)),
                ("b".to_string(), OptionValue::Int(2)),
            ]
        );
        for bad in ["a", "a=", "=1", "a=1,b"] {
            let message = parse_compiler_options(bad).unwrap_err().to_string();
            assert!(
                message.contains(COMPILER_OPTIONS_ENV) && message.contains("NAME=VALUE"),
                "{bad}: {message}"
            );
        }
        let twice = parse_compiler_options("a=1,a=2").unwrap_err().to_string();
        assert!(twice.contains("`a` is given twice"), "{twice}");
    }

    #[test]
    fn a_gpu_plugin_keeps_its_tuning_beside_the_compile_cache() {
        let folder = tempfile::tempdir().unwrap();
        let machine = MachineIdentity::default();
        let cache = XlaDiskCache::new(folder.path().into(), "/cuda.so".as_ref(), &machine, "");
        let options = gpu_tuning_options(PluginKind::Gpu, Some(&cache), &[]);
        let names: Vec<&str> = options.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, [AUTOTUNE_CACHE_OPTION, KERNEL_CACHE_OPTION]);
        for (_, value) in &options {
            let OptionValue::Text(path) = value else {
                panic!("{value:?}")
            };
            assert!(path.starts_with(&*cache.tuning_folder().to_string_lossy()));
        }
        // Another plugin (another build) tunes in another folder.
        let other = XlaDiskCache::new(folder.path().into(), "/other.so".as_ref(), &machine, "");
        assert_ne!(other.tuning_folder(), cache.tuning_folder());
        // A CPU plugin, no cache, or the user's own setting: nothing added for it.
        assert!(gpu_tuning_options(PluginKind::Xla, Some(&cache), &[]).is_empty());
        assert!(gpu_tuning_options(PluginKind::Gpu, None, &[]).is_empty());
        let given = [(
            KERNEL_CACHE_OPTION.to_string(),
            OptionValue::Text("k".into()),
        )];
        let kept = gpu_tuning_options(PluginKind::Gpu, Some(&cache), &given);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].0, AUTOTUNE_CACHE_OPTION);
    }

    #[test]
    fn missing_or_bad_settings_say_what_to_do() {
        let count = settings(Some("/plugin.so".into()), Some("zero".into()))
            .unwrap_err()
            .to_string();
        assert!(
            count.contains("`zero` is not a positive device count"),
            "{count}"
        );
        assert_eq!(
            settings(Some("/plugin.so".into()), None).unwrap(),
            (PathBuf::from("/plugin.so"), DEFAULT_CPU_DEVICES)
        );
    }
}
