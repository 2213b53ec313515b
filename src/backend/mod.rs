//! Backends: where chunks become vectors. The service API and the local
//! model are two implementations of [`EmbeddingBackend`]; the pipeline knows
//! only the trait.

pub mod api;
mod build;
#[cfg(feature = "local")]
pub mod local;
/// Without the model, the local kind's parameters are still read, so that
/// a job naming it is told why it cannot run.
#[cfg(not(feature = "local"))]
pub mod local {
    mod config;
    pub use self::config::{local_backend, Kind, LocalParams};
}

use std::fmt;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::rate::QuotaStop;
use crate::types::{Usage, Vectors};
use crate::warnings::Warnings;

pub use self::api::tokenizer_name;
pub use self::build::{build, fitted_chunking, info_kind, kinds, Embedding, EmbeddingKind};

/// Every kind of backend, one line each, in the order messages list them.
const KINDS: &[&dyn EmbeddingKind] = &[&api::Kind, &local::Kind];

/// Whether a backend is a service (billed by tokens, rate-limited) or a
/// model in this process, as [`BackendInfo`] tells it: not the job's
/// `backend.kind`, of which there may be more than these two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Api,
    Local,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Api => "api",
            BackendKind::Local => "local",
        })
    }
}

/// What a backend embeds with.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendInfo {
    pub kind: BackendKind,
    pub model: String,
    /// Known before the first request (a documented model, a declared
    /// `dimensions`, or the local model's own); otherwise learned from the
    /// first vector.
    pub dimensions: Option<usize>,
    pub context_window: Option<u64>,
    /// Price per 1000 input tokens, when the service lists one.
    pub input_per_1k: Option<f64>,
    /// Price per 1000 output tokens, when the service lists one; output
    /// tokens are priced as input tokens without it. Embeddings have none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_per_1k: Option<f64>,
    /// The price per 1000 input tokens of the other way of sending, when
    /// known: in batch mode (where `input_per_1k` is the batch price) the
    /// synchronous price, which the window probe's requests are billed at;
    /// otherwise the batch price, which the vectors of batches an earlier
    /// run of the job collected were billed at.
    #[serde(skip)]
    pub other_input_per_1k: Option<f64>,
    /// Tokens the model adds to every text (`[CLS]` and `[SEP]` for a BERT
    /// model), which its window must hold besides the chunk: the local
    /// model's, or those of the `tokenizer.json` chunks are counted with.
    #[serde(skip)]
    pub special_tokens: u64,
    /// The most inputs a request may hold, when the service says so before
    /// any request (TEI's `max_client_batch_size`): requests are made no
    /// larger, whatever `backend.max_inputs_per_request` allows.
    #[serde(skip)]
    pub max_inputs_per_request: Option<usize>,
}

/// Tokens the local model adds to every text (`[CLS]` and `[SEP]`), which
/// its window must hold besides the chunk.
pub const LOCAL_SPECIAL_TOKENS: u64 = 2;

impl BackendInfo {
    /// Tokens of text a chunk may hold for the model to see all of it: the
    /// context window, less the special tokens the model adds.
    pub fn chunk_window(&self) -> Option<u64> {
        Some(self.context_window?.saturating_sub(self.special_tokens))
    }

    /// The most inputs a request holds: `configured` (the job's
    /// `backend.max_inputs_per_request`), or fewer as the service says.
    pub fn inputs_per_request(&self, configured: usize) -> usize {
        configured.min(self.max_inputs_per_request.unwrap_or(usize::MAX))
    }

    /// What `usage` costs at the model's prices, when it has an input price:
    /// output tokens at the output price, or at the input price without one
    /// (so that a budget never counts them free).
    #[allow(clippy::cast_precision_loss)]
    pub fn cost(&self, usage: Usage) -> Option<f64> {
        let input = self.input_per_1k?;
        let output = self.output_per_1k.unwrap_or(input);
        let cost = usage.prompt_tokens as f64 / 1000.0 * input
            + usage.completion_tokens as f64 / 1000.0 * output;
        cost.is_finite().then_some(cost)
    }

    /// What `usage` costs when `other` of its prompt tokens were billed at
    /// the other way of sending's price ([`BackendInfo::other_input_per_1k`]),
    /// or at the run's when that is not known.
    #[allow(clippy::cast_precision_loss)]
    pub fn cost_with_other(&self, usage: Usage, other: u64) -> Option<f64> {
        let cost = self.cost(usage)?;
        let apart = self
            .other_input_per_1k
            .map_or(0.0, |price| price - self.input_per_1k.unwrap_or(price));
        let cost = cost + other.min(usage.prompt_tokens) as f64 / 1000.0 * apart;
        cost.is_finite().then_some(cost)
    }
}

/// A limit of the service's on whole requests that a request went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestLimit {
    /// Inputs per request; the most, when the service said.
    Inputs(Option<usize>),
    /// Tokens per request; the most, when the service said.
    Tokens(Option<u64>),
    /// The request took longer than the client waits: the server may still
    /// bill it, so it is not sent again whole.
    Time,
}

/// A request that failed for good. The pipeline splits `TooLarge` and
/// `OverLimit` batches and stops the run on the others.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// One of the inputs is too large for the model: the batch is split until
    /// that input is alone, and then quarantined.
    #[error("too large: {message}")]
    TooLarge {
        status: Option<u16>,
        message: String,
    },
    /// The request as a whole went over a limit: the rest of the run sends
    /// smaller requests.
    #[error("over the service's limit: {message}")]
    OverLimit {
        limit: RequestLimit,
        status: Option<u16>,
        message: String,
    },
    /// The request is larger than the service's token quota asks for (a
    /// hundredth of it): it went unsent, and its parts of at most `most`
    /// tokens (by the local count) go as requests of their own.
    #[error("larger than the service's quota asks for: at most {most} tokens a request")]
    Cut { most: u64 },
    #[error("{message}")]
    Permanent {
        status: Option<u16>,
        message: String,
    },
    #[error("gave up after {attempts} attempts: {message}")]
    Exhausted { attempts: usize, message: String },
    /// The service's quota stops the run: nothing succeeded for the stall
    /// timeout, or the quota is used up. What was paid for is kept; the
    /// next run carries on.
    #[error("{0}")]
    Quota(#[from] QuotaStop),
    /// Some inputs got good vectors, billed, before the request failed for
    /// the others: the pipeline keeps them, and handles `error` for the rest.
    #[error("{error}")]
    Partial {
        kept: Box<Kept>,
        error: Box<BackendError>,
    },
}

/// The good vectors of a request that then failed, with everything it was
/// billed.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    /// The inputs these vectors are for, ascending (indices into the request).
    pub inputs: Vec<usize>,
    pub vectors: Vectors,
}

impl BackendError {
    pub fn status(&self) -> Option<u16> {
        match self {
            BackendError::TooLarge { status, .. }
            | BackendError::OverLimit { status, .. }
            | BackendError::Permanent { status, .. } => *status,
            BackendError::Exhausted { .. } | BackendError::Cut { .. } => None,
            BackendError::Quota(QuotaStop::InsufficientQuota(_)) => Some(429),
            BackendError::Quota(_) => None,
            BackendError::Partial { error, .. } => error.status(),
        }
    }
}

/// A context window the service's answers taught, as chunks are cut to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LearnedWindow {
    /// The most tokens the model takes in its own count, when a refusal said.
    pub server_tokens: Option<u64>,
    /// The window in the job's tokenizer (`chunking.tokenizer`), scaled by
    /// the server's count over the local one and less a margin: chunks are
    /// cut to it.
    pub tokens: u64,
    /// How it was found.
    pub from: WindowSource,
    /// Where the probe's search found it for a job that counts in an
    /// encoding: the word pieces (`bert-base-uncased`'s count) of the text
    /// the server read, less the margin. Chunks hold no more
    /// (`ChunkingConfig::wordpieces`): text denser for the server than the
    /// probe's fits the encoding's count and not the server's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wordpieces: Option<u64>,
}

/// The part of a learned window left as a margin: the server's count over
/// the local one varies from text to text.
pub const WINDOW_MARGIN_PERCENT: u64 = 10;

impl LearnedWindow {
    /// The window a refusal states (`limit`, and the refused text's count,
    /// `given`, in the server's tokens), for a text of `local` tokens:
    /// scaled by the server's count over ours, less the margin.
    pub fn from_refusal(limit: u64, given: Option<u64>, local: u64) -> LearnedWindow {
        let scaled = given.filter(|&g| g > 0).map_or(limit, |given| {
            let scaled = u128::from(limit) * u128::from(local) / u128::from(given);
            u64::try_from(scaled).unwrap_or(u64::MAX)
        });
        LearnedWindow {
            server_tokens: Some(limit),
            tokens: with_margin(scaled),
            from: WindowSource::Refusal,
            wordpieces: None,
        }
    }
}

impl LearnedWindow {
    /// As an output records it, without the tokenizer.
    fn to_value(self) -> serde_json::Value {
        let mut value = serde_json::json!({
            "tokens": self.tokens,
            "server_tokens": self.server_tokens,
            "from": self.from,
        });
        if let Some(wordpieces) = self.wordpieces {
            value["wordpieces"] = wordpieces.into();
        }
        value
    }

    /// A window as [`LearnedWindow::to_value`] records it; anything else is none.
    fn from_value(value: &serde_json::Value) -> Option<LearnedWindow> {
        let from = match value.get("from")?.as_str()? {
            "refusal" => WindowSource::Refusal,
            "truncation" => WindowSource::Truncation,
            _ => return None,
        };
        Some(LearnedWindow {
            tokens: value.get("tokens")?.as_u64().filter(|&n| n > 0)?,
            server_tokens: value
                .get("server_tokens")
                .and_then(serde_json::Value::as_u64),
            from,
            wordpieces: value
                .get("wordpieces")
                .and_then(serde_json::Value::as_u64)
                .filter(|&n| n > 0),
        })
    }
}

/// The windows a finished run learned, as its output records them
/// (`embedjob.context_window`), so that the next run chunks as it did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordedWindow {
    /// The window chunks were cut to from the start (a probe found it).
    pub chunks: Option<LearnedWindow>,
    /// The window the chunks refused during the run were cut to: the next
    /// run cuts the chunks over it into the same pieces before it sends them.
    pub pieces: Option<LearnedWindow>,
    /// The tokens of a text a probe found the server reads whole, when it
    /// found no window within it: a run whose chunks are no longer does not
    /// probe again.
    pub read_whole: Option<u64>,
}

impl RecordedWindow {
    /// As the output's metadata records it, with the tokenizer that counts
    /// the tokens: the chunks' window at the top, the pieces' under `pieces`;
    /// `None` when there is neither.
    pub fn to_json(&self, tokenizer: &str) -> Option<String> {
        let mut value = match self.chunks {
            Some(chunks) => chunks.to_value(),
            None if self.pieces.is_some() || self.read_whole.is_some() => serde_json::json!({}),
            None => return None,
        };
        value["tokenizer"] = tokenizer.into();
        if let Some(pieces) = self.pieces {
            value["pieces"] = pieces.to_value();
        }
        if let Some(read_whole) = self.read_whole {
            value["read_whole"] = read_whole.into();
        }
        Some(value.to_string())
    }

    /// The windows recorded by [`RecordedWindow::to_json`], when counted in
    /// `tokenizer`; anything else is none.
    pub fn from_json(json: &str, tokenizer: &str) -> RecordedWindow {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else {
            return RecordedWindow::default();
        };
        if value.get("tokenizer").and_then(serde_json::Value::as_str) != Some(tokenizer) {
            return RecordedWindow::default();
        }
        RecordedWindow {
            chunks: LearnedWindow::from_value(&value),
            pieces: value.get("pieces").and_then(LearnedWindow::from_value),
            read_whole: value
                .get("read_whole")
                .and_then(serde_json::Value::as_u64)
                .filter(|&n| n > 0),
        }
    }

    /// The windows an output's metadata records, when `model` made it and
    /// they are counted in `tokenizer`.
    pub fn of_output(
        metadata: &std::collections::BTreeMap<String, String>,
        model: &str,
        tokenizer: &str,
    ) -> RecordedWindow {
        match (
            metadata.get(crate::contract::MODEL_KEY),
            metadata.get(crate::contract::CONTEXT_WINDOW_KEY),
        ) {
            (Some(made_by), Some(json)) if made_by == model => {
                RecordedWindow::from_json(json, tokenizer)
            }
            _ => RecordedWindow::default(),
        }
    }

    /// The window a run's summary gives (`learned_limits.context_window`),
    /// when `model` ran and the chunks were counted in `tokenizer`, as the
    /// window to cut chunks to from the start: a run that stopped before it
    /// kept anything leaves no output nor part to record it. The summary
    /// gives the smaller of the probe's window and the one refusals taught,
    /// so it is for a run that finds nothing kept to reuse.
    pub fn of_summary(summary: &serde_json::Value, model: &str, tokenizer: &str) -> RecordedWindow {
        let same = summary.get("model").and_then(serde_json::Value::as_str) == Some(model)
            && summary.get("tokenizer").and_then(serde_json::Value::as_str) == Some(tokenizer);
        RecordedWindow {
            chunks: summary
                .pointer("/learned_limits/context_window")
                .filter(|_| same)
                .and_then(LearnedWindow::from_value),
            pieces: None,
            read_whole: None,
        }
    }

    /// Whether an earlier probe found the server reads whole a text at
    /// least as long as chunks of `chunk_tokens`: a probe for them would
    /// find no window either.
    pub fn read_whole_covers(&self, chunk_tokens: u64) -> bool {
        self.read_whole.is_some_and(|read| read >= chunk_tokens)
    }
}

/// `tokens` less the margin, at least 1.
pub fn with_margin(tokens: u64) -> u64 {
    (tokens - tokens / 100 * WINDOW_MARGIN_PERCENT - tokens % 100 * WINDOW_MARGIN_PERCENT / 100)
        .max(1)
}

/// How a window was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowSource {
    /// The server refused an input as too long, and said its limit.
    Refusal,
    /// The server stopped reading a long text: its prefixes got the same vector.
    Truncation,
}

/// What looking for an unlisted window cost before the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProbeCost {
    /// Requests sent, refused ones included.
    pub requests: u64,
    /// Tokens billed for them.
    pub tokens: u64,
    /// The length of the vectors it was answered with, when it was: a
    /// run stopped before any vector of its own keeps the probe's bill in
    /// a checkpoint part of that width.
    #[serde(skip)]
    pub dimensions: Option<usize>,
}

/// Counters a backend keeps while it works.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BackendStats {
    /// Requests answered whole (and so billed), whether or not their vectors
    /// passed every check.
    pub requests: u64,
    /// Attempts that failed and were tried again.
    pub retries: u64,
    /// Of the retries, responses rejected by a check.
    pub invalid_responses: u64,
    /// 429 answers (rate limits), which are waited out rather than retried.
    pub throttled: u64,
    /// Time during which requests waited for the service's quota or a configured limit.
    pub quota_wait_ms: u64,
    /// Requests given up on after the client's timeout; the service may
    /// have billed them.
    pub timeouts: u64,
    /// Every response's usage, kept or not: what the service billed.
    pub billed: Usage,
    /// The requests in flight allowed, when timeouts lowered it.
    pub lowered_concurrency: Option<usize>,
    /// The context window learned from the service, when it listed none.
    pub window: Option<LearnedWindow>,
    /// What finding it cost, when the window was probed for.
    pub window_probe: Option<ProbeCost>,
    /// The tokens of a text the server reads whole, when a probe (this
    /// run's, or an earlier run's that this run took) found no window.
    pub read_whole: Option<u64>,
    /// What the window probe could have cost, when that was more than
    /// `budget.max_cost` and it was not sent: the run stops at its first
    /// request, for this.
    #[serde(skip)]
    pub probe_held: Option<HeldProbe>,
    /// What `backend.concurrency = "auto"` settled on.
    pub concurrency: Option<crate::rate::SettledConcurrency>,
}

/// A window probe not sent for the budget: what it could have sent, by the
/// job's count, and cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeldProbe {
    pub tokens: u64,
    pub cost: f64,
}

impl HeldProbe {
    /// Why the run stops at its first request, for a budget of `max_cost`
    /// and `model`.
    pub fn stop(&self, max_cost: f64, model: &str) -> String {
        format!(
            "stopped at the budget of {max_cost}: the probe for model {model}'s context window \
             could cost {:.6} before the first request ({} tokens by the job's count; set \
             `backend.context_window` or raise the budget)",
            self.cost, self.tokens
        )
    }
}

/// Turns texts into checked vectors, in input order.
pub trait EmbeddingBackend: Send + Sync {
    fn info(&self) -> &BackendInfo;

    /// Embeds `texts` (whose local token count is `tokens`, for rate
    /// limits). The result has passed every check of `validate`.
    fn embed<'a>(
        &'a self,
        texts: &'a [&'a str],
        tokens: u64,
    ) -> BoxFuture<'a, Result<Vectors, BackendError>>;

    fn stats(&self) -> BackendStats;

    /// What the backend could not find out or had to change about the
    /// service, for stderr and the run's summary.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// Where the backend puts what it finds while it works that is worth a
    /// word on stderr only (not in the summary); the command prints it.
    fn notices(&self) -> Warnings {
        Warnings::new()
    }

    /// Where [`BackendInfo::input_per_1k`] came from, when it is known: a
    /// job key, or the request the service answered it in.
    fn price_source(&self) -> Option<String> {
        None
    }

    /// In batch mode (`backend.mode = "batch"`), the service's Batch API.
    fn batch(&self) -> Option<std::sync::Arc<crate::backend::api::BatchService>> {
        None
    }
}
