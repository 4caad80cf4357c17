//! [`FileError`]: a file that could not be read or written, or whose content is wrong, named in
//! the message.

use std::path::{Path, PathBuf};

/// A file (or folder) that could not be read or written, or whose content is invalid.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Reading or writing the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file's content is invalid or asks for something unsupported.
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl FileError {
    /// The I/O error of `path`, as a function of the error (for `map_err`).
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| Self::Io { path, source }
    }

    /// `path`'s content is wrong, as `message` says.
    pub fn invalid(path: &Path, message: impl Into<String>) -> Self {
        Self::Invalid {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }

    /// [`std::fs::read_to_string`] of `path`, its error naming the file.
    pub fn read_to_string(path: &Path) -> Result<String, Self> {
        std::fs::read_to_string(path).map_err(Self::io(path))
    }
}
