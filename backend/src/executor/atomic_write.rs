//! The project's one atomic file write: the compile caches, module dumps, checkpoints, run
//! folders, metrics and reports all publish their files through it.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` atomically: a temporary file in the same folder (`tempfile`), synced,
/// then persisted over `path` by a rename, with the permissions a new file gets. Readers (other processes included) see the old file or
/// the whole new one, never a part; a failed write leaves no temporary file behind.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    // As `File::create` would: readable by others unless the umask says otherwise (a temporary
    // file is private by default, and the rename would keep that).
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut file = builder.tempfile_in(folder)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map(drop).map_err(|error| error.error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_whole_file_leaves_no_temporaries_and_keeps_a_new_files_permissions() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("report.json");
        write_atomically(&path, b"first").unwrap();
        write_atomically(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(folder.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["report.json"]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let created = folder.path().join("plain");
            std::fs::File::create(&created).unwrap();
            let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&path), mode(&created));
        }
    }
}
