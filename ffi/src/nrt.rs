//! Bindings to the Neuron runtime (`libnrt`), loaded at run time with `libloading`.
//!
//! The declarations follow the headers the Neuron SDK publishes in aws-neuron/aws-neuron-sdk
//! `src/libnrt/include/nrt/`: `nrt.h` (runtime 2.0 API), `nrt_status.h`, `nrt_version.h` and
//! `nrt_experimental.h` (`nrt_get_model_tensor_info`). Only the calls the `neuron` executor needs
//! are bound. None of this has run against a real `libnrt` yet: the layouts are checked against the
//! header text by the unit tests below, not against the library.
//!
//! The library is searched in `NEURON_RT_LIB_DIR`, then `/opt/aws/neuron/lib`, then on the dynamic
//! loader's search path, as `libnrt.so.1` and then `libnrt.so`. [`NeuronRuntime::global`] loads it
//! and calls `nrt_init` once per process.

use std::ffi::{CString, c_char, c_int, c_void};
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use thiserror::Error;

/// The environment variable naming a folder that holds `libnrt.so.1`.
pub const LIB_DIR_ENV: &str = "NEURON_RT_LIB_DIR";

/// Where the Neuron SDK installs `libnrt` on a trn1/trn2 instance.
pub const DEFAULT_LIB_DIR: &str = "/opt/aws/neuron/lib";

/// The file names tried in each folder, in order.
pub const LIB_NAMES: [&str; 2] = ["libnrt.so.1", "libnrt.so"];

/// `NRT_FRAMEWORK_TYPE_NO_FW` from `nrt.h`: framework-less execution.
const FRAMEWORK_TYPE_NO_FW: c_int = 1;

/// `NRT_TENSOR_NAME_MAX` from `nrt_experimental.h`.
const TENSOR_NAME_MAX: usize = 256;

/// A non-success `NRT_STATUS` value (`nrt_status.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NrtStatus {
    /// `NRT_FAILURE` (1): non-specific failure.
    Failure,
    /// `NRT_INVALID` (2): invalid NEFF, instruction, DMA descriptor, or tensor name/size mismatch.
    Invalid,
    /// `NRT_INVALID_HANDLE` (3).
    InvalidHandle,
    /// `NRT_RESOURCE` (4): a resource could not be allocated.
    Resource,
    /// `NRT_TIMEOUT` (5).
    Timeout,
    /// `NRT_HW_ERROR` (6): hardware failure.
    HardwareError,
    /// `NRT_QUEUE_FULL` (7): the execution input queue is full.
    QueueFull,
    /// `NRT_LOAD_NOT_ENOUGH_NC` (9): not enough NeuronCores to load the NEFF.
    LoadNotEnoughCores,
    /// `NRT_UNSUPPORTED_NEFF_VERSION` (10).
    UnsupportedNeffVersion,
    /// `NRT_UNINITIALIZED` (13): called before `nrt_init`.
    Uninitialized,
    /// `NRT_CLOSED` (14): called after `nrt_close`.
    Closed,
    /// `NRT_EXEC_BAD_INPUT` (1002): invalid input submitted to an execution.
    ExecBadInput,
    /// `NRT_EXEC_COMPLETED_WITH_NUM_ERR` (1003): the execution produced NaN.
    ExecCompletedWithNumericalErrors,
    /// `NRT_EXEC_COMPLETED_WITH_ERR` (1004): the execution completed with other errors.
    ExecCompletedWithErrors,
    /// `NRT_EXEC_NC_BUSY` (1005): the NeuronCore is in use by another model or process.
    ExecCoreBusy,
    /// `NRT_COLL_PENDING` (1100): a collective operation is still pending.
    CollectivePending,
    /// A code this binding does not know.
    Unknown(i32),
}

impl NrtStatus {
    /// The status of a return code, `None` for `NRT_SUCCESS` (0).
    pub fn from_code(code: i32) -> Option<Self> {
        Some(match code {
            0 => return None,
            1 => Self::Failure,
            2 => Self::Invalid,
            3 => Self::InvalidHandle,
            4 => Self::Resource,
            5 => Self::Timeout,
            6 => Self::HardwareError,
            7 => Self::QueueFull,
            9 => Self::LoadNotEnoughCores,
            10 => Self::UnsupportedNeffVersion,
            13 => Self::Uninitialized,
            14 => Self::Closed,
            1002 => Self::ExecBadInput,
            1003 => Self::ExecCompletedWithNumericalErrors,
            1004 => Self::ExecCompletedWithErrors,
            1005 => Self::ExecCoreBusy,
            1100 => Self::CollectivePending,
            other => Self::Unknown(other),
        })
    }

    /// The return code, as in `nrt_status.h`.
    pub fn code(self) -> i32 {
        match self {
            Self::Failure => 1,
            Self::Invalid => 2,
            Self::InvalidHandle => 3,
            Self::Resource => 4,
            Self::Timeout => 5,
            Self::HardwareError => 6,
            Self::QueueFull => 7,
            Self::LoadNotEnoughCores => 9,
            Self::UnsupportedNeffVersion => 10,
            Self::Uninitialized => 13,
            Self::Closed => 14,
            Self::ExecBadInput => 1002,
            Self::ExecCompletedWithNumericalErrors => 1003,
            Self::ExecCompletedWithErrors => 1004,
            Self::ExecCoreBusy => 1005,
            Self::CollectivePending => 1100,
            Self::Unknown(code) => code,
        }
    }

    /// The header's name of the status.
    pub fn name(self) -> &'static str {
        match self {
            Self::Failure => "NRT_FAILURE",
            Self::Invalid => "NRT_INVALID",
            Self::InvalidHandle => "NRT_INVALID_HANDLE",
            Self::Resource => "NRT_RESOURCE",
            Self::Timeout => "NRT_TIMEOUT",
            Self::HardwareError => "NRT_HW_ERROR",
            Self::QueueFull => "NRT_QUEUE_FULL",
            Self::LoadNotEnoughCores => "NRT_LOAD_NOT_ENOUGH_NC",
            Self::UnsupportedNeffVersion => "NRT_UNSUPPORTED_NEFF_VERSION",
            Self::Uninitialized => "NRT_UNINITIALIZED",
            Self::Closed => "NRT_CLOSED",
            Self::ExecBadInput => "NRT_EXEC_BAD_INPUT",
            Self::ExecCompletedWithNumericalErrors => "NRT_EXEC_COMPLETED_WITH_NUM_ERR",
            Self::ExecCompletedWithErrors => "NRT_EXEC_COMPLETED_WITH_ERR",
            Self::ExecCoreBusy => "NRT_EXEC_NC_BUSY",
            Self::CollectivePending => "NRT_COLL_PENDING",
            Self::Unknown(_) => "unknown NRT_STATUS",
        }
    }
}

impl fmt::Display for NrtStatus {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{} ({})", self.name(), self.code())
    }
}

/// One place the loader looked for `libnrt`, and why it was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadAttempt {
    /// The path, or the bare file name handed to the dynamic loader.
    pub candidate: PathBuf,
    /// The loader's message.
    pub reason: String,
}

impl fmt::Display for LoadAttempt {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.candidate.is_absolute() {
            write!(formatter, "{} ({})", self.candidate.display(), self.reason)
        } else {
            write!(
                formatter,
                "{} on the dynamic loader search path ({})",
                self.candidate.display(),
                self.reason
            )
        }
    }
}

/// Errors of the Neuron runtime bindings.
#[derive(Debug, Clone, Error)]
pub enum NrtError {
    /// No candidate library could be opened.
    #[error(
        "the Neuron runtime library (libnrt) was not found; set {LIB_DIR_ENV} to the folder that holds libnrt.so.1 or install aws-neuronx-runtime-lib. Searched: {}",
        .searched.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    NotFound {
        /// Every candidate tried, in order, with the loader's message.
        searched: Vec<LoadAttempt>,
    },
    /// The library was opened but lacks a function this binding needs.
    #[error("`{library}` has no symbol `{symbol}`: it is not a compatible libnrt ({reason})")]
    MissingSymbol {
        /// The library that was opened.
        library: String,
        /// The missing function.
        symbol: &'static str,
        /// The loader's message.
        reason: String,
    },
    /// A runtime call returned a non-success status.
    #[error("`{call}` failed with {status}")]
    Status {
        /// The C function that failed.
        call: &'static str,
        /// Its status.
        status: NrtStatus,
    },
    /// A call was rejected before reaching the runtime.
    #[error("`{call}`: {reason}")]
    InvalidArgument {
        /// The C function that would have been called.
        call: &'static str,
        /// What was wrong with the arguments.
        reason: String,
    },
    /// The runtime was closed by [`NeuronRuntime::close`].
    #[error("the Neuron runtime was closed in this process")]
    Closed,
}

fn check(call: &'static str, code: c_int) -> Result<(), NrtError> {
    match NrtStatus::from_code(code) {
        None => Ok(()),
        Some(status) => Err(NrtError::Status { call, status }),
    }
}

/// The candidates tried by [`NeuronLibrary::load`], in order: `lib_dir`, [`DEFAULT_LIB_DIR`], then
/// the bare names for the dynamic loader's own search path.
pub fn library_candidates(lib_dir: Option<&Path>) -> Vec<PathBuf> {
    let folders = lib_dir.into_iter().chain([Path::new(DEFAULT_LIB_DIR)]);
    let mut candidates: Vec<PathBuf> = folders
        .flat_map(|folder| LIB_NAMES.map(|name| folder.join(name)))
        .collect();
    candidates.extend(LIB_NAMES.map(PathBuf::from));
    candidates
}

/// `nrt_version_t` from `nrt_version.h`.
#[repr(C)]
struct RawVersion {
    rt_major: u64,
    rt_minor: u64,
    rt_patch: u64,
    rt_maintenance: u64,
    rt_detail: [c_char; 128],
    git_hash: [c_char; 64],
}

/// `nrt_tensor_info_t` from `nrt_experimental.h`.
#[repr(C)]
struct RawTensorInfo {
    name: [c_char; TENSOR_NAME_MAX],
    usage: c_int,
    size: usize,
    dtype: c_int,
    shape: *mut u32,
    ndim: u32,
}

/// `nrt_tensor_info_array_t` from `nrt_experimental.h` (a count followed by a flexible array).
#[repr(C)]
struct RawTensorInfoArray {
    tensor_count: u64,
    tensor_array: [RawTensorInfo; 0],
}

/// Opaque `nrt_model_t`.
#[repr(C)]
struct RawModel {
    _opaque: [u8; 0],
}

/// Opaque `nrt_tensor_t`.
#[repr(C)]
struct RawTensor {
    _opaque: [u8; 0],
}

/// `nrt_tensor_set_t` is `void` in the header.
type RawTensorSet = c_void;

/// The functions of `libnrt` this binding calls.
struct Api {
    init: unsafe extern "C" fn(c_int, *const c_char, *const c_char) -> c_int,
    close: unsafe extern "C" fn(),
    get_version: unsafe extern "C" fn(*mut RawVersion, usize) -> c_int,
    get_total_core_count: unsafe extern "C" fn(*mut u32) -> c_int,
    get_visible_core_count: unsafe extern "C" fn(*mut u32) -> c_int,
    load: unsafe extern "C" fn(*const c_void, usize, i32, i32, *mut *mut RawModel) -> c_int,
    load_collectives:
        unsafe extern "C" fn(*const c_void, usize, i32, i32, u32, u32, *mut *mut RawModel) -> c_int,
    unload: unsafe extern "C" fn(*mut RawModel) -> c_int,
    get_model_tensor_info:
        unsafe extern "C" fn(*mut RawModel, *mut *mut RawTensorInfoArray) -> c_int,
    free_model_tensor_info: unsafe extern "C" fn(*mut RawTensorInfoArray) -> c_int,
    allocate_tensor_set: unsafe extern "C" fn(*mut *mut RawTensorSet) -> c_int,
    destroy_tensor_set: unsafe extern "C" fn(*mut *mut RawTensorSet),
    add_tensor_to_tensor_set:
        unsafe extern "C" fn(*mut RawTensorSet, *const c_char, *mut RawTensor) -> c_int,
    execute: unsafe extern "C" fn(*mut RawModel, *const RawTensorSet, *mut RawTensorSet) -> c_int,
    tensor_allocate:
        unsafe extern "C" fn(c_int, c_int, usize, *const c_char, *mut *mut RawTensor) -> c_int,
    tensor_free: unsafe extern "C" fn(*mut *mut RawTensor),
    tensor_read: unsafe extern "C" fn(*const RawTensor, *mut c_void, usize, usize) -> c_int,
    tensor_write: unsafe extern "C" fn(*mut RawTensor, *const c_void, usize, usize) -> c_int,
    tensor_get_size: unsafe extern "C" fn(*const RawTensor) -> usize,
}

/// An opened `libnrt` and the functions resolved from it.
pub struct NeuronLibrary {
    api: Api,
    path: PathBuf,
    // Keeps the functions in `api` mapped; declared last so it is dropped last.
    _library: libloading::Library,
}

impl fmt::Debug for NeuronLibrary {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("NeuronLibrary")
            .field("path", &self.path)
            .finish()
    }
}

impl NeuronLibrary {
    /// Opens the first loadable candidate of [`library_candidates`] and resolves every function.
    ///
    /// The error lists every candidate tried with the loader's message.
    pub fn load(lib_dir: Option<&Path>) -> Result<Self, NrtError> {
        let mut searched = Vec::new();
        for candidate in library_candidates(lib_dir) {
            // SAFETY: libnrt's initializers only set up its own state.
            match unsafe { libloading::Library::new(&candidate) } {
                Ok(library) => return Self::resolve(library, candidate),
                Err(error) => searched.push(LoadAttempt {
                    candidate,
                    reason: error.to_string(),
                }),
            }
        }
        Err(NrtError::NotFound { searched })
    }

    /// Opens the library from `NEURON_RT_LIB_DIR` or the default places.
    pub fn load_from_env() -> Result<Self, NrtError> {
        let lib_dir = std::env::var_os(LIB_DIR_ENV).filter(|value| !value.is_empty());
        Self::load(lib_dir.as_deref().map(Path::new))
    }

    /// Where the library was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn resolve(library: libloading::Library, path: PathBuf) -> Result<Self, NrtError> {
        let shown = path.display().to_string();
        let lookup = Lookup {
            library: &library,
            shown: &shown,
        };
        let api = Api {
            init: lookup.function("nrt_init")?,
            close: lookup.function("nrt_close")?,
            get_version: lookup.function("nrt_get_version")?,
            get_total_core_count: lookup
                .either("nrt_get_total_vnc_count", "nrt_get_total_nc_count")?,
            get_visible_core_count: lookup
                .either("nrt_get_visible_vnc_count", "nrt_get_visible_nc_count")?,
            load: lookup.function("nrt_load")?,
            load_collectives: lookup.function("nrt_load_collectives")?,
            unload: lookup.function("nrt_unload")?,
            get_model_tensor_info: lookup.function("nrt_get_model_tensor_info")?,
            free_model_tensor_info: lookup.function("nrt_free_model_tensor_info")?,
            allocate_tensor_set: lookup.function("nrt_allocate_tensor_set")?,
            destroy_tensor_set: lookup.function("nrt_destroy_tensor_set")?,
            add_tensor_to_tensor_set: lookup.function("nrt_add_tensor_to_tensor_set")?,
            execute: lookup.function("nrt_execute")?,
            tensor_allocate: lookup.function("nrt_tensor_allocate")?,
            tensor_free: lookup.function("nrt_tensor_free")?,
            tensor_read: lookup.function("nrt_tensor_read")?,
            tensor_write: lookup.function("nrt_tensor_write")?,
            tensor_get_size: lookup.function("nrt_tensor_get_size")?,
        };
        log::info!("loaded the Neuron runtime from {shown}");
        Ok(Self {
            api,
            path,
            _library: library,
        })
    }
}

/// Resolves functions of an opened library, naming the library in errors.
struct Lookup<'a> {
    library: &'a libloading::Library,
    shown: &'a str,
}

impl Lookup<'_> {
    /// The function `name`, typed as the field it is stored in (the header's declaration).
    fn function<T: Copy>(&self, name: &'static str) -> Result<T, NrtError> {
        // SAFETY: every `T` used is the exact C signature `nrt.h` declares for `name`.
        unsafe { self.library.get::<T>(name.as_bytes()) }
            .map(|symbol| *symbol)
            .map_err(|error| NrtError::MissingSymbol {
                library: self.shown.to_string(),
                symbol: name,
                reason: error.to_string(),
            })
    }

    /// `current`, or `deprecated` in runtimes older than it: `nrt_get_*_vnc_count` replaced
    /// `nrt_get_*_nc_count`, with the same signature.
    fn either<T: Copy>(
        &self,
        current: &'static str,
        deprecated: &'static str,
    ) -> Result<T, NrtError> {
        self.function(current).or_else(|_| {
            log::debug!(
                "{} has no `{current}`, using the deprecated `{deprecated}`",
                self.shown
            );
            self.function(deprecated)
        })
    }
}

/// The runtime version reported by `nrt_get_version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// Major, minor, patch and maintenance numbers.
    pub numbers: [u64; 4],
    /// The free-form detail string.
    pub detail: String,
    /// The git hash the runtime was built from.
    pub git_hash: String,
}

impl fmt::Display for RuntimeVersion {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [major, minor, patch, maintenance] = self.numbers;
        write!(formatter, "{major}.{minor}.{patch}.{maintenance}")
    }
}

/// Whether a model tensor is read or written by the model (`nrt_tensor_usage_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorUsage {
    /// `NRT_TENSOR_USAGE_INPUT`.
    Input,
    /// `NRT_TENSOR_USAGE_OUTPUT`.
    Output,
}

/// One input or output of a loaded model, as `nrt_get_model_tensor_info` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTensorInfo {
    /// The tensor's name in the NEFF; tensor sets are keyed by it.
    pub name: String,
    /// Input or output.
    pub usage: TensorUsage,
    /// Size in bytes.
    pub size: usize,
    /// The raw `nrt_dtype_t` value. Its numbering changed between runtime releases, so the
    /// executor checks sizes rather than relying on it.
    pub dtype_code: i32,
    /// The dimensions.
    pub shape: Vec<u32>,
}

/// Where a tensor is allocated (`nrt_tensor_placement_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorPlacement {
    /// `NRT_TENSOR_PLACEMENT_DEVICE`: device memory (HBM) of a NeuronCore.
    Device,
    /// `NRT_TENSOR_PLACEMENT_HOST`: host memory.
    Host,
}

impl TensorPlacement {
    fn code(self) -> c_int {
        match self {
            Self::Device => 0,
            Self::Host => 1,
        }
    }
}

/// The process's Neuron runtime: the library, initialized once with `nrt_init`.
pub struct NeuronRuntime {
    library: NeuronLibrary,
    closed: AtomicBool,
}

impl fmt::Debug for NeuronRuntime {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("NeuronRuntime")
            .field("library", &self.library)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

// SAFETY: libnrt's API is documented as thread-safe; the struct only holds function pointers.
unsafe impl Sync for NeuronRuntime {}
// SAFETY: as above.
unsafe impl Send for NeuronRuntime {}

fn c_string(call: &'static str, text: &str) -> Result<CString, NrtError> {
    CString::new(text).map_err(|_| NrtError::InvalidArgument {
        call,
        reason: format!("`{text}` contains a NUL byte"),
    })
}

fn from_c_chars(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl NeuronRuntime {
    /// Loads `libnrt` (see [`NeuronLibrary::load_from_env`]) and calls `nrt_init` on first use;
    /// later calls return the same runtime, or the same error.
    ///
    /// The runtime reads its own environment at `nrt_init`: `NEURON_RT_VISIBLE_CORES` (which
    /// NeuronCores this process may use) and `NEURON_RT_STOCHASTIC_ROUNDING_EN` among others.
    pub fn global() -> Result<&'static NeuronRuntime, NrtError> {
        static RUNTIME: OnceLock<Result<NeuronRuntime, NrtError>> = OnceLock::new();
        RUNTIME
            .get_or_init(|| NeuronLibrary::load_from_env().and_then(Self::init))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Calls `nrt_init` on an opened library. At most one runtime may be initialized per
    /// process: use [`NeuronRuntime::global`].
    fn init(library: NeuronLibrary) -> Result<Self, NrtError> {
        // SAFETY: the strings are NUL-terminated and outlive the call.
        let code = unsafe { (library.api.init)(FRAMEWORK_TYPE_NO_FW, c"".as_ptr(), c"".as_ptr()) };
        check("nrt_init", code)?;
        Ok(Self {
            library,
            closed: AtomicBool::new(false),
        })
    }

    fn api(&self) -> Result<&Api, NrtError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(NrtError::Closed);
        }
        Ok(&self.library.api)
    }

    /// The library this runtime was loaded from.
    pub fn library(&self) -> &NeuronLibrary {
        &self.library
    }

    /// Calls `nrt_close`: releases every NeuronCore of the process. Later calls fail with
    /// [`NrtError::Closed`]; models and tensors must be dropped before.
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            // SAFETY: nrt_init succeeded and close runs once.
            unsafe { (self.library.api.close)() };
        }
    }

    /// `nrt_get_version`.
    pub fn version(&self) -> Result<RuntimeVersion, NrtError> {
        let api = self.api()?;
        let mut raw = RawVersion {
            rt_major: 0,
            rt_minor: 0,
            rt_patch: 0,
            rt_maintenance: 0,
            rt_detail: [0; 128],
            git_hash: [0; 64],
        };
        // SAFETY: `raw` is a valid `nrt_version_t` of the size passed.
        check("nrt_get_version", unsafe {
            (api.get_version)(&mut raw, size_of::<RawVersion>())
        })?;
        Ok(RuntimeVersion {
            numbers: [raw.rt_major, raw.rt_minor, raw.rt_patch, raw.rt_maintenance],
            detail: from_c_chars(&raw.rt_detail),
            git_hash: from_c_chars(&raw.git_hash),
        })
    }

    /// How many NeuronCores this process may use (`NEURON_RT_VISIBLE_CORES` restricts them).
    pub fn visible_core_count(&self) -> Result<u32, NrtError> {
        let mut count = 0u32;
        // SAFETY: `count` is a valid out pointer.
        check("nrt_get_visible_vnc_count", unsafe {
            (self.api()?.get_visible_core_count)(&mut count)
        })?;
        Ok(count)
    }

    /// How many NeuronCores the instance has.
    pub fn total_core_count(&self) -> Result<u32, NrtError> {
        let mut count = 0u32;
        // SAFETY: `count` is a valid out pointer.
        check("nrt_get_total_vnc_count", unsafe {
            (self.api()?.get_total_core_count)(&mut count)
        })?;
        Ok(count)
    }

    /// `nrt_load`: places a NEFF on the NeuronCore `core` (an index among the visible cores).
    pub fn load(&self, neff: &[u8], core: i32) -> Result<Model<'_>, NrtError> {
        let api = self.api()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `neff` is valid for its length; vnc_count is -1 as the header asks.
        check("nrt_load", unsafe {
            (api.load)(neff.as_ptr().cast(), neff.len(), core, -1, &mut raw)
        })?;
        Ok(Model { runtime: self, raw })
    }

    /// `nrt_load_collectives`: places a NEFF that holds collective operations on the NeuronCore
    /// `core`, as rank `rank` of the `ranks` devices that run it together (global ids across
    /// every process of the job).
    pub fn load_collectives(
        &self,
        neff: &[u8],
        core: i32,
        rank: u32,
        ranks: u32,
    ) -> Result<Model<'_>, NrtError> {
        let api = self.api()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `neff` is valid for its length; one NeuronCore per rank.
        check("nrt_load_collectives", unsafe {
            (api.load_collectives)(
                neff.as_ptr().cast(),
                neff.len(),
                core,
                1,
                rank,
                ranks,
                &mut raw,
            )
        })?;
        Ok(Model { runtime: self, raw })
    }

    /// `nrt_tensor_allocate`: a tensor of `size` bytes. `core` is ignored for host tensors.
    pub fn allocate_tensor(
        &self,
        placement: TensorPlacement,
        core: i32,
        size: usize,
        name: &str,
    ) -> Result<Tensor<'_>, NrtError> {
        let api = self.api()?;
        let name = c_string("nrt_tensor_allocate", name)?;
        let core = match placement {
            TensorPlacement::Device => core,
            TensorPlacement::Host => -1,
        };
        let mut raw = ptr::null_mut();
        // SAFETY: `name` is NUL-terminated; `raw` is a valid out pointer.
        check("nrt_tensor_allocate", unsafe {
            (api.tensor_allocate)(placement.code(), core, size, name.as_ptr(), &mut raw)
        })?;
        Ok(Tensor { runtime: self, raw })
    }

    /// `nrt_allocate_tensor_set`: an empty set of named tensors.
    pub fn tensor_set<'t>(&self) -> Result<TensorSet<'_, 't>, NrtError> {
        let api = self.api()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer.
        check("nrt_allocate_tensor_set", unsafe {
            (api.allocate_tensor_set)(&mut raw)
        })?;
        Ok(TensorSet {
            runtime: self,
            raw,
            tensors: PhantomData,
        })
    }

    /// `nrt_execute`: runs `model` synchronously, reading `inputs` and writing `outputs`.
    pub fn execute(
        &self,
        model: &Model<'_>,
        inputs: &TensorSet<'_, '_>,
        outputs: &mut TensorSet<'_, '_>,
    ) -> Result<(), NrtError> {
        let api = self.api()?;
        // SAFETY: the model and sets are live handles of this runtime.
        check("nrt_execute", unsafe {
            (api.execute)(model.raw, inputs.raw, outputs.raw)
        })
    }
}

/// A NEFF loaded on a NeuronCore; unloaded on drop.
pub struct Model<'rt> {
    runtime: &'rt NeuronRuntime,
    raw: *mut RawModel,
}

// SAFETY: a model handle may be used from any thread (libnrt serializes per core).
unsafe impl Send for Model<'_> {}

impl Model<'_> {
    /// `nrt_get_model_tensor_info`: the model's inputs and outputs by name.
    pub fn tensor_info(&self) -> Result<Vec<ModelTensorInfo>, NrtError> {
        let api = self.runtime.api()?;
        let mut array = ptr::null_mut();
        // SAFETY: `array` is a valid out pointer; the result is freed below.
        check("nrt_get_model_tensor_info", unsafe {
            (api.get_model_tensor_info)(self.raw, &mut array)
        })?;
        // SAFETY: on success the runtime returns an array of `tensor_count` entries.
        let infos = unsafe {
            let count = (*array).tensor_count as usize;
            let first = ptr::addr_of!((*array).tensor_array).cast::<RawTensorInfo>();
            std::slice::from_raw_parts(first, count)
                .iter()
                .map(|info| ModelTensorInfo {
                    name: from_c_chars(&info.name),
                    usage: if info.usage == 0 {
                        TensorUsage::Input
                    } else {
                        TensorUsage::Output
                    },
                    size: info.size,
                    dtype_code: info.dtype,
                    shape: if info.shape.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(info.shape, info.ndim as usize).to_vec()
                    },
                })
                .collect()
        };
        // SAFETY: `array` came from nrt_get_model_tensor_info and is freed once.
        check("nrt_free_model_tensor_info", unsafe {
            (api.free_model_tensor_info)(array)
        })?;
        Ok(infos)
    }
}

impl Drop for Model<'_> {
    fn drop(&mut self) {
        if let Ok(api) = self.runtime.api() {
            // SAFETY: the handle came from nrt_load and is unloaded once.
            if let Err(error) = check("nrt_unload", unsafe { (api.unload)(self.raw) }) {
                log::warn!("{error}");
            }
        }
    }
}

/// A tensor allocated by the runtime; freed on drop.
pub struct Tensor<'rt> {
    runtime: &'rt NeuronRuntime,
    raw: *mut RawTensor,
}

// SAFETY: a tensor handle may be used from any thread.
unsafe impl Send for Tensor<'_> {}

impl Tensor<'_> {
    /// `nrt_tensor_get_size`: the size in bytes.
    pub fn size(&self) -> usize {
        match self.runtime.api() {
            // SAFETY: the handle is live.
            Ok(api) => unsafe { (api.tensor_get_size)(self.raw) },
            Err(_) => 0,
        }
    }

    fn check_range(&self, call: &'static str, offset: usize, len: usize) -> Result<(), NrtError> {
        let size = self.size();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(NrtError::InvalidArgument {
                call,
                reason: format!("{len} bytes at offset {offset} exceed the tensor's {size} bytes"),
            }),
        }
    }

    /// `nrt_tensor_read`: copies `buffer.len()` bytes starting at `offset` to the host.
    pub fn read(&self, buffer: &mut [u8], offset: usize) -> Result<(), NrtError> {
        self.check_range("nrt_tensor_read", offset, buffer.len())?;
        let api = self.runtime.api()?;
        // SAFETY: `buffer` is valid for its length and the range was checked.
        check("nrt_tensor_read", unsafe {
            (api.tensor_read)(self.raw, buffer.as_mut_ptr().cast(), offset, buffer.len())
        })
    }

    /// `nrt_tensor_write`: copies `data` into the tensor starting at `offset`.
    pub fn write(&mut self, data: &[u8], offset: usize) -> Result<(), NrtError> {
        self.check_range("nrt_tensor_write", offset, data.len())?;
        let api = self.runtime.api()?;
        // SAFETY: `data` is valid for its length and the range was checked.
        check("nrt_tensor_write", unsafe {
            (api.tensor_write)(self.raw, data.as_ptr().cast(), offset, data.len())
        })
    }
}

impl Drop for Tensor<'_> {
    fn drop(&mut self) {
        if let Ok(api) = self.runtime.api() {
            // SAFETY: the handle came from nrt_tensor_allocate and is freed once.
            unsafe { (api.tensor_free)(&mut self.raw) };
        }
    }
}

/// A set of named tensors passed to `nrt_execute`; it borrows its tensors (`'t`), which the
/// header requires to stay valid until the set is destroyed (on drop).
pub struct TensorSet<'rt, 't> {
    runtime: &'rt NeuronRuntime,
    raw: *mut RawTensorSet,
    tensors: PhantomData<&'t Tensor<'rt>>,
}

impl<'rt, 't> TensorSet<'rt, 't> {
    /// `nrt_add_tensor_to_tensor_set`: adds or replaces the tensor named `name`.
    pub fn add(&mut self, name: &str, tensor: &'t Tensor<'rt>) -> Result<(), NrtError> {
        let api = self.runtime.api()?;
        let name = c_string("nrt_add_tensor_to_tensor_set", name)?;
        // SAFETY: the set and tensor are live; the tensor outlives the set (`'t`).
        check("nrt_add_tensor_to_tensor_set", unsafe {
            (api.add_tensor_to_tensor_set)(self.raw, name.as_ptr(), tensor.raw)
        })
    }
}

impl Drop for TensorSet<'_, '_> {
    fn drop(&mut self) {
        if let Ok(api) = self.runtime.api() {
            // SAFETY: the handle came from nrt_allocate_tensor_set and is destroyed once.
            unsafe { (api.destroy_tensor_set)(&mut self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn statuses_map_to_the_header_names_and_codes() {
        assert_eq!(NrtStatus::from_code(0), None);
        for code in [
            1, 2, 3, 4, 5, 6, 7, 9, 10, 13, 14, 1002, 1003, 1004, 1005, 1100,
        ] {
            let status = NrtStatus::from_code(code).unwrap();
            assert_eq!(status.code(), code);
            assert!(status.name().starts_with("NRT_"), "{status}");
        }
        assert_eq!(
            NrtStatus::from_code(1005).unwrap().name(),
            "NRT_EXEC_NC_BUSY"
        );
        assert_eq!(NrtStatus::from_code(8), Some(NrtStatus::Unknown(8)));
        let error = check("nrt_load", 9).unwrap_err().to_string();
        assert_eq!(error, "`nrt_load` failed with NRT_LOAD_NOT_ENOUGH_NC (9)");
    }

    #[test]
    fn structs_have_the_header_layout() {
        // nrt_tensor_info_t: char name[256]; enum usage; size_t size; enum dtype; uint32_t *shape;
        // uint32_t ndim (LP64).
        assert_eq!(offset_of!(RawTensorInfo, usage), 256);
        assert_eq!(offset_of!(RawTensorInfo, size), 264);
        assert_eq!(offset_of!(RawTensorInfo, dtype), 272);
        assert_eq!(offset_of!(RawTensorInfo, shape), 280);
        assert_eq!(offset_of!(RawTensorInfo, ndim), 288);
        assert_eq!(size_of::<RawTensorInfo>(), 296);
        assert_eq!(offset_of!(RawTensorInfoArray, tensor_array), 8);
        // nrt_version_t: four uint64_t, char rt_detail[128], char git_hash[64].
        assert_eq!(offset_of!(RawVersion, rt_detail), 32);
        assert_eq!(size_of::<RawVersion>(), 224);
    }

    #[test]
    fn candidates_follow_the_documented_order() {
        let candidates = library_candidates(Some(Path::new("/custom")));
        let shown: Vec<_> = candidates
            .iter()
            .map(|path| path.display().to_string())
            .collect();
        assert_eq!(
            shown,
            [
                "/custom/libnrt.so.1",
                "/custom/libnrt.so",
                "/opt/aws/neuron/lib/libnrt.so.1",
                "/opt/aws/neuron/lib/libnrt.so",
                "libnrt.so.1",
                "libnrt.so",
            ]
        );
        assert_eq!(library_candidates(None).len(), 4);
    }

    #[test]
    fn missing_library_error_lists_every_path_searched() {
        let empty = std::env::temp_dir().join(format!("nrt-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        match NeuronLibrary::load(Some(&empty)) {
            Err(NrtError::NotFound { searched }) => {
                assert_eq!(searched.len(), 6);
                let message = NrtError::NotFound { searched }.to_string();
                for candidate in library_candidates(Some(&empty)) {
                    let candidate = candidate.display().to_string();
                    assert!(
                        message.contains(&candidate),
                        "{candidate} missing from {message}"
                    );
                }
                assert!(message.contains(LIB_DIR_ENV), "{message}");
            }
            Err(other) => panic!("expected NotFound, got {other}"),
            Ok(library) => eprintln!(
                "a libnrt is installed at {}; nothing to check",
                library.path().display()
            ),
        }
        std::fs::remove_dir_all(&empty).unwrap();
    }

    #[test]
    fn c_strings_are_read_up_to_the_terminator() {
        let mut chars = [0 as c_char; 8];
        for (slot, byte) in chars.iter_mut().zip(b"input0") {
            *slot = *byte as c_char;
        }
        assert_eq!(from_c_chars(&chars), "input0");
    }
}
