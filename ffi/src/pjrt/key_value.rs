//! The key-value store a plugin uses to join the processes of a job: `PJRT_Client_Create` takes
//! get, try-get and put callbacks (with `node_id` and `num_nodes` among the create options), and
//! a plugin that spans processes (the CUDA plugin, as JAX's distributed runtime drives it)
//! exchanges its topology through them. A plugin without that support ignores them.

use std::ffi::{c_char, c_void};
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
    fn code(&self) -> i32 {
        match self {
            KeyValueError::TimedOut(_) => raw::ERROR_CODE_DEADLINE_EXCEEDED,
            KeyValueError::Unavailable(_) => raw::ERROR_CODE_UNAVAILABLE,
        }
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

/// The callbacks' state, owned by the client for as long as the plugin may call them.
pub(crate) struct Callbacks {
    store: Arc<dyn KeyValueStore>,
}

impl Callbacks {
    /// The callbacks of `store`.
    pub(crate) fn new(store: Arc<dyn KeyValueStore>) -> Box<Self> {
        Box::new(Self { store })
    }

    /// Points `args`' callbacks at this state (which must outlive the client).
    pub(crate) fn install(self: &mut Box<Self>, args: &mut raw::ClientCreateArgs) {
        let user_arg = (&mut **self as *mut Callbacks).cast::<c_void>();
        args.kv_get_callback = get as *const c_void;
        args.kv_get_user_arg = user_arg;
        args.kv_try_get_callback = try_get as *const c_void;
        args.kv_try_get_user_arg = user_arg;
        args.kv_put_callback = put as *const c_void;
        args.kv_put_user_arg = user_arg;
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

/// A plugin error made by the plugin's `callback_error` (null when the plugin gave none).
///
/// # Safety
/// `callback_error` must be null or point to the plugin's `PJRT_CallbackError`.
unsafe fn plugin_error(
    callback_error: *const raw::CallbackError,
    code: i32,
    message: &str,
) -> *mut raw::PjrtError {
    // SAFETY: the caller guarantees the pointer is null or valid.
    match unsafe { callback_error.as_ref() }.copied().flatten() {
        // SAFETY: the plugin's function, with a message valid for the call.
        Some(make) => unsafe { make(code, message.as_ptr().cast(), message.len()) },
        None => std::ptr::null_mut(),
    }
}

/// Header before a value handed to the plugin: its length, so [`delete_value`] can free it.
const LENGTH_HEADER: usize = std::mem::size_of::<u64>();

/// A copy of `value` the plugin frees with [`delete_value`].
fn handed_value(value: &[u8]) -> *mut c_char {
    let mut buffer = Vec::with_capacity(LENGTH_HEADER + value.len());
    buffer.extend_from_slice(&(value.len() as u64).to_le_bytes());
    buffer.extend_from_slice(value);
    let base = Box::into_raw(buffer.into_boxed_slice()).cast::<u8>();
    // SAFETY: the allocation holds the header and the value.
    unsafe { base.add(LENGTH_HEADER) }.cast()
}

/// `PJRT_KeyValueGetCallback_ValueDeleter` of the values [`handed_value`] makes.
unsafe extern "C" fn delete_value(value: *mut c_char) {
    if value.is_null() {
        return;
    }
    // SAFETY: `value` came from `handed_value`: its header sits right before it.
    unsafe {
        let base = value.cast::<u8>().sub(LENGTH_HEADER);
        let length = u64::from_le_bytes(*base.cast::<[u8; LENGTH_HEADER]>()) as usize;
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            base,
            LENGTH_HEADER + length,
        )));
    }
}

/// `PJRT_KeyValueGetCallback`.
unsafe extern "C" fn get(args: *mut raw::KeyValueGetArgs) -> *mut raw::PjrtError {
    // SAFETY: the plugin passes valid arguments, `user_arg` is the installed `Callbacks`.
    let args = unsafe { &mut *args };
    let callbacks = unsafe { &*(args.user_arg as *const Callbacks) };
    let key = unsafe { bytes(args.key, args.key_size) };
    let timeout = Duration::from_millis(args.timeout_in_ms.max(0) as u64);
    match callbacks.store.get(key, timeout) {
        Ok(value) => {
            args.value = handed_value(&value);
            args.value_size = value.len();
            args.value_deleter_callback = Some(delete_value);
            std::ptr::null_mut()
        }
        // SAFETY: the plugin's callback_error.
        Err(error) => unsafe {
            plugin_error(args.callback_error, error.code(), &error.to_string())
        },
    }
}

/// `PJRT_KeyValueTryGetCallback`: a missing key is `NOT_FOUND`.
unsafe extern "C" fn try_get(args: *mut raw::KeyValueTryGetArgs) -> *mut raw::PjrtError {
    // SAFETY: as for `get`.
    let args = unsafe { &mut *args };
    let callbacks = unsafe { &*(args.user_arg as *const Callbacks) };
    let key = unsafe { bytes(args.key, args.key_size) };
    let (code, message) = match callbacks.store.try_get(key) {
        Ok(Some(value)) => {
            args.value = handed_value(&value);
            args.value_size = value.len();
            args.value_deleter_callback = Some(delete_value);
            return std::ptr::null_mut();
        }
        Ok(None) => (
            raw::ERROR_CODE_NOT_FOUND,
            format!("no key `{}`", String::from_utf8_lossy(key)),
        ),
        Err(error) => (error.code(), error.to_string()),
    };
    // SAFETY: the plugin's callback_error.
    unsafe { plugin_error(args.callback_error, code, &message) }
}

/// `PJRT_KeyValuePutCallback`.
unsafe extern "C" fn put(args: *mut raw::KeyValuePutArgs) -> *mut raw::PjrtError {
    // SAFETY: as for `get`.
    let args = unsafe { &mut *args };
    let callbacks = unsafe { &*(args.user_arg as *const Callbacks) };
    let key = unsafe { bytes(args.key, args.key_size) };
    let value = unsafe { bytes(args.value, args.value_size) };
    match callbacks.store.put(key, value) {
        Ok(()) => std::ptr::null_mut(),
        // SAFETY: the plugin's callback_error.
        Err(error) => unsafe {
            plugin_error(args.callback_error, error.code(), &error.to_string())
        },
    }
}

#[cfg(test)]
mod tests {
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
        static LAST_ERROR: std::cell::RefCell<Option<(i32, String)>> = const { std::cell::RefCell::new(None) };
    }

    /// Stands in for the plugin's `PJRT_CallbackError`: records, returns a non-null marker.
    unsafe extern "C" fn record_error(
        code: i32,
        message: *const c_char,
        size: usize,
    ) -> *mut raw::PjrtError {
        let text = String::from_utf8_lossy(unsafe { bytes(message, size) }).into_owned();
        LAST_ERROR.with(|last| *last.borrow_mut() = Some((code, text)));
        std::ptr::NonNull::dangling().as_ptr()
    }

    const RECORD_ERROR: raw::CallbackError = Some(record_error);

    /// The callbacks as a plugin sees them after `PJRT_Client_Create`.
    fn installed() -> (Box<Callbacks>, raw::ClientCreateArgs) {
        let mut callbacks = Callbacks::new(Arc::new(Memory::default()));
        // SAFETY: a valid zeroed argument struct.
        let mut args = unsafe { raw::args::<raw::ClientCreateArgs>() };
        callbacks.install(&mut args);
        (callbacks, args)
    }

    fn put_through(args: &raw::ClientCreateArgs, key: &[u8], value: &[u8]) -> *mut raw::PjrtError {
        // SAFETY: a valid zeroed argument struct, filled as a plugin does.
        let mut put_args = unsafe { raw::args::<raw::KeyValuePutArgs>() };
        put_args.key = key.as_ptr().cast();
        put_args.key_size = key.len();
        put_args.value = value.as_ptr().cast();
        put_args.value_size = value.len();
        put_args.callback_error = &RECORD_ERROR;
        put_args.user_arg = args.kv_put_user_arg;
        let call: unsafe extern "C" fn(*mut raw::KeyValuePutArgs) -> *mut raw::PjrtError =
            unsafe { std::mem::transmute(args.kv_put_callback) };
        unsafe { call(&mut put_args) }
    }

    #[test]
    fn a_value_put_through_the_callbacks_is_read_back_and_freed_by_the_plugin() {
        let (_callbacks, args) = installed();
        assert!(put_through(&args, b"topology/0", b"\x01\x00\x02").is_null());

        // SAFETY: as above.
        let mut get_args = unsafe { raw::args::<raw::KeyValueGetArgs>() };
        get_args.key = b"topology/0".as_ptr().cast();
        get_args.key_size = 10;
        get_args.timeout_in_ms = 1000;
        get_args.callback_error = &RECORD_ERROR;
        get_args.user_arg = args.kv_get_user_arg;
        let call: unsafe extern "C" fn(*mut raw::KeyValueGetArgs) -> *mut raw::PjrtError =
            unsafe { std::mem::transmute(args.kv_get_callback) };
        assert!(unsafe { call(&mut get_args) }.is_null());
        let value = unsafe { bytes(get_args.value, get_args.value_size) }.to_vec();
        assert_eq!(value, b"\x01\x00\x02");
        let delete = get_args.value_deleter_callback.expect("a deleter");
        unsafe { delete(get_args.value) };

        // An empty value is a value too.
        assert!(put_through(&args, b"empty", b"").is_null());
        let mut try_args = unsafe { raw::args::<raw::KeyValueTryGetArgs>() };
        try_args.key = b"empty".as_ptr().cast();
        try_args.key_size = 5;
        try_args.callback_error = &RECORD_ERROR;
        try_args.user_arg = args.kv_try_get_user_arg;
        let call: unsafe extern "C" fn(*mut raw::KeyValueTryGetArgs) -> *mut raw::PjrtError =
            unsafe { std::mem::transmute(args.kv_try_get_callback) };
        assert!(unsafe { call(&mut try_args) }.is_null());
        assert_eq!(try_args.value_size, 0);
        unsafe { delete_value(try_args.value) };
    }

    #[test]
    fn a_missing_key_is_a_plugin_error_with_its_code() {
        let (_callbacks, args) = installed();
        let mut get_args = unsafe { raw::args::<raw::KeyValueGetArgs>() };
        get_args.key = b"absent".as_ptr().cast();
        get_args.key_size = 6;
        get_args.callback_error = &RECORD_ERROR;
        get_args.user_arg = args.kv_get_user_arg;
        let call: unsafe extern "C" fn(*mut raw::KeyValueGetArgs) -> *mut raw::PjrtError =
            unsafe { std::mem::transmute(args.kv_get_callback) };
        assert!(!unsafe { call(&mut get_args) }.is_null());
        let (code, message) = LAST_ERROR.with(|last| last.borrow_mut().take()).unwrap();
        assert_eq!(code, raw::ERROR_CODE_DEADLINE_EXCEEDED);
        assert!(message.contains("absent"), "{message}");

        let mut try_args = unsafe { raw::args::<raw::KeyValueTryGetArgs>() };
        try_args.key = b"absent".as_ptr().cast();
        try_args.key_size = 6;
        try_args.callback_error = &RECORD_ERROR;
        try_args.user_arg = args.kv_try_get_user_arg;
        let call: unsafe extern "C" fn(*mut raw::KeyValueTryGetArgs) -> *mut raw::PjrtError =
            unsafe { std::mem::transmute(args.kv_try_get_callback) };
        assert!(!unsafe { call(&mut try_args) }.is_null());
        let (code, _) = LAST_ERROR.with(|last| last.borrow_mut().take()).unwrap();
        assert_eq!(code, raw::ERROR_CODE_NOT_FOUND);
    }
}
