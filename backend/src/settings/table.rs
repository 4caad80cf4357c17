//! The table of the backend's environment variables: one descriptor per variable, and
//! [`VARIABLES`], every one of them in the order the README presents them.

use super::{Reader, Variable};

/// `TRAINIUM_DEVICE`: the default device.
pub const DEVICE: Variable = Variable {
    name: "TRAINIUM_DEVICE",
    meaning: "the device `TrainiumDevice::default()` opens: an executor (`host`, `xla`, \
              `neuron`), optionally with an index (`xla:1`) or a range of replicas (`xla:0-3`)",
    default: "host:0",
    parser: "parsed as a device name; blank is unset; a bad value or non-UTF-8 is an error \
             naming the variable and the value, never a silent switch",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_PJRT_PLUGIN`: the PJRT plugin of the `xla` executor.
pub const PJRT_PLUGIN: Variable = Variable {
    name: "TRAINIUM_PJRT_PLUGIN",
    meaning: "path of the PJRT plugin (a shared library exporting `GetPjrtApi`) the `xla` \
              executor loads",
    default: "the Python packages' `jax_plugins`/`libneuronxla` plugin, then the newest one \
              `scripts/install-xla-cpu` installed (logged)",
    parser: "a path; empty is unset; a file that does not load is an error naming it",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_PJRT_CPU_DEVICES`: how many devices the XLA CPU plugin creates.
pub const PJRT_CPU_DEVICES: Variable = Variable {
    name: "TRAINIUM_PJRT_CPU_DEVICES",
    meaning: "how many devices the XLA CPU plugin creates (`cpu_device_count`; not passed to a \
              GPU plugin)",
    default: "4",
    parser: "a positive integer; non-UTF-8 is unset; anything else is an error naming the \
             variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_PJRT_CREATE_OPTIONS`: the PJRT client's create options.
pub const PJRT_CREATE_OPTIONS: Variable = Variable {
    name: "TRAINIUM_PJRT_CREATE_OPTIONS",
    meaning: "create options of the `xla` executor's PJRT client, over the plugin's defaults \
              (e.g. `memory_fraction=0.5` or `preallocate=true` for the CUDA plugin)",
    default: "`cpu_device_count` for the XLA CPU plugin, `preallocate=false` for a CUDA or ROCm \
              plugin",
    parser: "`NAME=VALUE` pairs separated by commas (`true`/`false`, integers, numbers with a \
             point, else text); a pair without `=` or a name given twice is an error naming the \
             variable and the value; a CUDA plugin refuses a name or type it does not expect",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_XLA_CACHE_DIR`: the `xla` executor's persistent compile cache.
pub const XLA_CACHE_DIR: Variable = Variable {
    name: "TRAINIUM_XLA_CACHE_DIR",
    meaning: "the folder of the `xla` executor's persistent compile cache",
    default: "`$XDG_CACHE_HOME/burn-trainium/xla`, else `$HOME/.cache/burn-trainium/xla`",
    parser: "a path; `off` turns the cache off; empty is unset",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_XLA_CACHE_MAX_BYTES`: the bound of the compile cache's size.
pub const XLA_CACHE_MAX_BYTES: Variable = Variable {
    name: "TRAINIUM_XLA_CACHE_MAX_BYTES",
    meaning: "the bound of the `xla` compile cache's size: past it, the least recently used \
              programs are removed after each store",
    default: "4294967296 (4 GiB)",
    parser: "a byte count; non-UTF-8 is unset; a bad value is logged (WARN) and the default \
             kept",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `XLA_FLAGS`: the XLA compiler's own flags.
pub const XLA_FLAGS: Variable = Variable {
    name: "XLA_FLAGS",
    meaning: "the XLA compiler's own flags, read by the PJRT plugin; the `xla` compile cache \
              keys its programs by them",
    default: "XLA's defaults",
    parser: "the plugin's (the backend only keys its cache on the text)",
    reader: Reader::Library("the PJRT plugin"),
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_XLA_COMPILER_OPTIONS`: XLA compiler options for the `xla` executor's programs.
pub const XLA_COMPILER_OPTIONS: Variable = Variable {
    name: "TRAINIUM_XLA_COMPILER_OPTIONS",
    meaning: "XLA compiler options (fields of `DebugOptions`) for the `xla` executor's programs \
              only; the compile cache keys programs by them",
    default: "cheap options for programs of small tensors, XLA's defaults for the others",
    parser: "`NAME=VALUE` pairs separated by commas; a pair without `=`, a name given twice or \
             one the plugin refuses is an error naming the variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_FUSED_ATTENTION`: whether `burn_trainium::attention::fused_attention` is one
/// operation on a Trainium device.
pub const FUSED_ATTENTION: Variable = Variable {
    name: "TRAINIUM_FUSED_ATTENTION",
    meaning: "whether `fused_attention` on a Trainium device is one forward and one backward \
              operation (`on`) or the materialised form in Burn's operations (`off`, to compare \
              the two: `scripts/device-check` does); `cudnn` lowers it as cuDNN's flash \
              attention on any `xla` plugin, to read with `TRAINIUM_DUMP_DIR` the HLO a CUDA \
              plugin gets (another plugin cannot compile it)",
    default: "on",
    parser: "`on`, `off` or `cudnn`, exactly, read once by the process; blank or non-UTF-8 is \
             unset; another value is an error naming the variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: false,
};

/// `TRAINIUM_HOST_FALLBACK`: what an operation without a lowering does.
pub const HOST_FALLBACK: Variable = Variable {
    name: "TRAINIUM_HOST_FALLBACK",
    meaning: "what an operation without a lowering does on `xla` and `neuron`: run on the host \
              with one WARN line per kind (`warn`), fail naming it (`error`), or run on the host \
              silently (`allow`)",
    default: "warn",
    parser: "`allow`, `warn` or `error`, read once; blank or non-UTF-8 is unset; another value \
             is an error naming the variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_HOST_OPERATIONS`: operation kinds kept on the host.
pub const HOST_OPERATIONS: Variable = Variable {
    name: "TRAINIUM_HOST_OPERATIONS",
    meaning: "operation kinds `xla` and `neuron` run on the host although they have a \
              lowering, to bisect a result that differs between executors",
    default: "none",
    parser: "kinds as the fallback reports name them, comma-separated (`Module::Conv2d`), read \
             once; a kind Burn's IR lacks is an error naming the variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_SEGMENT_CAP`: the operations after which a segment runs.
pub const SEGMENT_CAP: Variable = Variable {
    name: "TRAINIUM_SEGMENT_CAP",
    meaning: "the operations after which a segment is cut into a program of its own even if \
              nothing is read",
    default: "65,536",
    parser: "a positive integer, read once; blank is unset; unset, `xla` also cuts segments of \
             small tensors every 2,048; a bad value or non-UTF-8 is an error naming the \
             variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_MAX_TENSOR_BYTES`: the largest tensor an operation may make on a device.
pub const MAX_TENSOR_BYTES: Variable = Variable {
    name: "TRAINIUM_MAX_TENSOR_BYTES",
    meaning: "the largest tensor, in bytes, an operation may make on a device: an operation \
              asking for more is refused before anything is allocated, and reading its result \
              is an error naming the size and the limit",
    default: "the machine's physical memory",
    parser: "a positive integer, read once; blank is unset; a bad value or non-UTF-8 is an \
             error naming the variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_DUMP_DIR`: where lowered modules are written.
pub const DUMP_DIR: Variable = Variable {
    name: "TRAINIUM_DUMP_DIR",
    meaning: "a folder every lowered HLO module is written to, as `.hlo.pb` and `.hlo.txt`",
    default: "off",
    parser: "a path; empty is unset",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_JOIN_TIMEOUT_S`: how long joining a job waits.
pub const JOIN_TIMEOUT: Variable = Variable {
    name: "TRAINIUM_JOIN_TIMEOUT_S",
    meaning: "how long `distributed::join` waits for every process of a job to connect, in \
              seconds",
    default: "300",
    parser: "a positive number of seconds; non-UTF-8 is unset; anything else is an error \
             naming the variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `TRAINIUM_EXCHANGE_TIMEOUT_S`: how long one exchange between processes may take.
pub const EXCHANGE_TIMEOUT: Variable = Variable {
    name: "TRAINIUM_EXCHANGE_TIMEOUT_S",
    meaning: "how long one exchange between the processes of a job may take, in seconds",
    default: "1800",
    parser: "a positive number of seconds; non-UTF-8 is unset; anything else is an error \
             naming the variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `NEURON_RT_LIB_DIR`: where `libnrt` is looked up.
pub const NEURON_RT_LIB_DIR: Variable = Variable {
    name: trainium_ffi::nrt::LIB_DIR_ENV,
    meaning: "a folder holding `libnrt.so.1`, searched first",
    default: "`/opt/aws/neuron/lib`, then the dynamic loader's path",
    parser: "a path; empty is unset",
    reader: Reader::Library("trainium-ffi's libnrt loader"),
    set_by_backend: false,
    user_facing: true,
};

/// `NEURON_RT_VISIBLE_CORES`: the NeuronCores this process may use.
pub const NEURON_RT_VISIBLE_CORES: Variable = Variable {
    name: "NEURON_RT_VISIBLE_CORES",
    meaning: "the NeuronCores this process may use (read by `libnrt` at `nrt_init`); the backend \
              names it when a device does not exist, and computes each process's cores for a job",
    default: "every core",
    parser: "the runtime's (a core or a range, `16-23`)",
    reader: Reader::Library("libnrt"),
    set_by_backend: true,
    user_facing: true,
};

/// `NEURON_RT_STOCHASTIC_ROUNDING_EN`: stochastic rounding of BF16 results.
pub const NEURON_RT_STOCHASTIC_ROUNDING: Variable = Variable {
    name: "NEURON_RT_STOCHASTIC_ROUNDING_EN",
    meaning: "`1`: stochastic rounding of BF16 results (read by `libnrt` at `nrt_init`; the \
              backend logs it)",
    default: "the runtime's",
    parser: "the runtime's",
    reader: Reader::Library("libnrt"),
    set_by_backend: false,
    user_facing: true,
};

/// `NEURON_RT_ROOT_COMM_ID`: where the ranks of a collective program meet.
pub const NEURON_RT_ROOT_COMM_ID: Variable = Variable {
    name: "NEURON_RT_ROOT_COMM_ID",
    meaning: "the `HOST:PORT` where the ranks of a collective program meet (read by the Neuron \
              collectives); a replicated `neuron` device needs it, and every process of a job \
              must agree with rank 0's",
    default: "none (`hlat` sets `localhost:61234`, or rank 0's host and `MASTER_PORT` + 2 in a job)",
    parser: "the runtime's; empty is unset",
    reader: Reader::Library("libnrt's collectives"),
    set_by_backend: true,
    user_facing: true,
};

/// `NEURON_PJRT_PROCESS_INDEX`: this process's index, for the Neuron SDK's PJRT plugin.
pub const NEURON_PJRT_PROCESS_INDEX: Variable = Variable {
    name: "NEURON_PJRT_PROCESS_INDEX",
    meaning: "this process's index in a job, read by the Neuron SDK's PJRT plugin instead of the \
              launcher's; the backend checks it against the job",
    default: "none: a job of several processes on that plugin is refused, naming the values to set",
    parser: "an integer equal to this process's rank",
    reader: Reader::Library("the Neuron SDK's PJRT plugin"),
    set_by_backend: false,
    user_facing: true,
};

/// `NEURON_PJRT_PROCESSES_NUM_DEVICES`: every process's NeuronCores, for the Neuron PJRT plugin.
pub const NEURON_PJRT_PROCESSES_NUM_DEVICES: Variable = Variable {
    name: "NEURON_PJRT_PROCESSES_NUM_DEVICES",
    meaning: "the NeuronCores of every process of a job, read by the Neuron SDK's PJRT plugin; \
              the backend checks it against the job",
    default: "none: a job of several processes on that plugin is refused, naming the values to set",
    parser: "comma-separated integers, one per process",
    reader: Reader::Library("the Neuron SDK's PJRT plugin"),
    set_by_backend: false,
    user_facing: true,
};

/// `NEURON_CC`: the Neuron compiler executable.
pub const NEURON_CC: Variable = Variable {
    name: "NEURON_CC",
    meaning: "the compiler executable of the `neuron` executor (a path or a name on `PATH`)",
    default: "neuronx-cc",
    parser: "a path; blank is unset",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `NEURON_CC_FLAGS`: the Neuron compiler's flags.
pub const NEURON_CC_FLAGS: Variable = Variable {
    name: "NEURON_CC_FLAGS",
    meaning: "compiler flags, as for torch-neuronx; `--cache_dir=PATH` and \
              `--retry_failed_compilation` belong to the NEFF cache",
    default: "--model-type transformer",
    parser: "split on whitespace; blank is unset; `--target` or a `--cache_dir` without a path \
             is an error naming the variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `NEURON_COMPILE_CACHE_URL`: the NEFF cache folder.
pub const NEURON_COMPILE_CACHE_URL: Variable = Variable {
    name: "NEURON_COMPILE_CACHE_URL",
    meaning: "the NEFF cache folder, as for torch-neuronx",
    default: "/var/tmp/neuron-compile-cache",
    parser: "a path or a `file://` URL; blank is unset; a remote URL (`s3://`) is an error \
             naming the variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `HLAT_NEURON_TARGET`: the Trainium generation NEFFs are compiled for.
pub const NEURON_TARGET: Variable = Variable {
    name: "HLAT_NEURON_TARGET",
    meaning: "the Trainium generation NEFFs are compiled for (`neuronx-cc --target`, part of the \
              cache key)",
    default: "trn1",
    parser: "`trn1` or `trn2`, any case; blank is unset; another value is an error naming the \
             variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `HLAT_NEURON_COMPILE_ONLY`: compile-only mode of the `neuron` executor.
pub const NEURON_COMPILE_ONLY: Variable = Variable {
    name: "HLAT_NEURON_COMPILE_ONLY",
    meaning: "compile-only mode of the `neuron` executor (as `hlat compile`): every segment is \
              compiled into the NEFF cache, nothing runs",
    default: "off",
    parser: "`1`, `true` or `TRUE` (trimmed) turn it on; any other value leaves it off",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `HLAT_NEURON_LINT`: what a module breaking the Neuron lint's rules does.
pub const NEURON_LINT: Variable = Variable {
    name: "HLAT_NEURON_LINT",
    meaning: "what a module breaking the Neuron lint's rules does: refused naming each violation \
              (`error`), logged and compiled anyway (`warn`), or not checked (`off`)",
    default: "error",
    parser: "`error`, `warn` or `off`, exactly; blank is unset; another value is an error naming the \
             variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `HLAT_NEURON_FLASH_ATTENTION`: attention as the Neuron SDK's flash kernel.
pub const NEURON_FLASH_ATTENTION: Variable = Variable {
    name: "HLAT_NEURON_FLASH_ATTENTION",
    meaning: "whether attention (Burn's attention module, the fused attention's forward and \
              backward passes) runs as the Neuron SDK's flash-attention kernels: when the kernel \
              tracer finds them (`auto`), always (`on`), never (`off`)",
    default: "auto",
    parser: "`auto`, `on`/`1`/`true` or `off`/`0`/`false`, any case; blank is unset; another \
             value is an error naming the variable and the value",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `HLAT_NEURON_KERNEL_TRACER`: the kernel tracer executable.
pub const NEURON_KERNEL_TRACER: Variable = Variable {
    name: "HLAT_NEURON_KERNEL_TRACER",
    meaning: "the executable that traces the Neuron SDK's kernels",
    default: "the project's script, run by `python3`",
    parser: "a path; blank is unset",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: true,
};

/// `XDG_CACHE_HOME`: the user's cache folder.
pub const XDG_CACHE_HOME: Variable = Variable {
    name: "XDG_CACHE_HOME",
    meaning: "the user's cache folder, where the `xla` compile cache and the XLA CPU plugin \
              `scripts/install-xla-cpu` installs are found",
    default: "`$HOME/.cache`",
    parser: "a path; empty is unset",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: false,
};

/// `HOME`: the user's home folder.
pub const HOME: Variable = Variable {
    name: "HOME",
    meaning: "the user's home folder, holding `.cache` when `XDG_CACHE_HOME` is unset",
    default: "none: no default cache folder",
    parser: "a path; empty is unset",
    reader: Reader::Backend,
    set_by_backend: false,
    user_facing: false,
};

/// Every variable the backend reads or computes, in the order the README presents them.
pub const VARIABLES: &[Variable] = &[
    DEVICE,
    PJRT_PLUGIN,
    PJRT_CPU_DEVICES,
    PJRT_CREATE_OPTIONS,
    XLA_CACHE_DIR,
    XLA_CACHE_MAX_BYTES,
    XLA_FLAGS,
    XLA_COMPILER_OPTIONS,
    FUSED_ATTENTION,
    HOST_FALLBACK,
    HOST_OPERATIONS,
    SEGMENT_CAP,
    MAX_TENSOR_BYTES,
    DUMP_DIR,
    JOIN_TIMEOUT,
    EXCHANGE_TIMEOUT,
    NEURON_RT_LIB_DIR,
    NEURON_RT_VISIBLE_CORES,
    NEURON_RT_STOCHASTIC_ROUNDING,
    NEURON_RT_ROOT_COMM_ID,
    NEURON_PJRT_PROCESS_INDEX,
    NEURON_PJRT_PROCESSES_NUM_DEVICES,
    NEURON_CC,
    NEURON_CC_FLAGS,
    NEURON_COMPILE_CACHE_URL,
    NEURON_TARGET,
    NEURON_COMPILE_ONLY,
    NEURON_LINT,
    NEURON_FLASH_ATTENTION,
    NEURON_KERNEL_TRACER,
    XDG_CACHE_HOME,
    HOME,
];
