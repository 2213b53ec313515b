//! The client-side limits a job sets (`backend.requests_per_minute`,
//! `backend.tokens_per_minute`), as token buckets (governor) that requests
//! wait on before they go.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

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
/// `backend.tokens_per_minute` set, as requests wait on them; the estimate
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

/// A request larger than the bucket waits for a full bucket.
fn token_cells(tokens: u64, burst: NonZeroU32) -> u32 {
    u32::try_from(tokens)
        .unwrap_or(u32::MAX)
        .clamp(1, burst.get())
}

/// The buckets of [`RateLimits`], shared by the requests of one destination.
#[derive(Debug)]
pub(super) struct Limiter {
    requests: Option<DefaultDirectRateLimiter>,
    tokens: Option<(DefaultDirectRateLimiter, NonZeroU32)>,
}

impl Limiter {
    pub(super) fn new(limits: RateLimits) -> Limiter {
        Limiter {
            requests: limits.requests.map(RateLimiter::direct),
            tokens: limits
                .tokens
                .map(|(quota, burst)| (RateLimiter::direct(quota), burst)),
        }
    }

    pub(super) fn is_limited(&self) -> bool {
        self.requests.is_some() || self.tokens.is_some()
    }

    /// Waits until both buckets let a request of `tokens` through.
    pub(super) async fn until_ready(&self, tokens: u64) {
        if let Some(limit) = &self.requests {
            limit.until_ready().await;
        }
        if let Some((limit, burst)) = &self.tokens {
            let n = NonZeroU32::new(token_cells(tokens, *burst)).unwrap_or(NonZeroU32::MIN);
            // n never exceeds the quota's burst, so capacity is always sufficient.
            let _ = limit.until_n_ready(n).await;
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
