//! The service backend: retries with backoff, client-side rate limits, an
//! adaptive window of requests in flight, and a check of every response.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::throttle::Throttle;
use super::{BackendError, BackendInfo, BackendStats, EmbeddingBackend};
use crate::client::{ApiError, Client, EmbeddingInput, ErrorKind};
use crate::job::BackendKind;
use crate::retry::{with_retries_notify, RetryPolicy, Retryable};
use crate::types::Vectors;
use crate::validate::{self, ValidationError};

#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub model: String,
    pub dimensions: Option<usize>,
    pub concurrency: usize,
    pub requests_per_minute: u32,
    pub tokens_per_minute: u64,
    /// The largest request the batcher makes, in tokens: the token bucket must hold one.
    pub max_tokens_per_request: u64,
    pub retry: RetryPolicy,
    /// The service answers under another name than the model asked for (an
    /// alias, a gateway): accept it, with a warning. Otherwise such an
    /// answer is refused.
    pub renames_models: bool,
}

pub struct ApiBackend {
    client: Client,
    info: BackendInfo,
    retry: RetryPolicy,
    throttle: Throttle,
    requests_limit: Option<DefaultDirectRateLimiter>,
    tokens_limit: Option<(DefaultDirectRateLimiter, NonZeroU32)>,
    learned_dimensions: OnceLock<usize>,
    renames_models: bool,
    /// The first other name the service answered with, once warned about.
    renamed: OnceLock<String>,
    requests: AtomicU64,
    retries: AtomicU64,
    invalid: AtomicU64,
}

/// One failed attempt: the service said no, or its answer failed a check.
#[derive(Debug)]
enum Attempt {
    Api(ApiError),
    Invalid(ValidationError),
    /// The answer names another model than the one asked for.
    WrongModel(String),
}

impl Retryable for Attempt {
    fn should_retry(&self) -> bool {
        match self {
            Attempt::Api(e) => e.should_retry(),
            Attempt::Invalid(_) => true,
            Attempt::WrongModel(_) => false,
        }
    }

    fn requested_delay(&self) -> Option<Duration> {
        match self {
            Attempt::Api(e) => e.requested_delay(),
            Attempt::Invalid(_) | Attempt::WrongModel(_) => None,
        }
    }
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
    /// `model` is the service's listing of the model, when it was fetched.
    pub fn new(
        client: Client,
        settings: ApiSettings,
        model: Option<&crate::client::Model>,
    ) -> Self {
        let dimensions = settings
            .dimensions
            .or_else(|| validate::known_model_dimensions(&settings.model));
        let info = BackendInfo {
            kind: BackendKind::Api,
            model: settings.model.clone(),
            dimensions,
            context_window: model.and_then(|m| m.context_window),
            input_per_1k: model.and_then(price_of),
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
            requests_limit,
            tokens_limit,
            learned_dimensions: OnceLock::new(),
            renames_models: settings.renames_models,
            renamed: OnceLock::new(),
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            invalid: AtomicU64::new(0),
        }
    }

    async fn wait_for_rate_limits(&self, tokens: u64) {
        if let Some(limit) = &self.requests_limit {
            limit.until_ready().await;
        }
        if let Some((limit, burst)) = &self.tokens_limit {
            let n = NonZeroU32::new(token_cells(tokens, *burst)).unwrap_or(NonZeroU32::MIN);
            // n never exceeds the quota's burst, so capacity is always sufficient.
            let _ = limit.until_n_ready(n).await;
        }
    }

    async fn attempt(&self, texts: &[&str], tokens: u64) -> Result<Vectors, Attempt> {
        self.wait_for_rate_limits(tokens).await;
        let _permit = self.throttle.acquire().await;
        let expected = self
            .info
            .dimensions
            .or_else(|| self.learned_dimensions.get().copied());
        let capacity = texts.len() * expected.unwrap_or(0);
        let response = self
            .client
            .embeddings_flat(
                &self.info.model,
                EmbeddingInput::Many(texts.to_vec()),
                capacity,
            )
            .await
            .map_err(|e| {
                if e.status == Some(429) {
                    self.throttle.on_throttled(e.retry_after);
                }
                Attempt::Api(e)
            })?;
        if let Some(answered) = response.model.as_deref() {
            self.check_model(answered)?;
        }
        let vectors = validate::check(response, texts.len(), expected).map_err(Attempt::Invalid)?;
        let _ = self.learned_dimensions.set(vectors.dimensions);
        self.throttle.on_success();
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(vectors)
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

    async fn embed_with_retries(
        &self,
        texts: &[&str],
        tokens: u64,
    ) -> Result<Vectors, BackendError> {
        let mut attempts = 1;
        let result = with_retries_notify(
            &self.retry,
            || self.attempt(texts, tokens),
            |failure, _wait| {
                attempts += 1;
                self.retries.fetch_add(1, Ordering::Relaxed);
                if matches!(failure, Attempt::Invalid(_)) {
                    self.invalid.fetch_add(1, Ordering::Relaxed);
                }
            },
        )
        .await;
        result.map_err(|failure| match failure {
            Attempt::Api(e) => match e.kind {
                ErrorKind::TooLarge => BackendError::TooLarge {
                    status: e.status,
                    message: e.message,
                },
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
            Attempt::WrongModel(answered) => BackendError::Permanent {
                status: Some(200),
                message: format!(
                    "POST /v1/embeddings answered with vectors of model {answered:?}, not {:?} \
                     as asked; if the service renames models (an alias or a gateway), set \
                     `backend.server_renames_models = true`",
                    self.info.model
                ),
            },
        })
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
        self.embed_with_retries(texts, tokens).boxed()
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            requests: self.requests.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            invalid_responses: self.invalid.load(Ordering::Relaxed),
            throttled: self.throttle.throttled(),
        }
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
