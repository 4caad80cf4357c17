//! Input files: what `--input` names (files, folders, glob patterns) and the format of each.
//!
//! - A file is taken as it is, whatever its name.
//! - A folder is searched recursively for files whose name ends in one of [`FOLDER_EXTENSIONS`]
//!   (optionally followed by `.gz`, `.zst` or `.zstd`), in sorted order, so that the document
//!   order (and with it the validation split) does not depend on the file system.
//! - Any other input holding `*`, `?` or `[` is a glob pattern (`data/*.jsonl.zst`,
//!   `corpus/**/*.parquet`); its matches are taken in sorted order, folders searched as above.
//!
//! The format of a file comes from its first bytes, then its name:
//!
//! | first bytes          | format                                                       |
//! |----------------------|--------------------------------------------------------------|
//! | `PAR1`               | Parquet                                                      |
//! | `1f 8b`              | gzip-compressed JSONL or text                                |
//! | `28 b5 2f fd`        | zstd-compressed JSONL or text                                |
//! | anything else        | JSONL or text                                                |
//!
//! Without its compression suffix (`.gz`, `.gzip`, `.zst`, `.zstd`), a name ending in `.jsonl`,
//! `.ndjson` or `.json` is JSON lines; any other is plain text, one document per file. A name
//! ending in `.parquet` without the Parquet magic is an error.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use super::error::DataError;

/// Names that hold JSON lines (one JSON object per line).
pub const JSONL_EXTENSIONS: [&str; 3] = ["jsonl", "ndjson", "json"];
/// The files a folder is searched for (each possibly compressed).
pub const FOLDER_EXTENSIONS: [&str; 7] =
    ["txt", "text", "md", "jsonl", "ndjson", "json", "parquet"];
/// Compression suffixes left out when the format is read from a name.
const COMPRESSION_EXTENSIONS: [&str; 4] = ["gz", "gzip", "zst", "zstd"];

const PARQUET_MAGIC: [u8; 4] = *b"PAR1";
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// How a file's bytes are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Stored as is.
    None,
    /// gzip (one or more members, as `gzip`, `pigz` and `bgzip` write).
    Gzip,
    /// Zstandard (one or more frames).
    Zstd,
}

impl Compression {
    /// The name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "uncompressed",
            Self::Gzip => "gzip",
            Self::Zstd => "zstd",
        }
    }
}

/// What a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// One document: the whole (decompressed) file.
    Text(Compression),
    /// One JSON object per (decompressed) line, the text in a field.
    Jsonl(Compression),
    /// A Parquet file, the text in a string column.
    Parquet,
}

/// An input file and its format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    /// The file.
    pub path: PathBuf,
    /// Its format.
    pub format: InputFormat,
}

/// The files named by `inputs` (files, folders, glob patterns; see the [module](self)
/// documentation), each with its format, in a stable order. Fails when an input does not exist,
/// a pattern matches nothing, or no file is found.
pub fn list_input_files(inputs: &[PathBuf]) -> Result<Vec<InputFile>, DataError> {
    let mut paths = Vec::new();
    for input in inputs {
        if !input.exists() && is_pattern(input) {
            let matches = expand_pattern(input)?;
            for path in matches {
                add_input(&path, &mut paths)?;
            }
        } else {
            add_input(input, &mut paths)?;
        }
    }
    if paths.is_empty() {
        return Err(DataError::EmptyInput(format!(
            "no input file found in {inputs:?} (folders are searched for files ending in \
             {FOLDER_EXTENSIONS:?}, optionally compressed)"
        )));
    }
    paths
        .into_iter()
        .map(|path| {
            let format = detect_format(&path)?;
            Ok(InputFile { path, format })
        })
        .collect()
}

fn is_pattern(input: &Path) -> bool {
    input
        .to_str()
        .is_some_and(|text| text.contains(['*', '?', '[']))
}

fn expand_pattern(pattern: &Path) -> Result<Vec<PathBuf>, DataError> {
    let text = pattern.to_str().unwrap_or_default();
    let bad = |problem: String| DataError::setting("input pattern", format!("`{text}`: {problem}"));
    let mut matches = glob::glob(text)
        .map_err(|error| bad(error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| DataError::io(error.path(), std::io::Error::other(error.to_string())))?;
    if matches.is_empty() {
        return Err(bad("matches no file".into()));
    }
    matches.sort();
    Ok(matches)
}

/// Adds a file, or a folder's files in sorted order.
fn add_input(input: &Path, paths: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let metadata = fs::metadata(input).map_err(|error| DataError::io(input, error))?;
    if metadata.is_dir() {
        let start = paths.len();
        collect_folder(input, paths)?;
        paths[start..].sort();
    } else {
        paths.push(input.to_path_buf());
    }
    Ok(())
}

fn collect_folder(folder: &Path, files: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let entries = fs::read_dir(folder).map_err(|error| DataError::io(folder, error))?;
    for entry in entries {
        let path = entry.map_err(|error| DataError::io(folder, error))?.path();
        if path.is_dir() {
            collect_folder(&path, files)?;
        } else if name_extension(&path).is_some_and(|ext| FOLDER_EXTENSIONS.contains(&ext.as_str()))
        {
            files.push(path);
        }
    }
    Ok(())
}

/// The lower-case extension of `path` once a compression suffix is left out.
fn name_extension(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    let mut parts: Vec<&str> = name.rsplit('.').collect();
    if parts.len() > 1 && COMPRESSION_EXTENSIONS.contains(&parts[0]) {
        parts.remove(0);
    }
    (parts.len() > 1).then(|| parts[0].to_string())
}

/// The format of `path`, from its first bytes and its name.
pub fn detect_format(path: &Path) -> Result<InputFormat, DataError> {
    let mut magic = [0u8; 4];
    let mut file = File::open(path).map_err(|error| DataError::io(path, error))?;
    let mut read = 0;
    while read < magic.len() {
        match file.read(&mut magic[read..]) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(DataError::io(path, error)),
        }
    }
    let magic = &magic[..read];
    if magic == PARQUET_MAGIC {
        return Ok(InputFormat::Parquet);
    }
    let extension = name_extension(path);
    if extension.as_deref() == Some("parquet") {
        return Err(DataError::BadParquet {
            path: path.to_path_buf(),
            row_group: None,
            problem: "not a Parquet file: it does not start with the magic `PAR1`".into(),
        });
    }
    let compression = if magic.starts_with(&GZIP_MAGIC) {
        Compression::Gzip
    } else if magic == ZSTD_MAGIC {
        Compression::Zstd
    } else {
        Compression::None
    };
    let jsonl = extension.is_some_and(|ext| JSONL_EXTENSIONS.contains(&ext.as_str()));
    Ok(if jsonl {
        InputFormat::Jsonl(compression)
    } else {
        InputFormat::Text(compression)
    })
}
