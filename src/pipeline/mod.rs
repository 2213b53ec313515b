//! Wires a job's built stages together:
//! `source → chunk → classify → batch` on a reading thread ([`read`]),
//! requests in flight on the async runtime ([`dispatch`]), and the sink and
//! checkpoint on a writing thread ([`write`]), joined by bounded channels so
//! that memory does not grow with the input.
//!
//! Every vector paid for is committed to the job's checkpoint as soon as it
//! arrives, and chunks whose vector is already stored (held by the sink, or
//! in the checkpoint, see [`crate::state`]) are not sent again.

mod batch_mode;
mod bill;
mod build;
mod classify;
mod collect;
mod dispatch;
mod enqueue;
pub(crate) mod input_ids;
mod read;
mod rechunk;
mod repeats;
mod stop;
mod submit;
mod summary;
#[cfg(test)]
mod tests;
mod write;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::backend::{BackendError, EmbeddingBackend, RecordedWindow};
use crate::batch::{Batch, Batcher};
use crate::chunk::Chunker;
use crate::contract::TOKEN_RATIO_KEY;
use crate::exit::Exit;
use crate::fsio::FsError;
use crate::job::Job;
use crate::progress::{Mode, Progress};
use crate::sink::{Sink, SinkError};
use crate::source::{Source, SourceError};
use crate::state::Billed;
use crate::state::{Fingerprint, JobState, Reuse, StateError};
use crate::store::StoreError;
use crate::warnings::Warnings;

pub use self::build::build;
pub use self::classify::{Class, Classifier, Counts};
pub use self::collect::BatchSummary;
pub use self::rechunk::Rechunker;
pub use self::stop::StopRequest;
pub use self::summary::{LearnedLimits, Summary};

use self::dispatch::{Dispatch, Dispatched, Limits};
use self::read::{ReadReport, Reading};
use self::stop::{Budget, Prices, Stops};
use self::write::{SinkMessage, Writing, Written};

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
    State(#[from] StateError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{0}")]
    Internal(String),
}

impl RunError {
    pub fn exit(&self) -> Exit {
        // The source was opened and checked before the run started: what goes
        // wrong with it now (a file gone, a bad row) happens during the work.
        match self {
            RunError::State(e) if e.is_found_before_work() => Exit::Usage,
            RunError::Sink(e) if e.is_found_before_work() => Exit::Usage,
            _ => Exit::Failed,
        }
    }

    fn stage_stopped(stage: &str, e: &tokio::task::JoinError) -> RunError {
        RunError::Internal(format!("the {stage} stage stopped unexpectedly: {e}"))
    }
}

/// A job's stages, built: the pipeline only wires them.
pub struct Stages {
    pub source: Box<dyn Source>,
    pub chunker: Arc<dyn Chunker>,
    pub backend: Arc<dyn EmbeddingBackend>,
    pub sink: Box<dyn Sink>,
    /// A shard's count of the whole input's document ids, filled as it reads.
    pub input_ids: Option<Arc<std::sync::Mutex<input_ids::InputIds>>>,
}

/// How a run is driven, besides its job file.
#[derive(Debug, Default)]
pub struct RunOptions {
    /// Progress on stderr: a bar on a terminal, else a line every
    /// `pipeline.progress_seconds` (see [`crate::progress`]).
    pub progress: bool,
    /// Discard the checkpoint and what the sink holds instead of reusing them.
    pub fresh: bool,
    /// Stop gracefully after this long.
    pub max_duration: Option<Duration>,
    /// Stop requests, from signals.
    pub stop: Option<watch::Receiver<StopRequest>>,
    /// Where the run puts what it passes over or finds worth a warning
    /// (a damaged checkpoint part, a shard's rows removed), for the command
    /// to print.
    pub warnings: Warnings,
}

/// A run that failed once its state was opened: the error, and the summary
/// written for it (exit 1, the error, and what was billed before it).
#[derive(Debug)]
pub struct Failed {
    pub error: RunError,
    pub summary: Summary,
}

/// What the stages reported, as far as the run got.
#[derive(Default)]
struct Report {
    read: ReadReport,
    dispatched: Dispatched,
    written: Written,
    earlier: crate::store::Earlier,
}

/// Runs a job's built stages, with its state opened (and locked), to the
/// end or until asked to stop. Whatever happens, the job's summary is
/// written: a failed run's says so, with what it was billed.
pub async fn execute(
    job: &Job,
    stages: Stages,
    state: JobState,
    options: RunOptions,
) -> Result<Summary, Failed> {
    let started = Instant::now();
    let info = stages.backend.info().clone();
    let backend = Arc::clone(&stages.backend);
    let target = stages.sink.target();
    let limits = Arc::new(Limits::default());
    let rechunk = Arc::new(Rechunker::new(Arc::clone(&stages.chunker), None));
    let mut report = Report::default();
    let result = run_stages(
        job,
        stages,
        state,
        (options, started),
        (Arc::clone(&limits), Arc::clone(&rechunk)),
        &mut report,
    )
    .await;
    let stats = backend.stats();
    let (bill, _) = bill::reckon(&report.dispatched, &stats);
    let location = crate::state::StateLocation::for_job(job);
    let mut summary = Summary::new(&summary::Outcome {
        job,
        output: target,
        location: &location,
        info: &info,
        read: &report.read,
        dispatched: &report.dispatched,
        written: &report.written,
        stats,
        earlier: report.earlier,
        bill,
        limits: learned(&limits, &stats, rechunk.learned()),
        // What the sink found at the end (shards of a table on different inputs) is kept too.
        warnings: [
            backend.warnings(),
            limits.notes(),
            report.written.warnings.clone(),
        ]
        .concat(),
        elapsed_seconds: started.elapsed().as_secs_f64(),
        error: result.as_ref().err(),
    });
    let saved = serde_json::to_value(&summary)
        .map_err(|e| RunError::Internal(e.to_string()))
        .and_then(|value| Ok(crate::state::write_summary(&location, &value)?));
    match (result, saved) {
        (Ok(()), Ok(())) => Ok(summary),
        (Err(error), _) => Err(Failed { error, summary }),
        (Ok(()), Err(error)) => {
            summary.fail(&error);
            Err(Failed { error, summary })
        }
    }
}

/// Runs the stages to the end, filling `report` as they finish.
async fn run_stages(
    job: &Job,
    stages: Stages,
    mut state: JobState,
    (options, started): (RunOptions, Instant),
    (limits, rechunk): (Arc<Limits>, Arc<Rechunker>),
    report: &mut Report,
) -> Result<(), RunError> {
    let Stages {
        source,
        chunker,
        backend,
        mut sink,
        input_ids,
    } = stages;
    let info = backend.info().clone();
    let fingerprint = Fingerprint::new(job, &info.model, info.dimensions, info.chunk_window());
    let batch_mode =
        batch_mode::BatchMode::start(backend.batch(), job, &fingerprint, &mut state, &options)
            .await?;
    tell_sink(sink.as_mut(), job, source.as_ref(), options.fresh);
    let (mut reuse, sink, state, recorded) = load_reuse(sink, state, options.fresh).await?;
    let previous_ratio = recall(&recorded, job, &info.model, &rechunk);
    let keeps_rows = sink.keeps_rows();
    for warning in reuse.warnings.drain(..) {
        options.warnings.warn(warning);
    }
    let warnings = options.warnings.clone();
    let earlier = reuse.store.earlier();
    report.earlier = earlier;
    let checkpoint_dimensions = reuse.store.dimensions().filter(|_| earlier.parts > 0);
    let capacity = job.pipeline.channel_capacity;
    let mut display = progress_display(job, options.progress);
    let chunker = display.counting(chunker);
    let halt = Arc::new(AtomicBool::new(false));
    let settled = Arc::new(AtomicU64::new(0));

    let (sink_tx, sink_rx) = mpsc::channel::<SinkMessage>(capacity);
    let (batch_tx, batch_rx) = mpsc::channel::<Result<Batch, RunError>>(capacity);
    let inputs = info.inputs_per_request(job.backend.shared.max_inputs_per_request);
    let gate = repeats::RepeatGate::new();
    // In batch mode no repeat's first copy is answered in this run: none may hold the reader up.
    batch_mode.is_some().then(|| gate.close());
    let reading = Reading {
        classifier: Classifier::new(reuse.store, reuse.held_ids, keeps_rows)
            .cutting(Arc::clone(&rechunk)),
        batcher: Batcher::by_length(inputs, job.backend.shared.max_tokens_per_request as u64),
        removes_rows: keeps_rows,
        halt: Arc::clone(&halt),
        settled: Arc::clone(&settled),
        batches: batch_tx,
        sink: sink_tx.clone(),
        repeats: Arc::clone(&gate),
        reuse_batch: inputs.max(1),
    };
    let reader = tokio::task::spawn_blocking(move || reading.run(source, chunker.as_ref()));
    // What a kill can lose: see `Exposure`.
    let most_uncommitted =
        (job.backend.shared.most_in_flight() as u64).saturating_mul(inputs as u64);
    let (committed_tx, committed_rx) = watch::channel(0u64);
    let writing = writing(job, &*backend, &state, sink, checkpoint_dimensions, gate)
        .with_exposure(committed_tx, most_uncommitted);
    let writer = tokio::task::spawn_blocking(move || writing.run(sink_rx));

    let exposure = (committed_rx, most_uncommitted);
    let mut d = dispatcher(job, &backend, &rechunk, (halt, settled, limits), exposure);
    d.budget = budget(job, backend.as_ref(), previous_ratio);
    let stops = Stops::new(options.stop, started, options.max_duration);
    let finished = || reader.is_finished();
    let dispatched = match batch_mode {
        Some(mode) => {
            mode.submit(batch_rx, &sink_tx, (previous_ratio, &backend.stats()))
                .await
        }
        None => {
            d.run(batch_rx, &sink_tx, stops, &mut display, &finished)
                .await
        }
    };
    let read = reader
        .await
        .map_err(|e| RunError::stage_stopped("reading", &e));
    (report.read, report.dispatched) = settle(read, dispatched);
    let dispatched = &mut report.dispatched;
    let stats = backend.stats();
    let (bill, unseen) = bill::reckon(dispatched, &stats);
    let ending = ending(&bill::Ending {
        info: &info,
        job: &job.name,
        fingerprint: &fingerprint,
        bill: &bill,
        dispatched,
        earlier: &earlier,
        requests: stats.requests,
        previous_ratio,
        shard: job.shard,
        input: input_ids
            .as_ref()
            .and_then(|ids| ids.lock().ok().map(|ids| ids.text())),
        window: recorded_window(job, &stats, &rechunk),
    });
    if !dispatched.writer_stopped && unseen != Billed::default() {
        let _ = sink_tx.send(SinkMessage::Billed(unseen)).await;
    }
    report.written = finish_writing(ending, dispatched, sink_tx, writer).await?;
    for warning in &report.written.warnings {
        warnings.warn(warning.clone());
    }
    state.close();
    Ok(())
}

/// The run's progress on stderr, as `progress` and the terminal allow.
fn progress_display(job: &Job, progress: bool) -> Progress {
    let mode = match Mode::for_stderr(progress) {
        // The bars of a job's shards, on one terminal, would overwrite each other.
        Mode::Bar if job.shard.is_some() => Mode::Lines,
        mode => mode,
    };
    Progress::new(mode, job.pipeline.progress_seconds).for_shard(job.shard)
}

/// The dispatching stage, but for what the pipeline shares with the reader
/// and the budget, which the run sets.
fn dispatcher(
    job: &Job,
    backend: &Arc<dyn EmbeddingBackend>,
    rechunk: &Arc<rechunk::Rechunker>,
    (halt, settled, limits): (Arc<AtomicBool>, Arc<AtomicU64>, Arc<Limits>),
    (committed, most_uncommitted): (watch::Receiver<u64>, u64),
) -> Dispatch {
    Dispatch {
        backend: Arc::clone(backend),
        concurrency: job.backend.shared.most_in_flight(),
        // The run's: it knows the ratio the last run recorded.
        budget: None,
        halt,
        drain: crate::job::seconds_in_range(Some(job.backend.shared.timeout_seconds))
            .unwrap_or_default(),
        settled,
        limits,
        rechunk: Arc::clone(rechunk),
        exposure: dispatch::Exposure::new(committed, most_uncommitted),
    }
}

/// The writing stage: the sink, the checkpoint's parts (which carry billing
/// without vectors only once they hold vectors) and the failures file.
fn writing(
    job: &Job,
    backend: &dyn EmbeddingBackend,
    state: &JobState,
    sink: Box<dyn Sink>,
    checkpoint_dimensions: Option<usize>,
    gate: Arc<repeats::RepeatGate>,
) -> Writing {
    let info = backend.info();
    let stats = backend.stats();
    let mut parts = state
        .part_writer(
            &info.model,
            &info.kind.to_string(),
            output_row_group_bytes(job),
        )
        // The checkpoint's width, else that of the window probe's vectors:
        // the probe's bill then goes into a part even when the run stops
        // before a vector of its own.
        .with_dimensions(checkpoint_dimensions.or(stats.window_probe.and_then(|p| p.dimensions)));
    // The window the chunks were cut to, for a next run after a stop.
    let window = RecordedWindow {
        chunks: stats.window,
        pieces: None,
        read_whole: stats.read_whole,
    };
    if let Some(json) = window.to_json(crate::backend::tokenizer_name(&job.chunking)) {
        parts.set_extra(crate::contract::CONTEXT_WINDOW_KEY, json);
    }
    Writing::new(sink, parts, state.failures(), gate)
}

/// What the writer is told at the end: finish the output, or, after a
/// failure or a stop, keep what was paid for in the checkpoint and leave the
/// output as it was.
fn ending(ending: &bill::Ending<'_>) -> SinkMessage {
    if ending.dispatched.failure.is_some() || ending.dispatched.stopped.is_some() {
        SinkMessage::Stop
    } else {
        SinkMessage::Finish(bill::output_metadata(ending))
    }
}

/// `budget.max_cost`, priced by the model's prices per token (output
/// tokens at the input price when it has no output price), less what the
/// window probe was billed before the run; spent before the first request
/// when the probe could cost more and was not sent.
fn budget(
    job: &Job,
    backend: &dyn EmbeddingBackend,
    previous_ratio: Option<f64>,
) -> Option<Arc<Budget>> {
    let info = backend.info();
    let stats = backend.stats();
    let probed = stats.window_probe.map_or(0, |p| p.tokens);
    let input = info.input_per_1k.unwrap_or(0.0);
    let prices = Prices {
        input: input / 1000.0,
        output: info.output_per_1k.unwrap_or(input) / 1000.0,
    };
    job.budget.max_cost.map(|max_cost| {
        let held = stats
            .probe_held
            .map(|held| held.stop(max_cost, &info.model));
        let budget = Budget::new(max_cost, prices, probed).recorded_ratio(previous_ratio);
        Arc::new(budget.spent_before(held))
    })
}

/// The windows the output records, as JSON: the one the chunks were cut to
/// from the start, and the one chunks refused mid-run were cut to.
fn recorded_window(
    job: &Job,
    stats: &crate::backend::BackendStats,
    rechunk: &Rechunker,
) -> Option<String> {
    let windows = RecordedWindow {
        chunks: stats.window,
        pieces: rechunk.learned(),
        read_whole: stats.read_whole,
    };
    windows.to_json(crate::backend::tokenizer_name(&job.chunking))
}

/// The limits the service's answers lowered during the run; the window, the
/// smaller of the probe's and the refusals'.
fn learned(
    limits: &Limits,
    stats: &crate::backend::BackendStats,
    refused: Option<crate::backend::LearnedWindow>,
) -> LearnedLimits {
    LearnedLimits {
        max_inputs_per_request: limits.inputs(),
        max_tokens_per_request: limits.tokens(),
        quota_tokens_per_request: limits.quota_tokens(),
        concurrency: stats.lowered_concurrency,
        context_window: match (stats.window, refused) {
            (Some(probed), Some(refused)) if probed.tokens <= refused.tokens => Some(probed),
            (probed, refused) => refused.or(probed),
        },
        window_probe: stats.window_probe,
        read_whole: stats.read_whole,
    }
}

fn output_row_group_bytes(job: &Job) -> u64 {
    // An output without row groups of its own: the Parquet default.
    job.output
        .params
        .row_group_bytes()
        .unwrap_or(16 * 1024 * 1024)
}

/// Tells the sink the job and the input's columns before it reads what it
/// holds, which may depend on them.
fn tell_sink(sink: &mut dyn Sink, job: &Job, source: &dyn Source, fresh: bool) {
    sink.job(&job.name, fresh);
    if let Some(schema) = source.metadata_schema() {
        sink.columns(schema);
    }
}

/// What the sink holds and the checkpoint's parts, indexed off the runtime,
/// with the metadata the held output recorded (empty when none is held).
async fn load_reuse(
    sink: Box<dyn Sink>,
    state: JobState,
    fresh: bool,
) -> Result<(Reuse, Box<dyn Sink>, JobState, BTreeMap<String, String>), RunError> {
    tokio::task::spawn_blocking(move || {
        let held = if fresh { None } else { sink.held()? };
        let recorded = held
            .as_ref()
            .map(|h| h.metadata().clone())
            .unwrap_or_default();
        let reuse = state.reuse(held, fresh)?;
        Ok((reuse, sink, state, recorded))
    })
    .await
    .map_err(|e| {
        RunError::Internal(format!(
            "reading the stored vectors stopped unexpectedly: {e}"
        ))
    })?
}

/// What the held output recorded for this run: the ratio of billed to local
/// tokens, returned; and the window it cut chunks refused mid-run to, given
/// to `rechunk`, which cuts the same chunks the same way before they are sent.
fn recall(
    recorded: &BTreeMap<String, String>,
    job: &Job,
    model: &str,
    rechunk: &Rechunker,
) -> Option<f64> {
    let tokenizer = crate::backend::tokenizer_name(&job.chunking);
    if let Some(pieces) = RecordedWindow::of_output(recorded, model, tokenizer).pieces {
        rechunk.remember(pieces);
    }
    recorded
        .get(TOKEN_RATIO_KEY)
        .and_then(|r| r.parse::<f64>().ok())
        .filter(|r| r.is_finite() && *r > 0.0)
}

/// The reading stage's report; a reading stage that failed to finish makes
/// the run fail.
fn settle(
    read: Result<ReadReport, RunError>,
    mut dispatched: Dispatched,
) -> (ReadReport, Dispatched) {
    match read {
        Ok(read) => (read, dispatched),
        Err(e) => {
            dispatched.failure.get_or_insert(e);
            (ReadReport::default(), dispatched)
        }
    }
}

/// Tells the writer how the run ended and waits for it: on `Finish` it
/// completes the output, on `Stop` it keeps what was paid for in the
/// checkpoint and leaves the output as it was.
async fn finish_writing(
    ending: SinkMessage,
    dispatched: &mut Dispatched,
    sink_tx: mpsc::Sender<SinkMessage>,
    writer: tokio::task::JoinHandle<Result<Written, RunError>>,
) -> Result<Written, RunError> {
    if !dispatched.writer_stopped {
        let _ = sink_tx.send(ending).await;
    }
    drop(sink_tx);
    let written = writer
        .await
        .map_err(|e| RunError::stage_stopped("writing", &e));
    if dispatched.writer_stopped {
        return Err(match written {
            Ok(Err(e)) => e,
            Ok(Ok(_)) => RunError::Internal("the writing stage stopped early".to_string()),
            Err(e) => e,
        });
    }
    if let Some(error) = dispatched.failure.take() {
        return Err(error);
    }
    written?
}
