//! The C layout of the `libnrt` API this crate calls: the structs and constants of `nrt.h`,
//! `nrt_version.h` and `nrt_experimental.h`, and the table of functions resolved from the library.

use std::ffi::{c_char, c_int, c_void};

/// `NRT_FRAMEWORK_TYPE_NO_FW` from `nrt.h`: framework-less execution.
pub(crate) const FRAMEWORK_TYPE_NO_FW: c_int = 1;

/// `NRT_TENSOR_NAME_MAX` from `nrt_experimental.h`.
const TENSOR_NAME_MAX: usize = 256;

/// `nrt_version_t` from `nrt_version.h`.
#[repr(C)]
pub(crate) struct RawVersion {
    pub(crate) rt_major: u64,
    pub(crate) rt_minor: u64,
    pub(crate) rt_patch: u64,
    pub(crate) rt_maintenance: u64,
    pub(crate) rt_detail: [c_char; 128],
    pub(crate) git_hash: [c_char; 64],
}

/// `nrt_tensor_info_t` from `nrt_experimental.h`.
#[repr(C)]
pub(crate) struct RawTensorInfo {
    pub(crate) name: [c_char; TENSOR_NAME_MAX],
    pub(crate) usage: c_int,
    pub(crate) size: usize,
    pub(crate) dtype: c_int,
    pub(crate) shape: *mut u32,
    pub(crate) ndim: u32,
}

/// `nrt_tensor_info_array_t` from `nrt_experimental.h` (a count followed by a flexible array).
#[repr(C)]
pub(crate) struct RawTensorInfoArray {
    pub(crate) tensor_count: u64,
    pub(crate) tensor_array: [RawTensorInfo; 0],
}

/// Opaque `nrt_model_t`.
#[repr(C)]
pub(crate) struct RawModel {
    _opaque: [u8; 0],
}

/// Opaque `nrt_tensor_t`.
#[repr(C)]
pub(crate) struct RawTensor {
    _opaque: [u8; 0],
}

/// `nrt_tensor_set_t` is `void` in the header.
pub(crate) type RawTensorSet = c_void;

/// The functions of `libnrt` this binding calls.
pub(crate) struct Api {
    pub(crate) init: unsafe extern "C" fn(c_int, *const c_char, *const c_char) -> c_int,
    pub(crate) close: unsafe extern "C" fn(),
    pub(crate) get_version: unsafe extern "C" fn(*mut RawVersion, usize) -> c_int,
    pub(crate) get_total_core_count: unsafe extern "C" fn(*mut u32) -> c_int,
    pub(crate) get_visible_core_count: unsafe extern "C" fn(*mut u32) -> c_int,
    pub(crate) load:
        unsafe extern "C" fn(*const c_void, usize, i32, i32, *mut *mut RawModel) -> c_int,
    pub(crate) load_collectives:
        unsafe extern "C" fn(*const c_void, usize, i32, i32, u32, u32, *mut *mut RawModel) -> c_int,
    pub(crate) unload: unsafe extern "C" fn(*mut RawModel) -> c_int,
    pub(crate) get_model_tensor_info:
        unsafe extern "C" fn(*mut RawModel, *mut *mut RawTensorInfoArray) -> c_int,
    pub(crate) free_model_tensor_info: unsafe extern "C" fn(*mut RawTensorInfoArray) -> c_int,
    pub(crate) allocate_tensor_set: unsafe extern "C" fn(*mut *mut RawTensorSet) -> c_int,
    pub(crate) destroy_tensor_set: unsafe extern "C" fn(*mut *mut RawTensorSet),
    pub(crate) add_tensor_to_tensor_set:
        unsafe extern "C" fn(*mut RawTensorSet, *const c_char, *mut RawTensor) -> c_int,
    pub(crate) execute:
        unsafe extern "C" fn(*mut RawModel, *const RawTensorSet, *mut RawTensorSet) -> c_int,
    pub(crate) tensor_allocate:
        unsafe extern "C" fn(c_int, c_int, usize, *const c_char, *mut *mut RawTensor) -> c_int,
    pub(crate) tensor_free: unsafe extern "C" fn(*mut *mut RawTensor),
    pub(crate) tensor_read:
        unsafe extern "C" fn(*const RawTensor, *mut c_void, usize, usize) -> c_int,
    pub(crate) tensor_write:
        unsafe extern "C" fn(*mut RawTensor, *const c_void, usize, usize) -> c_int,
    pub(crate) tensor_get_size: unsafe extern "C" fn(*const RawTensor) -> usize,
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

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
}
