//! Parquet files in the output's layout, and the helpers every stage that
//! reads or writes Parquet shares: the source reads inputs with them, the
//! sink writes the output, the checkpoint writes parts and indexes them, and
//! `inspect` checks outputs.
//!
//! - [`VectorFile`] writes rows of chunks and vectors to a file that appears
//!   whole or not at all.
//! - [`ParquetRows`] reads such a file back by content hash, for the
//!   [`Store`](crate::store::Store).
//! - [`open_reader`] and [`load_metadata`] open a file with its footer
//!   checked, [`guard`] turns a decoder panic on a damaged file into an
//!   error, and [`list_parquet_files`] lists a directory's files.

mod checksum;
mod rows;
mod writer;

use std::collections::BTreeMap;
use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use arrow::datatypes::{DataType, Schema};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};

use crate::fsio::FsError;

pub use self::checksum::Checksum;
pub use self::rows::ParquetRows;
pub use self::writer::{Compression, FileOptions, VectorFile, WrittenFile};

/// Stored rows read from a Parquet file fail as the file does.
impl From<FileError> for crate::store::StoreError {
    fn from(e: FileError) -> Self {
        crate::store::StoreError::Unreadable(Box::new(e))
    }
}

/// A Parquet file that cannot be read or written. Every variant names it.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: no such file or directory")]
    NotFound { path: PathBuf },
    #[error("{path}: not a readable Parquet file: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{path}: Parquet: {source}")]
    Parquet {
        path: PathBuf,
        #[source]
        source: ::parquet::errors::ParquetError,
    },
    #[error("{path}: Arrow: {source}")]
    Arrow {
        path: PathBuf,
        #[source]
        source: arrow::error::ArrowError,
    },
    #[error("{path}: cannot hold {dimensions}-dimensional vectors")]
    UnsupportedDimensions { path: PathBuf, dimensions: usize },
    #[error("{path}: a batch has {got}-dimensional vectors, the output holds {expected}")]
    Dimensions {
        path: PathBuf,
        expected: usize,
        got: usize,
    },
    #[error(
        "{path}: a batch has {chunks} chunks but {values} vector values \
         ({dimensions} per row)"
    )]
    RowCount {
        path: PathBuf,
        chunks: usize,
        values: usize,
        dimensions: usize,
    },
    #[error("{path}: chunk {id}: vector value {value} at position {position} is not finite")]
    NonFinite {
        path: PathBuf,
        id: String,
        position: usize,
        value: f32,
    },
    #[error("{path}: metadata: {message}")]
    Metadata { path: PathBuf, message: String },
}

impl FileError {
    /// A batch that does not fit the file at `path`.
    pub(crate) fn shape(path: &Path, error: crate::contract::ShapeError) -> FileError {
        use crate::contract::ShapeError;
        let path = path.to_path_buf();
        match error {
            ShapeError::Dimensions { expected, got } => FileError::Dimensions {
                path,
                expected,
                got,
            },
            ShapeError::RowCount {
                chunks,
                values,
                dimensions,
            } => FileError::RowCount {
                path,
                chunks,
                values,
                dimensions,
            },
            ShapeError::NonFinite {
                id,
                position,
                value,
            } => FileError::NonFinite {
                path,
                id,
                position,
                value,
            },
            ShapeError::Metadata { id, message } => FileError::Metadata {
                path,
                message: format!("chunk {id}: {message}"),
            },
        }
    }

    pub(crate) fn corrupt(path: &Path, message: impl std::fmt::Display) -> FileError {
        FileError::Corrupt {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }

    fn open(path: &Path, source: std::io::Error) -> FileError {
        if source.kind() == std::io::ErrorKind::NotFound {
            FileError::NotFound {
                path: path.to_path_buf(),
            }
        } else {
            FsError::Io {
                path: path.to_path_buf(),
                action: "cannot open",
                source,
            }
            .into()
        }
    }
}

/// Opens a Parquet file for reading, with the footer checked so that the
/// decoder cannot panic or overflow on it.
pub fn open_reader(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>, FileError> {
    let file = File::open(path).map_err(|e| FileError::open(path, e))?;
    let file_len = file
        .metadata()
        .map_err(FsError::io(path, "cannot read"))?
        .len();
    let builder = guard(path, || ParquetRecordBatchReaderBuilder::try_new(file))?
        .map_err(|e| FileError::corrupt(path, e))?;
    check_layout(path, builder.metadata(), file_len)?;
    Ok(builder)
}

/// Reads a file's footer, with the page index when it has one, checked as
/// [`open_reader`] checks it.
pub fn load_metadata(path: &Path) -> Result<ArrowReaderMetadata, FileError> {
    let file = File::open(path).map_err(|e| FileError::open(path, e))?;
    let file_len = file
        .metadata()
        .map_err(FsError::io(path, "cannot read"))?
        .len();
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
    let metadata = guard(path, || ArrowReaderMetadata::load(&file, options))?
        .map_err(|e| FileError::corrupt(path, e))?;
    check_layout(path, metadata.metadata(), file_len)?;
    Ok(metadata)
}

/// Checks the footer's row counts and column chunk ranges, which the decoder
/// trusts: a negative or out-of-file value there makes it panic or overflow
/// instead of returning an error.
fn check_layout(path: &Path, metadata: &ParquetMetaData, file_len: u64) -> Result<(), FileError> {
    let mut rows: u64 = 0;
    for (group_index, group) in metadata.row_groups().iter().enumerate() {
        let bad =
            |what: String| FileError::corrupt(path, format!("row group {group_index}: {what}"));
        let group_rows = u64::try_from(group.num_rows())
            .map_err(|_| bad(format!("row count {} is negative", group.num_rows())))?;
        rows = rows
            .checked_add(group_rows)
            .filter(|&total| usize::try_from(total).is_ok())
            .ok_or_else(|| bad("row counts overflow".to_string()))?;
        for column in group.columns() {
            let start = column
                .dictionary_page_offset()
                .unwrap_or_else(|| column.data_page_offset());
            let len = column.compressed_size();
            let in_file = u64::try_from(start)
                .ok()
                .zip(u64::try_from(len).ok())
                .and_then(|(start, len)| start.checked_add(len))
                .is_some_and(|end| end <= file_len);
            if !in_file {
                return Err(bad(format!(
                    "column {}: bytes {start}..{start}+{len} lie outside the file ({file_len} bytes)",
                    column.column_path()
                )));
            }
        }
    }
    Ok(())
}

/// Runs a step of the Parquet decoder, turning a panic on malformed input
/// into an error that names the file. The decoder validates most input, but
/// a damaged file must never take the whole job down without saying which.
pub fn guard<T>(path: &Path, step: impl FnOnce() -> T) -> Result<T, FileError> {
    catch_decoder_panic(step).map_err(|detail| FileError::corrupt(path, detail))
}

/// Runs a step of the Parquet decoder; a panic becomes `malformed data (…)`.
pub fn catch_decoder_panic<T>(step: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(step)).map_err(|panic| {
        let detail = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "the decoder failed".to_string());
        format!("malformed data ({detail})")
    })
}

/// A Parquet file's key-value metadata; a key without a value maps to `""`.
pub fn key_values(metadata: &ParquetMetaData) -> BTreeMap<String, String> {
    metadata
        .file_metadata()
        .key_value_metadata()
        .into_iter()
        .flatten()
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
        .collect()
}

/// The key-value metadata of a Parquet file, as readers such as pyarrow's
/// `pq.read_metadata(path).metadata` show it. This includes `ARROW:schema`,
/// the Arrow schema the writer stored. A key without a value maps to `""`.
pub fn read_key_values(path: &Path) -> Result<BTreeMap<String, String>, FileError> {
    let file = File::open(path).map_err(FsError::io(path, "cannot open"))?;
    let reader = guard(path, || {
        parquet::file::reader::SerializedFileReader::new(file)
    })?
    .map_err(|source| FileError::Parquet {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(key_values(parquet::file::reader::FileReader::metadata(
        &reader,
    )))
}

/// The `*.parquet` files of a directory (any case of the extension), in
/// name order.
pub fn list_parquet_files(dir: &Path) -> Result<Vec<PathBuf>, FileError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| FileError::open(dir, e))? {
        let file = entry
            .map_err(|e| FileError::from(FsError::io(dir, "cannot list")(e)))?
            .path();
        let parquet = file
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
        if parquet && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// The length of the vectors of a file in the output's layout: its
/// `embedding` column must be a fixed-size list of float32.
pub fn embedding_dimensions(schema: &Schema) -> Result<usize, String> {
    let field = schema
        .field_with_name("embedding")
        .map_err(|_| "no column \"embedding\"".to_string())?;
    match field.data_type() {
        DataType::FixedSizeList(item, size)
            if item.data_type() == &DataType::Float32 && *size > 0 =>
        {
            usize::try_from(*size).map_err(|e| e.to_string())
        }
        other => Err(format!(
            "\"embedding\" is {other}, not a fixed-size list of float32"
        )),
    }
}
