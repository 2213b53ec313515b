//! Sinks: where validated vectors go, behind one trait.
//!
//! [`open`] builds the sink a job's `[output]` names; the pipeline sees only
//! a `Box<dyn Sink>`. A sink writes the run's rows and makes them appear on
//! [`Sink::finish`], and answers "which content hashes do you already
//! hold?" ([`Sink::held`]) so that a run reuses vectors instead of paying
//! for them again. A new kind of sink is a folder here (its parameters and
//! its [`SinkKind`]) and one line in [`KINDS`].

pub mod parquet;
#[cfg(feature = "pgvector")]
pub mod pgvector;
/// Without the database client, pgvector's parameters are still read, so
/// that a job naming it is told why it cannot run.
#[cfg(not(feature = "pgvector"))]
pub mod pgvector {
    mod config;
    pub use self::config::{
        Kind, PgvectorOutput, VectorIndex, HNSW_MAX_DIMENSIONS, METADATA_TABLE_SUFFIX,
    };
}

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::exit::Failure;
use crate::job::{OutputConfig, OutputParams, Shard};
use crate::parquet_io::FileError;
use crate::query::{Found, QueryError};
use crate::store::{StoreError, StoredRows};
use crate::types::{EmbeddedBatch, MetadataSchema, OutputMetadata};

pub use self::parquet::ParquetSink;
#[cfg(feature = "pgvector")]
pub use self::pgvector::{PgError, PgvectorSink};

/// Every kind of sink, one line each, in the order messages list them.
const KINDS: &[&dyn SinkKind] = &[&parquet::Kind, &pgvector::Kind];

/// A kind of sink: its parameters (read as a [`crate::job::Kind`]), its
/// checks before work, how it opens and how its output is searched.
pub trait SinkKind: crate::job::Kind<dyn OutputParams> {
    /// Builds the sink. A sink in a database connects here, so that a wrong
    /// address or password is found before any work. With a `shard`, the
    /// sink holds and writes that shard's rows only.
    fn open<'a>(
        &'a self,
        params: &'a dyn OutputParams,
        shard: Option<Shard>,
    ) -> BoxFuture<'a, Result<Box<dyn Sink>, SinkError>>;

    /// Refuses, before any work, vectors of `dimensions` made by `model`
    /// that the output could not hold.
    fn check(
        &self,
        _params: &dyn OutputParams,
        _dimensions: Option<usize>,
        _model: &str,
    ) -> Result<(), SinkError> {
        Ok(())
    }

    /// The `embedjob.*` keys the output's last finished run recorded, for
    /// `shard`'s part: a file's footer here; empty when there is no output yet.
    fn recorded<'a>(
        &'a self,
        params: &'a dyn OutputParams,
        _shard: Option<Shard>,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, SinkError>> {
        Box::pin(async move {
            match params.output_file().filter(|file| file.exists()) {
                Some(file) => Ok(crate::parquet_io::read_key_values(file)?),
                None => Ok(BTreeMap::new()),
            }
        })
    }

    /// The `k` rows of the output nearest to `vector`, after checking that
    /// `model` made them (`query`).
    fn search<'a>(
        &'a self,
        params: &'a dyn OutputParams,
        vector: Vec<f32>,
        model: &'a str,
        k: usize,
    ) -> BoxFuture<'a, Result<Found, Failure>>;
}

/// The sink kinds, for reading a job file.
pub fn kinds() -> Vec<&'static dyn crate::job::Kind<dyn OutputParams>> {
    // Each kind, seen as the job file's reader of its section.
    let mut all: Vec<&'static dyn crate::job::Kind<dyn OutputParams>> = Vec::new();
    for &kind in KINDS {
        all.push(kind);
    }
    all
}

/// The kind that reads `output`.
fn kind_of(output: &OutputConfig) -> Result<&'static dyn SinkKind, SinkError> {
    KINDS
        .iter()
        .copied()
        .find(|kind| kind.name() == output.kind())
        .ok_or(SinkError::Kind(output.kind()))
}

/// `params` as the kind's own type.
pub(crate) fn params_of<T: 'static>(params: &dyn OutputParams) -> Result<&T, SinkError> {
    params
        .as_any()
        .downcast_ref()
        .ok_or(SinkError::Kind(params.kind()))
}

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

    /// The job writing, and whether it replaces what another job left
    /// (`--fresh`): told before [`Sink::held`].
    fn job(&mut self, _name: &str, _fresh: bool) {}

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
    /// The output cannot take what the job would write.
    #[error("{0}")]
    Refused(String),
    #[error("`output.kind = \"{0}\"`: parameters this sink cannot read")]
    Kind(&'static str),
}

impl SinkError {
    /// A problem of configuration (a refused password, a missing extension,
    /// a table that is not embedjob's), found before any work starts.
    pub fn is_found_before_work(&self) -> bool {
        match self {
            #[cfg(feature = "pgvector")]
            SinkError::Pgvector(e) => e.is_found_before_work(),
            SinkError::NotBuilt(_) | SinkError::Refused(_) | SinkError::Kind(_) => true,
            _ => false,
        }
    }
}

/// Builds the sink a job's `[output]` names (see [`SinkKind::open`]).
pub async fn open(output: &OutputConfig, shard: Option<Shard>) -> Result<Box<dyn Sink>, SinkError> {
    kind_of(output)?.open(output.params.as_ref(), shard).await
}

/// Refuses, before any work, an output that cannot hold vectors of
/// `dimensions` made by `model` (see [`SinkKind::check`]).
pub fn check(
    output: &OutputConfig,
    dimensions: Option<usize>,
    model: &str,
) -> Result<(), SinkError> {
    kind_of(output)?.check(output.params.as_ref(), dimensions, model)
}

/// The `embedjob.*` keys the output's last finished run recorded (see
/// [`SinkKind::recorded`]).
pub async fn recorded(
    output: &OutputConfig,
    shard: Option<Shard>,
) -> Result<BTreeMap<String, String>, SinkError> {
    kind_of(output)?
        .recorded(output.params.as_ref(), shard)
        .await
}

/// The `k` rows of the output nearest to `vector` (see [`SinkKind::search`]).
pub async fn search(
    output: &OutputConfig,
    vector: Vec<f32>,
    model: &str,
    k: usize,
) -> Result<Found, Failure> {
    crate::query::check_query(&vector, model).map_err(query_failure)?;
    let kind = kind_of(output).map_err(failure)?;
    kind.search(output.params.as_ref(), vector, model, k).await
}

/// A sink that cannot be opened: a problem of configuration (exit 2), or a
/// database that cannot be reached (exit 1).
pub fn failure(e: SinkError) -> Failure {
    Failure::found(e.is_found_before_work(), e)
}

/// A search refused before any work (exit 2), or failed (exit 1).
pub(crate) fn query_failure(e: QueryError) -> Failure {
    Failure::found(e.is_found_before_work(), e)
}
