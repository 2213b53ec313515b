//! The service backend: retries with backoff, client-side rate limits, an
//! adaptive window of requests in flight, and a check of every response.
//!
//! Every response that arrives whole was billed, so its usage is counted
//! whether or not its vectors pass. When only some vectors of an answer fail
//! (a wrong length, a non-finite value) the others are kept and only the
//! failed inputs are sent again; an answer whose vectors all have another
//! length than expected stops the run, as sending it again would only be
//! billed again. A request that times out is not sent again whole: the
//! server may still compute and bill it.

mod config;

pub use self::config::{
    ApiParams, EncodingFormat, Kind, DEFAULT_API_KEY_ENV, DEFAULT_STALL_TIMEOUT_SECONDS,
    MAX_STALL_TIMEOUT_SECONDS,
};

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::quota::{self, Pacing, QuotaStop, Ticket};
use super::throttle::Throttle;
use super::{BackendError, BackendInfo, BackendKind, BackendStats, EmbeddingBackend, RequestLimit};
use crate::client::{
    ApiError, Client, EmbeddingInput, EmbeddingRequest, ErrorKind, RateLimitHeaders, SizeLimit,
};
use crate::retry::{with_retries_notify, RetryPolicy, Retryable};
use crate::types::{RawVectors, Usage, Vectors};
use crate::validate::{self, Checked, ValidationError};

#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub model: String,
    /// `backend.dimensions`: the length asked for (sent as `dimensions`
    /// when it is not the model's known length).
    pub dimensions: Option<usize>,
    pub concurrency: usize,
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
}

impl ApiSettings {
    /// Settings for `model` with no client-side limits, one request in
    /// flight, the default retries and floats.
    pub fn new(model: impl Into<String>) -> Self {
        ApiSettings {
            model: model.into(),
            dimensions: None,
            concurrency: 1,
            requests_per_minute: 0,
            tokens_per_minute: 0,
            max_tokens_per_request: 0,
            retry: RetryPolicy::default(),
            encoding: EncodingFormat::Float,
            context_window: None,
            input_per_1k: None,
            warnings: Vec::new(),
            sharing: 1,
            renames_models: false,
            stall_timeout: Duration::from_secs(600),
        }
    }
}

/// Tokens counted up from many tasks.
#[derive(Debug, Default)]
struct UsageCounter {
    prompt: AtomicU64,
    total: AtomicU64,
}

impl UsageCounter {
    fn add(&self, usage: Usage) {
        self.prompt
            .fetch_add(usage.prompt_tokens, Ordering::Relaxed);
        self.total.fetch_add(usage.total_tokens, Ordering::Relaxed);
    }

    fn get(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt.load(Ordering::Relaxed),
            total_tokens: self.total.load(Ordering::Relaxed),
        }
    }
}

pub struct ApiBackend {
    client: Client,
    info: BackendInfo,
    retry: RetryPolicy,
    throttle: Throttle,
    /// The service's quota, as its headers and refusals describe it.
    pacing: Pacing,
    requests_limit: Option<DefaultDirectRateLimiter>,
    tokens_limit: Option<(DefaultDirectRateLimiter, NonZeroU32)>,
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
}

impl Retryable for Attempt {
    fn should_retry(&self) -> bool {
        match self {
            Attempt::Api(e) => e.should_retry(),
            Attempt::Invalid(_) => true,
            Attempt::WrongLength(_)
            | Attempt::TimedOut(_)
            | Attempt::WrongModel(_)
            | Attempt::Stop(_) => false,
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

/// `per_minute` spread evenly over the minute, with a burst of one second's
/// worth (but at least `least_burst`, and at most the minute's): a limit of
/// 600 a minute sends 10 a second, not 600 at once.
fn smooth_quota(per_minute: NonZeroU32, least_burst: u32) -> Quota {
    let burst = per_minute
        .get()
        .div_ceil(60)
        .max(least_burst)
        .min(per_minute.get());
    let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
    let period = Duration::from_secs(60) / per_minute.get();
    Quota::with_period(period)
        .unwrap_or_else(|| Quota::per_minute(per_minute))
        .allow_burst(burst)
}

/// The client-side limits `backend.requests_per_minute` and
/// `backend.tokens_per_minute` set, as the backend applies them; the estimate
/// uses the same quotas to tell the shortest time a run can take.
#[derive(Debug, Clone, Copy, Default)]
pub struct RateLimits {
    requests: Option<Quota>,
    /// The token quota and its burst, which caps the cells one request takes.
    tokens: Option<(Quota, NonZeroU32)>,
}

impl RateLimits {
    /// The limits for the given settings; 0 means no limit. The token bucket
    /// holds at least one request of `max_tokens_per_request` tokens.
    #[must_use]
    pub fn new(
        requests_per_minute: u32,
        tokens_per_minute: u64,
        max_tokens_per_request: u64,
    ) -> Self {
        let requests = NonZeroU32::new(requests_per_minute).map(|rpm| smooth_quota(rpm, 1));
        let tokens =
            NonZeroU32::new(u32::try_from(tokens_per_minute).unwrap_or(u32::MAX)).map(|tpm| {
                let request = u32::try_from(max_tokens_per_request).unwrap_or(u32::MAX);
                let quota = smooth_quota(tpm, request);
                (quota, quota.burst_size())
            });
        RateLimits { requests, tokens }
    }

    /// Whether any client-side limit is set.
    pub fn is_limited(&self) -> bool {
        self.requests.is_some() || self.tokens.is_some()
    }

    /// The cells a request of `tokens` tokens takes from the token bucket.
    pub fn token_cells(&self, tokens: u64) -> u64 {
        self.tokens
            .map_or(0, |(_, burst)| u64::from(token_cells(tokens, burst)))
    }

    /// The least time in which `requests` requests taking `token_cells`
    /// cells in all can be let through, with no retries: each bucket starts
    /// full and then refills one cell per replenish interval. `None` when no
    /// limit is set, as the time then depends on the service alone.
    pub fn shortest_duration(&self, requests: u64, token_cells: u64) -> Option<Duration> {
        if !self.is_limited() {
            return None;
        }
        let wait = |quota: Quota, cells: u64| {
            let beyond_burst = cells.saturating_sub(u64::from(quota.burst_size().get()));
            quota
                .replenish_interval()
                .checked_mul(u32::try_from(beyond_burst).unwrap_or(u32::MAX))
                .unwrap_or(Duration::MAX)
        };
        let by_requests = self.requests.map_or(Duration::ZERO, |q| wait(q, requests));
        let by_tokens = self
            .tokens
            .map_or(Duration::ZERO, |(q, _)| wait(q, token_cells));
        Some(by_requests.max(by_tokens))
    }
}

/// The listed price per 1000 input tokens, when it is a price: a negative,
/// infinite or NaN one is taken as unknown.
fn price_of(model: &crate::client::Model) -> Option<f64> {
    let price = model.pricing.and_then(|p| p.input_per_1k)?;
    if price.is_finite() && price >= 0.0 {
        Some(price)
    } else {
        crate::progress::warn(&format!(
            "model {}: the listed price {price} per 1000 tokens is not a price; the cost is unknown",
            model.id
        ));
        None
    }
}

/// A request larger than the bucket waits for a full bucket.
fn token_cells(tokens: u64, burst: NonZeroU32) -> u32 {
    u32::try_from(tokens)
        .unwrap_or(u32::MAX)
        .clamp(1, burst.get())
}

impl ApiBackend {
    /// `model` is the service's description of the model, when it gave one.
    pub fn new(
        client: Client,
        settings: ApiSettings,
        model: Option<&crate::client::Model>,
    ) -> Self {
        let known = validate::known_model_dimensions(&settings.model);
        let dimensions = settings.dimensions.or(known);
        let info = BackendInfo {
            kind: BackendKind::Api,
            model: settings.model.clone(),
            dimensions,
            context_window: settings
                .context_window
                .or_else(|| model.and_then(|m| m.context_window)),
            input_per_1k: settings.input_per_1k.or_else(|| model.and_then(price_of)),
        };
        let limits = RateLimits::new(
            settings.requests_per_minute,
            settings.tokens_per_minute,
            settings.max_tokens_per_request,
        );
        let requests_limit = limits.requests.map(RateLimiter::direct);
        let tokens_limit = limits
            .tokens
            .map(|(quota, burst)| (RateLimiter::direct(quota), burst));
        ApiBackend {
            client,
            info,
            retry: settings.retry,
            throttle: Throttle::new(settings.concurrency),
            pacing: Pacing::new(settings.stall_timeout).shared_by(settings.sharing),
            requests_limit,
            tokens_limit,
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

    async fn wait_for_rate_limits(&self, tokens: u64) {
        let _waiting = (self.requests_limit.is_some() || self.tokens_limit.is_some())
            .then(|| self.pacing.waiting());
        if let Some(limit) = &self.requests_limit {
            limit.until_ready().await;
        }
        if let Some((limit, burst)) = &self.tokens_limit {
            let n = NonZeroU32::new(token_cells(tokens, *burst)).unwrap_or(NonZeroU32::MIN);
            // n never exceeds the quota's burst, so capacity is always sufficient.
            let _ = limit.until_n_ready(n).await;
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
            crate::progress::warn(&format!(
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
            self.wait_for_rate_limits(tokens).await;
            // A place in flight first, then the quota: a pause set while
            // waiting for the place still holds the request back.
            let permit = self.throttle.acquire().await;
            let ticket = self.pacing.admit(tokens).await.map_err(Attempt::Stop)?;
            let base64 = self.base64.load(Ordering::Relaxed);
            let dimensions = self
                .send_dimensions
                .filter(|_| !self.dimensions_refused.load(Ordering::Relaxed));
            let request = EmbeddingRequest {
                encoding_format: base64.then_some("base64"),
                dimensions,
                ..EmbeddingRequest::new(&self.info.model, EmbeddingInput::Many(texts.to_vec()))
            };
            let (result, headers) = self.send(&request, capacity).await;
            drop(permit);
            let error = match result {
                Ok(raw) => {
                    self.requests.fetch_add(1, Ordering::Relaxed);
                    let usage = raw.usage.unwrap_or_default();
                    self.billed.add(usage);
                    self.pacing
                        .on_answer(ticket, headers, raw.usage.map(|u| u.prompt_tokens));
                    self.throttle.on_success();
                    if let Some(answered) = raw.model.as_deref() {
                        self.check_model(answered)?;
                    }
                    return Ok(raw);
                }
                Err(e) => e,
            };
            if error.status == Some(429) {
                self.rate_limited(ticket, headers, error)?;
                continue;
            }
            self.pacing.on_failure(ticket, headers);
            if error.timed_out {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                self.throttle.on_timeout();
                if splittable && texts.len() > 1 {
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

    /// Sends one request, with the quota's headers of its answer, if any.
    async fn send(
        &self,
        request: &EmbeddingRequest<'_>,
        capacity: usize,
    ) -> (Result<RawVectors, ApiError>, Option<RateLimitHeaders>) {
        let seen = std::sync::Arc::new(Mutex::new(None));
        let slot = std::sync::Arc::clone(&seen);
        let client = self.client.observed(std::sync::Arc::new(move |_, headers| {
            *slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                RateLimitHeaders::parse(headers);
        }));
        let result = client.embed_request(request, capacity).await;
        let headers = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        (result, headers)
    }

    /// A 429. A rate limit is waited out (the caller sends again once the
    /// quota allows) and uses up no retry; a refusal because the quota is
    /// used up, or because the request is larger than the whole quota, is
    /// handed back.
    fn rate_limited(
        &self,
        ticket: Ticket,
        headers: Option<RateLimitHeaders>,
        mut error: ApiError,
    ) -> Result<(), Attempt> {
        if quota::is_insufficient_quota(&error) {
            self.pacing.on_failure(ticket, headers);
            return Err(Attempt::Stop(QuotaStop::InsufficientQuota(error.message)));
        }
        if quota::is_larger_than_quota(&error) {
            self.pacing.on_failure(ticket, headers);
            error.kind = ErrorKind::TooLarge;
            return Err(Attempt::Api(error));
        }
        if !self.pacing.on_refused(ticket, headers, &error) {
            // No headers to pace by: fewer requests in flight (the pause is the pacing's).
            self.throttle.on_throttled(None);
        }
        Ok(())
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
            &self.retry,
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
            if rounds > self.retry.max_retries {
                return Err(BackendError::Exhausted {
                    attempts: rounds,
                    message: format!(
                        "invalid response from POST /v1/embeddings: {}",
                        assembly.last_error
                    ),
                });
            }
            let pending: Vec<&str> = assembly.pending.iter().map(|&i| texts[i]).collect();
            let share = tokens * pending.len() as u64 / texts.len().max(1) as u64;
            let checked = self
                .round(&pending, share, Some(assembly.dimensions), false, &wasted)
                .await?;
            // The inputs sent again were billed before for vectors that were
            // dropped: as much as this answer, had it counted the same.
            resent += checked.vectors.usage;
            let confirmed = self.confirmed.load(Ordering::Relaxed);
            assembly
                .place(checked, !confirmed)
                .map_err(|e| self.wrong_length(&e))?;
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
            throttled: self.pacing.throttled(),
            quota_wait_ms: u64::try_from(self.pacing.waited().as_millis()).unwrap_or(u64::MAX),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            billed: self.billed.get(),
            lowered_concurrency: self.throttle.lowered(),
        }
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_limit_has_no_shortest_duration() {
        let limits = RateLimits::new(0, 0, 1000);
        assert!(!limits.is_limited());
        assert_eq!(limits.shortest_duration(1000, 0), None);
        assert_eq!(limits.token_cells(500), 0);
    }

    #[test]
    fn requests_beyond_the_burst_wait_one_interval_each() {
        // 60 a minute: one a second, a burst of one.
        let limits = RateLimits::new(60, 0, 1000);
        assert_eq!(limits.shortest_duration(1, 0), Some(Duration::ZERO));
        assert_eq!(
            limits.shortest_duration(11, 0),
            Some(Duration::from_secs(10))
        );
        // 600 a minute: a burst of 10, then one every 100 ms.
        let limits = RateLimits::new(600, 0, 1000);
        assert_eq!(limits.shortest_duration(10, 0), Some(Duration::ZERO));
        assert_eq!(
            limits.shortest_duration(20, 0),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn tokens_bound_the_duration_when_they_are_the_tighter_limit() {
        // 6000 tokens a minute, a burst of one 1000-token request, then 100 tokens a second.
        let limits = RateLimits::new(600, 6000, 1000);
        assert_eq!(limits.token_cells(0), 1);
        // A request larger than the burst takes the whole burst.
        assert_eq!(limits.token_cells(7000), 1000);
        assert_eq!(
            limits.shortest_duration(3, 3000),
            Some(Duration::from_secs(20))
        );
    }
}
