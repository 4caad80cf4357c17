//! `TRAINIUM_DUMP_DIR`: every lowered module written as binary protobuf and as text.

use std::io;
use std::path::{Path, PathBuf};

use super::LoweredProgram;
use crate::hlo;

/// The environment variable naming the folder modules are dumped to.
pub const DUMP_DIR_ENV: &str = crate::settings::DUMP_DIR.name;

/// Writes `program` to `$TRAINIUM_DUMP_DIR/<module name>.hlo.pb` and `.hlo.txt` when the variable
/// is set; returns the path of the binary file.
pub fn dump_module(program: &LoweredProgram) -> io::Result<Option<PathBuf>> {
    match crate::settings::DUMP_DIR
        .var_os()
        .filter(|value| !value.is_empty())
    {
        Some(folder) => dump_module_to(Path::new(&folder), program).map(Some),
        None => Ok(None),
    }
}

/// Writes `program` to `<folder>/<module name>.hlo.pb` and `.hlo.txt`; returns the path of the
/// binary file.
pub fn dump_module_to(folder: &Path, program: &LoweredProgram) -> io::Result<PathBuf> {
    std::fs::create_dir_all(folder)?;
    let binary = folder.join(format!("{}.hlo.pb", program.module.name));
    let text = folder.join(format!("{}.hlo.txt", program.module.name));
    crate::write_atomically(&binary, &program.bytes)?;
    crate::write_atomically(&text, hlo::module_to_text(&program.module).as_bytes())?;
    Ok(binary)
}
