//! The writing stage, on a blocking thread: commits every vector paid for to
//! the checkpoint, writes the run's rows to the sink and quarantined chunks
//! to the failures file, and gives repeated chunks the vector of their first
//! copy as soon as it is written (see [`super::repeats`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::repeats::{RepeatGate, Repeats, Settled};
use super::RunError;
use crate::sink::Sink;
use crate::state::{Billed, FailuresFile, PartWriter};
use crate::types::{Chunk, EmbeddedBatch, OutputMetadata, Usage, Vectors};

pub(super) enum SinkMessage {
    /// Vectors paid for by this run.
    Embedded(EmbeddedBatch),
    /// Vectors read back from the store.
    Reused(EmbeddedBatch),
    /// A chunk whose text was sent with another chunk of this run; it holds
    /// a place at the [`RepeatGate`] until it is written.
    Duplicate(Chunk),
    Quarantine {
        chunk: Chunk,
        reason: String,
        status: Option<u16>,
    },
    /// A chunk the model refused as over its window, whose pieces are sent
    /// in its place: repeats of its text, which wait for its vector, are
    /// quarantined for `reason`.
    Rechunked {
        chunk: Chunk,
        reason: String,
    },
    /// Rows the sink held whose ids no chunk of this run has.
    Remove(Vec<String>),
    /// Billing no vector carries, for the checkpoint.
    Billed(Billed),
    Finish(OutputMetadata),
    /// Commit what was paid for and leave the sink as it was.
    Stop,
}

/// Answers that arrive while the writer is idle are committed together once
/// this long has passed since the last commit: a part (two `fsync`s, and a
/// file the checkpoint's removal unlinks) per quarter of a second rather than
/// per answer. A part holding `commit_rows` is committed at once, so what a
/// kill can lose stays within the bound of `dispatch::Exposure`.
pub(super) const COMMIT_EVERY: Duration = Duration::from_millis(250);

/// What the writing stage wrote.
#[derive(Debug, Default)]
pub(super) struct Written {
    /// Rows the sink wrote; `None` when the run stopped before finishing.
    pub rows: Option<u64>,
    pub dimensions: Option<usize>,
    pub quarantined: u64,
    /// What the sink found worth a warning as it finished.
    pub warnings: Vec<String>,
}

pub(super) struct Writing {
    pub sink: Box<dyn Sink>,
    pub parts: PartWriter,
    pub failures: FailuresFile,
    /// The vector length of the rows written so far.
    pub dimensions: Option<usize>,
    pub quarantined: u64,
    pub repeats: Repeats,
    pub gate: Arc<RepeatGate>,
    /// Rows committed to the checkpoint so far, for the dispatcher's
    /// [`super::dispatch::Exposure`].
    pub committed: watch::Sender<u64>,
    /// A part is committed once it holds this many rows, however many
    /// messages wait: the dispatcher sends no request while more are
    /// uncommitted.
    pub commit_rows: u64,
    /// When the checkpoint was last committed.
    last_commit: Instant,
}

/// Opens the [`RepeatGate`] for good when the writer is gone, however it goes.
struct CloseGate(Arc<RepeatGate>);

impl Drop for CloseGate {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Writing {
    pub(super) fn new(
        sink: Box<dyn Sink>,
        parts: PartWriter,
        failures: FailuresFile,
        gate: Arc<RepeatGate>,
    ) -> Self {
        Writing {
            sink,
            parts,
            failures,
            dimensions: None,
            quarantined: 0,
            repeats: Repeats::default(),
            gate,
            committed: watch::channel(0).0,
            commit_rows: u64::MAX,
            last_commit: Instant::now(),
        }
    }

    /// Tells `committed` the rows committed, and commits a part once it
    /// holds `commit_rows`.
    pub(super) fn with_exposure(mut self, committed: watch::Sender<u64>, commit_rows: u64) -> Self {
        self.committed = committed;
        self.commit_rows = commit_rows.max(1);
        self
    }

    /// Makes what was appended durable, and tells the dispatcher.
    fn commit(&mut self) -> Result<(), RunError> {
        self.parts.commit()?;
        self.last_commit = Instant::now();
        self.committed.send_replace(self.parts.committed_rows());
        Ok(())
    }

    /// Waits for the next message when none is at hand. What arrived is
    /// committed first, or, when the last commit was less than
    /// [`COMMIT_EVERY`] ago, once that has passed with no message come;
    /// `None` once the senders are gone.
    fn wait(
        &mut self,
        rx: &mut mpsc::Receiver<SinkMessage>,
    ) -> Result<Option<SinkMessage>, RunError> {
        let due = self.last_commit + COMMIT_EVERY;
        let runtime = tokio::runtime::Handle::try_current();
        if let (Ok(runtime), true) = (runtime, self.parts.open_rows() > 0) {
            let left = due.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                if let Ok(message) = runtime.block_on(tokio::time::timeout(left, rx.recv())) {
                    return Ok(message);
                }
            }
        }
        // Nothing else at hand: make what arrived durable before waiting.
        self.commit()?;
        Ok(rx.blocking_recv())
    }

    /// Runs on a blocking thread. Whatever happens, vectors paid for are
    /// committed to the checkpoint before it returns.
    pub(super) fn run(mut self, mut rx: mpsc::Receiver<SinkMessage>) -> Result<Written, RunError> {
        let _close = CloseGate(Arc::clone(&self.gate));
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
                Err(mpsc::error::TryRecvError::Empty) => match self.wait(rx)? {
                    Some(message) => message,
                    None => return Ok(None),
                },
                Err(mpsc::error::TryRecvError::Disconnected) => return Ok(None),
            };
            match message {
                SinkMessage::Embedded(batch) => {
                    self.parts.append(&batch)?;
                    // Committed before the sink's write, which may be slow, when
                    // the dispatcher may be waiting for it.
                    if self.parts.open_rows() >= self.commit_rows {
                        self.commit()?;
                    } else {
                        self.committed.send_replace(self.parts.committed_rows());
                    }
                    self.write(&batch)?;
                    let settled = self.repeats.written(&batch);
                    self.write_repeats(settled)?;
                }
                SinkMessage::Reused(batch) => self.write(&batch)?,
                SinkMessage::Duplicate(chunk) => self.repeat(chunk)?,
                SinkMessage::Quarantine {
                    chunk,
                    reason,
                    status,
                } => {
                    self.quarantine(&chunk, &reason, status)?;
                    let waited = self.repeats.quarantined(&chunk, &reason, status);
                    let count = waited.len();
                    for repeat in waited {
                        self.quarantine(&repeat, &reason, status)?;
                    }
                    self.gate.leave(count);
                }
                SinkMessage::Rechunked { chunk, reason } => {
                    let reason = format!(
                        "its text was refused as over the model's window, and chunk {} of the \
                         same text was cut to fit in its place: {reason}",
                        chunk.id
                    );
                    let waited = self.repeats.quarantined(&chunk, &reason, None);
                    let count = waited.len();
                    for repeat in waited {
                        self.quarantine(&repeat, &reason, None)?;
                    }
                    self.gate.leave(count);
                }
                SinkMessage::Remove(ids) => self.sink.remove(&ids)?,
                SinkMessage::Billed(billed) => self.parts.add_billed(billed)?,
                SinkMessage::Finish(metadata) => return Ok(Some(metadata)),
                SinkMessage::Stop => return Ok(None),
            }
        }
    }

    /// Writes a repeat now if its first copy's vector (or quarantine) is
    /// known, or keeps it until it is.
    fn repeat(&mut self, chunk: Chunk) -> Result<(), RunError> {
        match self.repeats.settle(chunk, &mut self.parts)? {
            None => Ok(()),
            Some((chunk, Settled::Vector(vector))) => self.write_repeats(vec![(chunk, vector)]),
            Some((chunk, Settled::Quarantined(reason, status))) => {
                self.gate.leave(1);
                self.quarantine(&chunk, &reason, status)
            }
        }
    }

    /// Writes repeats with their first copies' vectors, and gives back their
    /// places at the gate.
    fn write_repeats(&mut self, settled: Vec<(Chunk, Arc<[f32]>)>) -> Result<(), RunError> {
        let Some((_, first)) = settled.first() else {
            return Ok(());
        };
        let dimensions = first.len();
        let count = settled.len();
        let mut values = Vec::with_capacity(count * dimensions);
        let mut chunks = Vec::with_capacity(count);
        for (chunk, vector) in settled {
            values.extend_from_slice(&vector);
            chunks.push(chunk);
        }
        let batch = EmbeddedBatch {
            chunks,
            vectors: Vectors {
                dimensions,
                values,
                usage: Usage::default(),
                discarded: Usage::default(),
            },
        };
        let written = self.write(&batch);
        self.gate.leave(count);
        written
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

    /// Completes the output and removes the checkpoint it now holds. Every
    /// repeat has been written by now: their first copies all came back.
    fn finish(self, mut metadata: OutputMetadata) -> Result<Written, RunError> {
        if let Some(chunk) = self.repeats.any_waiting() {
            let error = RunError::Internal(format!(
                "chunk {} looked like a repeat of a text sent in this run, but no vector has its \
                 content hash; run the job again to send it",
                chunk.id
            ));
            self.abort();
            return Err(error);
        }
        let Writing {
            sink,
            parts,
            failures,
            dimensions,
            quarantined,
            ..
        } = self;
        metadata.dimensions = dimensions.unwrap_or(metadata.dimensions);
        let report = sink.finish(&metadata)?;
        failures.finish()?;
        parts.remove_checkpoint()?;
        Ok(Written {
            rows: Some(report.rows),
            dimensions,
            quarantined,
            warnings: report.warnings,
        })
    }

    /// Drops the partial output and failures file.
    fn abort(self) {
        self.sink.abort();
        self.failures.abort();
    }
}
