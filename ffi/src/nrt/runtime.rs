//! The process's Neuron runtime: `libnrt` initialized once, and the calls that load models,
//! allocate tensors and execute.

use std::fmt;
use std::marker::PhantomData;
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::c_text::{c_string, from_c_chars};
use super::raw::{Api, FRAMEWORK_TYPE_NO_FW, RawVersion};
use super::status::check;
use super::{Model, NeuronLibrary, NrtError, RuntimeVersion, Tensor, TensorPlacement, TensorSet};

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

    pub(crate) fn api(&self) -> Result<&Api, NrtError> {
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
