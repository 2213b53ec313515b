//! Wires the stages together:
//! `source → chunk → batch` on a reading thread, requests in flight on the
//! async runtime, and the sink on a writing thread, joined by bounded
//! channels so that memory does not grow with the input.
//!
//! Every vector paid for is committed to the job's checkpoint as soon as it
//! arrives, and chunks whose vector is already stored (in the previous output
//! or the checkpoint, see [`crate::checkpoint`]) are not sent again.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::backend::{BackendError, BackendStats, EmbeddingBackend};
use crate::batch::{Batch, Batcher};
use crate::checkpoint::{
    self, id_key, Checkpoint, CheckpointError, Fingerprint, JobLock, Location, Origin, PartWriter,
    Store, FINGERPRINT_KEY,
};
use crate::chunk::{Chunk, Chunker};
use crate::client::Usage;
use crate::exit::Exit;
use crate::job::Job;
use crate::progress::{Mode, Progress, Snapshot};
use crate::sink::{
    self, EmbeddedBatch, FailuresFile, OutputMetadata, ParquetSink, Sink, SinkError, SinkReport,
};
use crate::source::{self, SourceError, SourceStats};
use crate::validate::Vectors;

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
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{0}")]
    Internal(String),
}

impl RunError {
    pub fn exit(&self) -> Exit {
        match self {
            RunError::Source(e) if e.is_found_at_open() => Exit::Usage,
            RunError::Checkpoint(e) if e.is_found_before_work() => Exit::Usage,
            _ => Exit::Failed,
        }
    }
}

/// Asks a running job to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopRequest {
    Running,
    /// Send nothing more, wait for the requests in flight, commit, exit 4.
    Graceful(String),
    /// As `Graceful`, without waiting for the requests in flight.
    Now(String),
}

/// How a run is driven, besides its job file.
#[derive(Debug, Default)]
pub struct RunOptions {
    /// Progress on stderr: a bar on a terminal, else a line every
    /// `pipeline.progress_seconds` (see [`crate::progress`]).
    pub progress: bool,
    /// Discard the checkpoint and the previous output instead of reusing them.
    pub fresh: bool,
    /// Stop gracefully after this long.
    pub max_duration: Option<Duration>,
    /// Stop requests, from signals.
    pub stop: Option<watch::Receiver<StopRequest>>,
}

/// What a run did; printed with `--json` and written next to the output.
///
/// `usage`, `requests` and `cost` are what this run was billed. Of the
/// chunks, `embedded` were sent, `reused` came from the previous output,
/// `resumed` from the checkpoint of an unfinished run, and `deduplicated`
/// repeat another chunk's text; compared with the previous output (by chunk
/// id), chunks are `added`, `changed` or `unchanged` (their vector reused),
/// and `removed` ones are gone.
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
    pub embedded: u64,
    pub reused: u64,
    pub resumed: u64,
    pub deduplicated: u64,
    pub added: u64,
    pub changed: u64,
    pub unchanged: u64,
    pub removed: u64,
    /// Local token count of the chunks sent.
    pub estimated_tokens: u64,
    /// Local token count of the chunks not sent because their vector was at hand.
    pub tokens_saved: u64,
    pub usage: Usage,
    /// Billed by earlier, unfinished runs for vectors this run reused.
    pub resumed_usage: Usage,
    pub requests: u64,
    pub retries: u64,
    pub invalid_responses: u64,
    pub throttled: u64,
    pub cost: Option<f64>,
    /// Why the run stopped before the end, when it did.
    pub stopped: Option<String>,
    pub elapsed_seconds: f64,
    pub chunks_per_second: f64,
    pub exit_code: u8,
}

/// Repeats of chunks sent in this run are read back this many at a time.
const REUSE_BATCH: usize = 256;

/// Runs a job with the given backend and chunker, to the end or until asked
/// to stop.
#[allow(clippy::too_many_lines)]
pub async fn run(
    job: &Job,
    backend: Arc<dyn EmbeddingBackend>,
    chunker: Arc<dyn Chunker>,
    options: RunOptions,
) -> Result<Summary, RunError> {
    let started = Instant::now();
    let info = backend.info().clone();
    let fingerprint = Fingerprint::new(job, &info);
    let output_path = job.output.path.clone();
    let lock = JobLock::acquire(&output_path)?;
    if let (Some(previous), true) = (&lock.taken_over, options.progress) {
        eprintln!(
            "embedjob: {}: taking over from a run that is gone ({previous})",
            lock.path().display()
        );
    }
    let source = source::open(&job.source)?;
    let checkpoint = Checkpoint::open(&job.name, &output_path, &fingerprint, options.fresh)?;
    let (store, previous_ids, checkpoint) = {
        let output = output_path.clone();
        let fresh = options.fresh;
        tokio::task::spawn_blocking(move || {
            checkpoint::load_store(&output, &checkpoint, fresh).map(|(s, i)| (s, i, checkpoint))
        })
        .await
        .map_err(|e| {
            RunError::Internal(format!(
                "reading the stored vectors stopped unexpectedly: {e}"
            ))
        })??
    };
    let earlier = store.earlier();
    let capacity = job.pipeline.channel_capacity;
    let mut display = Progress::new(
        Mode::for_stderr(options.progress),
        job.pipeline.progress_seconds,
    );
    let chunker = display.counting(chunker);
    let halt = Arc::new(AtomicBool::new(false));
    // Chunks done without a request (reused or repeated), for the progress display.
    let settled = Arc::new(AtomicU64::new(0));

    let (sink_tx, sink_rx) = mpsc::channel::<SinkMessage>(capacity);
    let (batch_tx, mut batch_rx) = mpsc::channel::<Result<Batch, RunError>>(capacity);
    let reader = {
        let chunker = Arc::clone(&chunker);
        let reading = Reading {
            store,
            previous_ids,
            scheduled: HashSet::new(),
            batcher: Batcher::for_backend(&job.backend),
            halt: Arc::clone(&halt),
            settled: Arc::clone(&settled),
            batches: batch_tx,
            sink: sink_tx.clone(),
            reuse: Vec::new(),
            reuse_batch: job.backend.max_inputs_per_request.max(1),
            report: ReadReport::default(),
        };
        tokio::task::spawn_blocking(move || reading.run(source, chunker.as_ref()))
    };

    let writer = {
        let writing = Writing {
            output: job.output.clone(),
            parts: PartWriter::new(
                checkpoint,
                &info.model,
                &info.kind.to_string(),
                job.output.row_group_bytes,
            ),
            fingerprint: fingerprint.to_json(),
        };
        tokio::task::spawn_blocking(move || writing.run(sink_rx))
    };

    let budget = job.budget.max_cost.map(|max_cost| {
        Arc::new(Budget::new(
            max_cost,
            info.input_per_1k.unwrap_or(0.0) / 1000.0,
        ))
    });
    let batches = {
        let halt = Arc::clone(&halt);
        let budget = budget.clone();
        futures::stream::poll_fn(move |cx| {
            if halt.load(Ordering::Relaxed) {
                return Poll::Ready(None);
            }
            match batch_rx.poll_recv(cx) {
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
        })
    };
    let backend_for_requests = Arc::clone(&backend);
    let mut results = batches
        .map(move |item| {
            let backend = Arc::clone(&backend_for_requests);
            async move {
                match item {
                    Ok(batch) => embed_or_split(backend.as_ref(), batch).await,
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(job.backend.concurrency);

    let mut usage = Usage::default();
    let mut failure = None;
    let mut stopped: Option<String> = None;
    let mut drain_until: Option<tokio::time::Instant> = None;
    let deadline = options
        .max_duration
        .map(|d| tokio::time::Instant::from_std(started) + d);
    let mut stop_rx = options.stop;
    let mut ticker = tokio::time::interval(display.interval());
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut embedded = 0u64;
    let mut writer_stopped = false;
    'run: loop {
        let stop_changed = async {
            match stop_rx.as_mut() {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        let time_limit = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
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
            () = stop_changed => {
                let request = stop_rx.as_ref().map(|rx| rx.borrow().clone());
                match request {
                    Some(StopRequest::Graceful(reason)) if stopped.is_none() => {
                        stopped = Some(reason);
                        halt.store(true, Ordering::Relaxed);
                        drain_until = Some(tokio::time::Instant::now()
                            + Duration::from_secs_f64(job.backend.timeout_seconds));
                    }
                    Some(StopRequest::Now(reason)) => {
                        stopped.get_or_insert(reason);
                        halt.store(true, Ordering::Relaxed);
                        break;
                    }
                    _ => {}
                }
                continue;
            }
            () = time_limit, if stopped.is_none() => {
                stopped = Some(format!(
                    "the time limit of {:.0}s was reached",
                    options.max_duration.unwrap_or_default().as_secs_f64()
                ));
                halt.store(true, Ordering::Relaxed);
                drain_until = Some(tokio::time::Instant::now()
                    + Duration::from_secs_f64(job.backend.timeout_seconds));
                continue;
            }
            () = drained => break,
            _ = ticker.tick(), if display.is_on() => {
                let done = reader.is_finished();
                let chunks = embedded + settled.load(Ordering::Relaxed);
                display.update(&Snapshot::of(chunks, &usage, &backend.stats(), done));
                continue;
            }
        };
        match result {
            Ok(pieces) => {
                if let Some(budget) = &budget {
                    budget.settle(&pieces);
                }
                for piece in pieces {
                    let message = match piece {
                        Piece::Embedded(batch) => {
                            usage += batch.vectors.usage;
                            embedded += batch.chunks.len() as u64;
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
    if stopped.is_none() {
        stopped = budget.as_ref().and_then(|b| b.exceeded());
    }
    // Dropping the stream cancels requests still in flight and stops the reader.
    halt.store(true, Ordering::Relaxed);
    drop(results);
    display.finish(&Snapshot::of(
        embedded + settled.load(Ordering::Relaxed),
        &usage,
        &backend.stats(),
        reader.is_finished(),
    ));
    let read = reader
        .await
        .map_err(|e| RunError::Internal(format!("the reading stage stopped unexpectedly: {e}")));
    if writer_stopped {
        drop(sink_tx);
        return Err(match writer.await {
            Ok(Err(e)) => e,
            Ok(Ok(_)) => RunError::Internal("the writing stage stopped early".to_string()),
            Err(e) => RunError::Internal(format!("the writing stage stopped unexpectedly: {e}")),
        });
    }
    let read = match read {
        Ok(read) => read,
        Err(e) => {
            failure.get_or_insert(e);
            ReadReport::default()
        }
    };
    let failure = failure.or_else(|| {
        (stopped.is_none() && read.chunks == 0).then(|| {
            RunError::Source(SourceError::Empty {
                input: source::describe_input(&job.source),
            })
        })
    });
    let stats: BackendStats = backend.stats();
    let cost_of = |usage: Usage| {
        info.input_per_1k
            .map(|price| usage.prompt_tokens as f64 / 1000.0 * price)
    };
    let cost = cost_of(usage);
    let message = if failure.is_some() || stopped.is_some() {
        // Keeps what was paid for in the checkpoint; the output is left as it was.
        SinkMessage::Stop
    } else {
        let mut total = usage;
        total += earlier.usage;
        SinkMessage::Finish(OutputMetadata {
            model: info.model.clone(),
            dimensions: 0,
            backend: info.kind.to_string(),
            usage: total,
            requests: stats.requests + earlier.requests,
            cost: cost_of(total),
            extra: Default::default(),
        })
    };
    let _ = sink_tx.send(message).await;
    drop(sink_tx);
    let written = writer
        .await
        .map_err(|e| RunError::Internal(format!("the writing stage stopped unexpectedly: {e}")));
    if let Some(error) = failure {
        return Err(error);
    }
    let written = written??;
    drop(lock);

    let elapsed = started.elapsed().as_secs_f64();
    let exit = if stopped.is_some() {
        Exit::Stopped
    } else if written.quarantined > 0 {
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
        embedded,
        reused: read.reused,
        resumed: read.resumed,
        deduplicated: read.deduplicated,
        added: read.added,
        changed: read.changed,
        unchanged: read.unchanged,
        removed: if stopped.is_none() { read.removed } else { 0 },
        estimated_tokens: read.sent_tokens,
        tokens_saved: read.tokens_saved,
        usage,
        resumed_usage: earlier.usage,
        requests: stats.requests,
        retries: stats.retries,
        invalid_responses: stats.invalid_responses,
        throttled: stats.throttled,
        cost,
        stopped,
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

/// `budget.max_cost`: a request is sent only if what was billed, what is in
/// flight (by local token count) and the request itself stay within it.
struct Budget {
    max_cost: f64,
    price_per_token: f64,
    state: std::sync::Mutex<BudgetState>,
}

#[derive(Default)]
struct BudgetState {
    billed_tokens: u64,
    in_flight_tokens: u64,
    exceeded: Option<String>,
}

impl Budget {
    fn new(max_cost: f64, price_per_token: f64) -> Budget {
        Budget {
            max_cost,
            price_per_token,
            state: std::sync::Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reserves a request of `tokens`, unless it would take the run over budget.
    fn admit(&self, tokens: u64) -> bool {
        let mut state = self.state();
        let spent = state.billed_tokens as f64 * self.price_per_token;
        let projected =
            (state.billed_tokens + state.in_flight_tokens + tokens) as f64 * self.price_per_token;
        if projected > self.max_cost {
            state.exceeded.get_or_insert_with(|| {
                format!(
                    "stopped at the budget of {}: {spent:.6} billed, the next request would bring it to {projected:.6}",
                    self.max_cost
                )
            });
            return false;
        }
        state.in_flight_tokens += tokens;
        true
    }

    /// Replaces a finished request's reservation with what it was billed.
    fn settle(&self, pieces: &[Piece]) {
        let (mut reserved, mut billed) = (0u64, 0u64);
        for piece in pieces {
            match piece {
                Piece::Embedded(batch) => {
                    reserved += batch
                        .chunks
                        .iter()
                        .map(|c| u64::from(c.token_count))
                        .sum::<u64>();
                    billed += batch.vectors.usage.prompt_tokens;
                }
                Piece::Quarantined { chunk, .. } => reserved += u64::from(chunk.token_count),
            }
        }
        let mut state = self.state();
        state.in_flight_tokens = state.in_flight_tokens.saturating_sub(reserved);
        state.billed_tokens += billed;
    }

    fn exceeded(&self) -> Option<String> {
        self.state().exceeded.clone()
    }
}

#[derive(Debug, Default)]
struct ReadReport {
    source: SourceStats,
    chunks: u64,
    sent_tokens: u64,
    reused: u64,
    resumed: u64,
    deduplicated: u64,
    added: u64,
    changed: u64,
    unchanged: u64,
    removed: u64,
    tokens_saved: u64,
}

/// The reading stage: reads, chunks, and sorts each chunk into one to send,
/// one whose vector is stored, or a repeat of one already sent.
struct Reading {
    store: Store,
    /// Ids of the previous output's chunks not yet seen in this run.
    previous_ids: HashSet<u64>,
    /// The first 64 bits of the content hashes sent in this run: 8 bytes a
    /// chunk. Two texts sharing them (about one run in 10^7 at a million
    /// chunks) make the second look like a repeat; the writer then finds no
    /// vector under its full hash and fails the run, and the next run, which
    /// finds the first text in the checkpoint, sends the second.
    scheduled: HashSet<u64>,
    batcher: Batcher,
    halt: Arc<AtomicBool>,
    settled: Arc<AtomicU64>,
    batches: mpsc::Sender<Result<Batch, RunError>>,
    sink: mpsc::Sender<SinkMessage>,
    reuse: Vec<(Chunk, Location)>,
    reuse_batch: usize,
    report: ReadReport,
}

impl Reading {
    /// Runs on a blocking thread. An error is sent down the batch channel
    /// like a batch, so the run sees it in order.
    fn run(mut self, mut source: Box<dyn source::Source>, chunker: &dyn Chunker) -> ReadReport {
        let outcome = self.read_all(source.as_mut(), chunker);
        self.report.source = source.stats();
        if let Err(e) = outcome {
            let _ = self.batches.blocking_send(Err(e));
        }
        self.report
    }

    fn read_all(
        &mut self,
        source: &mut dyn source::Source,
        chunker: &dyn Chunker,
    ) -> Result<(), RunError> {
        loop {
            if self.halt.load(Ordering::Relaxed) {
                return Ok(());
            }
            let Some(document) = source.next_document()? else {
                break;
            };
            for chunk in chunker.chunk(&document) {
                if !self.sort(chunk)? {
                    return Ok(());
                }
            }
        }
        self.flush_reuse()?;
        if let Some(batch) = self.batcher.finish() {
            let _ = self.batches.blocking_send(Ok(batch));
        }
        self.report.removed = self.previous_ids.len() as u64;
        Ok(())
    }

    /// Sends, reuses or defers one chunk; `false` once the run wants nothing more.
    fn sort(&mut self, chunk: Chunk) -> Result<bool, RunError> {
        let report = &mut self.report;
        report.chunks += 1;
        let tokens = u64::from(chunk.token_count);
        let known_id = self.previous_ids.remove(&id_key(&chunk.id));
        let located = self.store.locate(&chunk.content_hash);
        match located {
            Some((_, Origin::Previous)) => {
                report.unchanged += 1;
                report.reused += 1;
            }
            _ if known_id => report.changed += 1,
            _ => report.added += 1,
        }
        if let Some((location, origin)) = located {
            if origin == Origin::Checkpoint {
                report.resumed += 1;
            }
            report.tokens_saved += tokens;
            self.settled.fetch_add(1, Ordering::Relaxed);
            self.reuse.push((chunk, location));
            // As many as a request holds, so that the writer's queue holds no more memory than with new vectors.
            if self.reuse.len() >= self.reuse_batch {
                return self.flush_reuse();
            }
            return Ok(true);
        }
        if !self
            .scheduled
            .insert((checkpoint::hash_key(&chunk.content_hash) >> 64) as u64)
        {
            report.deduplicated += 1;
            report.tokens_saved += tokens;
            self.settled.fetch_add(1, Ordering::Relaxed);
            return Ok(self
                .sink
                .blocking_send(SinkMessage::Duplicate(chunk))
                .is_ok());
        }
        report.sent_tokens += tokens;
        if let Some(batch) = self.batcher.push(chunk) {
            // A closed channel means the run stopped; nothing more is wanted.
            return Ok(self.batches.blocking_send(Ok(batch)).is_ok());
        }
        Ok(true)
    }

    /// Reads the stored vectors of the chunks waiting for them and passes
    /// them to the writer.
    fn flush_reuse(&mut self) -> Result<bool, RunError> {
        if self.reuse.is_empty() {
            return Ok(true);
        }
        let pending = std::mem::take(&mut self.reuse);
        let wanted: Vec<(Location, [u8; 32])> =
            pending.iter().map(|(c, l)| (*l, c.content_hash)).collect();
        let values = self.store.fetch(&wanted)?;
        let dimensions = self.store.dimensions().unwrap_or(0);
        let chunks = pending.into_iter().map(|(c, _)| c).collect();
        let batch = EmbeddedBatch {
            chunks,
            vectors: Vectors {
                dimensions,
                values,
                usage: Usage::default(),
            },
        };
        Ok(self.sink.blocking_send(SinkMessage::Reused(batch)).is_ok())
    }
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
    Finish(OutputMetadata),
    /// Commit what was paid for and leave the output as it was.
    Stop,
}

#[derive(Default)]
struct Written {
    report: Option<SinkReport>,
    dimensions: Option<usize>,
    quarantined: u64,
}

/// The writing stage: the output, the failures file and the checkpoint.
struct Writing {
    output: crate::job::OutputConfig,
    parts: PartWriter,
    fingerprint: String,
}

struct Outputs {
    parquet: Option<Box<ParquetSink>>,
    failures: FailuresFile,
    quarantined: u64,
    /// Reasons for quarantined chunks, by content hash, for their repeats.
    quarantine_reasons: HashMap<u128, (String, Option<u16>)>,
    duplicates: Vec<Chunk>,
}

impl Writing {
    /// Runs on a blocking thread. Whatever happens, vectors paid for are
    /// committed to the checkpoint before it returns.
    fn run(mut self, mut rx: mpsc::Receiver<SinkMessage>) -> Result<Written, RunError> {
        let mut outputs = Outputs {
            parquet: None,
            failures: FailuresFile::new(&self.output.path),
            quarantined: 0,
            quarantine_reasons: HashMap::new(),
            duplicates: Vec::new(),
        };
        let result = self.receive(&mut rx, &mut outputs);
        let committed = self.parts.commit();
        match result {
            Ok(Some(metadata)) => {
                committed?;
                self.finish(outputs, &metadata)
            }
            Ok(None) => {
                outputs.abort();
                committed?;
                Ok(Written::default())
            }
            Err(e) => {
                outputs.abort();
                Err(e)
            }
        }
    }

    /// Handles messages until `Finish` (its metadata returned) or `Stop`.
    fn receive(
        &mut self,
        rx: &mut mpsc::Receiver<SinkMessage>,
        outputs: &mut Outputs,
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
                    outputs.write(&self.output, &batch)?;
                }
                SinkMessage::Reused(batch) => outputs.write(&self.output, &batch)?,
                SinkMessage::Duplicate(chunk) => outputs.duplicates.push(chunk),
                SinkMessage::Quarantine {
                    chunk,
                    reason,
                    status,
                } => {
                    outputs.quarantine(&chunk, &reason, status)?;
                    outputs
                        .quarantine_reasons
                        .insert(checkpoint::hash_key(&chunk.content_hash), (reason, status));
                }
                SinkMessage::Finish(metadata) => return Ok(Some(metadata)),
                SinkMessage::Stop => return Ok(None),
            }
        }
    }

    /// Writes the repeats of chunks sent in this run, completes the output and
    /// removes the checkpoint it now holds.
    fn finish(self, mut outputs: Outputs, metadata: &OutputMetadata) -> Result<Written, RunError> {
        if let Err(e) = self.write_duplicates(&mut outputs) {
            outputs.abort();
            return Err(e);
        }
        let Outputs {
            parquet,
            failures,
            quarantined,
            ..
        } = outputs;
        let dimensions = parquet.as_ref().map(|s| s.dimensions());
        let mut metadata = metadata.clone();
        metadata.dimensions = dimensions.unwrap_or(0);
        metadata
            .extra
            .insert(FINGERPRINT_KEY.to_string(), self.fingerprint.clone());
        let report = match parquet {
            Some(sink) => Some(sink.finish(&metadata)?),
            None => None,
        };
        failures.finish()?;
        self.parts.remove_checkpoint()?;
        Ok(Written {
            report,
            dimensions,
            quarantined,
        })
    }

    /// Repeated chunks take the vector their first copy got, read back from
    /// this run's parts, or its quarantine.
    fn write_duplicates(&self, outputs: &mut Outputs) -> Result<(), RunError> {
        if outputs.duplicates.is_empty() {
            return Ok(());
        }
        let mut store = Store::new();
        for part in self.parts.committed() {
            store.add(part, Origin::Checkpoint, None)?;
        }
        let duplicates = std::mem::take(&mut outputs.duplicates);
        let mut found = Vec::new();
        for chunk in duplicates {
            if let Some((location, _)) = store.locate(&chunk.content_hash) {
                found.push((chunk, location));
            } else if let Some((reason, status)) = outputs
                .quarantine_reasons
                .get(&checkpoint::hash_key(&chunk.content_hash))
                .cloned()
            {
                outputs.quarantine(&chunk, &reason, status)?;
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
                },
            };
            outputs.write(&self.output, &batch)?;
        }
        Ok(())
    }
}

impl Outputs {
    fn write(
        &mut self,
        config: &crate::job::OutputConfig,
        batch: &EmbeddedBatch,
    ) -> Result<(), RunError> {
        if self.parquet.is_none() {
            let sink = ParquetSink::create(
                &config.path,
                batch.vectors.dimensions,
                config.include_text,
                config.row_group_bytes,
            )?;
            self.parquet = Some(Box::new(sink));
        }
        if let Some(sink) = self.parquet.as_mut() {
            sink.write(batch)?;
        }
        Ok(())
    }

    fn quarantine(
        &mut self,
        chunk: &Chunk,
        reason: &str,
        status: Option<u16>,
    ) -> Result<(), RunError> {
        self.quarantined += 1;
        self.failures.record(chunk, reason, status)?;
        Ok(())
    }

    /// Drops the partial output and failures file.
    fn abort(self) {
        if let Some(sink) = self.parquet {
            sink.abort();
        }
        self.failures.abort();
    }
}
