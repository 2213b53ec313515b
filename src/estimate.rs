//! What a job will cost, before it runs.
//!
//! [`estimate`] reads and chunks the input exactly as a run does, and packs
//! the chunks with the run's [`Batcher`] and settings, but sends nothing: the
//! request count it reports is the count a fault-free run makes, and its
//! token count is the sum of the chunks' local counts, which for the hosted
//! models use the service's own encoding (cl100k). Like a run, it sends a
//! text repeated within the input once.
//!
//! A [`ChunkFilter`] decides which chunks would be sent at all, so that a run
//! that reuses vectors already embedded can be estimated by passing one that
//! skips them; [`SendAll`] sends every chunk.

use std::collections::HashSet;
use std::fmt::Write as _;

use serde::Serialize;

use crate::backend::api::RateLimits;
use crate::backend::BackendInfo;
use crate::batch::{Batch, Batcher};
use crate::checkpoint::hash_key;
use crate::chunk::{Chunk, Chunker};
use crate::exit::Exit;
use crate::job::{BackendKind, Job};
use crate::source::{self, SourceError, SourceStats};

/// Decides whether a chunk must be embedded, or is already.
pub trait ChunkFilter: Sync {
    fn must_send(&self, chunk: &Chunk) -> bool;
}

/// Every chunk must be sent: a run with no earlier output.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendAll;

impl ChunkFilter for SendAll {
    fn must_send(&self, _chunk: &Chunk) -> bool {
        true
    }
}

impl<F: Fn(&Chunk) -> bool + Sync> ChunkFilter for F {
    fn must_send(&self, chunk: &Chunk) -> bool {
        self(chunk)
    }
}

/// What a run of the job would send and what it would cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    pub job: String,
    pub backend: String,
    pub model: String,
    /// Known before any request: a documented model, a declared `dimensions`
    /// or the local model's own.
    pub dimensions: Option<usize>,
    pub documents: u64,
    pub skipped_null: u64,
    pub skipped_empty: u64,
    /// Chunks the input makes.
    pub chunks: u64,
    /// Of those, chunks the filter found already embedded.
    pub unchanged_chunks: u64,
    /// Of those, chunks whose text an earlier chunk of the input already sends.
    pub repeated_chunks: u64,
    /// Chunks that would be sent.
    pub chunks_to_send: u64,
    /// Tokens of the chunks that would be sent, counted locally.
    pub tokens: u64,
    /// Embedding requests a run without faults makes.
    pub requests: u64,
    /// The largest request, in tokens.
    pub largest_request_tokens: u64,
    pub context_window: Option<u64>,
    /// Price per 1000 input tokens, from the model listing.
    pub input_per_1k: Option<f64>,
    /// `tokens / 1000 * input_per_1k`, when the price is known.
    pub cost: Option<f64>,
    /// `backend.requests_per_minute`, when set (api backend).
    pub requests_per_minute: Option<u32>,
    /// `backend.tokens_per_minute`, when set (api backend).
    pub tokens_per_minute: Option<u64>,
    /// The least time the client-side rate limits allow, however fast the
    /// service; absent when no limit is set.
    pub shortest_duration_seconds: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    #[error(transparent)]
    Source(#[from] SourceError),
}

impl EstimateError {
    /// As for a run: a problem found when opening the input is a config
    /// error (2), one found while reading it a failure (1).
    pub fn exit(&self) -> Exit {
        match self {
            EstimateError::Source(e) if e.is_found_at_open() => Exit::Usage,
            EstimateError::Source(_) => Exit::Failed,
        }
    }
}

/// Reads and chunks the job's input with `chunker` and packs the chunks
/// that `filter` says must be sent into requests, as a run would, for the
/// backend `info` describes. Reading blocks: call it off the async runtime.
///
/// # Errors
///
/// The input cannot be opened or read, or has no documents with text.
pub fn estimate(
    job: &Job,
    chunker: &dyn Chunker,
    info: &BackendInfo,
    filter: &dyn ChunkFilter,
) -> Result<Estimate, EstimateError> {
    let mut source = source::open(&job.source)?;
    let limits = match info.kind {
        BackendKind::Api => RateLimits::new(
            job.backend.requests_per_minute,
            job.backend.tokens_per_minute,
            job.backend.max_tokens_per_request as u64,
        ),
        BackendKind::Local => RateLimits::default(),
    };
    let mut batcher = Batcher::for_backend(&job.backend);
    let mut count = Counts::default();
    // As in a run: 16 bytes per distinct text sent.
    let mut scheduled = HashSet::new();
    while let Some(document) = source.next_document()? {
        for chunk in chunker.chunk(&document) {
            count.chunks += 1;
            if !filter.must_send(&chunk) {
                count.unchanged += 1;
                continue;
            }
            if !scheduled.insert(hash_key(&chunk.content_hash)) {
                count.repeated += 1;
                continue;
            }
            count.to_send += 1;
            count.tokens += u64::from(chunk.token_count);
            if let Some(batch) = batcher.push(chunk) {
                count.request(&batch, &limits);
            }
        }
    }
    if let Some(batch) = batcher.finish() {
        count.request(&batch, &limits);
    }
    let stats: SourceStats = source.stats();
    let b = &job.backend;
    let api = info.kind == BackendKind::Api;
    Ok(Estimate {
        job: job.name.clone(),
        backend: info.kind.to_string(),
        model: info.model.clone(),
        dimensions: info.dimensions,
        documents: stats.documents,
        skipped_null: stats.skipped_null,
        skipped_empty: stats.skipped_empty,
        chunks: count.chunks,
        unchanged_chunks: count.unchanged,
        repeated_chunks: count.repeated,
        chunks_to_send: count.to_send,
        tokens: count.tokens,
        requests: count.requests,
        largest_request_tokens: count.largest_request,
        context_window: info.context_window,
        input_per_1k: info.input_per_1k,
        cost: info
            .input_per_1k
            .map(|price| count.tokens as f64 / 1000.0 * price),
        requests_per_minute: (api && b.requests_per_minute > 0).then_some(b.requests_per_minute),
        tokens_per_minute: (api && b.tokens_per_minute > 0).then_some(b.tokens_per_minute),
        shortest_duration_seconds: limits
            .shortest_duration(count.requests, count.token_cells)
            .map(|d| d.as_secs_f64()),
    })
}

#[derive(Default)]
struct Counts {
    chunks: u64,
    unchanged: u64,
    repeated: u64,
    to_send: u64,
    tokens: u64,
    requests: u64,
    largest_request: u64,
    token_cells: u64,
}

impl Counts {
    fn request(&mut self, batch: &Batch, limits: &RateLimits) {
        self.requests += 1;
        self.largest_request = self.largest_request.max(batch.tokens);
        self.token_cells += limits.token_cells(batch.tokens);
    }
}

/// The human form: a small two-column table.
pub fn table(e: &Estimate) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("job", e.job.clone()),
        ("model", format!("{} ({} backend)", e.model, e.backend)),
        ("documents", e.documents.to_string()),
        ("chunks", e.chunks.to_string()),
    ];
    if e.unchanged_chunks > 0 {
        rows.push(("already embedded", e.unchanged_chunks.to_string()));
    }
    if e.repeated_chunks > 0 {
        rows.push(("repeated texts", e.repeated_chunks.to_string()));
    }
    if e.chunks_to_send != e.chunks {
        rows.push(("chunks to send", e.chunks_to_send.to_string()));
    }
    rows.push(("tokens", e.tokens.to_string()));
    rows.push(("requests", e.requests.to_string()));
    if let Some(price) = e.input_per_1k {
        rows.push(("price per 1k tokens", format!("{price}")));
    }
    rows.push((
        "cost",
        e.cost.map_or_else(
            || "unknown (no price listed)".to_string(),
            |c| format!("{c:.6}"),
        ),
    ));
    if let Some(seconds) = e.shortest_duration_seconds {
        let mut limits = Vec::new();
        if let Some(rpm) = e.requests_per_minute {
            limits.push(format!("{rpm} requests/min"));
        }
        if let Some(tpm) = e.tokens_per_minute {
            limits.push(format!("{tpm} tokens/min"));
        }
        rows.push((
            "shortest duration",
            format!("{} (at {})", duration_text(seconds), limits.join(", ")),
        ));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in rows {
        let _ = writeln!(out, "{key:<width$}  {value}");
    }
    if e.skipped_null + e.skipped_empty > 0 {
        let _ = writeln!(
            out,
            "(skipped {} null and {} empty texts)",
            e.skipped_null, e.skipped_empty
        );
    }
    out
}

fn duration_text(seconds: f64) -> String {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let whole = seconds.ceil() as u64;
    match whole {
        0..=59 => format!("{seconds:.1}s"),
        60..=3599 => format!("{}m {:02}s", whole / 60, whole % 60),
        _ => format!("{}h {:02}m", whole / 3600, (whole % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::TokenChunker;

    /// A job whose backend settings apply; the backend itself is described by `info`.
    fn job(dir: &std::path::Path, extra_backend: &str) -> Job {
        let text = format!(
            r#"
[source]
kind = "files"
paths = ["{root}"]
[chunking]
max_tokens = 16
overlap_tokens = 0
[backend]
kind = "local"
max_inputs_per_request = 3
max_tokens_per_request = 40
{extra_backend}
[output]
path = "{out}"
"#,
            root = dir.join("docs").display(),
            out = dir.join("out.parquet").display()
        );
        crate::job::parse(&text, "t", &[]).unwrap()
    }

    fn info(price: Option<f64>) -> BackendInfo {
        BackendInfo {
            kind: BackendKind::Api,
            model: "svc-embed-1".into(),
            dimensions: Some(1024),
            context_window: Some(8192),
            input_per_1k: price,
        }
    }

    fn corpus(dir: &std::path::Path) {
        std::fs::create_dir_all(dir.join("docs")).unwrap();
        for i in 0..5 {
            let body: String = (0..4 + i * 4)
                .map(|k| format!("Document {i} has sentence {k}. "))
                .collect();
            std::fs::write(dir.join(format!("docs/d{i}.txt")), &body).unwrap();
            if i == 2 {
                // A copy: its chunks repeat texts already sent.
                std::fs::write(dir.join("docs/copy.txt"), &body).unwrap();
            }
        }
    }

    /// The chunks and requests, computed the long way.
    fn by_hand(job: &Job, chunker: &TokenChunker) -> (u64, u64, u64) {
        let mut source = source::open(&job.source).unwrap();
        let mut batcher = Batcher::new(3, 40);
        let (mut chunks, mut tokens, mut requests) = (0, 0, 0);
        let mut seen = HashSet::new();
        while let Some(document) = source.next_document().unwrap() {
            for chunk in chunker.chunk(&document) {
                chunks += 1;
                if !seen.insert(chunk.text.clone()) {
                    continue;
                }
                tokens += u64::from(chunk.token_count);
                requests += u64::from(batcher.push(chunk).is_some());
            }
        }
        requests += u64::from(batcher.finish().is_some());
        (chunks, tokens, requests)
    }

    #[test]
    fn counts_what_a_run_would_send_and_prices_it() {
        let dir = tempfile::tempdir().unwrap();
        corpus(dir.path());
        let job = job(dir.path(), "");
        let chunker = TokenChunker::cl100k(&job.chunking).unwrap();
        let e = estimate(&job, &chunker, &info(Some(0.5)), &SendAll).unwrap();
        let (chunks, tokens, requests) = by_hand(&job, &chunker);
        assert_eq!(e.documents, 6);
        assert_eq!((e.chunks, e.tokens, e.requests), (chunks, tokens, requests));
        assert!(e.requests > 3, "several requests: {e:?}");
        assert!(e.repeated_chunks > 0, "the corpus repeats itself: {e:?}");
        assert_eq!(e.chunks_to_send + e.repeated_chunks, e.chunks);
        assert!(e.largest_request_tokens <= 40);
        let cost = e.cost.unwrap();
        assert!((cost - tokens as f64 / 1000.0 * 0.5).abs() < 1e-12);
        assert_eq!(e.shortest_duration_seconds, None);
        assert!(table(&e).contains("requests"));

        let unpriced = estimate(&job, &chunker, &info(None), &SendAll).unwrap();
        assert_eq!(unpriced.cost, None);
        assert!(table(&unpriced).contains("unknown"));
    }

    #[test]
    fn a_filter_leaves_out_chunks_already_embedded() {
        let dir = tempfile::tempdir().unwrap();
        corpus(dir.path());
        let job = job(dir.path(), "");
        let chunker = TokenChunker::cl100k(&job.chunking).unwrap();
        let all = estimate(&job, &chunker, &info(Some(1.0)), &SendAll).unwrap();
        let skip_d4 = |chunk: &Chunk| !chunk.doc_id.starts_with("d4");
        let some = estimate(&job, &chunker, &info(Some(1.0)), &skip_d4).unwrap();
        assert!(some.unchanged_chunks > 0);
        assert_eq!(some.chunks, all.chunks);
        assert_eq!(
            some.chunks_to_send + some.unchanged_chunks + some.repeated_chunks,
            all.chunks
        );
        assert!(some.tokens < all.tokens);
        let none = estimate(&job, &chunker, &info(Some(1.0)), &|_: &Chunk| false).unwrap();
        assert_eq!((none.requests, none.tokens, none.cost), (0, 0, Some(0.0)));
    }

    #[test]
    fn rate_limits_give_a_shortest_duration() {
        let dir = tempfile::tempdir().unwrap();
        corpus(dir.path());
        let job = job(dir.path(), "requests_per_minute = 60");
        let chunker = TokenChunker::cl100k(&job.chunking).unwrap();
        let e = estimate(&job, &chunker, &info(None), &SendAll).unwrap();
        // One a second after a burst of one.
        assert_eq!(e.shortest_duration_seconds, Some((e.requests - 1) as f64));
        assert_eq!(e.requests_per_minute, Some(60));
        assert!(table(&e).contains("shortest duration"), "{}", table(&e));
    }

    #[test]
    fn a_missing_input_is_a_config_error() {
        let dir = tempfile::tempdir().unwrap();
        let job = job(dir.path(), "");
        let chunker = TokenChunker::cl100k(&job.chunking).unwrap();
        let error = estimate(&job, &chunker, &info(None), &SendAll).unwrap_err();
        assert_eq!(error.exit(), Exit::Usage);
        assert!(error.to_string().contains("docs"), "{error}");
    }
}
