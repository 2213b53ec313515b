//! One quota as the client models it from an answer's headers: what was
//! left as of which send, how fast it refills, and whether it is a
//! refilling bucket or a sliding window ([`Refill`]). The pacing
//! ([`super::pacing`]) keeps one for the request quota and one for the token
//! quota.

use std::time::Duration;

use tokio::time::Instant;

use super::headers::QuotaHeader;
use super::share::Refill;

/// The longest pause a service's `Retry-After` sets; a longer one is taken as this.
pub const MAX_PAUSE: Duration = Duration::from_secs(120);

/// One quota as the client models it from the headers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) limit: f64,
    /// What was left as of `at`; below 0 when refusals took from an empty quota.
    pub(super) remaining: f64,
    pub(super) at: Instant,
    /// Refill per second, learned from the resets.
    pub(super) rate: f64,
    /// `rate` comes from a header with something left, where remaining and
    /// reset tell it exactly; with nothing left the quota may be in debt.
    pub(super) rated: bool,
    /// Whether the resets are a bucket's or a sliding window's.
    pub(super) refill: Refill,
    /// The send the latest header describes the quota as of.
    pub(super) seen: Instant,
    /// What that header showed left.
    pub(super) shown: f64,
}

impl Budget {
    /// The first description of a quota, as of `at`; `given` is how long a
    /// use stays in it if it is a sliding window, where the job says.
    pub(super) fn new(
        header: QuotaHeader,
        at: Instant,
        refused: bool,
        given: Option<Duration>,
    ) -> Budget {
        let mut budget = Budget {
            limit: header.limit,
            remaining: header.remaining,
            at,
            // Until a reset tells: a quota per minute.
            rate: header.limit / 60.0,
            rated: false,
            refill: Refill::given(given),
            seen: at,
            shown: header.remaining,
        };
        budget.update(header, at, refused);
        budget
    }

    /// Takes in a newer description of the quota, as of `at`.
    /// A refusal's header may show a bucket in debt (refusals take from
    /// it), whole later than its rate says: only a success's tells the rate.
    pub(super) fn update(&mut self, header: QuotaHeader, at: Instant, refused: bool) {
        self.limit = header.limit;
        self.remaining = header.remaining;
        self.at = at;
        self.seen = at;
        self.shown = header.remaining;
        let Some(reset) = header.reset.filter(|r| !r.is_zero()) else {
            return;
        };
        let seconds = reset.as_secs_f64();
        let missing = header.limit - header.remaining;
        if missing <= 0.0 {
            // A full quota's reset tells nothing of how fast it refills.
            return;
        }
        if refused {
            // No rate: a bucket in debt is whole later than its rate says.
            // But a sliding window's reset is still when a use it counts
            // leaves (or when it is whole): within its length.
            self.refill.lengthen(reset);
        } else {
            self.refill.sample(header.limit, header.remaining, reset);
        }
        if let Some(rate) = self.refill.sliding_rate(header.limit) {
            // A sliding window's reset is when its oldest use leaves: nothing
            // is freed before, and after it about the rate.
            self.rate = rate;
            self.rated = true;
            self.at = at.checked_add(reset).unwrap_or(at);
            return;
        }
        if header.remaining >= 1.0 {
            let sample = missing / seconds;
            // A short reset is written to the millisecond: its rate is rough, so it counts less.
            let weight = if self.rated {
                (seconds / 0.25).clamp(0.05, 1.0) * 0.5
            } else {
                1.0
            };
            self.rate = self.rate * (1.0 - weight) + sample * weight;
            self.rated = true;
        } else if self.rated {
            // Nothing left: the reset tells how deep in debt the quota is.
            self.remaining = self.remaining.min(self.limit - self.rate * seconds);
        } else {
            // At least this fast, or it would be whole sooner.
            self.rate = self.rate.max(missing / seconds);
        }
    }

    /// What is there at `now`.
    pub(super) fn level(&self, now: Instant) -> f64 {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        (self.remaining + refill).min(self.limit)
    }

    /// Takes `cost` at `at`.
    pub(super) fn spend(&mut self, at: Instant, cost: f64) {
        self.remaining = self.level(at) - cost;
        self.at = self.at.max(at);
    }

    /// How long until `share` of the budget covers `need` (a request's cost
    /// and a margin); zero if it does now. Processes sharing a quota each
    /// count on their share of what is there, so that seeing the same
    /// budget they do not all spend it at once.
    pub(super) fn wait(&self, now: Instant, need: f64, share: f64) -> Duration {
        let need = need.min(self.limit * share);
        let missing = need - self.level(now) * share;
        let rate = self.rate * share;
        if missing <= 0.0 || rate <= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(missing / rate).map_or(MAX_PAUSE, |d| d.min(MAX_PAUSE))
    }

    /// The service refused a request of `cost` and said it fits at `until`:
    /// nothing refills for us before then.
    pub(super) fn refused(&mut self, cost: f64, until: Instant) {
        self.remaining = cost.min(self.limit);
        self.at = self.at.max(until);
    }
}
