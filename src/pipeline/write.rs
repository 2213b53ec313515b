//! The writing stage, on a blocking thread: commits every vector paid for to
//! the checkpoint, writes the run's rows to the sink and quarantined chunks
//! to the failures file, and at the end gives repeated chunks the vector of
//! their first copy.

use std::collections::HashMap;

use tokio::sync::mpsc;

use super::RunError;
use crate::parquet_io::ParquetRows;
use crate::sink::Sink;
use crate::state::{Billed, FailuresFile, PartWriter};
use crate::store::{hash_key, Location, Origin, Store};
use crate::types::{Chunk, EmbeddedBatch, OutputMetadata, Usage, Vectors};

/// Repeats of chunks sent in this run are read back this many at a time.
const REUSE_BATCH: usize = 256;

pub(super) enum SinkMessage {
    /// Vectors paid for by this run.
    Embedded(EmbeddedBatch),
    /// Vectors read back from the store.
    Reused(EmbeddedBatch),
    /// A chunk whose text was sent with another chunk of this run.
    Duplicate(Chunk),
    Quarantine {
        chunk: Chunk,
        reason: String,
        status: Option<u16>,
    },
    /// Rows the sink held whose ids no chunk of this run has.
    Remove(Vec<String>),
    /// Billing no vector carries, for the checkpoint.
    Billed(Billed),
    Finish(OutputMetadata),
    /// Commit what was paid for and leave the sink as it was.
    Stop,
}

/// What the writing stage wrote.
#[derive(Debug, Default)]
pub(super) struct Written {
    /// Rows the sink wrote; `None` when the run stopped before finishing.
    pub rows: Option<u64>,
    pub dimensions: Option<usize>,
    pub quarantined: u64,
}

pub(super) struct Writing {
    pub sink: Box<dyn Sink>,
    pub parts: PartWriter,
    pub failures: FailuresFile,
    /// The vector length of the rows written so far.
    pub dimensions: Option<usize>,
    pub quarantined: u64,
    /// Reasons for quarantined chunks, by content hash, for their repeats.
    pub quarantine_reasons: HashMap<u128, (String, Option<u16>)>,
    pub duplicates: Vec<Chunk>,
}

impl Writing {
    pub(super) fn new(sink: Box<dyn Sink>, parts: PartWriter, failures: FailuresFile) -> Self {
        Writing {
            sink,
            parts,
            failures,
            dimensions: None,
            quarantined: 0,
            quarantine_reasons: HashMap::new(),
            duplicates: Vec::new(),
        }
    }

    /// Runs on a blocking thread. Whatever happens, vectors paid for are
    /// committed to the checkpoint before it returns.
    pub(super) fn run(mut self, mut rx: mpsc::Receiver<SinkMessage>) -> Result<Written, RunError> {
        let result = self.receive(&mut rx);
        let committed = self.parts.commit();
        match result {
            Ok(Some(metadata)) => {
                committed?;
                self.finish(metadata)
            }
            Ok(None) => {
                self.abort();
                committed?;
                Ok(Written::default())
            }
            Err(e) => {
                self.abort();
                Err(e)
            }
        }
    }

    /// Handles messages until `Finish` (its metadata returned) or `Stop`.
    fn receive(
        &mut self,
        rx: &mut mpsc::Receiver<SinkMessage>,
    ) -> Result<Option<OutputMetadata>, RunError> {
        loop {
            let message = match rx.try_recv() {
                Ok(message) => message,
                Err(mpsc::error::TryRecvError::Empty) => {
                    // Nothing else at hand: make what arrived durable before waiting.
                    self.parts.commit()?;
                    match rx.blocking_recv() {
                        Some(message) => message,
                        None => return Ok(None),
                    }
                }
                Err(mpsc::error::TryRecvError::Disconnected) => return Ok(None),
            };
            match message {
                SinkMessage::Embedded(batch) => {
                    self.parts.append(&batch)?;
                    self.write(&batch)?;
                }
                SinkMessage::Reused(batch) => self.write(&batch)?,
                SinkMessage::Duplicate(chunk) => self.duplicates.push(chunk),
                SinkMessage::Quarantine {
                    chunk,
                    reason,
                    status,
                } => {
                    self.quarantine(&chunk, &reason, status)?;
                    self.quarantine_reasons
                        .insert(hash_key(&chunk.content_hash), (reason, status));
                }
                SinkMessage::Remove(ids) => self.sink.remove(&ids)?,
                SinkMessage::Billed(billed) => self.parts.add_billed(billed)?,
                SinkMessage::Finish(metadata) => return Ok(Some(metadata)),
                SinkMessage::Stop => return Ok(None),
            }
        }
    }

    fn write(&mut self, batch: &EmbeddedBatch) -> Result<(), RunError> {
        if batch.chunks.is_empty() {
            return Ok(());
        }
        self.dimensions.get_or_insert(batch.vectors.dimensions);
        Ok(self.sink.write(batch)?)
    }

    fn quarantine(
        &mut self,
        chunk: &Chunk,
        reason: &str,
        status: Option<u16>,
    ) -> Result<(), RunError> {
        self.quarantined += 1;
        // A table may hold an earlier version of the chunk: it goes, as from a fresh run's output.
        self.sink.remove(std::slice::from_ref(&chunk.id))?;
        Ok(self.failures.record(chunk, reason, status)?)
    }

    /// Writes the repeats of chunks sent in this run, completes the output and
    /// removes the checkpoint it now holds.
    fn finish(mut self, mut metadata: OutputMetadata) -> Result<Written, RunError> {
        if let Err(e) = self.write_duplicates() {
            self.abort();
            return Err(e);
        }
        let Writing {
            sink,
            parts,
            failures,
            dimensions,
            quarantined,
            ..
        } = self;
        metadata.dimensions = dimensions.unwrap_or(0);
        let report = sink.finish(&metadata)?;
        failures.finish()?;
        parts.remove_checkpoint()?;
        Ok(Written {
            rows: Some(report.rows),
            dimensions,
            quarantined,
        })
    }

    /// Drops the partial output and failures file.
    fn abort(self) {
        self.sink.abort();
        self.failures.abort();
    }

    /// Repeated chunks take the vector their first copy got, read back from
    /// this run's parts, or its quarantine.
    fn write_duplicates(&mut self) -> Result<(), RunError> {
        if self.duplicates.is_empty() {
            return Ok(());
        }
        let mut store = Store::new();
        for part in self.parts.committed() {
            let rows = ParquetRows::open(part)?;
            store.add(Box::new(rows), Origin::Checkpoint, None)?;
        }
        let duplicates = std::mem::take(&mut self.duplicates);
        let mut found = Vec::new();
        for chunk in duplicates {
            if let Some((location, _)) = store.locate(&chunk.content_hash) {
                found.push((chunk, location));
            } else if let Some((reason, status)) = self
                .quarantine_reasons
                .get(&hash_key(&chunk.content_hash))
                .cloned()
            {
                self.quarantine(&chunk, &reason, status)?;
            } else {
                return Err(RunError::Internal(format!(
                    "chunk {} looked like a repeat of a text sent in this run, but no vector has its \
                     content hash; run the job again to send it",
                    chunk.id
                )));
            }
        }
        for group in found.chunks(REUSE_BATCH) {
            let wanted: Vec<(Location, [u8; 32])> =
                group.iter().map(|(c, l)| (*l, c.content_hash)).collect();
            let values = store.fetch(&wanted)?;
            let batch = EmbeddedBatch {
                chunks: group.iter().map(|(c, _)| c.clone()).collect(),
                vectors: Vectors {
                    dimensions: store.dimensions().unwrap_or(0),
                    values,
                    usage: Usage::default(),
                    discarded: Usage::default(),
                },
            };
            self.write(&batch)?;
        }
        Ok(())
    }
}
