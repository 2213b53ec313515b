//! What a job will cost, before it runs.
//!
//! [`estimate`] reads and chunks the input exactly as a run does, and packs
//! the chunks with the run's [`Batcher`] and settings, but sends nothing: the
//! request count it reports is the count a fault-free run makes, and its
//! token count is the sum of the chunks' local counts, which for the hosted
//! models use the service's own encoding (cl100k). Like a run, it sends a
//! text repeated within the input once.
//!
//! Chunks are sorted by the run's own [`Classifier`]: given one over the
//! vectors a run would find (what the sink holds and the checkpoint), the
//! estimate counts only what that run would send; [`Classifier::fresh`]
//! counts a run that sends everything.

use std::fmt::Write as _;

use serde::Serialize;

use crate::backend::BackendInfo;
use crate::backend::BackendKind;
use crate::batch::{Batch, Batcher};
use crate::chunk::Chunker;
use crate::exit::Exit;
use crate::job::Job;
use crate::pipeline::{Class, Classifier};
use crate::rate::RateLimits;
use crate::source::{self, SkippedFiles, SourceError, SourceStats};

/// What a run of the job would send and what it would cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    pub job: String,
    /// The shard of the job estimated (`--shard`), `I/N`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::job::Shard>,
    /// For the whole of a split job, the number of shards whose files and
    /// state the estimate found to reuse.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<u64>,
    pub backend: String,
    pub model: String,
    /// Known before any request: a documented model, a declared `dimensions`
    /// or the local model's own.
    pub dimensions: Option<usize>,
    pub documents: u64,
    pub skipped_null: u64,
    pub skipped_empty: u64,
    /// Files passed over because they are not UTF-8 text.
    pub skipped_files: SkippedFiles,
    /// The chunk size and overlap, in tokens: the job's, or fitted to the model.
    pub max_tokens: usize,
    pub overlap_tokens: usize,
    /// Chunks the input makes.
    pub chunks: u64,
    /// Of those, chunks whose vector is already stored.
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
    /// Where the price came from: a job key, or the service's answer to a
    /// request (`GET /v1/models`, `GET /v1/model/info`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price_source: Option<String>,
    /// Billed tokens over local ones in the job's last run, from its output's
    /// metadata: what the service's own count adds to (or takes from) the local one.
    pub billed_token_ratio: Option<f64>,
    /// `tokens` scaled by `billed_token_ratio`: what the service will likely bill.
    pub expected_billed_tokens: Option<u64>,
    /// The expected billed tokens (else `tokens`) `/ 1000 * input_per_1k`,
    /// when the price is known.
    pub cost: Option<f64>,
    /// `backend.requests_per_minute`, when set (api backend).
    pub requests_per_minute: Option<u32>,
    /// `backend.tokens_per_minute`, when set (api backend).
    pub tokens_per_minute: Option<u64>,
    /// The least time the client-side rate limits allow, however fast the
    /// service; absent when no limit is set.
    pub shortest_duration_seconds: Option<f64>,
    /// What the service does not tell (window, model), as a run would warn.
    pub warnings: Vec<String>,
    /// In batch mode (`input_per_1k` and `cost` are then the batch's), the
    /// synchronous price and cost beside them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncPrice>,
}

/// What the same job would cost sent synchronously.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SyncPrice {
    pub input_per_1k: Option<f64>,
    pub cost: Option<f64>,
}

impl Estimate {
    /// `docs`, or `docs (shard 1/4)`.
    fn job_text(&self) -> String {
        match (self.shard, self.shards) {
            (Some(shard), _) => format!("{} (shard {shard})", self.job),
            (None, Some(shards)) => format!("{} (all {shards} shards)", self.job),
            (None, None) => self.job.clone(),
        }
    }

    /// Scales the token count, and the cost, by the ratio of billed to
    /// local tokens a previous run of the job measured.
    #[must_use]
    pub fn with_billed_ratio(mut self, ratio: Option<f64>) -> Estimate {
        let Some(ratio) = ratio.filter(|r| r.is_finite() && *r > 0.0) else {
            return self;
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let billed = (self.tokens as f64 * ratio).round() as u64;
        self.billed_token_ratio = Some(ratio);
        self.expected_billed_tokens = Some(billed);
        self.cost = self
            .input_per_1k
            .map(|price| billed as f64 / 1000.0 * price);
        self
    }
}

impl Estimate {
    /// In batch mode (`sync` is the synchronous price), the synchronous
    /// cost of the same tokens beside the batch's.
    #[must_use]
    pub fn with_sync_price(mut self, sync: Option<Option<f64>>) -> Estimate {
        let tokens = self.expected_billed_tokens.unwrap_or(self.tokens);
        self.sync = sync.map(|price| SyncPrice {
            input_per_1k: price,
            cost: price.map(|p| tokens as f64 / 1000.0 * p),
        });
        self
    }
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

/// Reads and chunks the job's input with `chunker`, sorts the chunks with
/// `classifier` and packs those to send into requests, as a run would, for
/// the backend `info` describes. Reading blocks: call it off the async runtime.
///
/// # Errors
///
/// The input cannot be opened or read, or has no documents with text.
pub fn estimate(
    job: &Job,
    chunker: &dyn Chunker,
    info: &BackendInfo,
    mut classifier: Classifier,
) -> Result<Estimate, EstimateError> {
    let mut source = source::open(&job.source)?;
    if let Some(shard) = job.shard {
        source = Box::new(crate::pipeline::input_ids::ShardOfInput::new(source, shard).0);
    }
    let b = &job.backend;
    let per_minute = b
        .params
        .per_minute_limits()
        .filter(|_| info.kind == BackendKind::Api);
    let limits = match per_minute {
        Some((requests, tokens)) => {
            RateLimits::new(requests, tokens, b.shared.max_tokens_per_request as u64)
        }
        None => RateLimits::default(),
    };
    let mut batcher = Batcher::for_backend(b);
    let mut count = Counts::default();
    while let Some(document) = source.next_document()? {
        for chunk in chunker.chunk(&document) {
            for chunk in classifier.fit(chunk) {
                if classifier.classify(&chunk) != Class::Send {
                    continue;
                }
                for batch in batcher.push(chunk) {
                    count.request(&batch, &limits);
                }
            }
        }
    }
    for batch in batcher.finish() {
        count.request(&batch, &limits);
    }
    let stats: SourceStats = source.stats();
    let chunking = job.chunking_for(info.chunk_window());
    let sorted = classifier.counts();
    count.chunks = sorted.chunks;
    count.unchanged = sorted.reused + sorted.resumed;
    count.repeated = sorted.deduplicated;
    count.to_send = sorted.to_send;
    count.tokens = sorted.sent_tokens;
    Ok(Estimate {
        job: job.name.clone(),
        shard: job.shard,
        shards: None,
        backend: info.kind.to_string(),
        model: info.model.clone(),
        dimensions: info.dimensions,
        documents: stats.documents,
        skipped_null: stats.skipped_null,
        skipped_empty: stats.skipped_empty,
        skipped_files: source.skipped_files(),
        max_tokens: chunking.max_tokens,
        overlap_tokens: chunking.overlap_tokens,
        chunks: count.chunks,
        unchanged_chunks: count.unchanged,
        repeated_chunks: count.repeated,
        chunks_to_send: count.to_send,
        tokens: count.tokens,
        requests: count.requests,
        largest_request_tokens: count.largest_request,
        context_window: info.context_window,
        input_per_1k: info.input_per_1k,
        price_source: None,
        billed_token_ratio: None,
        expected_billed_tokens: None,
        cost: info
            .input_per_1k
            .map(|price| count.tokens as f64 / 1000.0 * price),
        requests_per_minute: per_minute.map(|(rpm, _)| rpm).filter(|&rpm| rpm > 0),
        tokens_per_minute: per_minute.map(|(_, tpm)| tpm).filter(|&tpm| tpm > 0),
        shortest_duration_seconds: limits
            .shortest_duration(count.requests, count.token_cells)
            .map(|d| d.as_secs_f64()),
        warnings: Vec::new(),
        sync: None,
    })
}

/// A warning that the estimate's tokens and cost are the local count, for a
/// service whose own count is not known: no earlier run of the job recorded
/// the ratio of billed to local tokens, and the job's tokenizer is not the
/// one the service is known to bill by. A self-hosted server bills its
/// model's tokens or the characters: behind LiteLLM, infinity's
/// all-MiniLM-L6-v2 billed 3.31 units for each `cl100k_base` token, and a
/// job estimated at 0.0024 was billed 0.0085.
pub fn unknown_count_warning(info: &BackendInfo, tokenizer: &str) -> Option<String> {
    let known = crate::job::counts_as(&info.model, tokenizer);
    (info.kind == BackendKind::Api && !known).then(|| {
        format!(
            "the tokens and the cost are counted in {tokenizer} tokens, the job's count: how \
             the service counts for model {} is not known yet (a self-hosted server bills its \
             model's tokens or characters, often more); a run records the ratio of billed to \
             local tokens, and estimates after it scale by it",
            info.model
        )
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
        ("job", e.job_text()),
        ("model", format!("{} ({} backend)", e.model, e.backend)),
        ("documents", e.documents.to_string()),
        (
            "chunk size",
            format!(
                "up to {} tokens, {} overlapping",
                e.max_tokens, e.overlap_tokens
            ),
        ),
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
    if let (Some(billed), Some(ratio)) = (e.expected_billed_tokens, e.billed_token_ratio) {
        rows.push((
            "expected billed",
            format!(
                "{billed} tokens (the last run was billed {ratio:.3}× its local count; scaled by it)"
            ),
        ));
    }
    rows.push(("requests", e.requests.to_string()));
    if e.backend == BackendKind::Local.to_string() {
        rows.push(("cost", "none (the local model bills nothing)".to_string()));
    } else {
        if let Some(price) = e.input_per_1k {
            let source = e
                .price_source
                .as_ref()
                .map_or(String::new(), |source| format!(" (from {source})"));
            rows.push(("price per 1k tokens", format!("{price}{source}")));
        }
        let cost = e.cost.map_or_else(
            || "unknown (no price listed)".to_string(),
            |c| format!("{c:.6}"),
        );
        match e.sync {
            // Batch mode: the batch price, and the synchronous one beside it.
            Some(sync) => rows.push((
                "cost",
                format!(
                    "{cost} in batch mode (sync: {})",
                    sync.cost
                        .map_or_else(|| "unknown".to_string(), |c| format!("{c:.6}"))
                ),
            )),
            None => rows.push(("cost", cost)),
        }
    }
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
            format!(
                "{} (at {})",
                crate::display::duration(seconds),
                limits.join(", ")
            ),
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
            "(skipped {} null and {} empty {})",
            e.skipped_null,
            e.skipped_empty,
            if e.skipped_null + e.skipped_empty == 1 {
                "text"
            } else {
                "texts"
            }
        );
    }
    if e.skipped_files.count > 0 {
        let _ = writeln!(out, "(skipped {})", e.skipped_files.text());
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::chunk::TokenChunker;
    use crate::types::Chunk;

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
kind = "api"
base_url = "http://127.0.0.1:9"
model = "svc-embed-1"
api_key_env = "PATH"
max_inputs_per_request = 3
max_tokens_per_request = 40
{extra_backend}
[output]
path = "{out}"
"#,
            root = dir.join("docs").display(),
            out = dir.join("out.parquet").display()
        );
        crate::kinds::parse(&text, "t", &[]).unwrap()
    }

    fn info(price: Option<f64>) -> BackendInfo {
        BackendInfo {
            kind: BackendKind::Api,
            model: "svc-embed-1".into(),
            dimensions: Some(1024),
            context_window: Some(8192),
            input_per_1k: price,
            output_per_1k: None,
            other_input_per_1k: None,
            special_tokens: 0,
            max_inputs_per_request: None,
        }
    }

    #[test]
    fn an_estimate_warns_that_its_count_is_the_jobs_unless_the_service_bills_by_it() {
        let openai = |model: &str| BackendInfo {
            model: model.into(),
            ..info(Some(0.02))
        };
        for model in ["text-embedding-3-small", "text-embedding-ada-002"] {
            assert_eq!(unknown_count_warning(&openai(model), "cl100k_base"), None);
            let other = unknown_count_warning(&openai(model), "o200k_base").unwrap();
            assert!(other.contains("counted in o200k_base tokens"), "{other}");
        }
        let served = unknown_count_warning(&info(Some(0.02)), "cl100k_base").unwrap();
        assert!(
            served.contains("model svc-embed-1 is not known yet"),
            "{served}"
        );
        let local = BackendInfo {
            kind: BackendKind::Local,
            ..info(None)
        };
        assert_eq!(unknown_count_warning(&local, "model.json"), None);
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

    /// A classifier that finds stored the vectors of the chunks `pick` picks,
    /// as a previous output would hold them.
    fn stored(
        dir: &std::path::Path,
        job: &Job,
        chunker: &TokenChunker,
        pick: impl Fn(&Chunk) -> bool,
    ) -> Classifier {
        use crate::parquet_io::{Compression, FileOptions, ParquetRows, VectorFile};
        use crate::store::{HeldIds, Origin, Store};
        use crate::types::{EmbeddedBatch, OutputMetadata, Usage, Vectors};
        let mut source = source::open(&job.source).unwrap();
        let mut chunks = Vec::new();
        while let Some(document) = source.next_document().unwrap() {
            chunks.extend(chunker.chunk(&document).into_iter().filter(|c| pick(c)));
        }
        let path = dir.join(format!("stored-{}.parquet", chunks.len()));
        let options = FileOptions {
            include_text: false,
            row_group_bytes: 1 << 20,
            compression: Compression::None,
        };
        let mut file = VectorFile::create(&path, 1, options).unwrap();
        let values = vec![1.0; chunks.len()];
        file.write(&EmbeddedBatch {
            chunks,
            vectors: Vectors {
                dimensions: 1,
                values,
                usage: Usage::default(),
                discarded: Usage::default(),
            },
        })
        .unwrap();
        file.finish(&OutputMetadata {
            dimensions: 1,
            ..OutputMetadata::default()
        })
        .unwrap();
        let mut store = Store::new();
        let mut ids = HeldIds::new();
        let rows = Box::new(ParquetRows::open(&path).unwrap());
        store.add(rows, Origin::Previous, Some(&mut ids)).unwrap();
        Classifier::new(store, ids, false)
    }

    /// The chunks and requests, computed the long way.
    fn by_hand(job: &Job, chunker: &TokenChunker) -> (u64, u64, u64) {
        let mut source = source::open(&job.source).unwrap();
        let mut batcher = Batcher::by_length(3, 40);
        let (mut chunks, mut tokens, mut requests) = (0, 0, 0);
        let mut seen = HashSet::new();
        while let Some(document) = source.next_document().unwrap() {
            for chunk in chunker.chunk(&document) {
                chunks += 1;
                if !seen.insert(chunk.text.clone()) {
                    continue;
                }
                tokens += u64::from(chunk.token_count);
                requests += batcher.push(chunk).len() as u64;
            }
        }
        requests += batcher.finish().len() as u64;
        (chunks, tokens, requests)
    }

    #[test]
    fn counts_what_a_run_would_send_and_prices_it() {
        let dir = tempfile::tempdir().unwrap();
        corpus(dir.path());
        let job = job(dir.path(), "");
        let chunker = TokenChunker::cl100k(&job.chunking).unwrap();
        let e = estimate(&job, &chunker, &info(Some(0.5)), Classifier::fresh()).unwrap();
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

        let unpriced = estimate(&job, &chunker, &info(None), Classifier::fresh()).unwrap();
        assert_eq!(unpriced.cost, None);
        assert!(table(&unpriced).contains("unknown"));
    }

    #[test]
    fn a_filter_leaves_out_chunks_already_embedded() {
        let dir = tempfile::tempdir().unwrap();
        corpus(dir.path());
        let job = job(dir.path(), "");
        let chunker = TokenChunker::cl100k(&job.chunking).unwrap();
        let all = estimate(&job, &chunker, &info(Some(1.0)), Classifier::fresh()).unwrap();
        let skip_d4 = stored(dir.path(), &job, &chunker, |chunk| {
            chunk.doc_id.starts_with("d4")
        });
        let some = estimate(&job, &chunker, &info(Some(1.0)), skip_d4).unwrap();
        assert!(some.unchanged_chunks > 0);
        assert_eq!(some.chunks, all.chunks);
        assert_eq!(
            some.chunks_to_send + some.unchanged_chunks + some.repeated_chunks,
            all.chunks
        );
        assert!(some.tokens < all.tokens);
        let everything = stored(dir.path(), &job, &chunker, |_| true);
        let none = estimate(&job, &chunker, &info(Some(1.0)), everything).unwrap();
        assert_eq!((none.requests, none.tokens, none.cost), (0, 0, Some(0.0)));
    }

    #[test]
    fn a_learned_ratio_scales_the_tokens_and_the_cost() {
        let dir = tempfile::tempdir().unwrap();
        corpus(dir.path());
        let job = job(dir.path(), "");
        let chunker = TokenChunker::cl100k(&job.chunking).unwrap();
        let plain = estimate(&job, &chunker, &info(Some(2.0)), Classifier::fresh()).unwrap();
        let scaled = plain.clone().with_billed_ratio(Some(1.5));
        let expected = (plain.tokens as f64 * 1.5).round() as u64;
        assert_eq!(scaled.expected_billed_tokens, Some(expected));
        assert_eq!(scaled.tokens, plain.tokens, "the local count stays");
        assert!((scaled.cost.unwrap() - expected as f64 / 1000.0 * 2.0).abs() < 1e-12);
        assert!(table(&scaled).contains("1.500×"), "{}", table(&scaled));
        assert_eq!(plain.clone().with_billed_ratio(None), plain);
        assert_eq!(plain.clone().with_billed_ratio(Some(f64::NAN)), plain);
    }

    #[test]
    fn rate_limits_give_a_shortest_duration() {
        let dir = tempfile::tempdir().unwrap();
        corpus(dir.path());
        let job = job(dir.path(), "requests_per_minute = 60");
        let chunker = TokenChunker::cl100k(&job.chunking).unwrap();
        let e = estimate(&job, &chunker, &info(None), Classifier::fresh()).unwrap();
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
        let error = estimate(&job, &chunker, &info(None), Classifier::fresh()).unwrap_err();
        assert_eq!(error.exit(), Exit::Usage);
        assert!(error.to_string().contains("docs"), "{error}");
    }
}
