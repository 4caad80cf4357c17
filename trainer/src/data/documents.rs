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

use std::fs;
use std::path::{Path, PathBuf};

use super::error::DataError;

const JSONL_EXTENSIONS: [&str; 2] = ["jsonl", "ndjson"];
const FOLDER_EXTENSIONS: [&str; 5] = ["txt", "text", "md", "jsonl", "ndjson"];

/// The documents of one file.
#[derive(Debug, Default)]
pub struct FileDocuments {
    /// The documents' texts, in file order; empty texts are left out.
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
pub fn read_inputs(
    inputs: &[PathBuf],
    skip_invalid_utf8: bool,
) -> Result<FileDocuments, DataError> {
    let mut all = FileDocuments::default();
    for file in list_input_files(inputs)? {
        let documents = read_documents(&file, skip_invalid_utf8)?;
        all.texts.extend(documents.texts);
        all.skipped_invalid_utf8 += documents.skipped_invalid_utf8;
    }
    if all.texts.is_empty() {
        return Err(DataError::EmptyInput(format!(
            "no document with text in {inputs:?} ({} skipped as invalid UTF-8)",
            all.skipped_invalid_utf8
        )));
    }
    Ok(all)
}

/// Reads the documents of `path` (see the module documentation for the formats).
pub fn read_documents(path: &Path, skip_invalid_utf8: bool) -> Result<FileDocuments, DataError> {
    let bytes = fs::read(path).map_err(|error| DataError::io(path, error))?;
    if has_extension(path, &JSONL_EXTENSIONS) {
        read_jsonl(path, &bytes, skip_invalid_utf8)
    } else {
        let mut documents = FileDocuments::default();
        match decode_utf8(path, &bytes, 0, skip_invalid_utf8)? {
            Some(text) if !text.is_empty() => documents.texts.push(text.to_owned()),
            Some(_) => {}
            None => documents.skipped_invalid_utf8 += 1,
        }
        Ok(documents)
    }
}

fn read_jsonl(
    path: &Path,
    bytes: &[u8],
    skip_invalid_utf8: bool,
) -> Result<FileDocuments, DataError> {
    let mut documents = FileDocuments::default();
    let mut line_start = 0usize;
    for (index, line) in bytes.split(|byte| *byte == b'\n').enumerate() {
        let offset = line_start as u64;
        line_start += line.len() + 1;
        let Some(line) = decode_utf8(path, line, offset, skip_invalid_utf8)? else {
            documents.skipped_invalid_utf8 += 1;
            continue;
        };
        if line.trim().is_empty() {
            continue;
        }
        let bad_line = |problem: String| DataError::BadJsonLine {
            path: path.to_path_buf(),
            line: index + 1,
            problem,
        };
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|error| bad_line(format!("bad JSON: {error}")))?;
        let text = value
            .get("text")
            .ok_or_else(|| bad_line("no field `text`".into()))?
            .as_str()
            .ok_or_else(|| bad_line("field `text` is not a string".into()))?;
        if !text.is_empty() {
            documents.texts.push(text.to_owned());
        }
    }
    Ok(documents)
}

/// `bytes` as text; `None` when they are not UTF-8 and skipping was asked, an error naming the
/// file offset (`offset` is where `bytes` start in the file) otherwise.
fn decode_utf8<'a>(
    path: &Path,
    bytes: &'a [u8],
    offset: u64,
    skip_invalid_utf8: bool,
) -> Result<Option<&'a str>, DataError> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(Some(text)),
        Err(_) if skip_invalid_utf8 => Ok(None),
        Err(error) => Err(DataError::InvalidUtf8 {
            path: path.to_path_buf(),
            offset: offset + error.valid_up_to() as u64,
        }),
    }
}
