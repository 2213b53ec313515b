//! The dispatching stage, on the async runtime: keeps up to `concurrency`
//! requests in flight, splits a request the service finds too large, and
//! passes every answer to the writer as it arrives, until the batches run
//! out, the run fails, or it is asked to stop.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::{mpsc, watch};

use super::rechunk::Rechunker;
use super::stop::{Budget, Settled, Stopping, Stops};
use super::write::SinkMessage;
use super::RunError;
use crate::backend::{BackendError, EmbeddingBackend, Kept, RequestLimit};
use crate::batch::{Batch, Batcher};
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
    /// A chunk refused as over the model's window, cut in pieces sent in
    /// its place (see [`Rechunker`]).
    Rechunked {
        chunk: Chunk,
        reason: String,
    },
}

/// One request's answer: the pieces paid for, and the error that ended it
/// early, if one did. A request split in parts keeps the parts answered
/// before a later one failed: they were billed.
pub(super) struct Answer {
    pieces: Vec<Piece>,
    error: Option<RunError>,
}

impl Answer {
    fn done(pieces: Vec<Piece>) -> Answer {
        Answer {
            pieces,
            error: None,
        }
    }

    fn failed(error: RunError) -> Answer {
        Answer {
            pieces: Vec::new(),
            error: Some(error),
        }
    }

    /// Adds the answer of a part sent beside this one's: its pieces, and
    /// its error when none came before.
    fn merge(&mut self, other: Answer) {
        self.pieces.extend(other.pieces);
        if self.error.is_none() {
            self.error = other.error;
        }
    }

    /// Adds a later part's answer; `false` once one failed, so that no
    /// further part is sent.
    fn extend(&mut self, later: Answer) -> bool {
        self.pieces.extend(later.pieces);
        self.error = later.error;
        self.error.is_none()
    }
}

/// What a request's pieces settle in the budget: the tokens they reserved
/// (their local count), what they were billed, and the local count of
/// those that brought vectors.
fn reckoned(pieces: &[Piece]) -> Settled {
    let mut settled = Settled::default();
    for piece in pieces {
        match piece {
            Piece::Embedded(batch) => {
                let tokens = batch
                    .chunks
                    .iter()
                    .map(|c| u64::from(c.token_count))
                    .sum::<u64>();
                settled.reserved += tokens;
                settled.embedded += tokens;
                settled.billed += batch.vectors.usage;
            }
            Piece::Quarantined { chunk, .. } | Piece::Rechunked { chunk, .. } => {
                settled.reserved += u64::from(chunk.token_count);
            }
        }
    }
    settled
}

/// How the dispatching stage ended.
#[derive(Default)]
pub(super) struct Dispatched {
    /// Billed by the requests whose vectors went to the writer.
    pub usage: Usage,
    /// Of `usage`, what paid for vectors that failed a check.
    pub discarded: Usage,
    /// Chunks embedded by those requests.
    pub embedded: u64,
    /// Their local token count.
    pub local_tokens: u64,
    /// Batches whose vectors went to the writer.
    pub batches: u64,
    pub stopped: Option<String>,
    pub failure: Option<RunError>,
    /// The writer stopped taking messages: it failed.
    pub writer_stopped: bool,
    /// In batch mode, what was collected, sent and left pending.
    pub batch: Option<super::collect::BatchSummary>,
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
    /// What the service's refusals taught about the size of requests.
    pub limits: Arc<Limits>,
    /// Cuts the chunks the model refuses as over its window.
    pub rechunk: Arc<Rechunker>,
    pub exposure: Exposure,
}

/// What a kill can lose, bounded: a request is sent only while the texts
/// answered and not yet committed to the checkpoint are at most `most`. With
/// `most` = concurrency × max inputs per request, the texts paid for and not
/// committed at any instant are at most twice that: the requests in flight,
/// and as many answered ones waiting for their commit.
pub(super) struct Exposure {
    /// Texts whose vectors went to the writer.
    delivered: Arc<AtomicU64>,
    /// Rows the writer committed to the checkpoint.
    committed: watch::Receiver<u64>,
    most: u64,
}

impl Exposure {
    pub(super) fn new(committed: watch::Receiver<u64>, most: u64) -> Exposure {
        Exposure {
            delivered: Arc::default(),
            committed,
            most,
        }
    }

    /// Waits until a request may be sent; `false` if the writer is gone.
    async fn wait(delivered: &AtomicU64, committed: &mut watch::Receiver<u64>, most: u64) -> bool {
        committed
            .wait_for(|&rows| delivered.load(Ordering::Relaxed).saturating_sub(rows) <= most)
            .await
            .is_ok()
    }
}

/// Limits on requests learned from the service during a run: a request it
/// refused as too large, or that timed out, is sent again in smaller ones,
/// and so is every later request that would go over.
#[derive(Debug)]
pub(super) struct Limits {
    inputs: AtomicUsize,
    tokens: AtomicU64,
    /// The least size, in tokens, the service's token quota had a batch
    /// cut to ([`BackendError::Cut`]).
    quota: AtomicU64,
    notes: Mutex<Vec<String>>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            inputs: AtomicUsize::new(usize::MAX),
            tokens: AtomicU64::new(u64::MAX),
            quota: AtomicU64::new(u64::MAX),
            notes: Mutex::default(),
        }
    }
}

impl Limits {
    /// The most inputs a request may hold, once learned.
    pub(super) fn inputs(&self) -> Option<usize> {
        Some(self.inputs.load(Ordering::Relaxed)).filter(|&n| n != usize::MAX)
    }

    /// The most tokens a request may hold, once learned.
    pub(super) fn tokens(&self) -> Option<u64> {
        Some(self.tokens.load(Ordering::Relaxed)).filter(|&n| n != u64::MAX)
    }

    /// The least number of tokens the service's quota cut requests to.
    pub(super) fn quota_tokens(&self) -> Option<u64> {
        Some(self.quota.load(Ordering::Relaxed)).filter(|&n| n != u64::MAX)
    }

    pub(super) fn notes(&self) -> Vec<String> {
        self.notes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Lowers the limit `batch` went over so that it no longer fits: to what
    /// the service said, or else to half of the batch.
    fn lower(&self, limit: RequestLimit, batch: &Batch, message: &str) {
        let len = batch.len();
        let (what, value) = match limit {
            RequestLimit::Inputs(Some(most)) if most < len => ("inputs", most as u64),
            RequestLimit::Inputs(_) | RequestLimit::Time => ("inputs", len.div_ceil(2) as u64),
            RequestLimit::Tokens(Some(most)) if most < batch.tokens => ("tokens", most),
            RequestLimit::Tokens(_) => ("tokens", (batch.tokens / 2).max(1)),
        };
        let before = if what == "inputs" {
            let value = usize::try_from(value).unwrap_or(usize::MAX);
            self.inputs.fetch_min(value, Ordering::Relaxed) as u64
        } else {
            self.tokens.fetch_min(value, Ordering::Relaxed)
        };
        if value < before {
            let why = match limit {
                RequestLimit::Time => format!("a request of {len} inputs timed out ({message})"),
                _ => format!(
                    "the service refused a request of {len} inputs and {} tokens ({message})",
                    batch.tokens
                ),
            };
            self.notes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(format!(
                    "{why}: requests of at most {value} {what} for the rest of the run"
                ));
        }
    }

    /// `batch`, cut in order into requests within the limits learned so far.
    fn fit(&self, batch: Batch) -> Vec<Batch> {
        let inputs = self.inputs.load(Ordering::Relaxed);
        let tokens = self.tokens.load(Ordering::Relaxed);
        cut(batch, inputs, tokens)
    }

    /// `batch`, cut in order into parts of at most `most` tokens, the size
    /// the service's quota asks for: two at least, as the service's quota
    /// hands back only a batch of several chunks holding more.
    fn cut_for_quota(&self, batch: Batch, most: u64) -> Vec<Batch> {
        self.quota.fetch_min(most, Ordering::Relaxed);
        cut(batch, usize::MAX, most)
    }
}

/// `batch`, cut in order into batches of at most `inputs` chunks and
/// `tokens` tokens (a chunk larger alone).
fn cut(batch: Batch, inputs: usize, tokens: u64) -> Vec<Batch> {
    if batch.len() <= inputs && batch.tokens <= tokens {
        return vec![batch];
    }
    let mut batcher = Batcher::new(inputs, tokens);
    let mut pieces: Vec<Batch> = batch
        .chunks
        .into_iter()
        .flat_map(|chunk| batcher.push(chunk))
        .collect();
    pieces.extend(batcher.finish());
    pieces
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
            let Answer { pieces, error } = result;
            if let Some(budget) = &self.budget {
                budget.settle(reckoned(&pieces));
            }
            // What a request paid for goes to the writer even when a later part of it failed.
            if !pieces.is_empty() && !self.deliver(pieces, sink, &mut out).await {
                out.writer_stopped = true;
                break;
            }
            match error {
                None => {}
                Some(RunError::Backend {
                    error: BackendError::Quota(stop),
                    ..
                }) => {
                    // The quota stops the run, resumable: wait for the
                    // requests in flight, which were paid for.
                    self.halt.store(true, Ordering::Relaxed);
                    if out.stopped.is_none() {
                        out.stopped = Some(format!("stopped because {stop}"));
                        drain_until = Some(tokio::time::Instant::now() + self.drain);
                    }
                }
                Some(e) => {
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
        for piece in pieces {
            let message = match piece {
                Piece::Embedded(batch) => {
                    self.exposure
                        .delivered
                        .fetch_add(batch.chunks.len() as u64, Ordering::Relaxed);
                    out.usage += batch.vectors.usage;
                    out.discarded += batch.vectors.discarded;
                    out.embedded += batch.chunks.len() as u64;
                    out.local_tokens += batch
                        .chunks
                        .iter()
                        .map(|c| u64::from(c.token_count))
                        .sum::<u64>();
                    out.batches += 1;
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
                Piece::Rechunked { chunk, reason } => SinkMessage::Rechunked { chunk, reason },
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
        batches: mpsc::Receiver<Result<Batch, RunError>>,
    ) -> impl Stream<Item = Answer> + Unpin + '_ {
        let halt = Arc::clone(&self.halt);
        let budget = self.budget.clone();
        let delivered = Arc::clone(&self.exposure.delivered);
        let committed = self.exposure.committed.clone();
        let most = self.exposure.most;
        let start = (batches, committed, None::<Batch>);
        let admitted =
            futures::stream::unfold(start, move |(mut batches, mut committed, mut rest)| {
                let (halt, budget, delivered) =
                    (Arc::clone(&halt), budget.clone(), Arc::clone(&delivered));
                async move {
                    if halt.load(Ordering::Relaxed) {
                        return None;
                    }
                    let batch = match rest.take() {
                        Some(batch) => batch,
                        None => match batches.recv().await? {
                            Ok(batch) => batch,
                            Err(e) => return Some((Err(e), (batches, committed, None))),
                        },
                    };
                    // Checked once the batch is at hand: answers may have come meanwhile.
                    if !Exposure::wait(&delivered, &mut committed, most).await
                        || halt.load(Ordering::Relaxed)
                    {
                        return None;
                    }
                    let halted = || halt.load(Ordering::Relaxed);
                    let mut batch = batch;
                    if let Some(budget) = &budget {
                        // The request that tells how the service bills goes
                        // with one chunk (see `Budget::next_tells`).
                        if budget.next_tells() {
                            (batch, rest) = batch.split_first();
                        }
                        if !budget.admit(batch.tokens, halted).await {
                            // The batch is left for a later run.
                            halt.store(true, Ordering::Relaxed);
                            return None;
                        }
                    }
                    Some((Ok(batch), (batches, committed, rest)))
                }
            })
            .boxed();
        let backend = Arc::clone(&self.backend);
        let limits = Arc::clone(&self.limits);
        let rechunk = Arc::clone(&self.rechunk);
        admitted
            .map(move |item| {
                let backend = Arc::clone(&backend);
                let limits = Arc::clone(&limits);
                let rechunk = Arc::clone(&rechunk);
                async move {
                    match item {
                        Ok(batch) => {
                            embed_or_split(backend.as_ref(), batch, &limits, &rechunk).await
                        }
                        Err(e) => Answer::failed(e),
                    }
                }
            })
            .buffer_unordered(self.concurrency)
    }
}

/// Embeds a batch within the limits learned so far. A batch with an input
/// the service finds too large is split in half until that input is alone,
/// and then cut to fit the window the refusal states (or quarantined, when
/// it states none); a batch over a limit on whole requests lowers the
/// limit for the rest of the run and is sent again in smaller requests.
/// When a part fails, the parts answered before it are kept in the answer.
fn embed_or_split<'a>(
    backend: &'a dyn EmbeddingBackend,
    batch: Batch,
    limits: &'a Limits,
    rechunk: &'a Rechunker,
) -> futures::future::BoxFuture<'a, Answer> {
    async move {
        let mut fitted = limits.fit(batch);
        if fitted.len() > 1 {
            let mut answer = Answer::done(Vec::new());
            for part in fitted {
                if !answer.extend(embed_or_split(backend, part, limits, rechunk).await) {
                    break;
                }
            }
            return answer;
        }
        let Some(batch) = fitted.pop() else {
            return Answer::done(Vec::new());
        };
        let texts: Vec<&str> = batch.chunks.iter().map(|c| c.text.as_str()).collect();
        let result = backend.embed(&texts, batch.tokens).await;
        drop(texts);
        match result {
            Ok(vectors) => Answer::done(vec![Piece::Embedded(EmbeddedBatch {
                chunks: batch.chunks,
                vectors,
            })]),
            Err(BackendError::Partial { kept, error })
                if kept.inputs.len() == kept.vectors.len()
                    && kept.inputs.windows(2).all(|w| w[0] < w[1])
                    && kept.inputs.last().is_some_and(|&i| i < batch.len()) =>
            {
                // The good vectors were paid for: kept, whatever becomes of the rest.
                let (embedded, rest) = keep(batch, *kept);
                let mut answer = Answer::done(vec![Piece::Embedded(embedded)]);
                answer.extend(on_error(backend, rest, *error, limits, rechunk).await);
                answer
            }
            Err(error) => on_error(backend, batch, error, limits, rechunk).await,
        }
    }
    .boxed()
}

/// What becomes of a batch the service did not embed: split, sent in
/// smaller requests, quarantined, or the run's failure.
fn on_error<'a>(
    backend: &'a dyn EmbeddingBackend,
    batch: Batch,
    error: BackendError,
    limits: &'a Limits,
    rechunk: &'a Rechunker,
) -> futures::future::BoxFuture<'a, Answer> {
    async move {
        match error {
            BackendError::TooLarge { status, message } => match batch.split_in_half() {
                Ok((left, right)) => {
                    let mut answer = embed_or_split(backend, left, limits, rechunk).await;
                    if answer.error.is_none() {
                        answer.extend(embed_or_split(backend, right, limits, rechunk).await);
                    }
                    answer
                }
                Err(lone) => {
                    let pieces = lone
                        .chunks
                        .first()
                        .and_then(|c| rechunk.pieces(c, &message));
                    match (pieces, lone.chunks.into_iter().next()) {
                        (Some(pieces), Some(chunk)) => {
                            let mut answer = Answer::done(vec![Piece::Rechunked {
                                chunk,
                                reason: message,
                            }]);
                            answer.extend(
                                embed_or_split(backend, Batch::new(pieces), limits, rechunk).await,
                            );
                            answer
                        }
                        (_, chunk) => Answer::done(quarantine(
                            Batch::new(chunk.into_iter().collect()),
                            &message,
                            status,
                        )),
                    }
                }
            },
            BackendError::Cut { most } => {
                // Every part a request of its own, all in flight together:
                // what was answered is kept, whatever becomes of the others.
                let parts = limits.cut_for_quota(batch, most).into_iter();
                let answers = futures::future::join_all(
                    parts.map(|part| embed_or_split(backend, part, limits, rechunk)),
                )
                .await;
                let mut all = Answer::done(Vec::new());
                for answer in answers {
                    all.merge(answer);
                }
                all
            }
            BackendError::OverLimit {
                limit,
                status,
                message,
            } => {
                if batch.len() < 2 {
                    return Answer::done(quarantine(batch, &message, status));
                }
                limits.lower(limit, &batch, &message);
                if limits.fit(batch.clone()).len() < 2 {
                    // Tokens too few to halve: halve the inputs instead.
                    limits.lower(RequestLimit::Inputs(None), &batch, &message);
                }
                embed_or_split(backend, batch, limits, rechunk).await
            }
            error => Answer::failed(RunError::Backend {
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

/// A batch parted into the chunks `kept` has vectors for, and the rest.
fn keep(batch: Batch, kept: Kept) -> (EmbeddedBatch, Batch) {
    let mut inputs = kept.inputs.iter().peekable();
    let (mut chunks, mut rest) = (Vec::new(), Vec::new());
    for (index, chunk) in batch.chunks.into_iter().enumerate() {
        if inputs.next_if_eq(&&index).is_some() {
            chunks.push(chunk);
        } else {
            rest.push(chunk);
        }
    }
    (
        EmbeddedBatch {
            chunks,
            vectors: kept.vectors,
        },
        Batch::new(rest),
    )
}

/// A lone chunk the service refuses, with its reason.
fn quarantine(batch: Batch, reason: &str, status: Option<u16>) -> Vec<Piece> {
    batch
        .chunks
        .into_iter()
        .map(|chunk| Piece::Quarantined {
            chunk,
            reason: reason.to_string(),
            status,
        })
        .collect()
}
