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
use crate::validate::{self, ValidationError, Vectors};

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
}

pub struct ApiBackend {
    client: Client,
    info: BackendInfo,
    retry: RetryPolicy,
    throttle: Throttle,
    requests_limit: Option<DefaultDirectRateLimiter>,
    tokens_limit: Option<(DefaultDirectRateLimiter, NonZeroU32)>,
    learned_dimensions: OnceLock<usize>,
    requests: AtomicU64,
    retries: AtomicU64,
    invalid: AtomicU64,
}

/// One failed attempt: the service said no, or its answer failed a check.
#[derive(Debug)]
enum Attempt {
    Api(ApiError),
    Invalid(ValidationError),
}

impl Retryable for Attempt {
    fn should_retry(&self) -> bool {
        match self {
            Attempt::Api(e) => e.should_retry(),
            Attempt::Invalid(_) => true,
        }
    }

    fn requested_delay(&self) -> Option<Duration> {
        match self {
            Attempt::Api(e) => e.requested_delay(),
            Attempt::Invalid(_) => None,
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
            input_per_1k: model.and_then(|m| m.pricing).and_then(|p| p.input_per_1k),
        };
        let requests_limit = NonZeroU32::new(settings.requests_per_minute)
            .map(|rpm| RateLimiter::direct(smooth_quota(rpm, 1)));
        let tokens_limit = NonZeroU32::new(
            u32::try_from(settings.tokens_per_minute).unwrap_or(u32::MAX),
        )
        .map(|tpm| {
            let request = u32::try_from(settings.max_tokens_per_request).unwrap_or(u32::MAX);
            let quota = smooth_quota(tpm, request);
            (RateLimiter::direct(quota), quota.burst_size())
        });
        ApiBackend {
            client,
            info,
            retry: settings.retry,
            throttle: Throttle::new(settings.concurrency),
            requests_limit,
            tokens_limit,
            learned_dimensions: OnceLock::new(),
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            invalid: AtomicU64::new(0),
        }
    }

    async fn wait_for_rate_limits(&self, tokens: u64) {
        if let Some(limit) = &self.requests_limit {
            limit.until_ready().await;
        }
        if let Some((limit, per_minute)) = &self.tokens_limit {
            // A request larger than a minute's allowance waits for a whole minute's worth.
            let n = u32::try_from(tokens)
                .unwrap_or(u32::MAX)
                .clamp(1, per_minute.get());
            let n = NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
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
        let vectors =
            validate::check_flat(response, texts.len(), expected).map_err(Attempt::Invalid)?;
        let _ = self.learned_dimensions.set(vectors.dimensions);
        self.throttle.on_success();
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(vectors)
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
