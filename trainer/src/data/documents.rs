//! Reading documents from plain-text and JSONL files, given as files or folders.
//!
//! - A file whose name ends in `.jsonl` or `.ndjson` holds one JSON object per line; each
//!   object's string field `text` is a document. Blank lines are skipped.
//! - Any other file is plain text and is one document as a whole.
//! - A folder is searched recursively for files ending in `.txt`, `.text`, `.md`, `.jsonl` or
//!   `.ndjson`, in sorted order, so the document order (and with it the validation split) does
//!   not depend on the file system.
//!
//! Invalid UTF-8 is an error that names the file and the byte offset, unless it is asked to be
//! skipped: then the document holding it (the file, or the JSONL line) is skipped and counted.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use super::error::DataError;

const JSONL_EXTENSIONS: [&str; 2] = ["jsonl", "ndjson"];
const FOLDER_EXTENSIONS: [&str; 5] = ["txt", "text", "md", "jsonl", "ndjson"];

/// Documents read from several files.
#[derive(Debug, Default)]
pub struct Documents {
    /// The documents' texts, in input order; empty texts are left out.
    pub texts: Vec<String>,
    /// Documents skipped because they were not valid UTF-8.
    pub skipped_invalid_utf8: usize,
}

/// The files named by `inputs` (files, or folders searched recursively), in a stable order.
/// Fails when an input does not exist or when no file is found.
pub fn list_input_files(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, DataError> {
    let mut files = Vec::new();
    for input in inputs {
        let metadata = fs::metadata(input).map_err(|error| DataError::io(input, error))?;
        if metadata.is_dir() {
            let start = files.len();
            collect_folder(input, &mut files)?;
            files[start..].sort();
        } else {
            files.push(input.clone());
        }
    }
    if files.is_empty() {
        return Err(DataError::EmptyInput(format!(
            "no input file found in {inputs:?} (folders are searched for files ending in {FOLDER_EXTENSIONS:?})"
        )));
    }
    Ok(files)
}

fn collect_folder(folder: &Path, files: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let entries = fs::read_dir(folder).map_err(|error| DataError::io(folder, error))?;
    for entry in entries {
        let path = entry.map_err(|error| DataError::io(folder, error))?.path();
        if path.is_dir() {
            collect_folder(&path, files)?;
        } else if has_extension(&path, &FOLDER_EXTENSIONS) {
            files.push(path);
        }
    }
    Ok(())
}

fn has_extension(path: &Path, extensions: &[&str]) -> bool {
    path.extension()
        .and_then(|extension| extension.to_str())
        .is_some_and(|extension| extensions.contains(&extension.to_ascii_lowercase().as_str()))
}

/// Reads the documents of every file `inputs` name (see [`list_input_files`]), in order. Fails
/// when they hold no document with text.
pub fn read_inputs(inputs: &[PathBuf], skip_invalid_utf8: bool) -> Result<Documents, DataError> {
    let mut all = Documents::default();
    for file in list_input_files(inputs)? {
        all.skipped_invalid_utf8 += for_each_document(&file, skip_invalid_utf8, |text| {
            all.texts.push(text);
            Ok(())
        })?;
    }
    if all.texts.is_empty() {
        return Err(DataError::EmptyInput(format!(
            "no document with text in {inputs:?} ({} skipped as invalid UTF-8)",
            all.skipped_invalid_utf8
        )));
    }
    Ok(all)
}

/// Calls `visit` with every non-empty document of `path` in file order (see the module
/// documentation for the formats), stopping at its first error. JSONL files are streamed line by
/// line, so they need not fit in memory. Returns the number of documents skipped as invalid UTF-8.
pub fn for_each_document(
    path: &Path,
    skip_invalid_utf8: bool,
    mut visit: impl FnMut(String) -> Result<(), DataError>,
) -> Result<usize, DataError> {
    let io_error = |error| DataError::io(path, error);
    let file = File::open(path).map_err(io_error)?;
    if !has_extension(path, &JSONL_EXTENSIONS) {
        let mut bytes = Vec::new();
        BufReader::new(file)
            .read_to_end(&mut bytes)
            .map_err(io_error)?;
        return match decode_utf8(path, bytes, 0, skip_invalid_utf8)? {
            Some(text) if !text.is_empty() => visit(text).map(|()| 0),
            Some(_) => Ok(0),
            None => Ok(1),
        };
    }
    let mut reader = BufReader::new(file);
    let mut skipped = 0;
    let mut offset = 0u64;
    for number in 1.. {
        let mut line = Vec::new();
        let read = reader.read_until(b'\n', &mut line).map_err(io_error)?;
        if read == 0 {
            break;
        }
        let line_offset = offset;
        offset += read as u64;
        let Some(line) = decode_utf8(path, line, line_offset, skip_invalid_utf8)? else {
            skipped += 1;
            continue;
        };
        if let Some(text) = jsonl_text(path, number, &line)? {
            visit(text)?;
        }
    }
    Ok(skipped)
}

/// The non-empty `text` of JSONL line `number` of `path`; `None` for a blank line or empty text.
fn jsonl_text(path: &Path, number: usize, line: &str) -> Result<Option<String>, DataError> {
    if line.trim().is_empty() {
        return Ok(None);
    }
    let bad_line = |problem: String| DataError::BadJsonLine {
        path: path.to_path_buf(),
        line: number,
        problem,
    };
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|error| bad_line(format!("bad JSON: {error}")))?;
    match value.get("text") {
        None => Err(bad_line("no field `text`".into())),
        Some(serde_json::Value::String(text)) if text.is_empty() => Ok(None),
        Some(serde_json::Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(bad_line("field `text` is not a string".into())),
    }
}

/// `bytes` as text; `None` when they are not UTF-8 and skipping was asked, an error naming the
/// file offset (`offset` is where `bytes` start in the file) otherwise.
fn decode_utf8(
    path: &Path,
    bytes: Vec<u8>,
    offset: u64,
    skip_invalid_utf8: bool,
) -> Result<Option<String>, DataError> {
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Some(text)),
        Err(_) if skip_invalid_utf8 => Ok(None),
        Err(error) => Err(DataError::InvalidUtf8 {
            path: path.to_path_buf(),
            offset: offset + error.utf8_error().valid_up_to() as u64,
        }),
    }
}
