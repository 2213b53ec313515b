//! The service backend: retries with backoff, client-side rate limits, an
//! adaptive window of requests in flight, and a check of every response.
//!
//! Every response that arrives whole was billed, so its usage is counted
//! whether or not its vectors pass. When only some vectors of an answer fail
//! (a wrong length, a non-finite value) the others are kept and only the
//! failed inputs are sent again (if that fails, the good vectors go with
//! the error, [`BackendError::Partial`]); an answer whose vectors all have another
//! length than expected stops the run, as sending it again would only be
//! billed again. A request that times out lowers the requests in flight;
//! it is split only when it was alone in flight, since only then was its
//! own size the cause.

mod batch;
mod config;
mod window;

pub use self::batch::{batch_price, BatchService};

pub use self::window::tokenizer_name;

pub use self::config::{
    ApiParams, EncodingFormat, Kind, Mode, DEFAULT_API_KEY_ENV, DEFAULT_STALL_TIMEOUT_SECONDS,
    MAX_STALL_TIMEOUT_SECONDS,
};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

use super::{
    BackendError, BackendInfo, BackendKind, BackendStats, EmbeddingBackend, Kept, LearnedWindow,
    ProbeCost, RequestLimit,
};
use crate::client::{ApiError, Client, EmbeddingInput, EmbeddingRequest, ErrorKind, SizeLimit};
use crate::rate::{
    with_retries_notify, Fault, Held, QuotaStop, RateControl, RateSettings, Refusal, RetryPolicy,
    Retryable,
};
use crate::types::{RawVectors, Usage, Vectors};
use crate::validate::{self, Checked, ValidationError};
use crate::warnings::Warnings;

#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub model: String,
    /// `backend.dimensions`: the length asked for (sent as `dimensions`
    /// when it is not the model's known length).
    pub dimensions: Option<usize>,
    /// The most requests in flight: fixed, or `auto`'s ceiling.
    pub concurrency: usize,
    /// `backend.concurrency = "auto"`: the limit is found below `concurrency`.
    pub adaptive: bool,
    /// The client's timeout, which `auto` keeps every answer well within.
    pub timeout: Option<Duration>,
    pub requests_per_minute: u32,
    pub tokens_per_minute: u64,
    /// The largest request the batcher makes, in tokens: the token bucket must hold one.
    pub max_tokens_per_request: u64,
    pub retry: RetryPolicy,
    pub encoding: EncodingFormat,
    /// `backend.context_window`, over the listing's.
    pub context_window: Option<u64>,
    /// `backend.input_per_1k`, over the listing's.
    pub input_per_1k: Option<f64>,
    /// `backend.output_per_1k`, over the listing's.
    pub output_per_1k: Option<f64>,
    /// The request the service's price came from (`Discovery::price_source`).
    pub listed_price_source: Option<String>,
    /// What setting up found the service does not tell.
    pub warnings: Vec<String>,
    /// The service answers under another name than the model asked for (an
    /// alias, a gateway): accept it, with a warning. Otherwise such an
    /// answer is refused.
    pub renames_models: bool,
    /// `backend.stall_timeout_seconds`: the run stops when nothing has
    /// succeeded for this long while the quota holds requests back.
    pub stall_timeout: Duration,
    /// How many processes of the job share the key's quota (the shards of
    /// a split job): each counts on its part of the budget from the start.
    pub sharing: u32,
    /// `backend.quota_window_seconds`: how long a use stays in the
    /// service's sliding windows; `None` to learn it from the answers.
    pub quota_window: Option<Duration>,
    /// Tokens the model adds to every text, as `chunking.tokenizer` says.
    pub special_tokens: u64,
    /// The most inputs a request may hold, as the service says it
    /// (`Discovery::max_inputs`).
    pub max_inputs: Option<usize>,
}

impl ApiSettings {
    /// Settings for `model` with no client-side limits, one request in
    /// flight, the default retries and floats.
    pub fn new(model: impl Into<String>) -> Self {
        ApiSettings {
            model: model.into(),
            dimensions: None,
            concurrency: 1,
            adaptive: false,
            timeout: None,
            requests_per_minute: 0,
            tokens_per_minute: 0,
            max_tokens_per_request: 0,
            retry: RetryPolicy::default(),
            encoding: EncodingFormat::Float,
            context_window: None,
            input_per_1k: None,
            output_per_1k: None,
            listed_price_source: None,
            warnings: Vec::new(),
            sharing: 1,
            quota_window: None,
            special_tokens: 0,
            max_inputs: None,
            renames_models: false,
            stall_timeout: Duration::from_secs(600),
        }
    }
}

/// Tokens counted up from many tasks.
#[derive(Debug, Default)]
struct UsageCounter {
    prompt: AtomicU64,
    completion: AtomicU64,
    total: AtomicU64,
}

impl UsageCounter {
    fn add(&self, usage: Usage) {
        self.prompt
            .fetch_add(usage.prompt_tokens, Ordering::Relaxed);
        self.completion
            .fetch_add(usage.completion_tokens, Ordering::Relaxed);
        self.total.fetch_add(usage.total_tokens, Ordering::Relaxed);
    }

    fn get(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt.load(Ordering::Relaxed),
            completion_tokens: self.completion.load(Ordering::Relaxed),
            total_tokens: self.total.load(Ordering::Relaxed),
        }
    }
}

pub struct ApiBackend {
    client: Client,
    /// `backend.mode = "batch"`: what the batch stages need.
    batch: Option<std::sync::Arc<BatchService>>,
    info: BackendInfo,
    /// The job's limits, the window of requests in flight, and the
    /// service's quota as its headers and refusals describe it.
    rate: RateControl,
    learned_dimensions: OnceLock<usize>,
    /// Vectors of the expected length have come: a lone vector of another
    /// length is then a damaged one, not the model's length.
    confirmed: AtomicBool,
    /// Ask for base64; cleared when the service refuses it (`auto`).
    base64: AtomicBool,
    /// Fall back to floats when the service refuses base64.
    may_fall_back: bool,
    /// `dimensions` to send, until the service refuses it.
    send_dimensions: Option<usize>,
    dimensions_refused: AtomicBool,
    renames_models: bool,
    /// The first other name the service answered with, once warned about.
    renamed: OnceLock<String>,
    requests: AtomicU64,
    retries: AtomicU64,
    invalid: AtomicU64,
    timeouts: AtomicU64,
    billed: UsageCounter,
    warnings: Mutex<Vec<String>>,
    /// What is worth a word on stderr only, for the command to print.
    notices: Warnings,
    /// Where `info.input_per_1k` came from.
    price_source: Option<String>,
    /// The window a probe before the run found, when the service lists none.
    learned_window: Option<LearnedWindow>,
    /// What the probe cost, when there was one.
    probe_cost: Option<ProbeCost>,
    /// The tokens of a text the server reads whole, when a probe found no
    /// window ([`crate::backend::RecordedWindow::read_whole`]).
    read_whole: Option<u64>,
    /// What the window probe could have cost, when the budget held it back.
    probe_held: Option<crate::backend::HeldProbe>,
}

/// One failed attempt: the service said no, or its answer failed a check.
#[derive(Debug)]
enum Attempt {
    Api(ApiError),
    /// The whole answer failed a check; it was billed and is sent again.
    Invalid(ValidationError),
    /// Every vector has another length: sending again cannot help.
    WrongLength(ValidationError),
    /// A request of several inputs got no answer in time: it is split, not sent again whole.
    TimedOut(ApiError),
    /// The answer names another model than the one asked for.
    WrongModel(String),
    /// The quota stops the run.
    Stop(QuotaStop),
    /// The request is larger than the service's token quota asks for: it is
    /// cut, not sent.
    Cut(u64),
}

impl Retryable for Attempt {
    fn should_retry(&self) -> bool {
        match self {
            Attempt::Api(e) => e.should_retry(),
            Attempt::Invalid(_) => true,
            Attempt::WrongLength(_)
            | Attempt::TimedOut(_)
            | Attempt::WrongModel(_)
            | Attempt::Stop(_)
            | Attempt::Cut(_) => false,
        }
    }

    fn requested_delay(&self) -> Option<Duration> {
        match self {
            Attempt::Api(e) => e.requested_delay(),
            _ => None,
        }
    }
}

/// Whether a refusal is about one request parameter, which the service does not take.
fn refuses_parameter(error: &ApiError, words: &[&str]) -> bool {
    matches!(error.status, Some(400 | 422))
        && error.kind != ErrorKind::TooLarge
        && words
            .iter()
            .any(|w| error.message.to_ascii_lowercase().contains(w))
}

/// A listed price per 1000 tokens (`input` or `output`), when it is a
/// price: a negative, infinite or NaN one is taken as unknown, with a warning.
fn price_of(
    model: &crate::client::Model,
    price: Option<f64>,
    what: &str,
    notices: &Warnings,
) -> Option<f64> {
    let price = price?;
    if price.is_finite() && price >= 0.0 {
        Some(price)
    } else {
        notices.warn(format!(
            "model {}: the listed price {price} per 1000 {what} tokens is not a price; the cost is unknown",
            model.id
        ));
        None
    }
}

impl ApiBackend {
    /// Batch mode: requests go through the Batch API, and the run is billed
    /// at `service.input_per_1k`; the window probe's requests at the
    /// synchronous price.
    pub fn for_batch(&mut self, service: BatchService) {
        self.info.input_per_1k = service.input_per_1k;
        self.info.other_input_per_1k = service.sync_input_per_1k;
        self.batch = Some(std::sync::Arc::new(service));
    }

    /// A synchronous run: vectors of batches an earlier run of the job
    /// collected were billed at `batch_input_per_1k`.
    pub fn batches_priced_at(&mut self, batch_input_per_1k: Option<f64>) {
        self.info.other_input_per_1k = batch_input_per_1k;
    }

    /// `model` is the service's description of the model, when it gave one.
    pub fn new(
        client: Client,
        settings: ApiSettings,
        model: Option<&crate::client::Model>,
    ) -> Self {
        let known = validate::known_model_dimensions(&settings.model);
        let dimensions = settings.dimensions.or(known);
        let notices = Warnings::new();
        let listed = |what: &str, price: fn(&crate::client::Pricing) -> Option<f64>| {
            model.and_then(|m| price_of(m, m.pricing.as_ref().and_then(price), what, &notices))
        };
        let info = BackendInfo {
            kind: BackendKind::Api,
            model: settings.model.clone(),
            dimensions,
            context_window: settings
                .context_window
                .or_else(|| model.and_then(|m| m.context_window)),
            input_per_1k: settings
                .input_per_1k
                .or_else(|| listed("input", |p| p.input_per_1k)),
            output_per_1k: settings
                .output_per_1k
                .or_else(|| listed("output", |p| p.output_per_1k)),
            other_input_per_1k: None,
            special_tokens: settings.special_tokens,
            max_inputs_per_request: settings.max_inputs,
        };
        let price_source = if settings.input_per_1k.is_some() {
            Some("`backend.input_per_1k`".to_string())
        } else {
            info.input_per_1k.and(settings.listed_price_source.clone())
        };
        let rate = RateControl::new(&RateSettings {
            concurrency: settings.concurrency,
            adaptive: settings.adaptive,
            timeout: settings.timeout,
            requests_per_minute: settings.requests_per_minute,
            tokens_per_minute: settings.tokens_per_minute,
            max_tokens_per_request: settings.max_tokens_per_request,
            retry: settings.retry,
            stall_timeout: settings.stall_timeout,
            sharing: settings.sharing,
            quota_window: settings.quota_window,
        });
        ApiBackend {
            client,
            batch: None,
            info,
            rate,
            learned_dimensions: OnceLock::new(),
            confirmed: AtomicBool::new(false),
            base64: AtomicBool::new(settings.encoding != EncodingFormat::Float),
            may_fall_back: settings.encoding == EncodingFormat::Auto,
            send_dimensions: settings.dimensions.filter(|&d| known != Some(d)),
            dimensions_refused: AtomicBool::new(false),
            renames_models: settings.renames_models,
            renamed: OnceLock::new(),
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            invalid: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            billed: UsageCounter::default(),
            warnings: Mutex::new(settings.warnings),
            notices,
            price_source,
            learned_window: None,
            read_whole: None,
            probe_cost: None,
            probe_held: None,
        }
    }

    fn warn(&self, warning: String) {
        let mut warnings = self
            .warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !warnings.contains(&warning) {
            warnings.push(warning);
        }
    }

    /// The length every vector must have, once known.
    fn expected_dimensions(&self) -> Option<usize> {
        self.info
            .dimensions
            .or_else(|| self.learned_dimensions.get().copied())
    }

    /// An answer from another model than the one asked for is refused, or,
    /// when the job says the service renames models, accepted with one warning.
    fn check_model(&self, answered: &str) -> Result<(), Attempt> {
        let asked = &self.info.model;
        if answered == asked {
            return Ok(());
        }
        if !self.renames_models {
            return Err(Attempt::WrongModel(answered.to_string()));
        }
        if self.renamed.set(answered.to_string()).is_ok() {
            self.notices.warn(format!(
                "the service answers requests for model {asked:?} as model {answered:?}; \
                 accepted because `backend.server_renames_models` is set"
            ));
        }
        Ok(())
    }

    /// Sends one request and decodes its answer, which is billed from then
    /// on. A parameter the service refuses (`encoding_format: "base64"` under
    /// `auto`, `dimensions`) is dropped for the rest of the run and the
    /// request sent again at once. A request of several inputs that times out
    /// is handed back to be split, when `splittable`.
    async fn attempt(
        &self,
        texts: &[&str],
        tokens: u64,
        splittable: bool,
    ) -> Result<RawVectors, Attempt> {
        let capacity = texts.len() * self.expected_dimensions().unwrap_or(0);
        loop {
            let admission = match self
                .rate
                .admit_or_cut(tokens, splittable && texts.len() > 1)
                .await
            {
                Ok(admission) => admission,
                Err(Held::Stop(stop)) => return Err(Attempt::Stop(stop)),
                Err(Held::Cut(most)) => return Err(Attempt::Cut(most)),
            };
            let alone = admission.alone();
            let base64 = self.base64.load(Ordering::Relaxed);
            let dimensions = self
                .send_dimensions
                .filter(|_| !self.dimensions_refused.load(Ordering::Relaxed));
            let request = EmbeddingRequest {
                encoding_format: base64.then_some("base64"),
                dimensions,
                ..EmbeddingRequest::new(&self.info.model, EmbeddingInput::Many(texts.to_vec()))
            };
            let (result, headers) = self
                .client
                .with_quota_headers(|client| async move {
                    client.embed_request(&request, capacity).await
                })
                .await;
            let error = match result {
                Ok(raw) => {
                    self.requests.fetch_add(1, Ordering::Relaxed);
                    let usage = raw.usage.unwrap_or_default();
                    self.billed.add(usage);
                    admission.answered(headers, raw.usage.map(|u| u.prompt_tokens));
                    if let Some(answered) = raw.model.as_deref() {
                        self.check_model(answered)?;
                    }
                    return Ok(raw);
                }
                Err(e) => e,
            };
            if error.is_refusal() {
                match admission.refused(headers, &error) {
                    Refusal::Wait => continue,
                    Refusal::Stop(stop) => return Err(Attempt::Stop(stop)),
                    Refusal::TooLarge => {
                        let mut error = error;
                        error.kind = ErrorKind::TooLarge;
                        return Err(Attempt::Api(error));
                    }
                }
            }
            if error.status == Some(503) {
                admission.shed(headers);
            } else {
                admission.failed(headers, error.timed_out);
            }
            if error.timed_out {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                // Beside others, the wait was theirs too: fewer in flight
                // (above) and the request sent again whole. Alone, it is too
                // large for the timeout: split.
                if splittable && texts.len() > 1 && alone {
                    return Err(Attempt::TimedOut(error));
                }
            }
            if base64
                && self.may_fall_back
                && refuses_parameter(&error, &["encoding_format", "base64"])
            {
                self.base64.store(false, Ordering::Relaxed);
                self.warn(format!(
                    "the service refused `encoding_format: \"base64\"` ({}): asking for floats for the rest of the run",
                    error.message
                ));
                continue;
            }
            if dimensions.is_some() && refuses_parameter(&error, &["dimensions", "matryoshka"]) {
                self.dimensions_refused.store(true, Ordering::Relaxed);
                self.warn(format!(
                    "the service refused `dimensions` ({}): sent without it from now on; \
                     vectors must still have the {} values `backend.dimensions` declares",
                    error.message,
                    dimensions.unwrap_or_default()
                ));
                continue;
            }
            return Err(Attempt::Api(error));
        }
    }

    /// Sends `texts` until an answer holds together (count and indices
    /// right), retrying transient faults and answers that do not; every
    /// answer that failed whole adds its usage to `wasted`. Only the first
    /// round of a request is split on a timeout: later rounds send inputs
    /// again beside vectors already paid for, which a split would drop.
    async fn round(
        &self,
        texts: &[&str],
        tokens: u64,
        expected: Option<usize>,
        first: bool,
        wasted: &Mutex<Usage>,
    ) -> Result<Checked, BackendError> {
        let mut attempts = 1;
        let result = with_retries_notify(
            self.rate.retry_policy(),
            || async {
                let raw = self.attempt(texts, tokens, first).await?;
                let usage = raw.usage.unwrap_or_default();
                validate::check_rows(raw, texts.len(), expected).map_err(|e| {
                    *wasted
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) += usage;
                    match e {
                        ValidationError::Length { .. } => Attempt::WrongLength(e),
                        _ => Attempt::Invalid(e),
                    }
                })
            },
            |failure, _wait| {
                attempts += 1;
                self.retries.fetch_add(1, Ordering::Relaxed);
                if matches!(failure, Attempt::Invalid(_)) {
                    self.invalid.fetch_add(1, Ordering::Relaxed);
                }
            },
        )
        .await;
        result.map_err(|failure| self.failure(failure, attempts))
    }

    fn failure(&self, failure: Attempt, attempts: usize) -> BackendError {
        match failure {
            Attempt::Api(e) => match e.kind {
                ErrorKind::TooLarge => too_large(e),
                ErrorKind::Permanent => BackendError::Permanent {
                    status: e.status,
                    message: e.to_string(),
                },
                ErrorKind::Transient => BackendError::Exhausted {
                    attempts,
                    message: e.to_string(),
                },
            },
            Attempt::Invalid(e) => BackendError::Exhausted {
                attempts,
                message: format!("invalid response from POST /v1/embeddings: {e}"),
            },
            Attempt::WrongLength(e) => self.wrong_length(&e),
            Attempt::TimedOut(e) => BackendError::OverLimit {
                limit: RequestLimit::Time,
                status: None,
                message: e.to_string(),
            },
            Attempt::WrongModel(answered) => BackendError::Permanent {
                status: Some(200),
                message: format!(
                    "POST /v1/embeddings answered with vectors of model {answered:?}, not {:?} \
                     as asked; if the service renames models (an alias or a gateway), set \
                     `backend.server_renames_models = true`",
                    self.info.model
                ),
            },
            Attempt::Stop(stop) => BackendError::Quota(stop),
            Attempt::Cut(most) => BackendError::Cut { most },
        }
    }

    /// The run's vectors would all be of another length: say which, and why it may be.
    fn wrong_length(&self, error: &ValidationError) -> BackendError {
        let hint = match self.send_dimensions {
            Some(d) if self.dimensions_refused.load(Ordering::Relaxed) => format!(
                "; the service refused `dimensions: {d}`, so the model's own length came back"
            ),
            Some(d) => format!("; `dimensions: {d}` was sent and the service did not apply it"),
            None => String::new(),
        };
        BackendError::Permanent {
            status: None,
            message: format!(
                "invalid response from POST /v1/embeddings: {error}{hint}. \
                 Set `backend.dimensions` to the model's length (or leave it out); \
                 nothing was retried"
            ),
        }
    }

    /// Embeds `texts`: the first answer's good vectors are kept, and only
    /// the inputs whose vectors failed are sent again, until all pass.
    async fn embed_all(&self, texts: &[&str], tokens: u64) -> Result<Vectors, BackendError> {
        let wasted = Mutex::new(Usage::default());
        let first = self
            .round(texts, tokens, self.expected_dimensions(), true, &wasted)
            .await?;
        let _ = self.learned_dimensions.set(first.vectors.dimensions);
        if !first.vectors.is_empty() {
            self.confirmed.store(true, Ordering::Relaxed);
        }
        let discarded = |extra: Usage| {
            *wasted
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                + extra
        };
        if first.rejected.is_empty() {
            let mut vectors = first.vectors;
            vectors.discarded = discarded(Usage::default());
            vectors.usage += vectors.discarded;
            return Ok(vectors);
        }
        let mut assembly = Assembly::new(texts.len(), first);
        let mut resent = Usage::default();
        let mut rounds = 0;
        while !assembly.pending.is_empty() {
            rounds += 1;
            self.retries.fetch_add(1, Ordering::Relaxed);
            self.invalid.fetch_add(1, Ordering::Relaxed);
            if rounds > self.rate.retry_policy().max_retries {
                let error = BackendError::Exhausted {
                    attempts: rounds,
                    message: format!(
                        "invalid response from POST /v1/embeddings: {}",
                        assembly.last_error
                    ),
                };
                return Err(assembly.kept(discarded(resent), error));
            }
            let pending: Vec<&str> = assembly.pending.iter().map(|&i| texts[i]).collect();
            let share = tokens * pending.len() as u64 / texts.len().max(1) as u64;
            let checked = match self
                .round(&pending, share, Some(assembly.dimensions), false, &wasted)
                .await
            {
                Ok(checked) => checked,
                // The good vectors of the rounds before were paid for: kept.
                Err(error) => return Err(assembly.kept(discarded(resent), error)),
            };
            // The inputs sent again were billed before for vectors that were
            // dropped: as much as this answer, had it counted the same.
            resent += checked.vectors.usage;
            let confirmed = self.confirmed.load(Ordering::Relaxed);
            if let Err(e) = assembly.place(checked, !confirmed) {
                let error = self.wrong_length(&e);
                return Err(assembly.kept(discarded(resent), error));
            }
        }
        let wasted = discarded(resent);
        Ok(Vectors {
            dimensions: assembly.dimensions,
            values: assembly.values,
            usage: assembly.usage + wasted,
            discarded: wasted,
        })
    }
}

/// A too-large refusal, sorted by what was too large.
fn too_large(e: ApiError) -> BackendError {
    let limit = match e.size_limit() {
        SizeLimit::Input => {
            return BackendError::TooLarge {
                status: e.status,
                message: e.message,
            }
        }
        SizeLimit::Inputs(most) => RequestLimit::Inputs(most),
        SizeLimit::Tokens(most) => RequestLimit::Tokens(most),
        SizeLimit::Request => RequestLimit::Inputs(None),
    };
    BackendError::OverLimit {
        limit,
        status: e.status,
        message: e.message,
    }
}

/// The vectors of one request, put together from answers to its inputs
/// that were sent again.
struct Assembly {
    dimensions: usize,
    values: Vec<f32>,
    /// The usage of the first answer: what paid for the vectors kept.
    usage: Usage,
    /// Inputs still without a vector, ascending.
    pending: Vec<usize>,
    /// The length each pending input's vector last had, when that was the fault.
    lengths: Vec<Option<usize>>,
    last_error: ValidationError,
}

impl Assembly {
    fn new(inputs: usize, first: Checked) -> Assembly {
        let dimensions = first.vectors.dimensions;
        let mut assembly = Assembly {
            dimensions,
            values: vec![0.0; inputs * dimensions],
            usage: first.vectors.usage,
            pending: (0..inputs).collect(),
            lengths: vec![None; inputs],
            last_error: ValidationError::Empty,
        };
        // Placing the first answer cannot find a repeated wrong length.
        let _ = assembly.place(first, false);
        assembly
    }

    /// The vectors placed so far, with everything billed (`wasted` of it
    /// for vectors dropped), as `error` ends the request: nothing paid for
    /// that passed is lost.
    fn kept(self, wasted: Usage, error: BackendError) -> BackendError {
        let d = self.dimensions;
        let mut pending = self.pending.iter().peekable();
        let mut inputs = Vec::new();
        let mut values = Vec::new();
        for (input, row) in self.values.chunks_exact(d.max(1)).enumerate() {
            if pending.peek().is_some_and(|&&p| p == input) {
                pending.next();
                continue;
            }
            inputs.push(input);
            values.extend_from_slice(row);
        }
        if inputs.is_empty() || d == 0 {
            return error;
        }
        BackendError::Partial {
            kept: Box::new(Kept {
                inputs,
                vectors: Vectors {
                    dimensions: d,
                    values,
                    usage: self.usage + wasted,
                    discarded: wasted,
                },
            }),
            error: Box::new(error),
        }
    }

    /// Puts the vectors of an answer to `pending` in place; its failed
    /// inputs are pending next. Before any vector of the expected length
    /// came (`unconfirmed`), the same input failing twice with the same wrong
    /// length is the model's length, not a damaged vector.
    fn place(&mut self, checked: Checked, unconfirmed: bool) -> Result<(), ValidationError> {
        let d = self.dimensions;
        let mut kept = checked.vectors.rows();
        let mut failed = checked.rejected.into_iter().peekable();
        let mut next = Vec::new();
        for (position, &input) in self.pending.iter().enumerate() {
            if failed.peek().is_some_and(|r| r.index == position) {
                let rejected = failed.next().expect("peeked");
                if let ValidationError::Dimensions { got, .. } = rejected.error {
                    if unconfirmed && self.lengths[input] == Some(got) {
                        return Err(ValidationError::Length { expected: d, got });
                    }
                    self.lengths[input] = Some(got);
                }
                self.last_error = rejected.error;
                next.push(input);
            } else if let Some(row) = kept.next() {
                self.values[input * d..(input + 1) * d].copy_from_slice(row);
            }
        }
        self.pending = next;
        Ok(())
    }
}

impl EmbeddingBackend for ApiBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [&'a str],
        tokens: u64,
    ) -> BoxFuture<'a, Result<Vectors, BackendError>> {
        self.embed_all(texts, tokens).boxed()
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            requests: self.requests.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            invalid_responses: self.invalid.load(Ordering::Relaxed),
            throttled: self.rate.throttled(),
            quota_wait_ms: u64::try_from(self.rate.waited().as_millis()).unwrap_or(u64::MAX),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            billed: self.billed.get(),
            lowered_concurrency: self.rate.lowered(),
            window: self.learned_window,
            window_probe: self.probe_cost,
            read_whole: self.read_whole,
            probe_held: self.probe_held,
            concurrency: self.rate.settled(),
        }
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn notices(&self) -> Warnings {
        self.notices.clone()
    }

    fn price_source(&self) -> Option<String> {
        self.price_source.clone()
    }

    fn batch(&self) -> Option<std::sync::Arc<BatchService>> {
        self.batch.clone()
    }
}
