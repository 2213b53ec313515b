//! Sinks: where validated vectors go.
//!
//! Every file written here is complete or absent: it is written under a
//! temporary name in the same directory, fsynced and renamed into place.
//! Next to the output `out/docs.parquet` live `out/docs.parquet.failures.jsonl`
//! (quarantined chunks, only when there were some) and
//! `out/docs.parquet.summary.json` (the run summary).

mod atomic;
mod failures;
mod parquet;
mod summary;
#[cfg(test)]
mod testing;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::chunk::Chunk;
use crate::client::Usage;
use crate::validate::Vectors;

pub(crate) use self::atomic::{parent_dir, with_suffix};
pub use self::failures::{failures_path, FailuresFile, FailuresReport};
pub use self::parquet::{output_schema, ParquetSink, SCHEMA_VERSION};
pub use self::summary::{summary_path, write_json_atomically};

/// Chunks with the vectors that passed validation, row for row.
#[derive(Debug, Clone)]
pub struct EmbeddedBatch {
    pub chunks: Vec<Chunk>,
    pub vectors: Vectors,
}

/// Where embedded batches are written.
///
/// Writing blocks, so the pipeline drives a sink from a blocking thread, not
/// from the async runtime. A sink's output appears only on [`Sink::finish`];
/// [`Sink::abort`], or dropping the sink, leaves any earlier output untouched.
pub trait Sink: Send {
    /// Buffers or writes one batch. A batch that does not fit the output
    /// (vector length, row count, non-finite values) is rejected whole.
    fn write(&mut self, batch: &EmbeddedBatch) -> Result<(), SinkError>;

    /// Writes what is buffered and the run's metadata, and moves the output
    /// into place.
    fn finish(self: Box<Self>, metadata: &OutputMetadata) -> Result<SinkReport, SinkError>;

    /// Drops the partial output.
    fn abort(self: Box<Self>);
}

/// What the output's metadata records about the run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OutputMetadata {
    pub model: String,
    pub dimensions: usize,
    /// `api` or `local`.
    pub backend: String,
    pub usage: Usage,
    /// Embedding requests that succeeded.
    pub requests: u64,
    /// Only when the model's pricing is known.
    pub cost: Option<f64>,
    /// Further keys, written as given; they may not repeat a key above.
    pub extra: BTreeMap<String, String>,
}

/// What a finished sink wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkReport {
    pub rows: u64,
    pub row_groups: u64,
    /// The size of the output file.
    pub bytes: u64,
    pub path: PathBuf,
}

/// A problem writing or reading an output file. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("{path}: {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
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
    #[error("{path}: JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: not a file path")]
    InvalidPath { path: PathBuf },
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

/// The key-value metadata of a Parquet file, as readers such as pyarrow's
/// `pq.read_metadata(path).metadata` show it. This includes `ARROW:schema`,
/// the Arrow schema the writer stored. A key without a value maps to `""`.
pub fn read_metadata(path: &Path) -> Result<BTreeMap<String, String>, SinkError> {
    let file = File::open(path).map_err(|source| SinkError::Io {
        path: path.to_path_buf(),
        action: "cannot open",
        source,
    })?;
    let reader = ::parquet::file::reader::SerializedFileReader::new(file).map_err(|source| {
        SinkError::Parquet {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(key_values(::parquet::file::reader::FileReader::metadata(
        &reader,
    )))
}

/// A Parquet file's key-value metadata; a key without a value maps to `""`.
pub fn key_values(
    metadata: &::parquet::file::metadata::ParquetMetaData,
) -> BTreeMap<String, String> {
    metadata
        .file_metadata()
        .key_value_metadata()
        .into_iter()
        .flatten()
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
        .collect()
}
