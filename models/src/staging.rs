//! Folders written completely or not at all: filled under a temporary sibling, then renamed.

use std::io;
use std::path::{Path, PathBuf};

/// A temporary sibling of the target folder; removed on drop unless [`Staging::commit`]ted.
pub struct Staging {
    temporary: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl Staging {
    /// Creates an empty temporary folder beside `target` (creating `target`'s parents).
    pub fn new(target: &Path) -> io::Result<Staging> {
        let name = target
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no folder name"))?;
        let parent = match target.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent)?;
        let temporary = parent.join(format!(
            ".{}.partial-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        if temporary.exists() {
            std::fs::remove_dir_all(&temporary)?;
        }
        std::fs::create_dir(&temporary)?;
        Ok(Staging {
            temporary,
            target: target.to_path_buf(),
            committed: false,
        })
    }

    /// The temporary folder to fill.
    pub fn path(&self) -> &Path {
        &self.temporary
    }

    /// Renames the temporary folder to the target. An existing target is replaced when `replace`
    /// is set (moved aside first, removed after), and is an error otherwise.
    pub fn commit(mut self, replace: bool) -> io::Result<()> {
        if self.target.exists() {
            if !replace {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} already exists", self.target.display()),
                ));
            }
            let mut aside = self.temporary.clone().into_os_string();
            aside.push(".old");
            let aside = PathBuf::from(aside);
            std::fs::rename(&self.target, &aside)?;
            std::fs::rename(&self.temporary, &self.target)?;
            self.committed = true;
            std::fs::remove_dir_all(&aside)?;
        } else {
            std::fs::rename(&self.temporary, &self.target)?;
            self.committed = true;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed
            && let Err(error) = std::fs::remove_dir_all(&self.temporary)
        {
            log::warn!("could not remove {}: {error}", self.temporary.display());
        }
    }
}
