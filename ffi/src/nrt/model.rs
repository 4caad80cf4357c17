//! A NEFF loaded on a NeuronCore, and the inputs and outputs it declares.

use std::ptr;

use super::NeuronRuntime;
use super::NrtError;
use super::c_text::from_c_chars;
use super::raw::{RawModel, RawTensorInfo};
use super::status::check;

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

/// A NEFF loaded on a NeuronCore; unloaded on drop.
pub struct Model<'rt> {
    pub(crate) runtime: &'rt NeuronRuntime,
    pub(crate) raw: *mut RawModel,
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
