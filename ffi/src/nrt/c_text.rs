//! Conversions between Rust strings and the C strings of the `libnrt` API.

use std::ffi::{CString, c_char};

use super::NrtError;

/// `text` as a C string for the C function `call`, rejected if it holds a NUL byte.
pub(crate) fn c_string(call: &'static str, text: &str) -> Result<CString, NrtError> {
    CString::new(text).map_err(|_| NrtError::InvalidArgument {
        call,
        reason: format!("`{text}` contains a NUL byte"),
    })
}

/// The text of a fixed-size C char array, up to its first NUL.
pub(crate) fn from_c_chars(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_strings_are_read_up_to_the_terminator() {
        let mut chars = [0 as c_char; 8];
        for (slot, byte) in chars.iter_mut().zip(b"input0") {
            *slot = *byte as c_char;
        }
        assert_eq!(from_c_chars(&chars), "input0");
    }
}
