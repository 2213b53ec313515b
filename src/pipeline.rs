//! Wires the stages together:
//! `source → chunk → batch` on a reading thread, requests in flight on the
//! async runtime, and the sink on a writing thread, joined by bounded
//! channels so that memory does not grow with the input.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use futures::{FutureExt, StreamExt};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::backend::{BackendError, BackendStats, EmbeddingBackend};
use crate::batch::{Batch, Batcher};
use crate::chunk::{Chunk, Chunker};
use crate::client::Usage;
use crate::exit::Exit;
use crate::job::Job;
use crate::sink::{
    self, EmbeddedBatch, FailuresFile, OutputMetadata, ParquetSink, Sink, SinkError, SinkReport,
};
use crate::source::{self, SourceError, SourceStats};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("request for chunks {first}..{last} failed: {error}")]
    Backend {
        first: String,
        last: String,
        #[source]
        error: BackendError,
    },
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("{0}")]
    Internal(String),
}

impl RunError {
    pub fn exit(&self) -> Exit {
        match self {
            RunError::Source(e) if e.is_found_at_open() => Exit::Usage,
            _ => Exit::Failed,
        }
    }
}

/// What a finished run did; printed with `--json` and written next to the output.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub job: String,
    pub output: PathBuf,
    pub backend: String,
    pub model: String,
    pub dimensions: Option<usize>,
    pub documents: u64,
    pub skipped_null: u64,
    pub skipped_empty: u64,
    pub chunks: u64,
    pub written: u64,
    pub quarantined: u64,
    pub estimated_tokens: u64,
    pub usage: Usage,
    pub requests: u64,
    pub retries: u64,
    pub invalid_responses: u64,
    pub throttled: u64,
    pub cost: Option<f64>,
    pub elapsed_seconds: f64,
    pub chunks_per_second: f64,
    pub exit_code: u8,
}

/// Runs a job to the end with the given backend and chunker; with
/// `progress`, a line on stderr every `pipeline.progress_seconds`.
pub async fn run(
    job: &Job,
    backend: Arc<dyn EmbeddingBackend>,
    chunker: Arc<dyn Chunker>,
    progress: bool,
) -> Result<Summary, RunError> {
    let started = Instant::now();
    let source = source::open(&job.source)?;
    let capacity = job.pipeline.channel_capacity;

    let (batch_tx, mut batch_rx) = mpsc::channel::<Result<Batch, SourceError>>(capacity);
    let reader = {
        let chunker = Arc::clone(&chunker);
        let max_inputs = job.backend.max_inputs_per_request;
        let max_tokens = job.backend.max_tokens_per_request as u64;
        tokio::task::spawn_blocking(move || {
            read_stage(source, chunker.as_ref(), max_inputs, max_tokens, &batch_tx)
        })
    };

    let (sink_tx, sink_rx) = mpsc::channel::<SinkMessage>(capacity);
    let writer = {
        let output = job.output.clone();
        tokio::task::spawn_blocking(move || {
            write_stage(
                sink_rx,
                &output.path,
                output.include_text,
                output.row_group_bytes,
            )
        })
    };

    let batches = futures::stream::poll_fn(move |cx| batch_rx.poll_recv(cx));
    let backend_for_requests = Arc::clone(&backend);
    let mut results = batches
        .map(move |item| {
            let backend = Arc::clone(&backend_for_requests);
            async move {
                match item {
                    Ok(batch) => embed_or_split(backend.as_ref(), batch).await,
                    Err(e) => Err(RunError::Source(e)),
                }
            }
        })
        .buffer_unordered(job.backend.concurrency);

    let mut usage = Usage::default();
    let mut failure = None;
    let mut ticker = tokio::time::interval(std::time::Duration::from_secs_f64(
        job.pipeline.progress_seconds,
    ));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut embedded = 0u64;
    let mut writer_stopped = false;
    'run: loop {
        let result = tokio::select! {
            result = results.next() => match result {
                Some(result) => result,
                None => break,
            },
            _ = ticker.tick(), if progress => {
                let stats = backend.stats();
                eprintln!(
                    "embedjob: {embedded} chunks embedded, {} requests, {} retries, {:.0}s",
                    stats.requests,
                    stats.retries,
                    started.elapsed().as_secs_f64()
                );
                continue;
            }
        };
        match result {
            Ok(pieces) => {
                for piece in pieces {
                    let message = match piece {
                        Piece::Embedded(batch) => {
                            usage += batch.vectors.usage;
                            embedded += batch.chunks.len() as u64;
                            SinkMessage::Batch(batch)
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
                    if sink_tx.send(message).await.is_err() {
                        // The writer failed; sending more would pay for vectors with nowhere to go.
                        writer_stopped = true;
                        break 'run;
                    }
                }
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    // Dropping the stream cancels requests in flight and stops the reader.
    drop(results);
    if writer_stopped {
        drop(sink_tx);
        let _ = reader.await;
        return Err(match writer.await {
            Ok(Err(e)) => e,
            Ok(Ok(_)) => RunError::Internal("the writing stage stopped early".to_string()),
            Err(e) => RunError::Internal(format!("the writing stage stopped unexpectedly: {e}")),
        });
    }

    let read = reader
        .await
        .map_err(|e| RunError::Internal(format!("the reading stage stopped unexpectedly: {e}")))?;
    let failure = failure.or_else(|| {
        (read.chunks == 0).then(|| {
            RunError::Source(SourceError::Empty {
                input: source::describe_input(&job.source),
            })
        })
    });
    if let Some(error) = failure {
        let _ = sink_tx.send(SinkMessage::Abort).await;
        drop(sink_tx);
        let _ = writer.await;
        return Err(error);
    }
    let info = backend.info().clone();
    let stats: BackendStats = backend.stats();

    let cost = info
        .input_per_1k
        .map(|price| usage.prompt_tokens as f64 / 1000.0 * price);
    let metadata = OutputMetadata {
        model: info.model.clone(),
        dimensions: 0,
        backend: info.kind.to_string(),
        usage,
        requests: stats.requests,
        cost,
        extra: Default::default(),
    };
    let _ = sink_tx.send(SinkMessage::Finish(metadata)).await;
    drop(sink_tx);
    let written = writer.await.map_err(|e| {
        RunError::Internal(format!("the writing stage stopped unexpectedly: {e}"))
    })??;

    let elapsed = started.elapsed().as_secs_f64();
    let exit = if written.quarantined > 0 {
        Exit::Quarantined
    } else {
        Exit::Success
    };
    let summary = Summary {
        job: job.name.clone(),
        output: job.output.path.clone(),
        backend: info.kind.to_string(),
        model: info.model.clone(),
        dimensions: written.dimensions.or(info.dimensions),
        documents: read.source.documents,
        skipped_null: read.source.skipped_null,
        skipped_empty: read.source.skipped_empty,
        chunks: read.chunks,
        written: written.report.as_ref().map_or(0, |r| r.rows),
        quarantined: written.quarantined,
        estimated_tokens: read.tokens,
        usage,
        requests: stats.requests,
        retries: stats.retries,
        invalid_responses: stats.invalid_responses,
        throttled: stats.throttled,
        cost,
        elapsed_seconds: elapsed,
        chunks_per_second: if elapsed > 0.0 {
            read.chunks as f64 / elapsed
        } else {
            0.0
        },
        exit_code: exit.code(),
    };
    let summary_value =
        serde_json::to_value(&summary).map_err(|e| RunError::Internal(e.to_string()))?;
    sink::write_json_atomically(&sink::summary_path(&job.output.path), &summary_value)?;
    Ok(summary)
}

struct ReadReport {
    source: SourceStats,
    chunks: u64,
    tokens: u64,
}

/// Reads, chunks and batches on a blocking thread. A source error is sent
/// down the channel like a batch, so the run sees it in order.
fn read_stage(
    mut source: Box<dyn source::Source>,
    chunker: &dyn Chunker,
    max_inputs: usize,
    max_tokens: u64,
    out: &mpsc::Sender<Result<Batch, SourceError>>,
) -> ReadReport {
    let mut batcher = Batcher::new(max_inputs, max_tokens);
    let mut report = ReadReport {
        source: SourceStats::default(),
        chunks: 0,
        tokens: 0,
    };
    loop {
        let document = match source.next_document() {
            Ok(Some(document)) => document,
            Ok(None) => break,
            Err(e) => {
                let _ = out.blocking_send(Err(e));
                report.source = source.stats();
                return report;
            }
        };
        for chunk in chunker.chunk(&document) {
            report.chunks += 1;
            report.tokens += u64::from(chunk.token_count);
            if let Some(batch) = batcher.push(chunk) {
                if out.blocking_send(Ok(batch)).is_err() {
                    // The run stopped; nothing more is wanted.
                    report.source = source.stats();
                    return report;
                }
            }
        }
    }
    if let Some(batch) = batcher.finish() {
        let _ = out.blocking_send(Ok(batch));
    }
    report.source = source.stats();
    report
}

enum Piece {
    Embedded(EmbeddedBatch),
    Quarantined {
        chunk: Chunk,
        reason: String,
        status: Option<u16>,
    },
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

enum SinkMessage {
    Batch(EmbeddedBatch),
    Quarantine {
        chunk: Chunk,
        reason: String,
        status: Option<u16>,
    },
    Finish(OutputMetadata),
    Abort,
}

struct Written {
    report: Option<SinkReport>,
    dimensions: Option<usize>,
    quarantined: u64,
}

fn write_stage(
    mut rx: mpsc::Receiver<SinkMessage>,
    path: &Path,
    include_text: bool,
    row_group_bytes: u64,
) -> Result<Written, RunError> {
    let mut parquet: Option<Box<ParquetSink>> = None;
    let mut failures = FailuresFile::new(path);
    let mut quarantined = 0;
    let abort = |parquet: Option<Box<ParquetSink>>, failures: FailuresFile| {
        if let Some(sink) = parquet {
            sink.abort();
        }
        failures.abort();
    };
    while let Some(message) = rx.blocking_recv() {
        match message {
            SinkMessage::Batch(batch) => {
                if parquet.is_none() {
                    let sink = ParquetSink::create(
                        path,
                        batch.vectors.dimensions,
                        include_text,
                        row_group_bytes,
                    )?;
                    parquet = Some(Box::new(sink));
                }
                if let Some(sink) = parquet.as_mut() {
                    if let Err(e) = sink.write(batch) {
                        abort(parquet, failures);
                        return Err(e.into());
                    }
                }
            }
            SinkMessage::Quarantine {
                chunk,
                reason,
                status,
            } => {
                quarantined += 1;
                if let Err(e) = failures.record(&chunk, &reason, status) {
                    abort(parquet, failures);
                    return Err(e.into());
                }
            }
            SinkMessage::Finish(mut metadata) => {
                let dimensions = parquet.as_ref().map(|s| s.dimensions());
                metadata.dimensions = dimensions.unwrap_or(0);
                let report = match parquet {
                    Some(sink) => Some(sink.finish(&metadata)?),
                    None => None,
                };
                failures.finish()?;
                return Ok(Written {
                    report,
                    dimensions,
                    quarantined,
                });
            }
            SinkMessage::Abort => break,
        }
    }
    abort(parquet, failures);
    Err(RunError::Internal(
        "the run stopped before its output was complete".to_string(),
    ))
}
