//! A share of a quota used by strangers: processes on one key that do not
//! know of each other converge on parts of it that add up to nearly the
//! whole, from what the headers and the 429s say.
//!
//! On a bucket no process needs a share, a stranger (an independent job) or
//! a shard of a split job alike: each sends at a rate in proportion to the
//! level the headers show ([`Share::bucket_wait`]). All follow the same
//! level by the same rule, so they send alike whatever their number and
//! however far apart they started, and the level settles where their rates
//! add up to the refill.
//!
//! A sliding window's free part is wasted, not stored, and its level tells
//! no rate: there a process counts on a share of the window. In its first
//! window, and while it sees no others, the share comes from the others'
//! use: what the headers show used (`limit - remaining`) beyond this
//! process's own sends of the window, the most any answer of the last
//! window showed (uses only add up until they leave). It takes what the
//! others leave, less a headroom in proportion to their use, [`HEADROOM`]:
//! `share = 1 - (1 + HEADROOM) x others`; in its first window no more than
//! its part of what was used so far (processes started together are all
//! still growing). A process alone keeps the whole window: its sends of the
//! last window (each leaving it a window after the send and what its round
//! trip took beyond the shortest: [`Share::leaves`]) stay within it, and
//! what its own uses free is its to take at once, in bursts if it likes.
//!
//! Past its first window, among others, a process keeps its part of the
//! window's use as the latest answer shows it (its own sends the service
//! had counted over what the window holds), less a request and a half of
//! the window left free ([`REQUESTS_FREE`]): `share = (1 - free) x own /
//! used`. Applied by every process, the shares add up to about the window
//! less that room whatever their number (each reads its part at its own
//! answer); they fall at once when others come and rise at once as the
//! uses of one that left leave the window. Any split is kept by that rule,
//! so where a request is small beside the window every process adds the
//! same pull to its part, all of it scaled to the window ([`PULL`]): a
//! small part grows more for its size than a large one, and the parts even
//! out. With less than the whole window
//! a process sends at its share's rate, evenly: after each send a gap of
//! its cost over the share's part of the window's rate, counted from when
//! the send was due if a late wake held it ([`PACE_SLACK`]). Sends spread so
//! show the others the same use of the window at every answer; taken in
//! bursts, the window showed full, then empty, and the shares parted
//! unequally from the first window (0.40, 0.33, 0.29 and 0.03 for four
//! started together). A refusal cuts the share further (sends that met
//! before any header showed them); a process that then sees no others is
//! back on the whole window once its share is less than a request short of
//! it.
//!
//! The rate of a quota comes from the resets. A refilling bucket's reset is
//! the time until it is full, so every answer implies the same rate; a
//! sliding window's is the time until the oldest use it counts leaves it, so
//! the rates answers imply differ widely, and the longest reset seen (a
//! refusal's too) is the window's length. [`Refill`] tells the two apart.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::stay::Stays;

/// The headroom each process leaves in proportion to the others' use: it
/// absorbs what they send before their use shows in the headers.
const HEADROOM: f64 = 0.05;

/// Past its first window a process among others counts on its part of the
/// window less this many of the largest request: paced sends of whole
/// requests keep the window's count within a request or so of the shares'
/// sum, and it must stay below the limit.
const REQUESTS_FREE: f64 = 1.5;

/// A refusal keeps this much of the share, at most once per [`CUT_SPACING`]
/// of the window (requests in flight are refused together).
const REFUSAL_KEEPS: f64 = 0.7;
const CUT_SPACING: f64 = 0.25;

/// The part of a window over which the share rises to what the headers allow.
const RISE: f64 = 0.5;

/// Among others, a process claims its part of the room of a window used
/// below the shares' sum (the window less its free part) by more than the
/// free part and this many of its largest requests: shallower room is the
/// grain of paced sends of whole requests, or the echo of the first
/// window's bursts, not room nobody uses. At 4, four jobs on the quota
/// bench's window of 20 requests had up to 7.4% of their requests refused
/// (eight invocations, against up to 3.8% in six without claims); at 8, up
/// to 2.0% in four. A window of 200 requests is claimed below 86% used.
const CLAIM_DEPTH: f64 = 8.0;

/// The part of a sliding window a process among others leaves free, for
/// requests of `request` of it: [`REQUESTS_FREE`] of them, [`HEADROOM`] at least.
fn free_part(request: f64) -> f64 {
    (REQUESTS_FREE * request).max(HEADROOM)
}

/// The use of a sliding window below which processes among others claim its
/// room, once a window ([`Share::claim`]), for requests of `request` of it:
/// the window less twice its free part and [`CLAIM_DEPTH`] requests (86% of
/// a window of 200 requests).
pub(super) fn claimed_below(request: f64) -> f64 {
    1.0 - 2.0 * free_part(request) - CLAIM_DEPTH * request
}

/// Among others, a send late by up to this part of its gap is made up by
/// the next: the gap after it counts from when it was due. A wake comes up
/// to 5% of its wait late on purpose (the jitter that keeps processes from
/// waking together), and later still on a busy machine; counted from each
/// send, those delays added up, and four jobs whose shares added up to
/// 95.8% of a window of 200 requests sent about 92% of it a window (paused
/// time). A send held back longer was held by something else (the window, a
/// refusal's pause), and making that up would send two at once: made up
/// whole, four jobs on the quota bench's window of 20 requests, started
/// together or 30 ms apart, had 6.9% of their requests refused on average,
/// against none (paused time).
const PACE_SLACK: f64 = 0.1;

/// Among others, where a request is small beside the window, every process
/// counts on this much of the window beyond its part, and all of it scaled
/// to the window: `share = scale x ((1 - free) x part + PULL)`. Every split
/// of the window is a fixed point of the part rule alone, so the first
/// window's split held to the end: a job started 300 ms before three others
/// kept 72 of every 96 requests and they ended one after another, half a
/// window lost as each left. The pull is the same for
/// every process whatever its part, so it raises a small part more for its
/// size than a large one: for `n` processes the parts' gaps shrink to
/// `(1 - free) / (1 - free + n PULL)` of themselves a window, to 0.8 for four.
const PULL: f64 = 0.06;

/// The pull applies where the largest request is at most this part of the
/// pull (1.5% of the window): a share moves by whole requests, and where a
/// request is 5% or 8% of the window the pull refused more for no more used
/// where each process took its share of the room the resets told of. It
/// applies whatever the request where each process replaces its own uses
/// one for one instead (see `own_to_free` in the pacing), which holds any
/// split, and only the pull evens it. Four strangers on the quota bench's
/// window of 20 requests whose resets tell when it is whole again used
/// 83.2% of it without the pull and 87.7% with it, 0.9% refused either way
/// (paused time; docs/benchmark.md, "One for one where nobody is told when
/// a use leaves").
const PULL_GRAIN: f64 = 0.25;

/// On a window of requests, where the pull applies, it is at least this
/// many requests. On the quota bench's window of 20 requests (a request is
/// 5% of it) a run lasts about ten windows, and a pull of 0.06 narrows the
/// gaps between parts only to 0.8 of themselves a window: the split of the
/// first windows (3, 2, 4 and 9 requests a window in a trace) held until
/// the largest had done its work, and the window then went part idle while
/// the others' shares grew. At three requests (0.15 of that window) the
/// gaps shrink to `(1 - free) / (1 - free + 4 x 0.15)`, 0.61 of themselves
/// a window. Four strangers there, under a reset that tells when the window
/// is whole again, used 87.0% of it with a pull of 0.06 and 90.4% with
/// three requests (paused time, 48 runs each; docs/benchmark.md, "A pull
/// of three requests; one for one under the oldest-use reset tried"). Not
/// on a window of tokens: requests are cut to a hundredth of it where they
/// can be (see `REQUEST_GRAIN` in the pacing), and where they cannot, eight
/// strangers on a window of 20,000 tokens with requests of 8% of it, over a
/// minute, had 215, 298 and 376 requests fail in three invocations by
/// waiting out their stall timeout, against none and 28 in two with the
/// pull of 0.06.
const PULL_REQUESTS: f64 = 3.0;

/// The scale a process starts pulling at: where four processes' shares add
/// up to the window less its free part (`0.95 / (0.95 + 4 PULL)`). From
/// whole, the shares of four added up to 1.19 of the window, and the
/// window's use at the answers stayed at 0.88 to 0.92 while the free level
/// and refusals' pauses held the sends back: the scale saw no excess.
const FIRST_SCALE: f64 = 0.8;

/// A refusal keeps this much of the scale (the shares added up to more than
/// the window), at most as often as it cuts the share.
const SCALE_KEEPS: f64 = 0.9;

/// The least a pulled share is scaled by.
const LEAST_SCALE: f64 = 0.01;

/// The least share: a process is never starved.
const LEAST: f64 = 1.0 / 32.0;

/// A process on a bucket sends at this many times the refill for a whole
/// bucket left beyond what a request needs.
const LEVEL_GAIN: f64 = 1.5;

/// Above this part of a bucket a process spends at once: the level where
/// several processes' rates meet the refill is below it (a third of the
/// bucket for two, at [`LEVEL_GAIN`]), so nobody else is counting on it.
const UNCONTENDED: f64 = 0.75;

/// The longest a process on a bucket spaces its sends.
const MAX_SPACING: Duration = Duration::from_secs(120);

/// Round trips remembered, for how much they vary.
const ROUND_TRIPS: usize = 32;

/// A process counts each of its uses of a sliding window as leaving it this
/// part of the window later than a window after its send, besides how much
/// longer its round trip was than the shortest ([`Share::leaves`]). Counted
/// a whole round trip late, a job alone left each use's room idle for a
/// round trip every window: on a window of 2 s answered in 100 ms it used
/// 91.4% to 94.6% of it, and 83.1% to 90.2% answered in 250 ms; since,
/// 96.4% to 97.7% and 93.8% to 98.8% (paused time; docs/benchmark.md, "A
/// job alone: a use leaves a window after its send").
pub(super) const LEAVE_SLACK: f64 = 0.01;

/// Own sends remembered, at most.
const MAX_SENDS: usize = 4096;

/// Own sends are remembered this many windows.
const SENDS_KEPT: u32 = 8;

/// Rates implied by a bucket's resets agree to rounding; a sliding
/// window's differ by more than this factor.
const SLIDING_SPREAD: f64 = 2.0;

/// From this many answers on, rates apart by [`DISJOINT_SPREAD`] tell a
/// sliding window too. A process that comes to a window already busy,
/// whose reset tells when it is whole again, sees a reset of about the
/// window at every answer and the window's use between 15 and 20 of 20
/// (the others keep it near full): rates at most a third apart, never
/// twice. It took the window for neither a bucket nor a sliding window,
/// counted on all that the headers showed left, one request at a time, and
/// took the window from the others. Eight strangers on a window of 20
/// requests a minute, started up to 9 s apart, had 48.5% of their requests
/// refused and 3,003 failed over 24 runs, against 8.2% and 48 since; four
/// on the quota bench's window of 20 requests over 2 s, up to 9.2% refused
/// in a set-up's runs, against 2.0% (paused time; docs/benchmark.md, "A
/// busy window whose reset tells when it is whole").
const DISJOINT_SAMPLES: u32 = 4;

/// How far apart the rates several answers imply must be, at the least, to
/// tell a sliding window ([`DISJOINT_SAMPLES`]): a bucket's agree to the
/// rounding of what headers write, and this much more is not rounding.
const DISJOINT_SPREAD: f64 = 1.1;

/// From this many answers that showed a sliding window at least half used,
/// resets none of which was shorter than [`WHOLE_PART`] of the longest tell
/// when the window is whole again ([`Refill::resets_when_whole`]): were
/// they when its oldest use leaves, each would be shorter three times in
/// four on a window used evenly.
const WHOLE_SAMPLES: u32 = 4;
const WHOLE_PART: f64 = 0.75;

/// What the resets say of how a quota refills.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Refill {
    /// The rates a bucket could refill at to give every answer so far:
    /// at least `floor`, at most `ceiling` (none yet: 0 and infinite).
    floor: f64,
    ceiling: Option<f64>,
    /// The longest reset seen, in seconds.
    longest: f64,
    /// How long the latest answers tell a use stays in the window, in
    /// seconds, where that is longer ([`Stays`]).
    stay: f64,
    /// How long the job says a use stays in the window, in seconds; 0 where
    /// it does not say.
    given: f64,
    /// Headers with some of the quota used taken in.
    samples: u32,
    /// The shortest reset of the headers that showed the quota at least
    /// half used, and how many did.
    busy_shortest: Option<f64>,
    busy: u32,
}

impl Refill {
    /// Nothing seen yet; `given` is how long a use stays in the window if
    /// the quota turns out to be a sliding window, where the job says.
    pub(super) fn given(given: Option<Duration>) -> Refill {
        Refill {
            given: given.map_or(0.0, |g| g.as_secs_f64()),
            ..Refill::default()
        }
    }

    /// Whether the job says how long a use stays in the window.
    pub(super) fn is_given(&self) -> bool {
        self.given > 0.0
    }

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
        self.samples = self.samples.saturating_add(1);
        if used * 2.0 >= limit {
            self.busy_shortest = Some(self.busy_shortest.map_or(seconds, |s| s.min(seconds)));
            self.busy = self.busy.saturating_add(1);
        }
    }

    /// Whether the resets tell when a sliding window is whole again rather
    /// than when its oldest use leaves: [`WHOLE_SAMPLES`] answers or more
    /// that showed it at least half used, and none of their resets shorter
    /// than [`WHOLE_PART`] of the longest. A busy window's oldest use
    /// leaves anywhere within it; the window is whole again only about a
    /// window after its newest.
    pub(super) fn resets_when_whole(&self) -> bool {
        self.busy >= WHOLE_SAMPLES
            && self
                .busy_shortest
                .is_some_and(|shortest| shortest >= WHOLE_PART * self.longest)
    }

    /// Takes in a refusal's reset: it tells nothing of a rate, but a
    /// sliding window's length is at least as long. A process that comes to
    /// a window already in use sees, at every answer, the oldest use about
    /// to leave: over a minute shared by eight, a second or less. Taken for
    /// the window's length, that is a rate fifty times the window's, and
    /// such a process, refused while another's burst held the window, spent
    /// the window in a burst of its own as soon as that one left, and held
    /// it for the next minute: one process a minute had the window, and
    /// eight strangers failed 14,054 requests over 36 runs by waiting out
    /// their stall timeout. Refused, it sees the reset of a window that
    /// burst filled, about as long as the window: none failed (paused
    /// time; docs/benchmark.md, "What starves eight strangers").
    pub(super) fn lengthen(&mut self, reset: Duration) {
        self.longest = self.longest.max(reset.as_secs_f64());
    }

    /// The window's length as the latest answers tell it from the
    /// process's own uses ([`Stays`]); `None` where they tell none.
    pub(super) fn stay(&mut self, length: Option<Duration>) {
        self.stay = length.map_or(0.0, |l| l.as_secs_f64());
    }

    /// The longest reset seen.
    pub(super) fn longest(&self) -> Duration {
        Duration::try_from_secs_f64(self.longest).unwrap_or(Duration::ZERO)
    }

    /// Whether the answers so far show a bucket: two or more, and one
    /// rate that gives every one of them.
    pub(super) fn is_bucket(&self) -> bool {
        self.samples >= 2 && self.ceiling.is_some_and(|c| self.floor <= c)
    }

    /// The rate of a sliding window (its limit over its length), once the
    /// answers show it is one: two whose rates are far apart, or several
    /// that no one rate gives.
    pub(super) fn sliding_rate(&self, limit: f64) -> Option<f64> {
        let ceiling = self.ceiling?;
        let spread = if self.samples >= DISJOINT_SAMPLES {
            DISJOINT_SPREAD
        } else {
            SLIDING_SPREAD
        };
        // No reset is longer than the window: a given length that one
        // passes was too short.
        let length = if self.is_given() {
            self.given.max(self.longest)
        } else {
            self.longest.max(self.stay)
        };
        (self.floor > ceiling * spread && length > 0.0).then(|| limit / length)
    }
}

/// One quota as the share sees it: its limit, and what the request about
/// to go takes of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Quota {
    pub limit: f64,
    pub cost: f64,
}

/// One of this process's sends: when, and what it took of the request and
/// the token quota.
#[derive(Debug, Clone, Copy)]
struct Send {
    seq: u64,
    at: Instant,
    took: [f64; 2],
    /// When its answer came: the service counted it by then.
    heard: Option<Instant>,
    /// Whether it went at the share's pace, not in a burst.
    paced: bool,
}

/// This process's share of the quotas and its own sends of the last window.
#[derive(Debug, Clone)]
pub(super) struct Share {
    share: f64,
    /// When a refusal last cut the share: refusals of requests sent before
    /// then tell of the share before the cut, and cut it no further.
    cut_at: Option<Instant>,
    /// When headers last moved the share.
    moved_at: Option<Instant>,
    /// The round trips of the latest answers, the latest last: a use leaves
    /// the service's window at most the latest after it leaves the process's
    /// count of its sends, and about how much they vary after.
    round_trips: VecDeque<Duration>,
    sends: VecDeque<Send>,
    /// The first send: in the first window the others' use so far, next to
    /// this process's, tells how many started with it.
    first: Option<Instant>,
    /// Under a sliding window, the others' part each answer of the last
    /// window showed.
    recent: VecDeque<(Instant, f64)>,
    /// Room of the window claimed on top of the part, and when: the claim
    /// wanes over a window as the sends it adds come into the part.
    claim: f64,
    claimed_at: Option<Instant>,
    /// Among others, where the gap after the latest send counts from: when
    /// that send was due, if it went late by no more than [`PACE_SLACK`] of
    /// its gap; else that much before it went.
    paced_from: Option<Instant>,
    /// Among others where a request is small beside the window, what the
    /// part and the pull are scaled by ([`PULL`]); `None` where no pull applies.
    scale: Option<f64>,
    /// What the answers tell of how long a use stays in each sliding window.
    stays: [Stays; 2],
}

/// What an answer shows of a sliding window beside the others' use: this
/// process's part of the window's use, as a process that paces its sends
/// counts it, and its largest request's part of the window.
#[derive(Debug, Clone, Copy)]
struct Paced {
    part: f64,
    request: f64,
    used: f64,
    /// Whether each process replaces its uses of the window one for one.
    one_for_one: bool,
    /// Whether the window counts requests (rather than tokens).
    requests: bool,
}

/// What an answer's headers show of one quota, a sliding window.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shown {
    pub limit: f64,
    pub remaining: f64,
    /// Whether, among others, each process replaces its uses of it one for
    /// one (see `own_to_free` in the pacing).
    pub one_for_one: bool,
}

impl Share {
    /// A process that counts on `share` of the quota to start with.
    pub(super) fn new(share: f64) -> Share {
        Share {
            share: share.clamp(LEAST, 1.0),
            cut_at: None,
            moved_at: None,
            round_trips: VecDeque::new(),
            sends: VecDeque::new(),
            first: None,
            recent: VecDeque::new(),
            claim: 0.0,
            claimed_at: None,
            paced_from: None,
            scale: None,
            stays: [Stays::default(), Stays::default()],
        }
    }

    /// How long a process on a bucket waits before a request of `cost`:
    /// it sends at a rate in proportion to the `level` it counts on beyond
    /// what the request `need`s, [`LEVEL_GAIN`] times the refill for a
    /// whole bucket. Every process on the key follows the same level by
    /// the same rule, so they send at the same rate whatever their number,
    /// and the level settles where those rates add up to the refill: for
    /// `n` processes at `need + limit / (LEVEL_GAIN n)`, each sending `1/n`
    /// of the refill. None of them has to know the others' use.
    pub(super) fn bucket_wait(
        &self,
        now: Instant,
        [level, limit, refill]: [f64; 3],
        need: f64,
        cost: f64,
    ) -> Duration {
        let Some(last) = self.sends.back() else {
            return Duration::ZERO;
        };
        if limit <= 0.0 || refill <= 0.0 || level >= limit * UNCONTENDED {
            return Duration::ZERO;
        }
        // A process alone sends at least the refill below three quarters of
        // the bucket, however large its requests.
        let room = (limit * UNCONTENDED - need).max(limit / 1000.0);
        let gain = LEVEL_GAIN.max(limit / room);
        let part = (gain * (level - need) / limit).max(LEAST);
        let spacing = Duration::try_from_secs_f64(cost / (refill * part)).unwrap_or(MAX_SPACING);
        (last.at + spacing.min(MAX_SPACING)).saturating_duration_since(now)
    }

    /// The part of the quotas this process counts on.
    pub(super) fn share(&self) -> f64 {
        self.share
    }

    /// This process's sends of quota `k` in the `span` up to `until`.
    fn sent_within(&self, k: usize, until: Instant, span: Duration) -> f64 {
        self.sends
            .iter()
            .filter(|s| s.at <= until && until.saturating_duration_since(s.at) < span)
            .map(|s| s.took[k])
            .sum()
    }

    /// How long after a window from its send a use of this process's whose
    /// answer has not come has surely left the service's window. The
    /// service takes a request in somewhere within its round trip, at about
    /// the same point from one request to the next, so a use leaves a window
    /// after its send give or take how much the round trips differ: their
    /// spread and [`LEAVE_SLACK`] of the window, never more than the latest
    /// round trip (the most it can be wherever the service takes requests in).
    fn leaves_after(&self, window: Duration) -> Duration {
        (self.round_trip_spread() + window.mul_f64(LEAVE_SLACK)).min(self.round_trip())
    }

    /// How much the latest round trips differ: the longest less the shortest.
    fn round_trip_spread(&self) -> Duration {
        let least = self.round_trips.iter().min().copied().unwrap_or_default();
        let most = self.round_trips.iter().max().copied().unwrap_or_default();
        most - least
    }

    /// When a use of this process's has surely left the service's `window`.
    /// Once its answer came, a window after its send and what its own round
    /// trip took beyond the shortest of the latest ones, and [`LEAVE_SLACK`]
    /// of the window, never more than its round trip: a request the service
    /// took in late leaves late, and the others of its window do not wait
    /// for it. Counted by the spread of the latest 32 round trips instead, a
    /// request taken in late a window before was not among them when its
    /// room was taken again, and every use waited out any late one's delay:
    /// a job alone on the quota bench's window of 200 requests, answered in
    /// 100 ms, used 89.5% to 99.1% of it in 16 runs, 4 of them with
    /// requests refused; counted by its own, 95.5% to 99.2%, none refused
    /// (docs/benchmark.md, "A job alone: each use leaves by its own round
    /// trip"). Before its answer, a window and `unanswered`
    /// ([`Share::leaves_after`]). `least` is the shortest of the latest
    /// round trips.
    fn leaves(
        send: &Send,
        window: Duration,
        least: Option<Duration>,
        unanswered: Duration,
    ) -> Instant {
        let slack = match send.heard {
            Some(heard) => {
                let round_trip = heard.saturating_duration_since(send.at);
                let beyond = round_trip.saturating_sub(least.unwrap_or(round_trip));
                (beyond + window.mul_f64(LEAVE_SLACK)).min(round_trip)
            }
            None => unanswered,
        };
        send.at + window + slack
    }

    /// This process's uses of quota `k` sent by `sent_by` that a sliding
    /// `window` may still count after `since`, each as when it surely
    /// leaves, the earliest to leave first.
    fn leaving(
        &self,
        k: usize,
        (since, sent_by): (Instant, Instant),
        window: Duration,
    ) -> Vec<(Instant, f64)> {
        let least = self.round_trips.iter().copied().min();
        let unanswered = self.leaves_after(window);
        let mut leaving: Vec<(Instant, f64)> = self
            .sends
            .iter()
            .filter(|s| s.took[k] > 0.0 && s.at <= sent_by)
            .map(|s| (Share::leaves(s, window, least, unanswered), s.took[k]))
            .filter(|(leaves, _)| *leaves > since)
            .collect();
        leaving.sort_by_key(|(leaves, _)| *leaves);
        leaving
    }

    /// An answer to a request sent at `sent_at` showed quota `k`, a
    /// sliding window whose longest reset so far is `known`, with its
    /// oldest use leaving `reset` after: the window's length, where the
    /// answers tell one longer ([`Stays`]).
    pub(super) fn stay(
        &mut self,
        k: usize,
        sent_at: Instant,
        reset: Duration,
        known: Duration,
    ) -> Option<Duration> {
        // A process alone sends in bursts, and the oldest use it is told
        // of is one of a burst: its answers are read while it is paced.
        if self.share >= 1.0 {
            return self.stays[k].length();
        }
        // The service takes requests in a little sooner or later from one
        // to the next: by about as much as their round trips differ.
        let tolerance = Duration::from_millis(1).saturating_add(self.round_trip_spread() / 2);
        let paced = self
            .sends
            .iter()
            .rev()
            .filter(|s| s.took[k] > 0.0 && s.paced)
            .map(|s| s.at);
        self.stays[k].answered((sent_at, reset), paced, known, tolerance);
        if !self.stays[k].due(sent_at, known) {
            return self.stays[k].length();
        }
        let sends: Vec<Instant> = self
            .sends
            .iter()
            .filter(|s| s.took[k] > 0.0)
            .map(|s| s.at)
            .collect();
        self.stays[k].read(sent_at, &sends, known, tolerance)
    }

    /// The latest round trip; none before an answer.
    fn round_trip(&self) -> Duration {
        self.round_trips.back().copied().unwrap_or_default()
    }

    /// When the first of this process's uses of quota `k` that a sliding
    /// window counted as of `since` leaves it; `None` if it counted none.
    pub(super) fn first_leaving(
        &self,
        k: usize,
        since: Instant,
        window: Duration,
    ) -> Option<Instant> {
        if window.is_zero() {
            return None;
        }
        self.leaving(k, (since, since), window)
            .first()
            .map(|(leaves, _)| *leaves)
    }

    /// How long from `now` until this process's sends leaving the
    /// service's window since `since` free `missing` of quota `k`; `None`
    /// if the sends of the last window do not hold that much.
    pub(super) fn freed_by(
        &self,
        k: usize,
        since: Instant,
        now: Instant,
        window: Duration,
        missing: f64,
    ) -> Option<Duration> {
        if window.is_zero() {
            return None;
        }
        let mut freed = 0.0;
        for (leaves, took) in self.leaving(k, (since, now), window) {
            freed += took;
            if freed >= missing {
                return Some(leaves.saturating_duration_since(now));
            }
        }
        None
    }

    /// How long a request must wait for its sends of the last `window` to
    /// leave room for it within the share of each quota; zero if it may go now.
    pub(super) fn wait(
        &self,
        now: Instant,
        quotas: [Option<Quota>; 2],
        window: Duration,
    ) -> Duration {
        if window.is_zero() {
            return Duration::ZERO;
        }
        let mut wait = Duration::ZERO;
        for (k, quota) in quotas.iter().enumerate() {
            let Some(quota) = quota.filter(|q| q.limit > 0.0) else {
                continue;
            };
            if self.share < 1.0 {
                if let Some(due) = self.paced_due(k, &quota, window) {
                    wait = wait.max(due.saturating_duration_since(now));
                }
                continue;
            }
            // A request larger than the share still goes, once the share is free.
            let allowed = (self.share * quota.limit).max(quota.cost);
            // Its use as a window counts it at `now`: each send leaves it a
            // window after it went, give or take its round trip ([`Share::leaves`]).
            let leaving = self.leaving(k, (now, now), window);
            let mut excess =
                leaving.iter().map(|(_, took)| took).sum::<f64>() + quota.cost - allowed;
            for (leaves, took) in leaving {
                if excess <= 1e-9 {
                    break;
                }
                excess -= took;
                wait = wait.max(leaves.saturating_duration_since(now));
            }
        }
        wait
    }

    /// Among others, when the pace lets the next request of `quota` `k` go:
    /// at the share's rate, the latest send, or this request if larger (a
    /// refused one took no tokens), paid off; a request larger than the
    /// share once the latest has left the window.
    fn paced_due(&self, k: usize, quota: &Quota, window: Duration) -> Option<Instant> {
        let last = self.sends.back()?;
        let span = window.saturating_add(self.round_trip());
        let cost = last.took[k].max(quota.cost);
        let gap =
            Duration::try_from_secs_f64(window.as_secs_f64() * cost / (self.share * quota.limit))
                .map_or(span, |gap| gap.min(span));
        // A gap no clock reaches (a header's absurd rate) paces nothing.
        self.paced_from.unwrap_or(last.at).checked_add(gap)
    }

    /// When the pace lets the next request go, for the `quotas` that are
    /// sliding windows; `None` when it does not pace (alone on the window,
    /// or nothing sent yet).
    pub(super) fn due(&self, quotas: [Option<Quota>; 2], window: Duration) -> Option<Instant> {
        if self.share >= 1.0 || window.is_zero() {
            return None;
        }
        quotas
            .iter()
            .enumerate()
            .filter_map(|(k, q)| self.paced_due(k, q.as_ref().filter(|q| q.limit > 0.0)?, window))
            .max()
    }

    /// Request `seq` went at `now`, taking `took` of the quotas, when the
    /// pace had let it go at `due` ([`Share::due`]); sends older than
    /// `window` are let go.
    pub(super) fn sent(
        &mut self,
        seq: u64,
        (now, due): (Instant, Option<Instant>),
        took: [f64; 2],
        window: Duration,
    ) {
        // A send a little late leaves the next its gap from when it was due.
        let from = self
            .sends
            .back()
            .map(|last| self.paced_from.unwrap_or(last.at));
        self.paced_from = due
            .zip(from)
            .filter(|(due, _)| *due <= now)
            .map(|(due, from)| {
                let slack = due.saturating_duration_since(from).mul_f64(PACE_SLACK);
                now.checked_sub(slack).map_or(due, |start| due.max(start))
            });
        // Before a window is known every send is kept: the first headers
        // count them. Sends are kept two windows, for what they free, and
        // as long as the answers read for the window's length go back
        // ([`SENDS_KEPT`]).
        let span = (window + self.round_trip()) * SENDS_KEPT;
        while self.sends.len() >= MAX_SENDS
            || self
                .sends
                .front()
                .is_some_and(|s| !window.is_zero() && now.saturating_duration_since(s.at) >= span)
        {
            self.sends.pop_front();
        }
        self.sends.push_back(Send {
            seq,
            at: now,
            took,
            heard: None,
            paced: self.share < 1.0,
        });
        self.first.get_or_insert(now);
    }

    /// Request `seq`'s send, if it is still remembered (sends are kept in
    /// the order they went, which is the order of their numbers).
    fn send_mut(&mut self, seq: u64) -> Option<&mut Send> {
        let at = self.sends.binary_search_by_key(&seq, |s| s.seq).ok()?;
        self.sends.get_mut(at)
    }

    /// The answer to request `seq` came at `now`.
    pub(super) fn heard(&mut self, seq: u64, now: Instant) {
        if let Some(send) = self.send_mut(seq) {
            send.heard = Some(now);
        }
    }

    /// The most of this process's use of quota `k` that a sliding window
    /// can count as of an admission between `sent_at` and `now`: every
    /// send before `now`, but those answered a window before `sent_at`
    /// (a use leaves a window after the service took it in, and that was
    /// before its answer came).
    fn counted(&self, k: usize, sent_at: Instant, now: Instant, window: Duration) -> f64 {
        self.sends
            .iter()
            .filter(|s| s.at <= now && s.heard.unwrap_or(now) + window > sent_at)
            .map(|s| s.took[k])
            .sum()
    }

    /// Request `seq` was billed `tokens`: its use as the service counts it,
    /// not as the local count scaled when it went.
    pub(super) fn billed(&mut self, seq: u64, tokens: f64) {
        if let Some(send) = self.send_mut(seq) {
            send.took[1] = tokens;
        }
    }

    /// A refusal of request `seq` took its request (the service counts it)
    /// but none of its tokens.
    pub(super) fn untook_tokens(&mut self, seq: u64) {
        if let Some(send) = self.send_mut(seq) {
            send.took[1] = 0.0;
        }
    }

    /// Whether this process's largest request of quota `k` is more than
    /// [`PULL_GRAIN`] of the pull beside a window of `limit` (1.5% of it):
    /// a share there moves by steps too large for the pull alone.
    pub(super) fn coarse(&self, k: usize, limit: f64) -> bool {
        self.largest(k) > PULL * PULL_GRAIN * limit
    }

    /// The largest of this process's remembered requests, in quota `k`.
    fn largest(&self, k: usize) -> f64 {
        self.sends.iter().map(|s| s.took[k]).fold(0.0, f64::max)
    }

    /// The others' part of quota `k`, a sliding window, as an answer shows
    /// it beside this process's `own` use it may count ([`Share::counted`]):
    /// the window counts every use of its length, and what is not this
    /// process's is the others'.
    fn others(&self, k: usize, own: f64, shown: Shown) -> f64 {
        // Up to two of its own requests unexplained are the process's own
        // sends meeting the service a little off their count (a use merged
        // with the next, a send just before a window's edge), not another
        // process: a process alone keeps the whole window.
        let others = shown.limit - shown.remaining - own;
        if others <= 2.0 * self.largest(k) {
            return 0.0;
        }
        (others / shown.limit).max(0.0)
    }

    /// An answer to a request sent at `sent_at`, whose headers show the
    /// quotas: the share moves to what the others leave of the most used
    /// sliding window. A bucket's level decides the rate of every process
    /// on it ([`Share::bucket_wait`]) and leaves the share where it is.
    pub(super) fn answered(
        &mut self,
        now: Instant,
        sent_at: Instant,
        quotas: [Option<Shown>; 2],
        window: Duration,
    ) {
        if self.round_trips.len() >= ROUND_TRIPS {
            self.round_trips.pop_front();
        }
        self.round_trips
            .push_back(now.saturating_duration_since(sent_at));
        let mut most: Option<(f64, f64, Paced)> = None;
        for (k, shown) in quotas.into_iter().enumerate() {
            let Some(shown) = shown.filter(|q| q.limit > 0.0) else {
                continue;
            };
            // The service counted this process's sends that reached it
            // before the answered one, and may have counted any sent before
            // the answer came: the others' are what is left beyond all of them.
            let own = self.counted(k, sent_at, now, window);
            let others = self.others(k, own, shown);
            let shown_used = shown.limit - shown.remaining;
            // This process's part of what the window shows used.
            let part = own / shown_used.max(own).max(f64::MIN_POSITIVE);
            // Paced sends are far apart: those before the answered one are
            // the ones the service had counted. Sends in a burst (a process
            // that counted on the whole window) may all have been.
            let counted = if self.share < 1.0 {
                self.sent_within(k, sent_at, window)
            } else {
                own
            };
            let paced = Paced {
                part: counted / shown_used.max(counted).max(f64::MIN_POSITIVE),
                request: self.largest(k) / shown.limit,
                used: shown_used / shown.limit,
                one_for_one: shown.one_for_one,
                requests: k == 0,
            };
            if most.is_none_or(|(o, _, _)| others > o) {
                most = Some((others, part, paced));
            }
        }
        let Some((others, part, paced)) = most else {
            return;
        };
        let since = self
            .moved_at
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        self.moved_at = Some(now);
        // Uses only add up within a window until they leave it: the others'
        // use of the window is the most any answer of it showed, not what
        // one early in their sends shows.
        while self.recent.len() >= MAX_SENDS
            || self
                .recent
                .front()
                .is_some_and(|(at, _)| sent_at.saturating_duration_since(*at) >= window)
        {
            self.recent.pop_front();
        }
        self.recent.push_back((sent_at, others));
        let others = self.recent.iter().map(|(_, o)| *o).fold(others, f64::max);
        let first_window = self
            .first
            .is_some_and(|first| sent_at.saturating_duration_since(first) < window);
        if others > 0.0 && !first_window && !window.is_zero() {
            // Among others and past its first window, the process keeps its
            // part of the window's use, scaled to leave room free: applied
            // by every process, the parts add up to about the window less
            // that room whatever their number, and the shares follow the
            // window at once, down when others come and up when they leave.
            let free = free_part(paced.request);
            let (scale, pull) = self.pulled(since, window, free, paced);
            self.share = (scale * ((1.0 - free) * paced.part + pull)
                + self.claim(now, window, paced))
            .clamp(LEAST, 1.0);
            return;
        }
        self.scale = None;
        let mut allowed = (1.0 - (1.0 + HEADROOM) * others).clamp(LEAST, 1.0);
        if first_window {
            // Processes that started together are still growing: each
            // counts on its part of what was used so far.
            allowed = allowed.min(part.max(LEAST));
        }
        if allowed <= self.share || window.is_zero() {
            self.share = allowed.max(LEAST);
        } else {
            // At most a quarter of the way on one answer: a process that
            // waited long saw nothing meanwhile.
            let step = (since.as_secs_f64() / (window.as_secs_f64() * RISE)).min(0.25);
            self.share += (allowed - self.share) * step;
            if allowed >= 1.0 && self.share >= 1.0 - paced.request {
                // Less than a request short of the whole window is the
                // whole: a process alone spends it as its uses free it, not
                // paced a little below the window's rate.
                self.share = 1.0;
            }
        }
    }

    /// The scale and the pull of a process among others ([`PULL`]): none
    /// where its requests are large beside the window. The scale starts at
    /// [`FIRST_SCALE`] and moves with what the window shows used `since` the
    /// last answer: by the window's free part over its use, to the power of
    /// the part of a window gone (at most half of one), so that it falls
    /// while the window is fuller than the shares' sum and rises, to whole
    /// at most, while it is emptier.
    fn pulled(&mut self, since: Duration, window: Duration, free: f64, paced: Paced) -> (f64, f64) {
        if (paced.request > PULL * PULL_GRAIN && !paced.one_for_one) || paced.used <= 0.0 {
            self.scale = None;
            return (1.0, 0.0);
        }
        let windows = (since.as_secs_f64() / window.as_secs_f64()).min(0.5);
        let scale = self.scale.map_or(FIRST_SCALE, |scale| {
            (scale * ((1.0 - free) / paced.used).powf(windows)).clamp(LEAST_SCALE, 1.0)
        });
        self.scale = Some(scale);
        let least = if paced.requests {
            PULL_REQUESTS * paced.request
        } else {
            0.0
        };
        (scale, PULL.max(least))
    }

    /// What a process among others adds to its part for room of the window that
    /// nobody uses. Once a window it looks at the room below the shares' sum
    /// deeper than the free part and [`CLAIM_DEPTH`] requests, and claims its
    /// part of that: the claims of the processes that see the room add up to
    /// it, and the room a process that left frees is taken up as its uses
    /// leave, not a window after, when the parts alone would show it. Claimed
    /// whole by each, the room a burst left as it went was claimed by every
    /// process that answered then, and the first to send spent it in a burst of
    /// its own: eight strangers over a real minute, started 0.9 to 9 s apart,
    /// waited up to 322 s for a success on a window of 200 requests and 500 s
    /// on one of 200,000 tokens (36 runs each), against 131 s and 128 s with
    /// the room claimed by parts (paused time; docs/benchmark.md, "What starves
    /// eight strangers"). The claim wanes to nothing over the window as the
    /// sends it adds come into the part: claimed again at each answer, it would
    /// add up. Looked at the first time room showed rather than once a window,
    /// the claims refused more on the quota bench's window of 20 requests (0.6%
    /// of requests against 0.1%, 64 paused runs each). The first answer among
    /// others claims nothing and starts the clock: the room it shows may be
    /// what the process's own sends of its first window left as they went. A
    /// process that spent its first window alone, in a burst, saw the window
    /// all but empty a window on, claimed it, and spent it again while the
    /// others waited (four strangers over a real minute, started 0.9 to 9 s
    /// apart: one in four waited 185 s or more for a success, against 129 s
    /// with the first claim put off; eight: 8,309 requests failed over 36 runs
    /// by waiting out the stall timeout, against 3,976; paused time).
    fn claim(&mut self, now: Instant, window: Duration, paced: Paced) -> f64 {
        let since = |at: Instant| now.saturating_duration_since(at).as_secs_f64();
        let room = claimed_below(paced.request) - paced.used;
        if self.claimed_at.is_none() {
            self.claimed_at = Some(now);
            self.claim = 0.0;
        } else if self
            .claimed_at
            .is_some_and(|at| since(at) >= window.as_secs_f64())
        {
            self.claim = room.max(0.0) * paced.part;
            self.claimed_at = Some(now);
        }
        self.claimed_at.map_or(0.0, |at| {
            self.claim * (1.0 - since(at) / window.as_secs_f64()).max(0.0)
        })
    }

    /// A refusal of a request sent at `sent_at`, by a quota whose window is `window` long.
    pub(super) fn refused(&mut self, now: Instant, sent_at: Instant, window: Duration) {
        // The window was full: the room claimed is not there.
        self.claim = 0.0;
        let spaced = self.cut_at.is_none_or(|at| {
            sent_at >= at && now.saturating_duration_since(at) >= window.mul_f64(CUT_SPACING)
        });
        if spaced {
            self.share = (self.share * REFUSAL_KEEPS).max(LEAST);
            self.scale = self
                .scale
                .map(|scale| (scale * SCALE_KEEPS).max(LEAST_SCALE));
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

    /// A window of 20 requests over 2 s that others keep near full, whose
    /// reset tells when it is whole again, as a process that comes to it
    /// sees it: 15 to 19 used, and the window whole about 2 s after its own
    /// use (what is left, the reset in milliseconds).
    const BUSY_WHOLE: [(f64, u64); 4] = [(3.0, 1998), (1.0, 1990), (4.0, 1995), (5.0, 1985)];

    #[test]
    fn resets_that_all_tell_a_busy_window_whole_about_a_window_on_are_told_from_the_oldest_use_leaving(
    ) {
        let sample = |refill: &mut Refill, remaining: f64, reset_ms: u64| {
            refill.sample(20.0, remaining, ms(reset_ms));
        };
        // A window of 20 that others keep near full: every reset about the
        // window, the newest use just made. Four such answers tell resets
        // of when the window is whole again, not before.
        let mut whole = Refill::default();
        for (i, (remaining, reset)) in BUSY_WHOLE.into_iter().enumerate() {
            assert!(!whole.resets_when_whole(), "after {i} answers");
            sample(&mut whole, remaining, reset);
        }
        assert!(whole.resets_when_whole());
        // When the oldest use leaves: anywhere within the window.
        let mut oldest = Refill::default();
        for (remaining, reset) in [
            (3.0, 1998),
            (1.0, 700),
            (4.0, 1995),
            (5.0, 1985),
            (2.0, 1990),
        ] {
            sample(&mut oldest, remaining, reset);
        }
        assert!(!oldest.resets_when_whole());
        // Answers on a window less than half used tell neither: its newest
        // use may be long gone, its oldest just made.
        let mut quiet = Refill::default();
        for reset in [1998, 1990, 1995, 1985] {
            sample(&mut quiet, 15.0, reset);
        }
        assert!(!quiet.resets_when_whole());
    }

    #[test]
    fn a_busy_window_whose_reset_tells_when_it_is_whole_is_told_from_a_bucket() {
        // A window of 20 requests over 2 s, kept near full by others, whose
        // reset tells when it is whole again: a process that comes to it sees
        // 15 to 20 used, and the window whole about 2 s after its own use.
        let mut window = Refill::default();
        for (i, (remaining, reset)) in BUSY_WHOLE.into_iter().enumerate() {
            window.sample(20.0, remaining, ms(reset));
            if i > 0 {
                assert!(!window.is_bucket(), "answer {i}: no one rate gives them");
            }
            // The rates are at most a fifth apart: three answers do not tell.
            assert_eq!(window.sliding_rate(20.0).is_some(), i == 3, "answer {i}");
        }
        let rate = window.sliding_rate(20.0).unwrap();
        assert!((rate - 20.0 / 1.998).abs() < 1e-9, "{rate}");
        // A bucket's answers, however many, agree: the bucket of the test
        // above, answered eight times.
        let mut bucket = Refill::default();
        for level in [19.5, 7.95, 12.2, 3.0, 1.01, 0.4, 15.3, 9.99] {
            let reset = Duration::from_secs_f64((20.0 - level) / 8.0);
            bucket.sample(20.0, f64::floor(level), ms(reset.as_millis() as u64));
        }
        assert!(bucket.is_bucket());
        assert_eq!(bucket.sliding_rate(20.0), None);
    }

    #[test]
    fn a_stranger_on_a_bucket_sends_at_a_rate_in_proportion_to_the_level() {
        let start = Instant::now();
        let mut share = Share::new(1.0);
        assert_eq!(
            share.bucket_wait(start, [1.0, 30.0, 0.5], 1.6, 1.0),
            Duration::ZERO
        );
        share.sent(0, (start, None), [1.0, 0.0], Duration::from_secs(60));
        let wait = |level: f64, need: f64, cost: f64| {
            share
                .bucket_wait(start, [level, 30.0, 0.5], need, cost)
                .as_secs_f64()
        };
        // Four processes where the level is 1.6 + 30 / (1.5 x 4) = 6.6 each
        // send a request every 8 s: a quarter of the refill of half a second.
        assert!((wait(6.6, 1.6, 1.0) - 8.0).abs() < 1e-9);
        // A fuller bucket, a faster rate; past three quarters of it, at once.
        assert!((wait(19.0, 1.6, 1.0) - 1.0 / (0.5 * 1.5 * 17.4 / 30.0)).abs() < 1e-9);
        assert_eq!(wait(22.5, 1.6, 1.0), 0.0);
        // Below what a request needs, the least rate: the refill over 32.
        assert!((wait(1.0, 1.6, 1.0) - 64.0).abs() < 1e-9);
        // A request of 20 of the 30: alone just below three quarters of the
        // bucket it still sends the refill (20 every 40 s), not 1.5 x 1.89 /
        // 30 of it.
        let rate = 20.0 / wait(22.5 - 1e-9, 20.6, 20.0);
        assert!((rate - 0.5).abs() < 1e-6, "{rate}");
    }

    fn sliding(limit: f64, remaining: f64) -> [Option<Shown>; 2] {
        let shown = Shown {
            limit,
            remaining,
            one_for_one: false,
        };
        [Some(shown), None]
    }

    /// A process whole on a sliding window of 1 s, three seconds after its
    /// first send (past its first window): the share, and the time now.
    fn past_its_first_window() -> (Share, Instant) {
        let start = Instant::now();
        let mut share = Share::new(1.0);
        share.first = Some(start);
        (share, start + Duration::from_secs(3))
    }

    fn one_quota(limit: f64, cost: f64) -> [Option<Quota>; 2] {
        [Some(Quota { limit, cost }), None]
    }

    /// A process past its first window (of 1 s) that sent `n` requests 10 ms
    /// apart, the answer to the last, 20 ms after it went, showing
    /// `remaining` of `limit`: the share, and when the first went.
    fn among_others(n: u64, limit: f64, remaining: f64) -> (Share, Instant) {
        let window = Duration::from_secs(1);
        let (mut share, now) = past_its_first_window();
        for i in 0..n {
            share.sent(i, (now + ms(i * 10), None), [1.0, 0.0], window);
        }
        let last = now + ms(n.saturating_sub(1) * 10);
        share.answered(last + ms(20), last, sliding(limit, remaining), window);
        (share, now)
    }

    #[test]
    fn among_others_a_process_keeps_its_part_of_the_window_and_paces_its_sends() {
        let window = Duration::from_secs(1);
        // Past its first window, 4 of its own requests went 10 ms apart, and
        // the answer to the last shows 16 of the window of 20 used: its part
        // is 4 of 16, less a request and a half of the window left free.
        let (mut share, now) = among_others(4, 20.0, 4.0);
        let free = REQUESTS_FREE / 20.0;
        let expected = (1.0 - free) * 4.0 / 16.0;
        assert!((share.share - expected).abs() < 1e-9, "{}", share.share);
        // It sends at its share's rate: a request every 1 s / (20 x share),
        // from its latest send.
        let gap = 1.0 / (20.0 * expected);
        let wait = share.wait(now + ms(50), one_quota(20.0, 1.0), window);
        assert!((wait.as_secs_f64() - (gap - 0.02)).abs() < 1e-6, "{wait:?}");
        let paced = now + ms(30) + Duration::from_secs_f64(gap);
        assert_eq!(
            share.wait(paced, one_quota(20.0, 1.0), window),
            Duration::ZERO
        );
        share.sent(4, (paced, None), [1.0, 0.0], window);
        // The others leave: an answer shows 10 used, 5 of them its own (the
        // sends before the answered one, paced far apart). The share rises
        // at once.
        share.answered(paced + ms(20), paced, sliding(20.0, 10.0), window);
        let expected = (1.0 - free) * 5.0 / 10.0;
        assert!((share.share - expected).abs() < 1e-9, "{}", share.share);
        // Others come: the whole window used, 5 of it its own.
        share.answered(paced + ms(40), paced, sliding(20.0, 0.0), window);
        let expected = (1.0 - free) * 5.0 / 20.0;
        assert!((share.share - expected).abs() < 1e-9, "{}", share.share);
        // A request larger than its share goes once its latest send has left
        // the window (a window and the latest round trip, 40 ms, after it went).
        let wait = share.wait(paced + ms(40), one_quota(20.0, 10.0), window);
        assert_eq!(wait, ms(1040 - 40));
    }

    #[test]
    fn among_others_a_send_a_little_late_is_made_up_by_the_next() {
        let window = Duration::from_secs(1);
        // Its part is 4 of 16 used of a window of 20, as above: a request
        // every 1 s / (20 x 0.23125), 216 ms.
        let (mut share, now) = among_others(4, 20.0, 4.0);
        let quotas = one_quota(20.0, 1.0);
        let first = share.due(quotas, window).unwrap();
        let gap = first - (now + ms(30));
        assert_eq!(gap.as_millis(), 216);
        // Twenty sends, each 5% of its gap late (a wake's jitter): each
        // next one is due a gap after the last was due, so the twenty keep
        // the share's rate rather than falling 5% behind it.
        let mut due = first;
        for n in 4..24 {
            assert_eq!(share.wait(due, quotas, window), Duration::ZERO);
            share.sent(n, (due + gap.mul_f64(0.05), Some(due)), [1.0, 0.0], window);
            due = share.due(quotas, window).unwrap();
        }
        assert_eq!(due, first + gap * 20);
        // Held back half a gap (by the window, or a refusal's pause), a send
        // is made up by at most a tenth of its gap: the next is not sent at once.
        let held = due + gap / 2;
        share.sent(24, (held, Some(due)), [1.0, 0.0], window);
        let next = share.due(quotas, window).unwrap();
        assert_eq!(next, held - gap.mul_f64(PACE_SLACK) + gap);
        assert_eq!(share.wait(held, quotas, window), next - held);
        // Sent with no pace (alone on the window), the next counts from the send.
        share.sent(25, (next + gap, None), [1.0, 0.0], window);
        assert_eq!(share.due(quotas, window), Some(next + gap * 2));
    }

    #[test]
    fn among_others_where_requests_are_small_every_process_adds_the_same_pull_scaled_to_the_window()
    {
        let window = Duration::from_secs(1);
        // A window of 200 requests (a request is 0.5% of it) shows 190
        // used, 10 of them this process's: the window less its free part.
        // Its share is its part less that free part, and the pull, at the
        // first scale.
        let part = |own: f64, used: f64| (1.0 - HEADROOM) * own / used;
        let (mut share, now) = among_others(10, 200.0, 10.0);
        let expected = FIRST_SCALE * (part(10.0, 190.0) + PULL);
        assert!((share.share - expected).abs() < 1e-9, "{}", share.share);
        // The pull is the same whatever the part, so it raises a small part
        // more for its size than a large one: the parts even out.
        let (large, _) = among_others(80, 200.0, 10.0);
        let expected = FIRST_SCALE * (part(80.0, 190.0) + PULL);
        assert!((large.share - expected).abs() < 1e-9, "{}", large.share);
        assert!(large.share / share.share < 80.0 / 10.0 * 0.55);
        // Half a window after that answer, the window shows full, more than
        // the shares' sum: the scale falls by 0.95 to the power of the half
        // window, and the share with it.
        let last = now + ms(90);
        share.answered(last + ms(520), last, sliding(200.0, 0.0), window);
        let scale = FIRST_SCALE * (1.0 - HEADROOM).powf(0.5);
        let expected = scale * (part(10.0, 200.0) + PULL);
        assert!((share.share - expected).abs() < 1e-9, "{}", share.share);
        // A window emptier than the shares' sum raises the scale back, never
        // past whole.
        share.answered(last + ms(1020), last, sliding(200.0, 20.0), window);
        let scale = scale * ((1.0 - HEADROOM) / 0.9f64).powf(0.5);
        let expected = scale * (part(10.0, 180.0) + PULL);
        assert!((share.share - expected).abs() < 1e-9, "{}", share.share);
        // Half the window used: the scale is whole again (no room claimed:
        // the window of the last claim, at the answer before, is not over).
        share.answered(last + ms(1520), last, sliding(200.0, 100.0), window);
        let expected = part(10.0, 100.0) + PULL;
        assert!((share.share - expected).abs() < 1e-9, "{}", share.share);
        // On the quota bench's window of 20 requests a request is 5% of it:
        // no pull, the part alone.
        let (coarse, _) = among_others(4, 20.0, 4.0);
        let free = REQUESTS_FREE / 20.0;
        let expected = (1.0 - free) * 4.0 / 16.0;
        assert!((coarse.share - expected).abs() < 1e-9, "{}", coarse.share);
        // Unless its resets tell when it is whole again: there each process
        // replaces its own uses one for one, which holds any split, and the
        // pull evens it. A run there lasts a few windows, so the pull is
        // three requests, more than the one of a fine window.
        let (mut whole, now) = among_others(3, 20.0, 4.0);
        let last = now + ms(20);
        let shown = Shown {
            limit: 20.0,
            remaining: 4.0,
            one_for_one: true,
        };
        whole.sent(3, (last + ms(10), None), [1.0, 0.0], window);
        whole.answered(last + ms(30), last + ms(10), [Some(shown), None], window);
        let pull = PULL_REQUESTS / 20.0;
        assert!(pull > PULL);
        let expected = FIRST_SCALE * ((1.0 - free) * 4.0 / 16.0 + pull);
        assert!((whole.share - expected).abs() < 1e-9, "{}", whole.share);
    }

    #[test]
    fn among_others_a_process_claims_the_room_nobody_uses_once_a_window() {
        let window = Duration::from_secs(1);
        // A window of 100 requests shows 40 used, 10 of them this process's:
        // others left. Its part is 10 of 40 less the 5% left free, with the
        // pull every process adds where a request is 1% of the window, at
        // the first scale. The room it sees is not claimed yet: at its
        // first answer among others, it may be what the process's own sends
        // of its first window left as they went.
        let (mut share, now) = among_others(10, 100.0, 60.0);
        let part = (1.0 - HEADROOM) * 10.0 / 40.0 + PULL;
        let near = |share: &Share, expected: f64| {
            assert!((share.share - expected).abs() < 1e-9, "{}", share.share);
        };
        near(&share, FIRST_SCALE * part);
        // A window on, it claims its part (a quarter) of the room beyond
        // twice that free part and 8 requests: of 42. The window is emptier
        // than the shares' sum: the scale is back to whole.
        share.answered(now + ms(1110), now + ms(90), sliding(100.0, 60.0), window);
        near(&share, part + 0.42 / 4.0);
        // The claim wanes over the window, as the sends it adds come into
        // the part; the room seen again within the window adds nothing.
        share.answered(now + ms(1610), now + ms(90), sliding(100.0, 60.0), window);
        near(&share, part + 0.42 / 8.0);
        // A refusal says the room is not there, and that the shares added
        // up to more than the window: it cuts the scale, which the next
        // answer, 20 ms on, raises by a fiftieth of a window's rise.
        share.refused(now + ms(1620), now + ms(1600), window);
        share.answered(now + ms(1630), now + ms(90), sliding(100.0, 60.0), window);
        let scale = SCALE_KEEPS * ((1.0 - HEADROOM) / 0.4f64).powf(0.02);
        near(&share, scale * part);
        // A window after the claim, room seen is claimed again.
        share.answered(now + ms(2110), now + ms(90), sliding(100.0, 60.0), window);
        near(&share, part + 0.42 / 4.0);
        // In a window of 20 requests, a request is 5% of it: 10 requests
        // free are the grain of paced sends (1.5 requests left free, twice,
        // and 8), not room; 12 free leave one to claim, a window on, and
        // the process claims half of it: its 4 requests of the 8 used.
        for (remaining, claim) in [(10.0, 0.0), (12.0, 0.025)] {
            let (mut share, now) = among_others(4, 20.0, remaining);
            let part = (1.0 - REQUESTS_FREE / 20.0) * 4.0 / (20.0 - remaining);
            near(&share, part);
            share.answered(
                now + ms(1050),
                now + ms(30),
                sliding(20.0, remaining),
                window,
            );
            assert!(
                (share.share - (part + claim)).abs() < 1e-9,
                "{remaining} free: {}",
                share.share
            );
        }
    }

    #[test]
    fn a_process_that_sees_no_others_returns_to_the_whole_window() {
        let window = Duration::from_secs(1);
        let (mut share, mut now) = past_its_first_window();
        // A refusal cuts the share: the process paces its sends.
        share.sent(0, (now, None), [1.0, 0.0], window);
        share.refused(now + ms(20), now, window);
        assert!((share.share - REFUSAL_KEEPS).abs() < 1e-9);
        assert!(!share
            .wait(now + ms(20), one_quota(20.0, 1.0), window)
            .is_zero());
        // Its answers show its own sends alone (one every 300 ms, the latest
        // 4 in the window): the share rises a quarter of the way at a time,
        // and within a request of the whole it is whole.
        let mut shares = Vec::new();
        for n in 1..10 {
            now += ms(300);
            share.sent(n, (now, None), [1.0, 0.0], window);
            share.heard(n, now + ms(20));
            let used = (n + 1).min(4) as f64;
            share.answered(now + ms(20), now, sliding(20.0, 20.0 - used), window);
            shares.push(share.share);
        }
        assert!(shares.windows(2).all(|w| w[1] >= w[0]), "{shares:?}");
        assert_eq!(shares.last(), Some(&1.0), "{shares:?}");
        assert!(shares[0] < 1.0 - 1.0 / 20.0, "{shares:?}");
        assert_eq!(
            share.wait(now + ms(20), one_quota(20.0, 1.0), window),
            Duration::ZERO
        );
    }

    #[test]
    fn a_process_alone_reads_its_own_sends_under_way_as_its_own() {
        let window = Duration::from_secs(1);
        let (mut share, now) = past_its_first_window();
        // Two sends of a window before, answered before this window began.
        for n in 0..2 {
            share.sent(n, (now - ms(1500), None), [1.0, 0.0], window);
            share.heard(n, now - ms(1480));
        }
        // A burst of 8, 1 ms apart, on as many connections: the service took
        // all 8 in before it took the first one's, whose answer comes 25 ms
        // after it went and shows 8 of the window of 20 used. None of them
        // is another process's.
        for n in 2..10 {
            share.sent(n, (now + ms(n - 2), None), [1.0, 0.0], window);
        }
        share.heard(2, now + ms(25));
        share.answered(now + ms(25), now, sliding(20.0, 12.0), window);
        assert_eq!(share.share, 1.0);
        // 6 more than its sends are the others': it keeps its part, 8 of the
        // 14 used, less a request and a half of the window left free.
        share.heard(3, now + ms(26));
        share.answered(now + ms(26), now + ms(1), sliding(20.0, 6.0), window);
        let expected = (1.0 - REQUESTS_FREE / 20.0) * 8.0 / 14.0;
        assert!((share.share - expected).abs() < 1e-9, "{}", share.share);
    }

    #[test]
    fn a_process_alone_counts_a_use_as_leaving_a_window_after_its_send() {
        let window = Duration::from_secs(1);
        // The window's 2 requests went together and came back in 100 ms:
        // the service took both in at the same point of their round trips,
        // and each leaves a window after it went, give or take a hundredth
        // of the window; not a window and a round trip.
        let (mut share, now) = past_its_first_window();
        for n in 0..2 {
            share.sent(n, (now, None), [1.0, 0.0], window);
            share.heard(n, now + ms(100));
            share.answered(now + ms(100), now, sliding(2.0, 0.0), window);
        }
        assert_eq!(share.share, 1.0);
        let after = |share: &Share| {
            let at = now + ms(100);
            at + share.wait(at, one_quota(2.0, 1.0), window) - now
        };
        assert_eq!(after(&share), window + ms(10));
        let leaving = |share: &Share, at: Instant| -> Vec<Duration> {
            share
                .leaving(0, (at, at), window)
                .iter()
                .map(|(leaves, _)| *leaves - now)
                .collect()
        };
        // One answered 60 ms later in its round trip than those: the
        // service may have taken it in that much later, and its use alone
        // leaves that much later.
        share.sent(2, (now + ms(1), None), [1.0, 0.0], window);
        share.heard(2, now + ms(161));
        share.answered(now + ms(161), now + ms(1), sliding(2.0, 0.0), window);
        assert_eq!(
            leaving(&share, now + ms(161)),
            [window + ms(10), window + ms(10), window + ms(71)]
        );
        // Never later than its own round trip after the window: the
        // service took it in by the time it answered. A round trip of 5 ms
        // makes the first two 95 ms longer than the shortest.
        share.sent(3, (now + ms(2), None), [1.0, 0.0], window);
        share.heard(3, now + ms(7));
        share.answered(now + ms(7), now + ms(2), sliding(2.0, 0.0), window);
        assert_eq!(
            leaving(&share, now + ms(161)),
            [
                window + ms(7),
                window + ms(100),
                window + ms(100),
                window + ms(161)
            ]
        );
        assert_eq!(
            share.first_leaving(0, now + ms(1), window),
            Some(now + window + ms(100))
        );
        assert_eq!(share.first_leaving(1, now + ms(1), window), None);
        // One not answered yet leaves a window after it went and the
        // latest round trips' spread and a hundredth of the window (165 ms),
        // never more than the latest round trip (5 ms).
        share.sent(4, (now + ms(8), None), [1.0, 0.0], window);
        assert_eq!(share.leaves_after(window), ms(5));
        assert_eq!(leaving(&share, now + ms(161))[1], window + ms(13));
    }
}
