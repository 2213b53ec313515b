//! Quotas as OpenAI documents them: requests and tokens per minute, shared
//! by every caller of one key.
//!
//! Each limit is either a bucket that holds a minute's allowance and refills
//! continuously, or a sliding window that admits a request when the uses of
//! the last minute leave room for it. A request takes one request and its
//! billed tokens. A request the quota cannot cover gets a 429, and still
//! takes its request from the request quota (so a client that retries in a
//! tight loop digs itself deeper, down to a minute's debt). Every embeddings
//! response carries `x-ratelimit-limit-*`, `x-ratelimit-remaining-*` and
//! `x-ratelimit-reset-*`, written as OpenAI writes it (`6m0s`, `1.5s`,
//! `120ms`): for a bucket the time until it is full again, for a sliding
//! window the time until the oldest use it counts leaves it, or (as OpenAI
//! words its reset, "until the rate limit resets to its initial state")
//! until the newest does and the window is whole again. The minute can be
//! shortened (`window`) so that tests and benchmarks run in seconds.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tokio::time::Instant;

use super::error::ApiError;

/// Keys whose buckets are kept; past this many the buckets start over.
const MAX_KEYS: usize = 4096;

/// How a quota counts its minute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QuotaWindow {
    /// A bucket holding a minute's allowance, refilling continuously.
    #[default]
    Bucket,
    /// The uses of the last minute, each leaving it a minute after it was made.
    Sliding,
}

/// What a sliding window's `x-ratelimit-reset-*` tells: a bucket's is
/// always the time until it is whole again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QuotaReset {
    /// The time until the oldest use the window counts leaves it.
    #[default]
    Oldest,
    /// The time until the newest use leaves it, and the window is whole again.
    Whole,
}

/// The quotas a simulator enforces on `POST /v1/embeddings`.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaConfig {
    /// Requests allowed per window.
    pub requests_per_minute: Option<u64>,
    /// Billed tokens allowed per window.
    pub tokens_per_minute: Option<u64>,
    /// The length of the quota's "minute": 60 s, or shorter in tests.
    pub window: Duration,
    /// A refilling bucket or a sliding window.
    pub kind: QuotaWindow,
    /// What a sliding window's reset header tells.
    pub reset: QuotaReset,
    /// Send the `x-ratelimit-*` headers (as OpenAI does); without them a
    /// client learns of the quota from 429s alone, as behind many gateways.
    pub headers: bool,
    /// After this many requests admitted, every request gets a 429 with code
    /// `insufficient_quota`: the account is out of credit.
    pub insufficient_after: Option<u64>,
    /// A key's quotas start used up rather than whole (a bucket empty, a
    /// sliding window full of uses made as the key was first seen).
    pub start_empty: bool,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        QuotaConfig {
            requests_per_minute: None,
            tokens_per_minute: None,
            window: Duration::from_secs(60),
            kind: QuotaWindow::Bucket,
            reset: QuotaReset::Oldest,
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

/// Uses of a sliding window within this share of it of the first of a
/// group are kept as one, made at the latest's time: the log stays short,
/// and the quota errs on the strict side by at most this much.
const SLIDING_GRAIN: u32 = 1000;

/// One limit: a bucket, or the log of a sliding window's uses.
#[derive(Debug, Clone)]
struct Bucket {
    limit: f64,
    window: Duration,
    reset: QuotaReset,
    kind: Meter,
}

#[derive(Debug, Clone)]
enum Meter {
    /// What is left as of `at`; below 0 after refused requests took from an empty bucket.
    Refilling { level: f64, at: Instant },
    /// The uses of the last window, oldest first, and their sum; uses
    /// within a grain of the first of the latest are kept as one, made at
    /// the latest's time, and `since` is when that first was made.
    Sliding {
        uses: VecDeque<(Instant, f64)>,
        used: f64,
        since: Option<Instant>,
    },
}

impl Bucket {
    #[allow(clippy::cast_precision_loss)]
    fn new(limit: u64, now: Instant, config: &QuotaConfig) -> Bucket {
        let limit = limit as f64;
        let kind = match config.kind {
            QuotaWindow::Bucket => Meter::Refilling {
                level: if config.start_empty { 0.0 } else { limit },
                at: now,
            },
            QuotaWindow::Sliding => Meter::Sliding {
                uses: if config.start_empty {
                    VecDeque::from([(now, limit)])
                } else {
                    VecDeque::new()
                },
                used: if config.start_empty { limit } else { 0.0 },
                since: None,
            },
        };
        Bucket {
            limit,
            window: config.window,
            reset: config.reset,
            kind,
        }
    }

    /// Brings the bucket to `now`: refilled at `limit` per window up to
    /// `limit`, or the uses older than a window let go.
    fn refill(&mut self, now: Instant) {
        let (limit, window) = (self.limit, self.window);
        match &mut self.kind {
            Meter::Refilling { level, at } => {
                let elapsed = now.saturating_duration_since(*at).as_secs_f64();
                *level = (*level + limit * elapsed / window.as_secs_f64()).min(limit);
                *at = now;
            }
            Meter::Sliding { uses, used, .. } => {
                while uses.front().is_some_and(|(at, _)| *at + window <= now) {
                    if let Some((_, amount)) = uses.pop_front() {
                        *used -= amount;
                    }
                }
                if uses.is_empty() {
                    *used = 0.0;
                }
            }
        }
    }

    /// What is left now.
    fn level(&self) -> f64 {
        match &self.kind {
            Meter::Refilling { level, .. } => *level,
            Meter::Sliding { used, .. } => self.limit - used,
        }
    }

    /// Takes `amount` at `now`, never below a window's debt.
    fn take(&mut self, now: Instant, amount: f64) {
        let grain = self.window / SLIDING_GRAIN;
        let floor = -self.limit;
        match &mut self.kind {
            Meter::Refilling { level, .. } => *level = (*level - amount).max(floor),
            Meter::Sliding { uses, used, since } => {
                let amount = amount.min(self.limit - floor - *used);
                if amount <= 0.0 {
                    return;
                }
                *used += amount;
                // Within a grain of the first use kept with the latest, not of
                // the latest: uses a little less than a grain apart, each kept
                // with the one before, held the first of them in the window
                // for as long as they went on.
                let joins = since.is_some_and(|first| now.saturating_duration_since(first) < grain);
                match uses.back_mut() {
                    Some((at, last)) if joins => {
                        *at = now;
                        *last += amount;
                    }
                    _ => {
                        uses.push_back((now, amount));
                        *since = Some(now);
                    }
                }
            }
        }
    }

    /// The time from `now` until the bucket holds `amount`.
    fn time_until(&self, now: Instant, amount: f64) -> Duration {
        match &self.kind {
            Meter::Refilling { level, .. } => {
                let missing = (amount - level).max(0.0);
                Duration::from_secs_f64(missing / self.limit * self.window.as_secs_f64())
            }
            Meter::Sliding { uses, used, .. } => {
                let mut excess = used + amount - self.limit;
                for (at, use_) in uses {
                    if excess <= 0.0 {
                        break;
                    }
                    excess -= use_;
                    if excess <= 0.0 {
                        return (*at + self.window).saturating_duration_since(now);
                    }
                }
                Duration::ZERO
            }
        }
    }

    /// The `x-ratelimit-reset-*` time: until the bucket is full, or until
    /// the oldest use the window counts leaves it (or the newest, [`QuotaReset::Whole`]).
    fn reset(&self, now: Instant) -> Duration {
        match &self.kind {
            Meter::Refilling { .. } => self.time_until(now, self.limit),
            Meter::Sliding { uses, .. } => {
                let leaving = match self.reset {
                    QuotaReset::Oldest => uses.front(),
                    QuotaReset::Whole => uses.back(),
                };
                leaving.map_or(Duration::ZERO, |(at, _)| {
                    (*at + self.window).saturating_duration_since(now)
                })
            }
        }
    }
}

/// The buckets of one key.
#[derive(Debug, Clone)]
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
                    .map(|l| Bucket::new(l, now, config)),
                tokens: config
                    .tokens_per_minute
                    .map(|l| Bucket::new(l, now, config)),
            });
        for bucket in [&mut buckets.requests, &mut buckets.tokens]
            .into_iter()
            .flatten()
        {
            bucket.refill(now);
        }
        buckets
    }

    /// The headers of a response to `key` that took nothing from its quota.
    pub(crate) fn peek(&self, key: &str) -> HeaderMap {
        if !self.config.headers || !self.config.is_set() {
            return HeaderMap::new();
        }
        let now = Instant::now();
        let mut state = self.state();
        let buckets = self.buckets(&mut state, key, now);
        self.headers(buckets, now)
    }

    /// Takes a request of `tokens` billed tokens from `key`'s quota, or
    /// refuses it. The headers go on the response either way.
    pub(crate) fn admit(&self, key: &str, tokens: u64) -> Result<HeaderMap, Box<Refused>> {
        let now = Instant::now();
        let mut state = self.state();
        if self
            .config
            .insufficient_after
            .is_some_and(|n| state.admitted >= n)
        {
            let buckets = self.buckets(&mut state, key, now);
            return Err(Box::new(Refused {
                refusal: Refusal::InsufficientQuota,
                error: insufficient_quota(),
                headers: self.headers(buckets, now),
            }));
        }
        #[allow(clippy::cast_precision_loss)]
        let tokens = tokens as f64;
        let buckets = self.buckets(&mut state, key, now);
        let mut refusal = None;
        let mut wait = Duration::ZERO;
        if let Some(bucket) = buckets.requests.as_mut() {
            let short = bucket.level() < 1.0;
            // Refused requests count too, down to a minute's debt.
            bucket.take(now, 1.0);
            if short {
                refusal = Some(Refusal::Requests);
                wait = wait.max(bucket.time_until(now, 1.0));
            }
        }
        let mut too_large = None;
        if let Some(bucket) = buckets.tokens.as_ref() {
            if tokens > bucket.limit {
                too_large = Some(bucket.limit);
            } else if bucket.level() < tokens {
                refusal.get_or_insert(Refusal::Tokens);
                wait = wait.max(bucket.time_until(now, tokens));
            }
        }
        if let Some(limit) = too_large {
            return Err(Box::new(Refused {
                refusal: Refusal::Tokens,
                error: request_too_large(limit, tokens),
                headers: self.headers(buckets, now),
            }));
        }
        if let Some(refusal) = refusal {
            let mut headers = self.headers(buckets, now);
            retry_after(&mut headers, wait);
            return Err(Box::new(Refused {
                refusal,
                error: rate_limited(refusal, buckets, tokens, wait),
                headers,
            }));
        }
        if let Some(bucket) = buckets.tokens.as_mut() {
            bucket.take(now, tokens);
        }
        let headers = self.headers(buckets, now);
        state.admitted += 1;
        Ok(headers)
    }

    /// Headers that claim the whole quota is left (the configured limits, or
    /// a made-up generous quota when none is enforced), as a lying server sends.
    pub(crate) fn whole(&self) -> HeaderMap {
        let now = Instant::now();
        let config = QuotaConfig {
            kind: QuotaWindow::Bucket,
            start_empty: false,
            ..self.config.clone()
        };
        let full = |limit: Option<u64>, made_up: u64| {
            Some(Bucket::new(limit.unwrap_or(made_up), now, &config))
        };
        let buckets = Buckets {
            requests: full(self.config.requests_per_minute, 10_000),
            tokens: full(self.config.tokens_per_minute, 10_000_000),
        };
        quota_headers(&buckets, now)
    }

    fn headers(&self, buckets: &Buckets, now: Instant) -> HeaderMap {
        if !self.config.headers {
            return HeaderMap::new();
        }
        quota_headers(buckets, now)
    }
}

/// The `x-ratelimit-*` headers that describe `buckets` at `now`.
fn quota_headers(buckets: &Buckets, now: Instant) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, bucket) in [("requests", &buckets.requests), ("tokens", &buckets.tokens)] {
        let Some(bucket) = bucket else { continue };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let values = [
            ("limit", (bucket.limit as u64).to_string()),
            (
                "remaining",
                (bucket.level().max(0.0).floor() as u64).to_string(),
            ),
            ("reset", format_reset(bucket.reset(now))),
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
            let b = buckets
                .tokens
                .as_ref()
                .map_or((0.0, 0.0), |b| (b.limit, b.level()));
            (b.0, b.0 - b.1, tokens)
        }
        _ => {
            let b = buckets
                .requests
                .as_ref()
                .map_or((0.0, 0.0), |b| (b.limit, b.level()));
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

    fn sliding(requests: Option<u64>, tokens: Option<u64>) -> Quotas {
        Quotas::new(QuotaConfig {
            kind: QuotaWindow::Sliding,
            ..quotas(requests, tokens).config
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_sliding_window_counts_the_uses_of_the_last_window() {
        let q = sliding(Some(3), None);
        for (ms, remaining, reset) in [(0, "2", "1s"), (200, "1", "800ms"), (200, "0", "600ms")] {
            tokio::time::advance(Duration::from_millis(ms)).await;
            let headers = q.admit("k", 1).unwrap();
            assert_eq!(
                header(&headers, "x-ratelimit-remaining-requests"),
                remaining
            );
            assert_eq!(header(&headers, "x-ratelimit-reset-requests"), reset);
        }
        tokio::time::advance(Duration::from_millis(100)).await;
        let refused = q.admit("k", 1).unwrap_err();
        assert_eq!(refused.refusal, Refusal::Requests);
        // The refusal at 0.5 s counts: the next fits once the uses at 0
        // and 0.2 s have left, at 1.2 s.
        assert_eq!(header(&refused.headers, "retry-after-ms"), "700");
        tokio::time::advance(Duration::from_millis(500)).await;
        let at_one = q.peek("k");
        assert_eq!(
            header(&at_one, "x-ratelimit-remaining-requests"),
            "0",
            "at 1 s only the first use left"
        );
        assert_eq!(header(&at_one, "x-ratelimit-reset-requests"), "200ms");
        tokio::time::advance(Duration::from_millis(200)).await;
        let headers = q.admit("k", 1).unwrap();
        assert_eq!(header(&headers, "x-ratelimit-remaining-requests"), "0");
        // The oldest use counted now is the one at 0.4 s.
        assert_eq!(header(&headers, "x-ratelimit-reset-requests"), "200ms");
    }

    #[tokio::test(start_paused = true)]
    async fn a_sliding_window_can_tell_when_it_is_whole_again() {
        let q = Quotas::new(QuotaConfig {
            reset: QuotaReset::Whole,
            ..sliding(Some(3), None).config
        });
        // Each reset is a window after the newest use, not the oldest.
        for (ms, reset) in [(0, "1s"), (200, "1s"), (300, "1s")] {
            tokio::time::advance(Duration::from_millis(ms)).await;
            let headers = q.admit("k", 1).unwrap();
            assert_eq!(header(&headers, "x-ratelimit-reset-requests"), reset);
        }
        tokio::time::advance(Duration::from_millis(600)).await;
        let at_eleven = q.peek("k");
        assert_eq!(header(&at_eleven, "x-ratelimit-remaining-requests"), "1");
        assert_eq!(header(&at_eleven, "x-ratelimit-reset-requests"), "400ms");
    }

    #[tokio::test(start_paused = true)]
    async fn a_sliding_window_frees_tokens_only_as_their_uses_leave_it() {
        let q = sliding(None, Some(1000));
        assert!(q.admit("k", 800).is_ok());
        tokio::time::advance(Duration::from_millis(500)).await;
        let refused = q.admit("k", 300).unwrap_err();
        assert_eq!(refused.refusal, Refusal::Tokens);
        assert_eq!(
            header(&refused.headers, "x-ratelimit-remaining-tokens"),
            "200"
        );
        assert_eq!(
            header(&refused.headers, "x-ratelimit-reset-tokens"),
            "500ms"
        );
        assert_eq!(header(&refused.headers, "retry-after-ms"), "500");
        // A bucket would have refilled by now; the window has not moved past the use.
        tokio::time::advance(Duration::from_millis(490)).await;
        assert!(q.admit("k", 300).is_err());
        tokio::time::advance(Duration::from_millis(10)).await;
        let headers = q.admit("k", 300).unwrap();
        assert_eq!(header(&headers, "x-ratelimit-remaining-tokens"), "700");
        assert_eq!(header(&headers, "x-ratelimit-reset-tokens"), "1s");
    }

    #[tokio::test(start_paused = true)]
    async fn uses_kept_as_one_leave_within_a_grain_of_a_window_after_the_first() {
        // A window of 1 s keeps uses within 1 ms of the first of a group as
        // one: ten uses 0.6 ms apart are five groups of two, not one group
        // 5.4 ms long made at its last use.
        let q = sliding(Some(10), None);
        for _ in 0..10 {
            assert!(q.admit("k", 1).is_ok());
            tokio::time::advance(Duration::from_micros(600)).await;
        }
        // At a window after the first use, and the grain, the first group
        // (the uses at 0 and 0.6 ms) has left.
        tokio::time::advance(Duration::from_millis(1001) - Duration::from_micros(6000)).await;
        let headers = q.peek("k");
        assert_eq!(header(&headers, "x-ratelimit-remaining-requests"), "2");
    }

    #[tokio::test(start_paused = true)]
    async fn a_sliding_window_in_debt_stops_at_one_window_of_refusals() {
        let q = sliding(Some(2), None);
        for _ in 0..100 {
            let _ = q.admit("k", 1);
        }
        // 2 admitted and 2 more refused fill the debt: the log holds four
        // uses, all of this instant, and leaves it whole a window later.
        let refused = q.admit("k", 1).unwrap_err();
        assert_eq!(header(&refused.headers, "retry-after-ms"), "1000");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(q.admit("k", 1).is_ok());
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
