//! Tensors allocated by the runtime, and the named sets of them an execution reads and writes.

use std::ffi::c_int;
use std::marker::PhantomData;

use super::NeuronRuntime;
use super::NrtError;
use super::c_text::c_string;
use super::raw::{RawTensor, RawTensorSet};
use super::status::check;

/// Where a tensor is allocated (`nrt_tensor_placement_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorPlacement {
    /// `NRT_TENSOR_PLACEMENT_DEVICE`: device memory (HBM) of a NeuronCore.
    Device,
    /// `NRT_TENSOR_PLACEMENT_HOST`: host memory.
    Host,
}

impl TensorPlacement {
    /// The `nrt_tensor_placement_t` value.
    pub(crate) fn code(self) -> c_int {
        match self {
            Self::Device => 0,
            Self::Host => 1,
        }
    }
}

/// A tensor allocated by the runtime; freed on drop.
pub struct Tensor<'rt> {
    pub(crate) runtime: &'rt NeuronRuntime,
    pub(crate) raw: *mut RawTensor,
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
    pub(crate) runtime: &'rt NeuronRuntime,
    pub(crate) raw: *mut RawTensorSet,
    pub(crate) tensors: PhantomData<&'t Tensor<'rt>>,
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
