//! A share of a quota used by strangers: processes on one key that do not
//! know of each other converge on a fair part of it, from what the headers
//! and the 429s say.
//!
//! Each process paces its own sends at its share of the quota's rate (a
//! request goes no sooner than its cost at that rate after the one before),
//! and moves the share as TCP does among independent flows: it grows
//! additively while the headers show more of the quota left than the
//! target (by the same step in every process, in proportion to what is
//! left unused), and shrinks multiplicatively when they show less, or on a
//! refusal (each process by a part of its own share, so a larger share
//! gives up more). Additive increase with multiplicative decrease converges
//! on equal shares whose sum keeps about [`TARGET`] of the quota unused.
//!
//! The rate itself comes from the resets. A refilling bucket's reset is the
//! time until it is full, so every answer implies the same rate; a sliding
//! window's is the time until the oldest use it counts leaves it, so the
//! rates answers imply differ widely, and the longest reset seen is the
//! window's length. [`Refill`] tells the two apart.

use std::time::Duration;

use tokio::time::Instant;

/// The part of the quota kept unused, that the shares converge on: it
/// absorbs what the others send before their use shows in the headers.
const TARGET: f64 = 0.04;

/// While the headers show more than the target left, the share grows by
/// [`STEP`] and this times the part left above the target, per window of
/// the quota: each process by the same amount. The constant step keeps
/// the shares moving, so that the cuts, which take more from larger
/// shares, even them out.
const GROWTH: f64 = 0.1;
const STEP: f64 = 0.02;

/// A refusal keeps this much of the share, at most once per [`CUT_SPACING`]
/// of the window (requests in flight are refused together, and a sliding
/// window stays full until its uses leave it). Headers showing nothing
/// left take `LOW_CUT` of the share per window, less than the target
/// proportionally less.
const REFUSAL_KEEPS: f64 = 0.7;
const CUT_SPACING: f64 = 0.25;
const LOW_CUT: f64 = 0.3;

/// The least share: a process is never starved.
const LEAST: f64 = 1.0 / 32.0;

/// Rates implied by a bucket's resets agree to rounding; a sliding
/// window's differ by more than this factor.
const SLIDING_SPREAD: f64 = 2.0;

/// What the resets say of how a quota refills.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Refill {
    /// The rates a bucket could refill at to give every answer so far:
    /// at least `floor`, at most `ceiling` (none yet: 0 and infinite).
    floor: f64,
    ceiling: Option<f64>,
    /// The longest reset seen, in seconds.
    longest: f64,
}

impl Refill {
    /// Takes in a header with some of the quota used. `remaining` is
    /// rounded down and `reset` to the millisecond, so each answer allows
    /// a range of rates: a bucket's ranges overlap, a sliding window's
    /// (where reset is when the oldest use leaves) do not.
    pub(super) fn sample(&mut self, limit: f64, remaining: f64, reset: Duration) {
        let seconds = reset.as_secs_f64();
        let used = limit - remaining;
        if seconds <= 0.0 || used <= 0.0 {
            return;
        }
        self.floor = self.floor.max((used - 1.0).max(0.0) / (seconds + 0.001));
        if seconds > 0.001 {
            let most = used / (seconds - 0.001);
            self.ceiling = Some(self.ceiling.map_or(most, |c| c.min(most)));
        }
        self.longest = self.longest.max(seconds);
    }

    /// The rate of a sliding window (its limit over its length), once the
    /// answers show it is one.
    pub(super) fn sliding_rate(&self, limit: f64) -> Option<f64> {
        let ceiling = self.ceiling?;
        (self.floor > ceiling * SLIDING_SPREAD && self.longest > 0.0).then(|| limit / self.longest)
    }
}

/// One quota as the pacing sees it: its rate, and the cost of the request
/// about to go.
#[derive(Debug, Clone, Copy)]
pub(super) struct Quota {
    pub rate: f64,
    pub cost: f64,
}

/// This process's share of the quotas and the pace it sets.
#[derive(Debug, Clone)]
pub(super) struct Share {
    share: f64,
    /// When a refusal last cut the share: refusals of requests sent before
    /// then tell of the share before the cut, and cut it no further.
    cut_at: Option<Instant>,
    /// When headers last moved the share.
    moved_at: Option<Instant>,
    /// For the requests and the tokens quota: when the next send may go.
    next: [Option<Instant>; 2],
}

impl Share {
    /// A process that counts on `share` of the quota to start with.
    pub(super) fn new(share: f64) -> Share {
        Share {
            share: share.clamp(LEAST, 1.0),
            cut_at: None,
            moved_at: None,
            next: [None; 2],
        }
    }

    /// How long a request must wait for its pace; zero if it may go now.
    /// While the quotas hold `plenty` (more than the request and the
    /// target), nothing is contended and the pace holds nothing back: alone
    /// on a whole quota, a process spends it at once.
    pub(super) fn wait(&self, now: Instant, plenty: bool) -> Duration {
        if plenty {
            return Duration::ZERO;
        }
        self.next
            .iter()
            .flatten()
            .map(|next| next.saturating_duration_since(now))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Whether this process's share of what a quota of `limit` holds above
    /// the target (`level`, not counting the process's own sends the
    /// headers do not show yet) covers `cost` (those sends and the next):
    /// processes seeing the same plenty each take their share of it.
    pub(super) fn plenty(&self, limit: f64, level: f64, cost: f64) -> bool {
        self.share * (level - TARGET * limit) >= cost
    }

    /// A request went at `now`: the next waits for its cost at the share's
    /// rate, counted from the first request sent without `plenty`.
    pub(super) fn sent(&mut self, now: Instant, quotas: [Option<Quota>; 2], plenty: bool) {
        if plenty {
            self.next = [None; 2];
            return;
        }
        for (next, quota) in self.next.iter_mut().zip(quotas) {
            let Some(quota) = quota.filter(|q| q.rate > 0.0) else {
                continue;
            };
            let gap = quota.cost / (quota.rate * self.share);
            let from = next.map_or(now, |n| n.max(now));
            *next = Some(Duration::try_from_secs_f64(gap).map_or(from, |gap| from + gap));
        }
    }

    /// An answer whose headers show `left` of the quotas (the least part
    /// of their limits), whose window is `window` long. The share moves in
    /// proportion to the time since the last answer, so that it moves as
    /// fast however often answers come.
    pub(super) fn answered(&mut self, now: Instant, left: f64, window: Duration) {
        let since = self
            .moved_at
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        self.moved_at = Some(now);
        if window.is_zero() {
            return;
        }
        let windows = (since.as_secs_f64() / window.as_secs_f64()).min(1.0);
        if left < TARGET {
            let cut = LOW_CUT * (TARGET - left.max(0.0)) / TARGET;
            self.share = (self.share * (1.0 - cut).powf(windows)).max(LEAST);
        } else {
            self.share = (self.share + (STEP + GROWTH * (left - TARGET)) * windows).min(1.0);
        }
    }

    /// A refusal of a request sent at `sent_at`, by a quota whose window is `window` long.
    pub(super) fn refused(&mut self, now: Instant, sent_at: Instant, window: Duration) {
        let spaced = self.cut_at.is_none_or(|at| {
            sent_at >= at && now.saturating_duration_since(at) >= window.mul_f64(CUT_SPACING)
        });
        if spaced {
            self.share = (self.share * REFUSAL_KEEPS).max(LEAST);
            self.cut_at = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_buckets_resets_agree_and_a_sliding_windows_do_not() {
        // A bucket of 20 refilling at 8 a second, its level rounded down in
        // `remaining`: 7.95 left shows 7, whole again in 6 ms.
        let mut bucket = Refill::default();
        for level in [19.5, 7.95, 12.2, 3.0, 1.01, 0.4] {
            let reset = Duration::from_secs_f64((20.0 - level) / 8.0);
            let reset = Duration::from_millis(reset.as_millis() as u64);
            bucket.sample(20.0, f64::floor(level), reset);
        }
        assert_eq!(bucket.sliding_rate(20.0), None);
        // A window of 2 s: one use just made leaves in 2 s; with 19 used the
        // oldest leaves in 0.1 s.
        let mut sliding = Refill::default();
        sliding.sample(20.0, 19.0, ms(1990));
        assert_eq!(sliding.sliding_rate(20.0), None, "one answer tells nothing");
        sliding.sample(20.0, 1.0, ms(100));
        let rate = sliding.sliding_rate(20.0).unwrap();
        assert!((rate - 20.0 / 1.99).abs() < 1e-9, "{rate}");
        // Nothing used, or no reset, tells nothing of the refill.
        let mut empty = Refill::default();
        empty.sample(20.0, 20.0, ms(50));
        empty.sample(20.0, 3.0, ms(0));
        assert_eq!(empty.ceiling, None);
    }

    #[test]
    fn the_pace_spaces_sends_by_their_cost_at_the_shares_rate() {
        let now = Instant::now();
        let mut share = Share::new(0.25);
        let quotas = [
            Some(Quota {
                rate: 10.0,
                cost: 1.0,
            }),
            Some(Quota {
                rate: 1000.0,
                cost: 300.0,
            }),
        ];
        assert_eq!(share.wait(now, false), Duration::ZERO);
        share.sent(now, quotas, false);
        // A quarter of 1000 tokens a second: 300 tokens take 1.2 s, longer
        // than a quarter of 10 requests a second takes for one (0.4 s).
        assert_eq!(share.wait(now, false), ms(1200));
        assert_eq!(share.wait(now + ms(1200), false), Duration::ZERO);
        // A send after an idle spell does not bank the time idle.
        share.sent(now + ms(5000), quotas, false);
        assert_eq!(share.wait(now + ms(5000), false), ms(1200));
        // With plenty left nothing is held back, and the pace starts over.
        // A quarter of 1600 tokens above the target of 40 is 390.
        assert!(share.plenty(1000.0, 1600.0, 390.0));
        assert!(!share.plenty(1000.0, 1600.0, 391.0));
        assert_eq!(share.wait(now + ms(5000), true), Duration::ZERO);
        share.sent(now + ms(5000), quotas, true);
        assert_eq!(share.wait(now + ms(5000), false), Duration::ZERO);
    }

    #[test]
    fn a_burst_of_refusals_cuts_the_share_once() {
        let start = Instant::now();
        let window = Duration::from_secs(2);
        let mut share = Share::new(1.0);
        // Eight requests sent together are refused together: one cut.
        for n in 0..8 {
            share.refused(start + ms(20 + n), start, window);
        }
        assert!((share.share - REFUSAL_KEEPS).abs() < 1e-9);
        // Sent after the cut but refused within a quarter window of it: no more.
        share.refused(start + ms(200), start + ms(100), window);
        assert!((share.share - REFUSAL_KEEPS).abs() < 1e-9);
        share.refused(start + ms(600), start + ms(580), window);
        assert!((share.share - REFUSAL_KEEPS * REFUSAL_KEEPS).abs() < 1e-9);
        for n in 0..100 {
            share.refused(
                start + ms(1000 * n + 1000),
                start + ms(1000 * n + 999),
                window,
            );
        }
        assert_eq!(share.share, LEAST, "never starved");
    }

    #[test]
    fn headers_below_the_target_cut_and_above_it_grow_the_share() {
        let start = Instant::now();
        let window = Duration::from_secs(2);
        let mut share = Share::new(0.5);
        share.answered(start, 0.5, window);
        assert_eq!(share.share, 0.5, "the first answer only starts the clock");
        // Half the quota left for a whole window: half of that above the target.
        share.answered(start + window, 0.5, window);
        let grown = 0.5 + STEP + GROWTH * (0.5 - TARGET);
        assert!((share.share - grown).abs() < 1e-9, "{}", share.share);
        // Nothing left for half a window: LOW_CUT a window, compounded.
        share.answered(start + window * 3 / 2, 0.0, window);
        let cut = grown * (1.0 - LOW_CUT).sqrt();
        assert!((share.share - cut).abs() < 1e-9, "{}", share.share);
    }

    /// `n` processes on one quota of `limit` a window, each paced by its
    /// share, for `windows` windows in steps of a fiftieth of one: the
    /// service's `remaining` is the limit less the use of the last window
    /// (a sliding window) or a bucket's level. Returns the shares and the
    /// quota's use over the last half, as a part of its rate.
    fn converge(n: usize, sliding: bool, windows: usize) -> (Vec<f64>, f64) {
        const STEPS: usize = 50;
        let window = Duration::from_secs(1);
        let step = window / STEPS as u32;
        let start = Instant::now();
        let limit = 100.0;
        // Uneven starting shares: fairness must come from the mechanism.
        let mut shares: Vec<Share> = (0..n).map(|i| Share::new(1.0 / (i + 1) as f64)).collect();
        let mut uses = std::collections::VecDeque::from(vec![0.0; STEPS]);
        let mut level: f64 = limit;
        let mut late = 0.0;
        for t in 0..windows * STEPS {
            let now = start + step * t as u32;
            let sent_at = now.checked_sub(step * 2).unwrap_or(start);
            let used: f64 = shares.iter().map(|s| s.share * limit / STEPS as f64).sum();
            let left = if sliding {
                uses.pop_front();
                uses.push_back(used);
                (limit - uses.iter().sum::<f64>()) / limit
            } else {
                level = (level + limit / STEPS as f64 - used).min(limit);
                level / limit
            };
            if t >= windows * STEPS / 2 {
                late += used.min(limit / STEPS as f64);
            }
            for share in &mut shares {
                if left < 0.0 {
                    share.refused(now, sent_at, window);
                } else {
                    share.answered(now, left, window);
                }
            }
        }
        let rate = late / (limit * windows as f64 / 2.0);
        (shares.iter().map(|s| s.share).collect(), rate)
    }

    #[test]
    fn independent_processes_converge_on_equal_shares_that_use_the_quota() {
        for sliding in [false, true] {
            for n in [1, 4] {
                let (shares, used) = converge(n, sliding, 40);
                let (least, most) = shares
                    .iter()
                    .fold((f64::MAX, 0.0f64), |(l, m), &s| (l.min(s), m.max(s)));
                // From a spread of 4x, within 15% of each other after 40
                // windows (the constant step and the cuts even them out),
                // using at least 90% of the quota (the fixed point leaves TARGET).
                assert!(most <= least * 1.15, "sliding {sliding}, {n}: {shares:?}");
                assert!(
                    used >= 0.9,
                    "sliding {sliding}, {n}: {used} used, {shares:?}"
                );
            }
        }
    }
}
