//! The dispatching stage, on the async runtime: keeps up to `concurrency`
//! requests in flight, splits a request the service finds too large, and
//! passes every answer to the writer as it arrives, until the batches run
//! out, the run fails, or it is asked to stop.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::mpsc;

use super::stop::{Budget, Stopping, Stops};
use super::write::SinkMessage;
use super::RunError;
use crate::backend::{BackendError, EmbeddingBackend};
use crate::batch::Batch;
use crate::progress::{Progress, Snapshot};
use crate::types::{Chunk, EmbeddedBatch, Usage};

/// One request's outcome, after any splitting.
pub(super) enum Piece {
    Embedded(EmbeddedBatch),
    Quarantined {
        chunk: Chunk,
        reason: String,
        status: Option<u16>,
    },
}

/// How the dispatching stage ended.
#[derive(Default)]
pub(super) struct Dispatched {
    /// Billed by the requests whose vectors went to the writer.
    pub usage: Usage,
    /// Chunks embedded by those requests.
    pub embedded: u64,
    pub stopped: Option<String>,
    pub failure: Option<RunError>,
    /// The writer stopped taking messages: it failed.
    pub writer_stopped: bool,
}

/// What the dispatching stage works with.
pub(super) struct Dispatch {
    pub backend: Arc<dyn EmbeddingBackend>,
    pub concurrency: usize,
    pub budget: Option<Arc<Budget>>,
    /// Set when the run wants nothing more: the reader stops too.
    pub halt: Arc<AtomicBool>,
    /// How long a stopping run waits for the requests in flight.
    pub drain: Duration,
    /// Chunks the reader settled without a request, for progress.
    pub settled: Arc<AtomicU64>,
}

impl Dispatch {
    /// Sends the batches and hands every answer to the writer.
    pub(super) async fn run(
        self,
        batches: mpsc::Receiver<Result<Batch, RunError>>,
        sink: &mpsc::Sender<SinkMessage>,
        mut stops: Stops,
        display: &mut Progress,
        reading_done: &dyn Fn() -> bool,
    ) -> Dispatched {
        let mut results = self.requests(batches);
        let mut out = Dispatched::default();
        let mut drain_until: Option<tokio::time::Instant> = None;
        let mut ticker = tokio::time::interval(display.interval());
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            let drained = async {
                match drain_until {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let result = tokio::select! {
                result = results.next() => match result {
                    Some(result) => result,
                    None => break,
                },
                stopping = stops.next() => {
                    self.halt.store(true, Ordering::Relaxed);
                    match stopping {
                        Stopping::Drain(reason) => {
                            if out.stopped.is_none() {
                                out.stopped = Some(reason);
                                drain_until = Some(tokio::time::Instant::now() + self.drain);
                            }
                            continue;
                        }
                        Stopping::Now(reason) => {
                            out.stopped.get_or_insert(reason);
                            break;
                        }
                    }
                }
                () = drained => break,
                _ = ticker.tick(), if display.is_on() => {
                    display.update(&self.snapshot(&out, reading_done()));
                    continue;
                }
            };
            match result {
                Ok(pieces) => {
                    if !self.deliver(pieces, sink, &mut out).await {
                        out.writer_stopped = true;
                        break;
                    }
                }
                Err(e) => {
                    out.failure = Some(e);
                    break;
                }
            }
        }
        if out.stopped.is_none() {
            out.stopped = self.budget.as_ref().and_then(|b| b.exceeded());
        }
        // Dropping the stream cancels requests still in flight and stops the reader.
        self.halt.store(true, Ordering::Relaxed);
        drop(results);
        display.finish(&self.snapshot(&out, reading_done()));
        out
    }

    fn snapshot(&self, out: &Dispatched, reading_done: bool) -> Snapshot {
        let chunks = out.embedded + self.settled.load(Ordering::Relaxed);
        Snapshot::of(chunks, &out.usage, &self.backend.stats(), reading_done)
    }

    /// Passes one request's pieces to the writer; `false` if the writer is gone.
    async fn deliver(
        &self,
        pieces: Vec<Piece>,
        sink: &mpsc::Sender<SinkMessage>,
        out: &mut Dispatched,
    ) -> bool {
        if let Some(budget) = &self.budget {
            budget.settle(&pieces);
        }
        for piece in pieces {
            let message = match piece {
                Piece::Embedded(batch) => {
                    out.usage += batch.vectors.usage;
                    out.embedded += batch.chunks.len() as u64;
                    SinkMessage::Embedded(batch)
                }
                Piece::Quarantined {
                    chunk,
                    reason,
                    status,
                } => SinkMessage::Quarantine {
                    chunk,
                    reason,
                    status,
                },
            };
            // A failed writer would leave vectors paid for with nowhere to go.
            if sink.send(message).await.is_err() {
                return false;
            }
        }
        true
    }

    /// The answers to the batches, up to `concurrency` in flight, admitted
    /// one by one against the budget.
    fn requests(
        &self,
        mut batches: mpsc::Receiver<Result<Batch, RunError>>,
    ) -> impl Stream<Item = Result<Vec<Piece>, RunError>> + Unpin + '_ {
        let halt = Arc::clone(&self.halt);
        let budget = self.budget.clone();
        let admitted = futures::stream::poll_fn(move |cx| {
            if halt.load(Ordering::Relaxed) {
                return Poll::Ready(None);
            }
            match batches.poll_recv(cx) {
                Poll::Ready(Some(Ok(batch))) => {
                    if budget.as_ref().is_some_and(|b| !b.admit(batch.tokens)) {
                        // The batch is left for a later run.
                        halt.store(true, Ordering::Relaxed);
                        return Poll::Ready(None);
                    }
                    Poll::Ready(Some(Ok(batch)))
                }
                other => other,
            }
        });
        let backend = Arc::clone(&self.backend);
        admitted
            .map(move |item| {
                let backend = Arc::clone(&backend);
                async move {
                    match item {
                        Ok(batch) => embed_or_split(backend.as_ref(), batch).await,
                        Err(e) => Err(e),
                    }
                }
            })
            .buffer_unordered(self.concurrency)
    }
}

/// Embeds a batch; a batch the service finds too large is split in half
/// until it fits, and a single chunk that still doesn't is quarantined.
fn embed_or_split(
    backend: &dyn EmbeddingBackend,
    batch: Batch,
) -> futures::future::BoxFuture<'_, Result<Vec<Piece>, RunError>> {
    async move {
        let texts: Vec<&str> = batch.chunks.iter().map(|c| c.text.as_str()).collect();
        let result = backend.embed(&texts, batch.tokens).await;
        drop(texts);
        match result {
            Ok(vectors) => Ok(vec![Piece::Embedded(EmbeddedBatch {
                chunks: batch.chunks,
                vectors,
            })]),
            Err(BackendError::TooLarge { status, message }) => match batch.split_in_half() {
                Ok((left, right)) => {
                    let mut pieces = embed_or_split(backend, left).await?;
                    pieces.extend(embed_or_split(backend, right).await?);
                    Ok(pieces)
                }
                Err(lone) => Ok(lone
                    .chunks
                    .into_iter()
                    .map(|chunk| Piece::Quarantined {
                        chunk,
                        reason: message.clone(),
                        status,
                    })
                    .collect()),
            },
            Err(error) => Err(RunError::Backend {
                first: batch
                    .chunks
                    .first()
                    .map(|c| c.id.clone())
                    .unwrap_or_default(),
                last: batch
                    .chunks
                    .last()
                    .map(|c| c.id.clone())
                    .unwrap_or_default(),
                error,
            }),
        }
    }
    .boxed()
}
