//! Sources: where documents come from. Each kind streams documents one at a
//! time, so memory is bounded by a document (or a Parquet record batch), not
//! by the input.

use std::path::PathBuf;
use std::sync::Arc;

/// One document to chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// A file's path relative to its root, or the record's id (or row number).
    pub doc_id: String,
    /// The input file, as the job names it.
    pub source: Arc<str>,
    pub text: String,
}

/// What a source read and what it passed over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceStats {
    pub documents: u64,
    pub skipped_null: u64,
    pub skipped_empty: u64,
}

/// A problem with the input. Every variant names the file, and the row or
/// column where there is one.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{path}: cannot read: {error}")]
    Io {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("{pattern}: no input files match")]
    NoMatch { pattern: String },
    #[error("{path}: not valid UTF-8 (first bad byte at offset {offset})")]
    Utf8 { path: PathBuf, offset: u64 },
    #[error("{path}: row {row}: {message}")]
    Row {
        path: PathBuf,
        row: u64,
        message: String,
    },
    #[error("{path}: column {column:?}: {message}")]
    Column {
        path: PathBuf,
        column: String,
        message: String,
    },
    #[error("{path}: not a readable Parquet file: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("duplicate document id {id:?}: in {first} and again in {second}")]
    DuplicateId {
        id: String,
        first: String,
        second: String,
    },
    #[error("the input has no documents with text")]
    Empty,
}

impl SourceError {
    /// Problems found when opening the input, before any work starts: a
    /// missing file or column, a glob that matches nothing. The rest come up
    /// while reading.
    pub fn is_found_at_open(&self) -> bool {
        matches!(
            self,
            SourceError::NoMatch { .. } | SourceError::Column { .. }
        )
    }
}

/// A stream of documents. Reading blocks, so sources run off the async runtime.
pub trait Source: Send {
    /// The next document with text, or `None` at the end. Null and empty
    /// texts are skipped and counted, not returned.
    fn next_document(&mut self) -> Result<Option<Document>, SourceError>;
    fn stats(&self) -> SourceStats;
}
