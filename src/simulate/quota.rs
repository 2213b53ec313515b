//! Quotas as OpenAI documents them: requests and tokens per minute, shared
//! by every caller of one key.
//!
//! Each limit is a bucket that holds a minute's allowance and refills
//! continuously; a request takes one request and its billed tokens. A request
//! the bucket cannot cover gets a 429, and still takes its request from the
//! request bucket (so a client that retries in a tight loop digs itself
//! deeper, down to a minute's debt). Every embeddings response carries
//! `x-ratelimit-limit-*`, `x-ratelimit-remaining-*` and
//! `x-ratelimit-reset-*` (the time until the bucket is full again, written
//! as OpenAI writes it: `6m0s`, `1.5s`, `120ms`). The minute can be
//! shortened (`window`) so that tests and benchmarks run in seconds.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tokio::time::Instant;

use super::error::ApiError;

/// Keys whose buckets are kept; past this many the buckets start over.
const MAX_KEYS: usize = 4096;

/// The quotas a simulator enforces on `POST /v1/embeddings`.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaConfig {
    /// Requests allowed per window.
    pub requests_per_minute: Option<u64>,
    /// Billed tokens allowed per window.
    pub tokens_per_minute: Option<u64>,
    /// The length of the quota's "minute": 60 s, or shorter in tests.
    pub window: Duration,
    /// Send the `x-ratelimit-*` headers (as OpenAI does); without them a
    /// client learns of the quota from 429s alone, as behind many gateways.
    pub headers: bool,
    /// After this many requests admitted, every request gets a 429 with code
    /// `insufficient_quota`: the account is out of credit.
    pub insufficient_after: Option<u64>,
    /// A key's buckets start empty rather than full, so that a benchmark
    /// measures the quota's rate and not the first minute's allowance.
    pub start_empty: bool,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        QuotaConfig {
            requests_per_minute: None,
            tokens_per_minute: None,
            window: Duration::from_secs(60),
            headers: true,
            insufficient_after: None,
            start_empty: false,
        }
    }
}

impl QuotaConfig {
    /// Whether any quota is enforced.
    pub fn is_set(&self) -> bool {
        self.requests_per_minute.is_some()
            || self.tokens_per_minute.is_some()
            || self.insufficient_after.is_some()
    }

    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.requests_per_minute == Some(0) {
            problems.push("requests_per_minute must be at least 1".to_string());
        }
        if self.tokens_per_minute == Some(0) {
            problems.push("tokens_per_minute must be at least 1".to_string());
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&self.window) {
            problems.push(format!(
                "quota_window_ms must be between 10 and 3600000, got {}",
                self.window.as_millis()
            ));
        }
        problems
    }
}

/// One limit's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    limit: f64,
    /// What is left; below 0 after refused requests took from an empty bucket.
    level: f64,
    at: Instant,
}

impl Bucket {
    #[allow(clippy::cast_precision_loss)]
    fn new(limit: u64, now: Instant, empty: bool) -> Bucket {
        Bucket {
            limit: limit as f64,
            level: if empty { 0.0 } else { limit as f64 },
            at: now,
        }
    }

    /// Refills at `limit` per `window` up to `limit`.
    fn refill(&mut self, now: Instant, window: Duration) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + self.limit * elapsed / window.as_secs_f64()).min(self.limit);
        self.at = now;
    }

    /// The time until the bucket holds `amount`.
    fn time_until(&self, amount: f64, window: Duration) -> Duration {
        let missing = (amount - self.level).max(0.0);
        Duration::from_secs_f64(missing / self.limit * window.as_secs_f64())
    }
}

/// The buckets of one key.
#[derive(Debug, Clone, Copy)]
struct Buckets {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<String, Buckets>,
    admitted: u64,
}

/// Why a request was refused, for the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Requests,
    Tokens,
    InsufficientQuota,
}

impl Refusal {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Refusal::Requests => "requests",
            Refusal::Tokens => "tokens",
            Refusal::InsufficientQuota => "insufficient_quota",
        }
    }
}

/// A refused request: the 429 to send and why.
#[derive(Debug)]
pub(crate) struct Refused {
    pub refusal: Refusal,
    pub error: ApiError,
    pub headers: HeaderMap,
}

/// The quotas of a running simulator.
#[derive(Debug)]
pub(crate) struct Quotas {
    config: QuotaConfig,
    state: Mutex<State>,
}

impl Quotas {
    pub(crate) fn new(config: QuotaConfig) -> Self {
        Quotas {
            config,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn buckets<'a>(&self, state: &'a mut State, key: &str, now: Instant) -> &'a mut Buckets {
        if state.keys.len() >= MAX_KEYS && !state.keys.contains_key(key) {
            state.keys.clear();
        }
        let config = &self.config;
        let buckets = state
            .keys
            .entry(key.to_string())
            .or_insert_with(|| Buckets {
                requests: config
                    .requests_per_minute
                    .map(|l| Bucket::new(l, now, config.start_empty)),
                tokens: config
                    .tokens_per_minute
                    .map(|l| Bucket::new(l, now, config.start_empty)),
            });
        for bucket in [&mut buckets.requests, &mut buckets.tokens]
            .into_iter()
            .flatten()
        {
            bucket.refill(now, config.window);
        }
        buckets
    }

    /// The headers of a response to `key` that took nothing from its quota.
    pub(crate) fn peek(&self, key: &str) -> HeaderMap {
        if !self.config.headers || !self.config.is_set() {
            return HeaderMap::new();
        }
        let mut state = self.state();
        let buckets = *self.buckets(&mut state, key, Instant::now());
        self.headers(&buckets)
    }

    /// Takes a request of `tokens` billed tokens from `key`'s quota, or
    /// refuses it. The headers go on the response either way.
    pub(crate) fn admit(&self, key: &str, tokens: u64) -> Result<HeaderMap, Box<Refused>> {
        let now = Instant::now();
        let window = self.config.window;
        let mut state = self.state();
        if self
            .config
            .insufficient_after
            .is_some_and(|n| state.admitted >= n)
        {
            let buckets = *self.buckets(&mut state, key, now);
            return Err(Box::new(Refused {
                refusal: Refusal::InsufficientQuota,
                error: insufficient_quota(),
                headers: self.headers(&buckets),
            }));
        }
        #[allow(clippy::cast_precision_loss)]
        let tokens = tokens as f64;
        let buckets = self.buckets(&mut state, key, now);
        let mut refusal = None;
        let mut wait = Duration::ZERO;
        if let Some(bucket) = buckets.requests.as_mut() {
            let short = bucket.level < 1.0;
            // Refused requests count too, down to a minute's debt.
            bucket.level = (bucket.level - 1.0).max(-bucket.limit);
            if short {
                refusal = Some(Refusal::Requests);
                wait = wait.max(bucket.time_until(1.0, window));
            }
        }
        let mut too_large = None;
        if let Some(bucket) = buckets.tokens.as_ref() {
            if tokens > bucket.limit {
                too_large = Some(bucket.limit);
            } else if bucket.level < tokens {
                refusal.get_or_insert(Refusal::Tokens);
                wait = wait.max(bucket.time_until(tokens, window));
            }
        }
        let buckets = *buckets;
        if let Some(limit) = too_large {
            return Err(Box::new(Refused {
                refusal: Refusal::Tokens,
                error: request_too_large(limit, tokens),
                headers: self.headers(&buckets),
            }));
        }
        if let Some(refusal) = refusal {
            let mut headers = self.headers(&buckets);
            retry_after(&mut headers, wait);
            return Err(Box::new(Refused {
                refusal,
                error: rate_limited(refusal, &buckets, tokens, wait),
                headers,
            }));
        }
        let buckets = self.buckets(&mut state, key, now);
        if let Some(bucket) = buckets.tokens.as_mut() {
            bucket.level -= tokens;
        }
        let buckets = *buckets;
        state.admitted += 1;
        Ok(self.headers(&buckets))
    }

    /// Headers that claim the whole quota is left (the configured limits, or
    /// a made-up generous quota when none is enforced), as a lying server sends.
    pub(crate) fn whole(&self) -> HeaderMap {
        let now = Instant::now();
        let full = |limit: Option<u64>, made_up: u64| {
            Some(Bucket::new(limit.unwrap_or(made_up), now, false))
        };
        let buckets = Buckets {
            requests: full(self.config.requests_per_minute, 10_000),
            tokens: full(self.config.tokens_per_minute, 10_000_000),
        };
        quota_headers(&buckets, self.config.window)
    }

    fn headers(&self, buckets: &Buckets) -> HeaderMap {
        if !self.config.headers {
            return HeaderMap::new();
        }
        quota_headers(buckets, self.config.window)
    }
}

/// The `x-ratelimit-*` headers that describe `buckets`.
fn quota_headers(buckets: &Buckets, window: Duration) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, bucket) in [("requests", buckets.requests), ("tokens", buckets.tokens)] {
        let Some(bucket) = bucket else { continue };
        let reset = bucket.time_until(bucket.limit, window);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let values = [
            ("limit", (bucket.limit as u64).to_string()),
            (
                "remaining",
                (bucket.level.max(0.0).floor() as u64).to_string(),
            ),
            ("reset", format_reset(reset)),
        ];
        for (what, value) in values {
            if let (Ok(name), Ok(value)) = (
                HeaderName::try_from(format!("x-ratelimit-{what}-{name}")),
                HeaderValue::try_from(value),
            ) {
                headers.insert(name, value);
            }
        }
    }
    headers
}

/// `Retry-After` in whole seconds (rounded up) and `retry-after-ms`.
fn retry_after(headers: &mut HeaderMap, wait: Duration) {
    let ms = wait.as_millis().max(1);
    headers.insert("retry-after", HeaderValue::from(ms.div_ceil(1000) as u64));
    headers.insert(
        "retry-after-ms",
        HeaderValue::from(u64::try_from(ms).unwrap_or(u64::MAX)),
    );
}

/// A duration as OpenAI writes a reset: `6m0s`, `1m30.5s`, `1.5s`, `120ms`, `0s`.
pub fn format_reset(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let seconds = |ms: u128| {
        let whole = ms / 1000;
        let fraction = ms % 1000;
        if fraction == 0 {
            format!("{whole}s")
        } else {
            let digits = format!("{fraction:03}");
            format!("{whole}.{}s", digits.trim_end_matches('0'))
        }
    };
    let (hours, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    match (hours, minutes) {
        (0, 0) => seconds(rest),
        (0, m) => format!("{m}m{}", seconds(rest)),
        (h, m) => format!("{h}h{m}m{}", seconds(rest)),
    }
}

fn rate_limited(refusal: Refusal, buckets: &Buckets, tokens: f64, wait: Duration) -> ApiError {
    let (limit, used, requested) = match refusal {
        Refusal::Tokens => {
            let b = buckets.tokens.map_or((0.0, 0.0), |b| (b.limit, b.level));
            (b.0, b.0 - b.1, tokens)
        }
        _ => {
            let b = buckets.requests.map_or((0.0, 0.0), |b| (b.limit, b.level));
            (b.0, b.0 - b.1, 1.0)
        }
    };
    let what = match refusal {
        Refusal::Tokens => "tokens per min (TPM)",
        _ => "requests per min (RPM)",
    };
    ApiError {
        code: Some("rate_limit_exceeded"),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "requests",
            format!(
                "Rate limit reached on {what}: Limit {limit:.0}, Used {used:.0}, Requested \
                 {requested:.0}. Please try again in {}.",
                format_reset(wait)
            ),
        )
    }
}

fn request_too_large(limit: f64, tokens: f64) -> ApiError {
    ApiError {
        code: Some("rate_limit_exceeded"),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "tokens",
            format!(
                "Request too large on tokens per min (TPM): Limit {limit:.0}, Requested \
                 {tokens:.0}. The input must be reduced in order to run successfully."
            ),
        )
    }
}

fn insufficient_quota() -> ApiError {
    ApiError {
        code: Some("insufficient_quota"),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "insufficient_quota",
            "You exceeded your current quota, please check your plan and billing details.",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_are_written_as_openai_writes_them() {
        assert_eq!(format_reset(Duration::ZERO), "0s");
        assert_eq!(format_reset(Duration::from_millis(120)), "120ms");
        assert_eq!(format_reset(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_reset(Duration::from_secs(1)), "1s");
        assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
        assert_eq!(format_reset(Duration::from_millis(90_250)), "1m30.25s");
        assert_eq!(format_reset(Duration::from_secs(3600)), "1h0m0s");
    }

    fn quotas(requests: Option<u64>, tokens: Option<u64>) -> Quotas {
        Quotas::new(QuotaConfig {
            requests_per_minute: requests,
            tokens_per_minute: tokens,
            window: Duration::from_secs(1),
            ..QuotaConfig::default()
        })
    }

    fn header(headers: &HeaderMap, name: &str) -> String {
        headers[name].to_str().unwrap().to_string()
    }

    #[tokio::test(start_paused = true)]
    async fn refused_requests_count_against_the_request_quota() {
        let q = quotas(Some(2), None);
        assert!(q.admit("k", 1).is_ok());
        let headers = q.admit("k", 1).unwrap();
        assert_eq!(header(&headers, "x-ratelimit-remaining-requests"), "0");
        assert_eq!(header(&headers, "x-ratelimit-reset-requests"), "1s");
        let refused = q.admit("k", 1).unwrap_err();
        assert_eq!(refused.refusal, Refusal::Requests);
        assert_eq!(header(&refused.headers, "retry-after-ms"), "1000");
        // Half a window refills one request, which the refusal took.
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(q.admit("k", 1).is_err(), "the refusal took the refill");
        // Another key has its own quota.
        assert!(q.admit("other", 1).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_refill_continuously_and_refusals_do_not_take_them() {
        let q = quotas(None, Some(1000));
        assert!(q.admit("k", 800).is_ok());
        let refused = q.admit("k", 300).unwrap_err();
        assert_eq!(refused.refusal, Refusal::Tokens);
        assert_eq!(
            header(&refused.headers, "x-ratelimit-remaining-tokens"),
            "200"
        );
        assert_eq!(header(&refused.headers, "retry-after-ms"), "100");
        tokio::time::advance(Duration::from_millis(100)).await;
        let headers = q.admit("k", 300).unwrap();
        assert_eq!(header(&headers, "x-ratelimit-remaining-tokens"), "0");
        assert_eq!(header(&headers, "x-ratelimit-reset-tokens"), "1s");
        assert!(q.admit("k", 2000).is_err(), "larger than the quota");
    }

    #[tokio::test(start_paused = true)]
    async fn insufficient_quota_after_the_credit_runs_out() {
        let q = Quotas::new(QuotaConfig {
            insufficient_after: Some(1),
            ..QuotaConfig::default()
        });
        assert!(q.admit("k", 5).is_ok());
        let refused = q.admit("k", 5).unwrap_err();
        assert_eq!(refused.refusal, Refusal::InsufficientQuota);
        assert_eq!(refused.error.code, Some("insufficient_quota"));
    }
}
