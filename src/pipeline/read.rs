//! The reading stage, on a blocking thread: reads documents, chunks them,
//! classifies each chunk, packs the chunks to send into requests and passes
//! the others straight to the writer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::classify::{Class, Classifier, Counts};
use super::repeats::RepeatGate;
use super::write::SinkMessage;
use super::RunError;
use crate::batch::{Batch, Batcher};
use crate::chunk::Chunker;
use crate::source::{SkippedFiles, Source, SourceStats};
use crate::store::{Location, Origin};
use crate::types::{Chunk, EmbeddedBatch, Usage, Vectors};

/// What the reading stage read and how it sorted it.
#[derive(Debug, Default)]
pub(super) struct ReadReport {
    pub source: SourceStats,
    /// Files passed over because they are not text.
    pub skipped_files: SkippedFiles,
    pub counts: Counts,
    /// Chunks a sink that keeps rows already held unchanged.
    pub kept: u64,
}

pub(super) struct Reading {
    pub classifier: Classifier,
    pub batcher: Batcher,
    /// Whether the sink is to be told which held rows are gone.
    pub removes_rows: bool,
    /// Set when the run wants nothing more.
    pub halt: Arc<AtomicBool>,
    /// Chunks done without a request (reused or repeated), for progress.
    pub settled: Arc<AtomicU64>,
    pub batches: mpsc::Sender<Result<Batch, RunError>>,
    pub sink: mpsc::Sender<SinkMessage>,
    /// Places for repeats waiting at the writer for their first copy.
    pub repeats: Arc<RepeatGate>,
    /// Stored vectors are read back this many at a time.
    pub reuse_batch: usize,
}

impl Reading {
    /// Runs on a blocking thread. An error is sent down the batch channel
    /// like a batch, so the run sees it in order.
    pub(super) fn run(mut self, mut source: Box<dyn Source>, chunker: &dyn Chunker) -> ReadReport {
        let mut reuse = Vec::new();
        let mut kept = 0;
        let outcome = self.read_all(source.as_mut(), chunker, &mut reuse, &mut kept);
        let report = ReadReport {
            source: source.stats(),
            skipped_files: source.skipped_files(),
            counts: self.classifier.counts(),
            kept,
        };
        if let Err(e) = outcome {
            let _ = self.batches.blocking_send(Err(e));
        }
        report
    }

    fn read_all(
        &mut self,
        source: &mut dyn Source,
        chunker: &dyn Chunker,
        reuse: &mut Vec<(Chunk, Location)>,
        kept: &mut u64,
    ) -> Result<(), RunError> {
        loop {
            if self.halt.load(Ordering::Relaxed) {
                return Ok(());
            }
            let Some(document) = source.next_document()? else {
                break;
            };
            // Each chunk goes on as it is cut: the first request of a long
            // document leaves before the document is all cut.
            let mut outcome = Ok(true);
            chunker.chunk_each(&document, &mut |chunk| {
                for piece in self.classifier.fit(chunk) {
                    outcome = self.route(piece, reuse, kept);
                    if !matches!(outcome, Ok(true)) {
                        return false;
                    }
                }
                true
            });
            if !outcome? {
                return Ok(());
            }
        }
        self.flush_reuse(reuse)?;
        let last = self.batcher.finish();
        self.send(last);
        let gone = self.classifier.finish();
        if self.removes_rows && !gone.is_empty() {
            let ids = self.classifier.store().ids_of(Origin::Previous, &gone)?;
            let _ = self.sink.blocking_send(SinkMessage::Remove(ids));
        }
        Ok(())
    }

    /// Sends, reuses or defers one chunk; `false` once the run wants nothing more.
    fn route(
        &mut self,
        chunk: Chunk,
        reuse: &mut Vec<(Chunk, Location)>,
        kept: &mut u64,
    ) -> Result<bool, RunError> {
        match self.classifier.classify(&chunk) {
            Class::Kept => {
                *kept += 1;
                self.settled.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Class::Stored(location) => {
                self.settled.fetch_add(1, Ordering::Relaxed);
                reuse.push((chunk, location));
                // As many as a request holds, so that the writer's queue holds
                // no more memory than with new vectors.
                if reuse.len() >= self.reuse_batch {
                    return self.flush_reuse(reuse);
                }
                Ok(true)
            }
            Class::Repeat => {
                self.settled.fetch_add(1, Ordering::Relaxed);
                if !self.repeats.try_enter() {
                    // The first copies of the repeats waiting may be among
                    // the chunks held: send them, then wait for a place.
                    let held = self.batcher.finish();
                    if !self.send(held) {
                        return Ok(false);
                    }
                    if !self.repeats.enter(&self.halt) {
                        return Ok(false);
                    }
                }
                Ok(self
                    .sink
                    .blocking_send(SinkMessage::Duplicate(chunk))
                    .is_ok())
            }
            Class::Send => {
                let batches = self.batcher.push(chunk);
                Ok(self.send(batches))
            }
        }
    }

    /// Passes `batches` on; `false` once the channel is closed, when the run
    /// stopped and wants nothing more.
    fn send(&self, batches: Vec<Batch>) -> bool {
        batches
            .into_iter()
            .all(|batch| self.batches.blocking_send(Ok(batch)).is_ok())
    }

    /// Reads the stored vectors of the chunks waiting for them and passes
    /// them to the writer.
    fn flush_reuse(&mut self, reuse: &mut Vec<(Chunk, Location)>) -> Result<bool, RunError> {
        if reuse.is_empty() {
            return Ok(true);
        }
        let pending = std::mem::take(reuse);
        let wanted: Vec<(Location, [u8; 32])> =
            pending.iter().map(|(c, l)| (*l, c.content_hash)).collect();
        let store = self.classifier.store();
        let values = store.fetch(&wanted)?;
        let dimensions = store.dimensions().unwrap_or(0);
        let batch = EmbeddedBatch {
            chunks: pending.into_iter().map(|(c, _)| c).collect(),
            vectors: Vectors {
                dimensions,
                values,
                usage: Usage::default(),
                discarded: Usage::default(),
            },
        };
        Ok(self.sink.blocking_send(SinkMessage::Reused(batch)).is_ok())
    }
}
