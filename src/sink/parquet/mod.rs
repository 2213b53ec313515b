//! The Parquet sink: the output is one file, written whole by each run
//! under a temporary name and renamed into place when complete. The previous
//! output is what the sink holds for reuse. A shard's file is written even
//! when the shard has no rows, so that the directory of shards is whole.

mod config;

pub use self::config::{Kind, ParquetOutput};

use std::path::PathBuf;
use std::sync::Arc;

use super::{Sink, SinkError, SinkReport};
use crate::job::Shard;
use crate::parquet_io::{Compression, FileOptions, ParquetRows, VectorFile};
use crate::store::StoredRows;
use crate::types::{EmbeddedBatch, MetadataSchema, OutputMetadata};

/// Writes a job's rows to `output.path`.
///
/// The file is created with the first batch, which sets the vector length
/// and the metadata columns; a run that writes nothing leaves the previous
/// output as it was.
pub struct ParquetSink {
    path: PathBuf,
    options: FileOptions,
    file: Option<VectorFile>,
    /// Write a file with no rows when the run has none (a shard's).
    always: bool,
    /// The input's metadata columns, for that file.
    columns: Option<Arc<MetadataSchema>>,
}

impl ParquetSink {
    pub fn new(params: &ParquetOutput, shard: Option<Shard>) -> ParquetSink {
        ParquetSink {
            always: shard.is_some(),
            columns: None,
            path: params.path.clone(),
            options: FileOptions {
                include_text: params.include_text,
                row_group_bytes: params.row_group_bytes,
                compression: Compression::Zstd,
            },
            file: None,
        }
    }
}

impl Sink for ParquetSink {
    fn target(&self) -> String {
        self.path.display().to_string()
    }

    fn held(&self) -> Result<Option<Box<dyn StoredRows>>, SinkError> {
        if !self.path.exists() {
            return Ok(None);
        }
        Ok(Some(Box::new(ParquetRows::open(&self.path)?)))
    }

    fn write(&mut self, batch: &EmbeddedBatch) -> Result<(), SinkError> {
        let file = match &mut self.file {
            Some(file) => file,
            // The first batch sets the vector length and the metadata columns.
            None => self.file.insert(VectorFile::create_with_metadata(
                &self.path,
                batch.vectors.dimensions,
                self.options,
                batch.metadata_schema(),
            )?),
        };
        Ok(file.write(batch)?)
    }

    fn columns(&mut self, schema: Arc<MetadataSchema>) {
        self.columns = Some(schema);
    }

    /// The file is written whole: rows not written are not in it.
    fn remove(&mut self, _ids: &[String]) -> Result<(), SinkError> {
        Ok(())
    }

    fn finish(self: Box<Self>, metadata: &OutputMetadata) -> Result<SinkReport, SinkError> {
        let file = match self.file {
            Some(file) => file,
            None if self.always => {
                // No rows: vectors of the model's length, or of the file this one replaces.
                let dimensions = match metadata.dimensions {
                    0 => self.held()?.map_or(0, |rows| rows.dimensions()),
                    d => d,
                };
                if dimensions == 0 {
                    return Ok(SinkReport {
                        rows: 0,
                        warnings: vec![format!(
                            "{}: not written: this shard has no rows, and the model's vector \
                             length is not known to write an empty file with",
                            self.path.display()
                        )],
                    });
                }
                VectorFile::create_with_metadata(
                    &self.path,
                    dimensions,
                    self.options,
                    self.columns.clone(),
                )?
            }
            None => return Ok(SinkReport::default()),
        };
        Ok(SinkReport {
            rows: file.finish(metadata)?.rows,
            warnings: Vec::new(),
        })
    }

    fn abort(self: Box<Self>) {
        if let Some(file) = self.file {
            file.abort();
        }
    }
}
