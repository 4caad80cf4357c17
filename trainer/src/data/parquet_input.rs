//! Documents of a Parquet file: one string column, read row group by row group in batches of
//! rows, without Arrow.
//!
//! The column is the [`TextField`](super::text_field::TextField) (`text`, or a dotted path into
//! structs such as `meta.body`); it must be a string (`BYTE_ARRAY`) column that is not inside a
//! list. Only its pages are read, one at a time, so memory is bounded by a page and a batch of
//! rows, not by the file or the row group. Snappy, gzip, zstd and LZ4 pages are supported. Null
//! and empty values are left out.

use std::fs::File;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parquet::basic::Type as PhysicalType;
use parquet::column::reader::get_typed_column_reader;
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::reader::FileReader;
use parquet::file::serialized_reader::SerializedFileReader;

use super::documents::{Item, ReadOptions, decode_utf8};
use super::error::DataError;

/// Rows read from the column at a time.
const BATCH_ROWS: usize = 1024;

/// Calls `visit` with every item of the Parquet file `path` in row order (see
/// [`super::documents::for_each_item`]).
pub fn for_each_item(
    path: &Path,
    options: &ReadOptions,
    bytes_read: &Arc<AtomicU64>,
    mut visit: impl FnMut(Item) -> Result<ControlFlow<()>, DataError>,
) -> Result<ControlFlow<()>, DataError> {
    let bad = |row_group: Option<usize>, problem: String| DataError::BadParquet {
        path: path.to_path_buf(),
        row_group,
        problem,
    };
    let file = File::open(path).map_err(|error| DataError::io(path, error))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|error| bad(None, format!("cannot read the footer: {error}")))?;
    let metadata = reader.metadata();
    let schema = metadata.file_metadata().schema_descr();
    let field = &options.text_field;
    let Some(column) = (0..schema.num_columns())
        .find(|&index| schema.column(index).path().parts() == field.parts())
    else {
        let columns: Vec<String> = (0..schema.num_columns())
            .map(|index| schema.column(index).path().string())
            .collect();
        return Err(bad(
            None,
            format!("no column `{field}` (its columns: {columns:?}; choose one with --text-field)"),
        ));
    };
    let descriptor = schema.column(column);
    if descriptor.physical_type() != PhysicalType::BYTE_ARRAY {
        return Err(bad(
            None,
            format!(
                "column `{field}` holds {} values, not strings",
                descriptor.physical_type()
            ),
        ));
    }
    if descriptor.max_rep_level() > 0 {
        return Err(bad(
            None,
            format!("column `{field}` is inside a list: one string per row is needed"),
        ));
    }
    let max_def = descriptor.max_def_level();
    for group in 0..metadata.num_row_groups() {
        let group_error =
            |error: parquet::errors::ParquetError| bad(Some(group), error.to_string());
        let row_group = reader.get_row_group(group).map_err(group_error)?;
        let mut column_reader = get_typed_column_reader::<ByteArrayType>(
            row_group.get_column_reader(column).map_err(group_error)?,
        );
        let mut definitions: Vec<i16> = Vec::new();
        let mut values: Vec<ByteArray> = Vec::new();
        let mut row = 0usize;
        loop {
            definitions.clear();
            values.clear();
            let (rows, _, _) = column_reader
                .read_records(BATCH_ROWS, Some(&mut definitions), None, &mut values)
                .map_err(group_error)?;
            if rows == 0 {
                break;
            }
            let mut values = values.drain(..);
            for index in 0..rows {
                let present = max_def == 0 || definitions.get(index) == Some(&max_def);
                let this_row = row + index;
                if !present {
                    continue;
                }
                let value = values.next().ok_or_else(|| {
                    bad(
                        Some(group),
                        format!("row {this_row}: fewer values than rows"),
                    )
                })?;
                if value.is_empty() {
                    continue;
                }
                let location = format!("row group {group}, row {this_row}: ");
                let item = match decode_utf8(
                    path,
                    location,
                    value.data().to_vec(),
                    0,
                    options.skip_invalid_utf8,
                )? {
                    Some(text) => Item::Text(text),
                    None => Item::InvalidUtf8,
                };
                if visit(item)?.is_break() {
                    return Ok(ControlFlow::Break(()));
                }
            }
            row += rows;
        }
        let compressed = metadata.row_group(group).compressed_size().max(0) as u64;
        bytes_read.fetch_add(compressed, Ordering::Relaxed);
    }
    Ok(ControlFlow::Continue(()))
}
