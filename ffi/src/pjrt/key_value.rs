//! The key-value store a plugin uses to join the processes of a job: `PJRT_Client_Create` takes
//! get, try-get and put callbacks (with `node_id` and `num_nodes` among the create options), and
//! a plugin that spans processes (the CUDA plugin, as JAX's distributed runtime drives it)
//! exchanges its topology through them. A plugin without that support ignores them.

use std::ffi::{c_char, c_void};
use std::panic::AssertUnwindSafe;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use super::raw;

/// Why a key-value operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyValueError {
    /// No other process put the key in time.
    #[error("timed out: {0}")]
    TimedOut(String),
    /// The store cannot be reached.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl KeyValueError {
    /// The `PJRT_Error_Code` and message a callback returns for this error.
    fn into_plugin_error(self) -> (i32, String) {
        let code = match self {
            KeyValueError::TimedOut(_) => raw::ERROR_CODE_DEADLINE_EXCEEDED,
            KeyValueError::Unavailable(_) => raw::ERROR_CODE_UNAVAILABLE,
        };
        (code, self.to_string())
    }
}

/// A store every process of a job reads and writes (thread-safe; `get` blocks).
pub trait KeyValueStore: Send + Sync {
    /// Stores `value` under `key`.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KeyValueError>;
    /// The value of `key`, waiting up to `timeout` for a process to put it.
    fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, KeyValueError>;
    /// The value of `key` if a process put it already.
    fn try_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KeyValueError>;
}

/// How a client joins the processes of a job: this process's node id, the node count, and the
/// store they share.
#[derive(Clone)]
pub struct Distributed {
    /// This process's index among the job's processes.
    pub node_id: usize,
    /// Processes in the job.
    pub num_nodes: usize,
    /// The store the plugin exchanges its topology through.
    pub store: Arc<dyn KeyValueStore>,
}

/// The callbacks' state, owned by the client for as long as the plugin may call them: made with
/// [`Callbacks::leak`] before the client, freed with [`Callbacks::free`] after it is destroyed.
pub(crate) struct Callbacks {
    store: Arc<dyn KeyValueStore>,
}

impl Callbacks {
    /// The callbacks' state for `store`, on the heap until [`Callbacks::free`].
    pub(crate) fn leak(store: Arc<dyn KeyValueStore>) -> NonNull<Callbacks> {
        NonNull::from(Box::leak(Box::new(Callbacks { store })))
    }

    /// Points `args`' callbacks at `state`.
    pub(crate) fn install(state: NonNull<Callbacks>, args: &mut raw::ClientCreateArgs) {
        let user_arg = state.as_ptr().cast::<c_void>();
        args.kv_get_callback = Some(get);
        args.kv_get_user_arg = user_arg;
        args.kv_try_get_callback = Some(try_get);
        args.kv_try_get_user_arg = user_arg;
        args.kv_put_callback = Some(put);
        args.kv_put_user_arg = user_arg;
    }

    /// Frees the state [`Callbacks::leak`] made.
    ///
    /// # Safety
    /// Once only, after the plugin can no longer call the callbacks (its client is destroyed).
    pub(crate) unsafe fn free(state: NonNull<Callbacks>) {
        // SAFETY: made by `leak`, freed once (the caller's promise).
        drop(unsafe { Box::from_raw(state.as_ptr()) });
    }
}

/// The bytes at `pointer` (`size` of them; none when null).
///
/// # Safety
/// `pointer` must point to `size` readable bytes, or be null.
unsafe fn bytes<'a>(pointer: *const c_char, size: usize) -> &'a [u8] {
    if pointer.is_null() || size == 0 {
        return &[];
    }
    // SAFETY: the caller guarantees `size` readable bytes.
    unsafe { std::slice::from_raw_parts(pointer.cast(), size) }
}

/// Header before a value handed to the plugin: its length, so [`delete_value`] can free it.
const LENGTH_HEADER: usize = std::mem::size_of::<u64>();

/// A copy of `value` to hand to the plugin through a get's out-fields (`value`, `value_size`,
/// `value_deleter_callback`); the plugin frees it with the [`delete_value`] it is given.
fn handed_over(value: &[u8]) -> (*mut c_char, usize, raw::ValueDeleter) {
    let mut buffer = Vec::with_capacity(LENGTH_HEADER + value.len());
    buffer.extend_from_slice(&(value.len() as u64).to_le_bytes());
    buffer.extend_from_slice(value);
    let base = Box::into_raw(buffer.into_boxed_slice()).cast::<u8>();
    // SAFETY: the allocation holds the header and the value.
    let copy = unsafe { base.add(LENGTH_HEADER) }.cast();
    (copy, value.len(), Some(delete_value))
}

/// `PJRT_KeyValueGetCallback_ValueDeleter` of the values [`handed_over`] makes.
unsafe extern "C" fn delete_value(value: *mut c_char) {
    if value.is_null() {
        return;
    }
    // SAFETY: `value` came from `handed_over`: its header sits right before it.
    unsafe {
        let base = value.cast::<u8>().sub(LENGTH_HEADER);
        let length = u64::from_le_bytes(*base.cast::<[u8; LENGTH_HEADER]>()) as usize;
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            base,
            LENGTH_HEADER + length,
        )));
    }
}

/// Runs a callback's body: its error (or a panic, which must not unwind into the plugin) as a
/// plugin error made by the plugin's `callback_error`.
///
/// # Safety
/// `callback_error` must be null or point to the plugin's `PJRT_CallbackError`.
unsafe fn answer(
    callback_error: *const raw::CallbackError,
    body: impl FnOnce() -> Result<(), (i32, String)>,
) -> *mut raw::PjrtError {
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        let reason = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err((
            raw::ERROR_CODE_INTERNAL,
            format!("key-value callback: {reason}"),
        ))
    });
    let Err((code, message)) = outcome else {
        return std::ptr::null_mut();
    };
    // SAFETY: the caller guarantees the pointer is null or valid.
    match unsafe { callback_error.as_ref() }.copied().flatten() {
        // SAFETY: the plugin's function, with a message valid for the call.
        Some(make) => unsafe { make(code, message.as_ptr().cast(), message.len()) },
        None => {
            // The plugin gave no way to fail: nothing better than stopping with the reason.
            log::error!("a PJRT key-value callback failed with no error to return: {message}");
            std::process::abort()
        }
    }
}

/// The store of the callbacks' state `user_arg`.
///
/// # Safety
/// `user_arg` must be the state [`Callbacks::install`] gave the plugin, not yet freed.
unsafe fn store<'a>(user_arg: *mut c_void) -> &'a dyn KeyValueStore {
    // SAFETY: the caller's promise.
    unsafe { &*(user_arg as *const Callbacks) }.store.as_ref()
}

/// `PJRT_KeyValueGetCallback`.
unsafe extern "C" fn get(args: *mut raw::KeyValueGetArgs) -> *mut raw::PjrtError {
    // SAFETY: the plugin passes valid arguments and the installed state.
    let args = unsafe { &mut *args };
    let callback_error = args.callback_error;
    // SAFETY: as above.
    unsafe {
        answer(callback_error, || {
            let key = bytes(args.key, args.key_size);
            let timeout = Duration::from_millis(args.timeout_in_ms.max(0) as u64);
            let value = store(args.user_arg)
                .get(key, timeout)
                .map_err(KeyValueError::into_plugin_error)?;
            (args.value, args.value_size, args.value_deleter_callback) = handed_over(&value);
            Ok(())
        })
    }
}

/// `PJRT_KeyValueTryGetCallback`: a missing key is `NOT_FOUND`.
unsafe extern "C" fn try_get(args: *mut raw::KeyValueTryGetArgs) -> *mut raw::PjrtError {
    // SAFETY: as for `get`.
    let args = unsafe { &mut *args };
    let callback_error = args.callback_error;
    // SAFETY: as above.
    unsafe {
        answer(callback_error, || {
            let key = bytes(args.key, args.key_size);
            let value = store(args.user_arg)
                .try_get(key)
                .map_err(KeyValueError::into_plugin_error)?
                .ok_or_else(|| {
                    (
                        raw::ERROR_CODE_NOT_FOUND,
                        format!("no key `{}`", String::from_utf8_lossy(key)),
                    )
                })?;
            (args.value, args.value_size, args.value_deleter_callback) = handed_over(&value);
            Ok(())
        })
    }
}

/// `PJRT_KeyValuePutCallback`.
unsafe extern "C" fn put(args: *mut raw::KeyValuePutArgs) -> *mut raw::PjrtError {
    // SAFETY: as for `get`.
    let args = unsafe { &mut *args };
    // SAFETY: as above.
    unsafe {
        answer(args.callback_error, || {
            let key = bytes(args.key, args.key_size);
            let value = bytes(args.value, args.value_size);
            store(args.user_arg)
                .put(key, value)
                .map_err(KeyValueError::into_plugin_error)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;

    /// A store of one process.
    #[derive(Default)]
    struct Memory(Mutex<HashMap<Vec<u8>, Vec<u8>>>);

    impl KeyValueStore for Memory {
        fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KeyValueError> {
            self.0.lock().unwrap().insert(key.to_vec(), value.to_vec());
            Ok(())
        }

        fn get(&self, key: &[u8], _timeout: Duration) -> Result<Vec<u8>, KeyValueError> {
            self.try_get(key)?.ok_or_else(|| {
                KeyValueError::TimedOut(format!("`{}`", String::from_utf8_lossy(key)))
            })
        }

        fn try_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KeyValueError> {
            Ok(self.0.lock().unwrap().get(key).cloned())
        }
    }

    thread_local! {
        /// The code and message of the last error the stand-in `callback_error` made.
        static LAST_ERROR: RefCell<Option<(i32, String)>> = const { RefCell::new(None) };
    }

    /// Stands in for the plugin's `PJRT_CallbackError`: records, returns a non-null marker.
    unsafe extern "C" fn record_error(
        code: i32,
        message: *const c_char,
        size: usize,
    ) -> *mut raw::PjrtError {
        let text = String::from_utf8_lossy(unsafe { bytes(message, size) }).into_owned();
        LAST_ERROR.with(|last| *last.borrow_mut() = Some((code, text)));
        NonNull::dangling().as_ptr()
    }

    const RECORD_ERROR: raw::CallbackError = Some(record_error);

    /// The callbacks as a plugin sees them after `PJRT_Client_Create`, and their state.
    struct Installed {
        state: NonNull<Callbacks>,
        args: raw::ClientCreateArgs,
    }

    impl Installed {
        fn new() -> Self {
            let state = Callbacks::leak(Arc::new(Memory::default()));
            // SAFETY: a valid zeroed argument struct.
            let mut args = unsafe { raw::args::<raw::ClientCreateArgs>() };
            Callbacks::install(state, &mut args);
            Self { state, args }
        }

        fn put(&self, key: &[u8], value: &[u8]) -> *mut raw::PjrtError {
            // SAFETY: a valid zeroed argument struct, filled as a plugin does.
            let mut args = unsafe { raw::args::<raw::KeyValuePutArgs>() };
            args.key = key.as_ptr().cast();
            args.key_size = key.len();
            args.value = value.as_ptr().cast();
            args.value_size = value.len();
            args.callback_error = &RECORD_ERROR;
            args.user_arg = self.args.kv_put_user_arg;
            unsafe { self.args.kv_put_callback.unwrap()(&mut args) }
        }

        fn get(&self, key: &[u8]) -> (*mut raw::PjrtError, raw::KeyValueGetArgs) {
            let mut args = unsafe { raw::args::<raw::KeyValueGetArgs>() };
            args.key = key.as_ptr().cast();
            args.key_size = key.len();
            args.timeout_in_ms = 1000;
            args.callback_error = &RECORD_ERROR;
            args.user_arg = self.args.kv_get_user_arg;
            let error = unsafe { self.args.kv_get_callback.unwrap()(&mut args) };
            (error, args)
        }

        fn try_get(&self, key: &[u8]) -> (*mut raw::PjrtError, raw::KeyValueTryGetArgs) {
            let mut args = unsafe { raw::args::<raw::KeyValueTryGetArgs>() };
            args.key = key.as_ptr().cast();
            args.key_size = key.len();
            args.callback_error = &RECORD_ERROR;
            args.user_arg = self.args.kv_try_get_user_arg;
            let error = unsafe { self.args.kv_try_get_callback.unwrap()(&mut args) };
            (error, args)
        }
    }

    impl Drop for Installed {
        fn drop(&mut self) {
            // SAFETY: made by `leak`, and the test no longer calls the callbacks.
            unsafe { Callbacks::free(self.state) };
        }
    }

    #[test]
    fn a_value_put_through_the_callbacks_is_read_back_and_freed_by_the_plugin() {
        let installed = Installed::new();
        assert!(installed.put(b"topology/0", b"\x01\x00\x02").is_null());
        let (error, got) = installed.get(b"topology/0");
        assert!(error.is_null());
        assert_eq!(unsafe { bytes(got.value, got.value_size) }, b"\x01\x00\x02");
        unsafe { got.value_deleter_callback.expect("a deleter")(got.value) };

        // An empty value is a value too.
        assert!(installed.put(b"empty", b"").is_null());
        let (error, got) = installed.try_get(b"empty");
        assert!(error.is_null());
        assert_eq!(got.value_size, 0);
        unsafe { got.value_deleter_callback.expect("a deleter")(got.value) };
    }

    #[test]
    fn a_missing_key_is_a_plugin_error_with_its_code() {
        let installed = Installed::new();
        let (error, _) = installed.get(b"absent");
        assert!(!error.is_null());
        let (code, message) = LAST_ERROR.with(|last| last.borrow_mut().take()).unwrap();
        assert_eq!(code, raw::ERROR_CODE_DEADLINE_EXCEEDED);
        assert!(message.contains("absent"), "{message}");

        let (error, _) = installed.try_get(b"absent");
        assert!(!error.is_null());
        let (code, _) = LAST_ERROR.with(|last| last.borrow_mut().take()).unwrap();
        assert_eq!(code, raw::ERROR_CODE_NOT_FOUND);
    }
}
