//! Columnar corpus files (feature `parquet`): Parquet, read a record batch at a
//! time with a projection of the one text column (arrow-rs's `parquet`), and Arrow
//! IPC, stream or file (`arrow-ipc`; `datasets`' `save_to_disk` writes the stream
//! format). A text column is a string, large string, string view or dictionary of
//! one of those; a null is `None`.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Schema};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use super::lines::{data_error, failed};
use super::BatchReader;
use crate::error::{DataError, Error, FileOp, Result};

/// Rows per record batch read from a Parquet file.
const BATCH_ROWS: usize = 1024;

/// The formats, as an error about a damaged file calls them.
const PARQUET: &str = "Parquet file";
const ARROW: &str = "Arrow IPC file or stream";

/// The index of the text column `column` in `schema`, checked to hold text; an
/// error naming the file and the column (and the columns it has) otherwise.
fn text_column(path: &Path, schema: &Schema, column: &str) -> Result<usize> {
    let Some((index, field)) = schema.column_with_name(column) else {
        let columns: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        return Err(Error::Data(DataError::CorpusColumnMissing {
            path: path.to_path_buf(),
            column: column.into(),
            columns: columns.join(", "),
        }));
    };
    if !is_text(field.data_type()) {
        return Err(Error::Data(DataError::CorpusColumnNotText {
            path: path.to_path_buf(),
            column: column.into(),
            data_type: field.data_type().to_string(),
        }));
    }
    Ok(index)
}

fn is_text(data_type: &DataType) -> bool {
    match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(_, values) => is_text(values),
        _ => false,
    }
}

/// The texts of a text column, `None` for nulls; an error for a column that is
/// not text after all (a batch whose type differs from the schema's).
fn texts(path: &Path, array: &ArrayRef) -> Result<Vec<Option<String>>> {
    let own = |s: Option<&str>| s.map(str::to_string);
    if let Some(strings) = array.as_string_opt::<i32>() {
        Ok(strings.iter().map(own).collect())
    } else if let Some(strings) = array.as_string_opt::<i64>() {
        Ok(strings.iter().map(own).collect())
    } else if let Some(strings) = array.as_string_view_opt() {
        Ok(strings.iter().map(own).collect())
    } else if let Some(dictionary) = array.as_any_dictionary_opt() {
        let values = texts(path, dictionary.values())?;
        let keys = dictionary.normalized_keys();
        Ok((0..array.len())
            .map(|i| match array.is_null(i) {
                true => None,
                false => values.get(keys[i]).cloned().flatten(),
            })
            .collect())
    } else {
        Err(data_error(
            path,
            format!("a batch's text column is {}, not text", array.data_type()),
        ))
    }
}

/// A Parquet file's text column, a record batch at a time.
pub(crate) struct ParquetReader {
    path: PathBuf,
    batches: ParquetRecordBatchReader,
    /// Rows in each row group, to name the one a damaged batch lies in.
    row_groups: Vec<i64>,
    rows_read: i64,
}

impl ParquetReader {
    /// Opens `path` (its footer and schema: a damaged footer, a missing or
    /// non-text column are errors here, before any row is read).
    pub(crate) fn open(path: &Path, column: &str) -> Result<Self> {
        unless_panicked(path, PARQUET, || Self::open_unguarded(path, column))
    }

    fn open_unguarded(path: &Path, column: &str) -> Result<Self> {
        let file = File::open(path).map_err(Error::io(FileOp::Read, path))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| failed(path, "is not a readable Parquet file", e))?;
        let index = text_column(path, builder.schema(), column)?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
        let row_groups = builder
            .metadata()
            .row_groups()
            .iter()
            .map(|group| group.num_rows())
            .collect();
        let batches = builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| failed(path, "cannot read its text column", e))?;
        Ok(Self {
            path: path.to_path_buf(),
            batches,
            row_groups,
            rows_read: 0,
        })
    }

    /// The row group row `row` lies in.
    fn row_group_of(&self, row: i64) -> usize {
        let mut end = 0;
        for (i, rows) in self.row_groups.iter().enumerate() {
            end += rows;
            if row < end {
                return i;
            }
        }
        self.row_groups.len().saturating_sub(1)
    }
}

impl BatchReader for ParquetReader {
    fn next_batch(&mut self) -> Result<Option<Vec<Option<String>>>> {
        let path = self.path.clone();
        unless_panicked(&path, PARQUET, || match self.batches.next() {
            None => Ok(None),
            Some(Err(e)) => {
                let group = self.row_group_of(self.rows_read);
                Err(failed(
                    &self.path,
                    format!("row group {group} cannot be read"),
                    e,
                ))
            }
            Some(Ok(batch)) => {
                self.rows_read += batch.num_rows() as i64;
                texts(&self.path, batch.column(0)).map(Some)
            }
        })
    }
}

/// An Arrow IPC file or stream's text column, a record batch at a time.
pub(crate) struct ArrowReader {
    path: PathBuf,
    batches:
        Box<dyn Iterator<Item = std::result::Result<RecordBatch, arrow_schema::ArrowError>> + Send>,
    batch: usize,
}

/// The Arrow IPC file format's leading magic; without it, the stream format.
const FILE_MAGIC: &[u8; 6] = b"ARROW1";

/// `read` (the parquet or arrow-ipc crate decoding the file `path`, a `kind`), a
/// panic refused as an error naming the file: both crates (60) panic on some
/// damaged files instead of returning an error (a buffer sliced past the end of
/// its body, an overflowing sum of definition levels: found by the corpus tests'
/// `a_damaged_*` properties).
fn unless_panicked<T>(path: &Path, kind: &str, read: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(data_error(
            path,
            format!("is a damaged {kind} (its reader panicked: {why})"),
        ))
    })
}

impl ArrowReader {
    /// Opens `path` (its schema: damaged, a missing or non-text column are
    /// errors here), projected to the text column.
    pub(crate) fn open(path: &Path, column: &str) -> Result<Self> {
        unless_panicked(path, ARROW, || Self::open_unguarded(path, column))
    }

    fn open_unguarded(path: &Path, column: &str) -> Result<Self> {
        use arrow_ipc::reader::{FileReader, StreamReader};
        use std::io::Read;
        let open = || File::open(path).map_err(Error::io(FileOp::Read, path));
        let mut magic = [0u8; 6];
        let is_file = open()?.read_exact(&mut magic).is_ok() && &magic == FILE_MAGIC;
        let unreadable = |e| failed(path, "is not a readable Arrow IPC file or stream", e);
        // The schema first, to find the column; then the file again, projected.
        let batches: Box<dyn Iterator<Item = _> + Send> = if is_file {
            let schema = FileReader::try_new_buffered(open()?, None)
                .map_err(unreadable)?
                .schema();
            let index = text_column(path, &schema, column)?;
            Box::new(FileReader::try_new_buffered(open()?, Some(vec![index])).map_err(unreadable)?)
        } else {
            let schema = StreamReader::try_new_buffered(open()?, None)
                .map_err(unreadable)?
                .schema();
            let index = text_column(path, &schema, column)?;
            Box::new(
                StreamReader::try_new_buffered(open()?, Some(vec![index])).map_err(unreadable)?,
            )
        };
        Ok(Self {
            path: path.to_path_buf(),
            batches,
            batch: 0,
        })
    }
}

impl BatchReader for ArrowReader {
    fn next_batch(&mut self) -> Result<Option<Vec<Option<String>>>> {
        let path = self.path.clone();
        unless_panicked(&path, ARROW, || match self.batches.next() {
            None => Ok(None),
            Some(Err(e)) => Err(failed(
                &self.path,
                format!("record batch {} cannot be read", self.batch),
                e,
            )),
            Some(Ok(batch)) => {
                self.batch += 1;
                texts(&self.path, batch.column(0)).map(Some)
            }
        })
    }
}
