//! Sinks: where validated vectors go, behind one trait.
//!
//! [`open`] builds the sink a job's `[output]` names; the pipeline sees only
//! a `Box<dyn Sink>`. A sink writes the run's rows and makes them appear on
//! [`Sink::finish`], and answers "which content hashes do you already
//! hold?" ([`Sink::held`]) so that a run reuses vectors instead of paying
//! for them again. A new kind of sink is a new file here and one line in
//! [`open`].

mod parquet;
#[cfg(feature = "pgvector")]
pub mod pgvector;

use crate::job::{OutputConfig, OutputParams, Shard};
use crate::parquet_io::FileError;
use crate::store::{StoreError, StoredRows};
use std::sync::Arc;

use crate::types::{EmbeddedBatch, MetadataSchema, OutputMetadata};

pub use self::parquet::ParquetSink;
#[cfg(feature = "pgvector")]
pub use self::pgvector::{PgError, PgvectorSink};

/// Where embedded batches are written.
///
/// Writing blocks, so the pipeline drives a sink from a blocking thread, not
/// from the async runtime. What a run writes appears only on
/// [`Sink::finish`]; [`Sink::abort`], or dropping the sink, leaves what the
/// sink held before untouched.
pub trait Sink: Send {
    /// The output, for messages and the summary: a path, or a table.
    fn target(&self) -> String;

    /// The rows an earlier finished run left in this sink, offered for
    /// reuse; `None` when there are none.
    fn held(&self) -> Result<Option<Box<dyn StoredRows>>, SinkError>;

    /// Whether the sink keeps its rows from one run to the next (a table)
    /// rather than writing its output whole each run (a file). A sink that
    /// keeps rows is not sent the rows it holds unchanged, and is told which
    /// rows to [`Sink::remove`].
    fn keeps_rows(&self) -> bool {
        false
    }

    /// Buffers or writes one batch. A batch that does not fit the output
    /// (vector length, row count, non-finite values) is rejected whole.
    fn write(&mut self, batch: &EmbeddedBatch) -> Result<(), SinkError>;

    /// The input's metadata columns, told before any batch, for an output
    /// written with no rows (a shard without documents).
    fn columns(&mut self, _schema: Arc<MetadataSchema>) {}

    /// Removes the rows with these ids: the chunks of documents that changed
    /// or are gone. Takes effect on [`Sink::finish`].
    fn remove(&mut self, ids: &[String]) -> Result<(), SinkError>;

    /// Writes what is buffered and the run's metadata, and makes the
    /// output appear.
    fn finish(self: Box<Self>, metadata: &OutputMetadata) -> Result<SinkReport, SinkError>;

    /// Drops what this run wrote.
    fn abort(self: Box<Self>);
}

/// What a finished sink holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SinkReport {
    /// Rows written by this run.
    pub rows: u64,
    /// What finishing found worth a warning, for the command to print.
    pub warnings: Vec<String>,
}

/// A problem writing to or reading from a sink. Every variant names it.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[cfg(feature = "pgvector")]
    #[error(transparent)]
    Pgvector(#[from] PgError),
    #[error("`output.kind = \"{0}\"`: this embedjob was built without it (cargo feature `{0}`)")]
    NotBuilt(&'static str),
}

impl SinkError {
    /// A problem of configuration (a refused password, a missing extension,
    /// a table that is not embedjob's), found before any work starts.
    pub fn is_found_before_work(&self) -> bool {
        match self {
            #[cfg(feature = "pgvector")]
            SinkError::Pgvector(e) => e.is_found_before_work(),
            SinkError::NotBuilt(_) => true,
            _ => false,
        }
    }
}

/// Builds the sink a job's `[output]` names. A sink in a database connects
/// here, so that a wrong address or password is found before any work.
/// With a `shard`, the sink holds and writes that shard's rows only.
pub async fn open(output: &OutputConfig, shard: Option<Shard>) -> Result<Box<dyn Sink>, SinkError> {
    match &output.params {
        OutputParams::Parquet(params) => Ok(Box::new(ParquetSink::new(params, shard))),
        #[cfg(feature = "pgvector")]
        OutputParams::Pgvector(params) => Ok(Box::new(PgvectorSink::open(params, shard).await?)),
        #[cfg(not(feature = "pgvector"))]
        OutputParams::Pgvector(_) => {
            let _ = shard;
            Err(SinkError::NotBuilt("pgvector"))
        }
    }
}
