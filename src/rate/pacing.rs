//! Pacing by the service's quota: one shared state per [`RateControl`](super::RateControl).
//!
//! Every response's `x-ratelimit-*` headers tell what is left of the request
//! and token quotas and when each is whole again (from which the rate it
//! refills at follows; each quota's model is a [`Budget`]). A request is
//! sent only when the budget, as of the
//! latest answer, refilled since and less what was sent after that answer's
//! request, covers it with a small margin; its tokens are the local count
//! scaled by the billed/local ratio learned from `usage`. So a run settles at
//! the quota's rate with few refusals, and several processes on one key,
//! each seeing the shared quota in the headers, share it without talking.
//!
//! Every 429 pauses every sender: as long as `Retry-After` /
//! `retry-after-ms` asks (capped), and never less than a floor that doubles
//! with each refusal in a row (up to a cap) and resets on a success; until
//! that success, requests go one at a time. So no server, not one that says
//! `Retry-After: 0` nor one whose headers claim a whole quota on its 429s
//! (such headers are not believed until a success), makes the run send
//! faster than the floor allows. A service that sends no headers is paced by
//! its 429s alone, while the window of requests in flight halves
//! ([`Concurrency`](super::concurrency::Concurrency)). A rate-limit refusal is a wait,
//! not a failed attempt: only when nothing has succeeded for the stall
//! timeout does the run stop, resumable.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::budget::{Budget, MAX_PAUSE};
use super::headers::{QuotaHeader, RateLimitHeaders, MAX_RESET};
use super::share::{Quota, Share, Shown};
use super::Fault;

/// The floor of the pause after a 429, whatever the service says: it
/// doubles with each refusal in a row, up to [`MAX_BACKOFF`], and a success
/// resets it (docs/service.md states the bound it sets). Strangers refused
/// together all pause, and the window they share shows the hole a window
/// later: their shares, raised while it was in the window, overflow it as it
/// leaves, and they are refused and pause again. At 250 ms, an eighth of
/// the quota bench's window of 2 s, four strangers on its window of 200
/// requests, answered in 100 ms and started up to 100 ms apart, were
/// refused together every 2 to 2.5 s and used 81.5% to 83.3% of it; at 100
/// ms, 87.2% to 88.9% (paused time; docs/benchmark.md, "A shorter floor").
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The budget kept in hand beyond a request's cost, as a share of the
/// quota: it absorbs a request billed a little more than estimated and the
/// refill counted from the send rather than the service's admission. In a
/// steady run it costs no rate, only a slightly fuller bucket.
pub(super) const MARGIN: f64 = 0.02;

/// The margin beyond a request's cost that a process counting on `share`
/// of a sliding window of `limit` waits for: [`MARGIN`] of the quota, and
/// with less than the whole window no more than half its request. It waits
/// for its share of the level to cover the request and the margin, so a
/// margin of the quota would have a small share wait for far more than the
/// window's free part: with 125 requests a window, a quarter share waited
/// for 14 requests free where the shares leave about 6, and shares that
/// small fell further while the larger ones took what they left.
///
/// With the whole window, where the cost is `exact` (a request of a request
/// quota, not tokens estimated by a local count), no more than the request:
/// nothing is billed more than counted, and when its uses leave is the
/// slack's to cover (`Share::leaves`). A job alone on the quota bench's
/// window of 200 requests, answered in 100 ms, kept 4 of them free and used
/// 93.2% of it on average over nine invocations of both resets; keeping
/// one, 96.2% (docs/benchmark.md, "A job alone keeps a request free").
fn sliding_margin(limit: f64, cost: f64, share: f64, exact: bool) -> f64 {
    if share < 1.0 {
        (MARGIN * limit).min(cost / 2.0)
    } else if exact {
        (MARGIN * limit).min(cost)
    } else {
        MARGIN * limit
    }
}

/// How much of a sliding window this process's own uses must free, as they
/// leave it, before a request of `cost` goes: what the request `need`s (its
/// cost and the margin) beyond its `share` of what the `budget` shows left.
///
/// Among others on a window whose resets tell when it is whole again, only
/// the cost: each of its uses is replaced as it leaves, one for one. Such
/// resets tell no process when a use leaves, so only its own sends tell it
/// when room comes. With the margin, a process whose share of a window near
/// full was less than the margin sent one request for every two of its own
/// that left, and its part shrank window by window while the largest took
/// the room: four strangers on the quota bench's window of 20 requests,
/// started 30 ms apart, held a split of 1, 2, 4 and 11 requests a window
/// for 10 s and ended 14 s apart. A use replaced keeps the window's count
/// where it was. Where the resets tell when the oldest use leaves, every
/// process is told when room comes, and a use replaced as it left met the
/// others' sends there: 3.2% of four strangers' requests refused against
/// 1.7% (paused time; docs/benchmark.md, "One for one where nobody is told
/// when a use leaves"). On a coarse window there, with the window's length
/// taken from the process's own uses too, 88.5% of the window was used
/// against 83.7%, but up to 7% of a set-up's requests refused ("A pull of
/// three requests; one for one under the oldest-use reset tried").
fn own_to_free(budget: &Budget, cost: f64, need: f64, share: f64, one_for_one: bool) -> f64 {
    let room = budget.remaining * share;
    if one_for_one {
        cost - room
    } else {
        need.min(budget.limit * share) - room
    }
}

/// What a process on a bucket counts on of the refill since the latest
/// header, until the next: the others on the key take the rest (a fair
/// part among four; without it, processes that all saw too little to send
/// would wait for the least rate while the bucket refills).
const OTHERS_LEAVE: f64 = 0.25;

/// After a refusal the share of the refill counted on halves, at most once
/// per spacing (the requests in flight are refused together), down to the
/// least share; each success adds a step back.
const SHARE_SPACING: Duration = Duration::from_millis(500);
const MIN_SHARE: f64 = 1.0 / 8.0;
const SHARE_STEP: f64 = 0.005;

/// The longest one sleep between checks of the budget; new answers may have come meanwhile.
const MAX_STEP: Duration = Duration::from_millis(500);

/// A sleep for the budget lasts up to this part of its wait longer, so that
/// processes sharing a quota do not wake together.
const WAKE_JITTER: f64 = 0.05;

/// A shard of a split job sends one request alone until the first answer
/// tells whether the service describes its quota, for at most this long:
/// shards each starting with a full window would find the quota they share
/// by having them refused. A process alone starts with its full window.
const PROBE: Duration = Duration::from_secs(2);

/// How often a request waiting on another's answer looks again.
const PROBE_STEP: Duration = Duration::from_millis(5);

/// A request holds at most this part of the service's token quota (by
/// what its `limit` header says): where one request is 5% or 8% of the
/// window, processes sharing it move by steps that large and part it
/// unevenly. On the quota bench's token window of 20,000 tokens, four
/// independent jobs whose requests held 32 texts (8% of it) used 71.2% to
/// 79.4% of it; cut to a hundredth of it, 89.8% to 91.4%, none refused
/// (docs/benchmark.md, "Quotas").
const REQUEST_GRAIN: f64 = 0.01;

/// Requests made smaller for the token quota still leave this many times
/// the request quota's rate of room: filling the token quota with them
/// takes at most half the requests the service allows.
const REQUEST_ROOM: f64 = 2.0;

/// Sends not yet covered by an answer's headers, at most.
const MAX_UNCOVERED: usize = 4096;

/// Why a request was not let through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// The quota stops the requests.
    Stop(QuotaStop),
    /// The request is larger than the service's token quota asks for:
    /// cut it into requests of at most this many tokens (by the local
    /// count), each sent on its own.
    Cut(u64),
}

/// Why requests stopped: the run ends, resumable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaStop {
    #[error(
        "nothing succeeded for {seconds}s (`backend.stall_timeout_seconds`) while the service \
         refused requests or its quota held them back ({last})"
    )]
    Stalled { seconds: u64, last: String },
    #[error("the service says the quota is used up (insufficient_quota): {0}")]
    InsufficientQuota(String),
}

/// Whether a refusal's `message` is a billing stop rather than a rate limit: waiting will not help.
pub fn is_insufficient_quota(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("insufficient_quota") || message.contains("exceeded your current quota")
}

/// Whether a 429's `message` refuses a request larger than the whole quota
/// (OpenAI's "Request too large ... on tokens per min"): it must be split,
/// not retried.
pub fn is_larger_than_quota(message: &str) -> bool {
    message.to_ascii_lowercase().contains("request too large")
}

/// A send that the latest answer's headers do not cover yet.
#[derive(Debug, Clone, Copy)]
struct Sent {
    seq: u64,
    at: Instant,
    tokens: f64,
}

#[derive(Debug)]
struct State {
    requests: Option<Budget>,
    tokens: Option<Budget>,
    /// The sequence number of the next send.
    next_seq: u64,
    /// The send whose answer last described the quotas.
    observed_seq: Option<u64>,
    uncovered: VecDeque<Sent>,
    /// When the first request went, until any answer came.
    probing: Option<Instant>,
    /// Whether the first request goes alone (a shard of a split job).
    probe: bool,
    answered: bool,
    /// Billed and local tokens of the answers so far.
    billed: f64,
    local: f64,
    paused_until: Option<Instant>,
    /// Refusals in a row that raised the floor, since the last success.
    refusals: u32,
    /// When the floor was last raised: a refusal of a request sent before
    /// then is of the same burst and raises it no further.
    raised_at: Option<Instant>,
    /// The request sent alone while refusals go on, and when it went.
    alone: Option<(u64, Instant)>,
    /// Headers that contradicted a refusal: none are taken in until a success.
    distrust: bool,
    /// The share of a sliding window counted on: 1 alone, a shard's part
    /// of the job, less when refusals show others on the same quota.
    share: f64,
    /// The least share refusals lower it to.
    least_share: f64,
    share_lowered: Option<Instant>,
    /// This process's part of the quota's rate among strangers on the key.
    pace: Share,
    /// The job's own limit on requests (`backend.requests_per_minute`), a second.
    own_request_rate: Option<f64>,
    /// How long a use stays in the service's sliding windows, where the job
    /// says (`backend.quota_window_seconds`).
    given_window: Option<Duration>,
    last_success: Instant,
    last_refusal: Option<String>,
    throttled: u64,
    /// Waits for the quota under way, and since when one has been.
    waiting: usize,
    waiting_since: Option<Instant>,
    waited: Duration,
    rng: SmallRng,
}

/// A request let through: what it was counted as.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    seq: u64,
    sent_at: Instant,
    local_tokens: u64,
}

impl Ticket {
    /// When the request was let through.
    pub fn sent_at(&self) -> Instant {
        self.sent_at
    }
}

/// The pacing state the requests to one service share.
#[derive(Debug)]
pub struct Pacing {
    /// Requests are let through one at a time, in the order they asked.
    gate: tokio::sync::Mutex<()>,
    state: Mutex<State>,
    stall_timeout: Duration,
}

/// Counts the time someone waits for the quota, once however many wait.
pub struct Waiting<'a>(&'a Pacing);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.waiting -= 1;
        if state.waiting == 0 {
            if let Some(since) = state.waiting_since.take() {
                state.waited += since.elapsed();
            }
        }
    }
}

impl Pacing {
    /// Nothing known of the quota yet; the run stops when nothing succeeds
    /// for `stall_timeout`.
    pub fn new(stall_timeout: Duration) -> Pacing {
        let seed = u64::from(std::process::id())
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        Pacing {
            gate: tokio::sync::Mutex::new(()),
            state: Mutex::new(State {
                requests: None,
                tokens: None,
                next_seq: 0,
                observed_seq: None,
                uncovered: VecDeque::new(),
                probing: None,
                probe: false,
                answered: false,
                billed: 0.0,
                local: 0.0,
                paused_until: None,
                refusals: 0,
                raised_at: None,
                alone: None,
                distrust: false,
                share: 1.0,
                least_share: MIN_SHARE,
                share_lowered: None,
                pace: Share::new(1.0),
                own_request_rate: None,
                given_window: None,
                last_success: Instant::now(),
                last_refusal: None,
                throttled: 0,
                waiting: 0,
                waiting_since: None,
                waited: Duration::ZERO,
                rng: SmallRng::seed_from_u64(seed),
            }),
            stall_timeout,
        }
    }

    /// Pacing for one of `processes` that share the quota: it sends one
    /// request first, and under a sliding window counts on its part of it
    /// from the start instead of learning it from refusals, winning back
    /// more as answers succeed (when the others are done). On a bucket it
    /// follows the level as any process does.
    #[must_use]
    pub fn shared_by(self, processes: u32) -> Pacing {
        {
            let mut state = self.lock();
            state.share = 1.0 / f64::from(processes.max(1));
            state.least_share = state.share.min(MIN_SHARE);
            state.probe = processes > 1;
            state.pace = Share::new(state.share);
        }
        self
    }

    /// Pacing for a job whose own limit is `requests_per_minute` (0 for
    /// none): requests cut for the token quota leave room within it too.
    #[must_use]
    pub fn limited_to(self, requests_per_minute: u32) -> Pacing {
        self.lock().own_request_rate =
            (requests_per_minute > 0).then(|| f64::from(requests_per_minute) / 60.0);
        self
    }

    /// Pacing for a job that says how long a use stays in the service's
    /// sliding windows (`None`: the answers tell it); see `State::one_for_one`.
    #[must_use]
    pub fn window_given(self, window: Option<Duration>) -> Pacing {
        self.lock().given_window = window.filter(|w| !w.is_zero());
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a single step: the state stays whole even if a holder panicked.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks a wait for the quota (or a configured limit) until dropped.
    pub fn waiting(&self) -> Waiting<'_> {
        let mut state = self.lock();
        state.waiting += 1;
        if state.waiting == 1 {
            state.waiting_since = Some(Instant::now());
        }
        Waiting(self)
    }

    /// Waits until the quota covers a request of `local_tokens` (by the
    /// local count), and counts it as sent.
    ///
    /// # Errors
    /// Nothing has succeeded for the stall timeout.
    #[cfg(test)]
    pub async fn admit(&self, local_tokens: u64) -> Result<Ticket, QuotaStop> {
        loop {
            match self.admit_or_cut(local_tokens, false).await {
                Ok(ticket) => return Ok(ticket),
                Err(Held::Stop(stop)) => return Err(stop),
                // Only a divisible request is cut.
                Err(Held::Cut(_)) => {}
            }
        }
    }

    /// Waits until the quota covers a request of `local_tokens` (by the
    /// local count), and counts it as sent; a `divisible` request larger
    /// than [`Pacing::request_tokens`] is not sent but handed back to be
    /// cut, as soon as the headers tell that size.
    ///
    /// # Errors
    /// Nothing has succeeded for the stall timeout, or the request is to be cut.
    pub async fn admit_or_cut(&self, local_tokens: u64, divisible: bool) -> Result<Ticket, Held> {
        let _turn = self.gate.lock().await;
        let mut waiting = None;
        loop {
            let now = Instant::now();
            let wait = {
                let mut state = self.lock();
                if let Some(most) = state
                    .request_tokens()
                    .filter(|&most| divisible && local_tokens > most)
                {
                    return Err(Held::Cut(most));
                }
                let wait = state.wait(now, local_tokens);
                // From the last success (or the first send), whatever the service says.
                let quiet = if state.next_seq == 0 {
                    Duration::ZERO
                } else {
                    now.saturating_duration_since(state.last_success)
                };
                let held = !wait.is_zero() || state.refusals > 0;
                if !held || (wait.is_zero() && quiet < self.stall_timeout) {
                    return Ok(state.send(now, local_tokens));
                }
                if quiet >= self.stall_timeout {
                    return Err(Held::Stop(QuotaStop::Stalled {
                        seconds: self.stall_timeout.as_secs(),
                        last: state.last_refusal.as_ref().map_or_else(
                            || "its headers said to wait, nothing was refused".to_string(),
                            |refusal| format!("last refusal: {refusal}"),
                        ),
                    }));
                }
                let jitter = wait.mul_f64(state.rng.random_range(0.0..WAKE_JITTER));
                (wait + jitter)
                    .min(MAX_STEP)
                    .min(self.stall_timeout - quiet)
            };
            waiting.get_or_insert_with(|| self.waiting());
            tokio::time::sleep(wait).await;
        }
    }

    /// An answer: its headers (if the service sent any) and, when it
    /// succeeded, the tokens it billed.
    pub fn on_answer(
        &self,
        ticket: Ticket,
        headers: Option<RateLimitHeaders>,
        billed_tokens: Option<u64>,
    ) {
        let mut state = self.lock();
        state.release(ticket);
        state.refusals = 0;
        state.raised_at = None;
        state.alone = None;
        state.distrust = false;
        state.observe(ticket, headers, false);
        state.last_success = Instant::now();
        state.share = (state.share + SHARE_STEP).min(1.0);
        state.pace.heard(ticket.seq, Instant::now());
        if let Some(billed) = billed_tokens {
            #[allow(clippy::cast_precision_loss)]
            state.pace.billed(ticket.seq, billed as f64);
        }
        if let Some(headers) = headers.filter(|_| !state.distrust) {
            state.pace_by(ticket, &headers);
        }
        if let Some(billed) = billed_tokens.filter(|_| ticket.local_tokens > 0) {
            #[allow(clippy::cast_precision_loss)]
            {
                state.billed += billed as f64;
                state.local += ticket.local_tokens as f64;
            }
        }
    }

    /// A failed request that is not a refusal by the quota (a 5xx, a
    /// timeout): its headers still describe the quota.
    pub fn on_failure(&self, ticket: Ticket, headers: Option<RateLimitHeaders>) {
        let mut state = self.lock();
        state.release(ticket);
        state.pace.heard(ticket.seq, Instant::now());
        state.observe(ticket, headers, false);
    }

    /// A 429 that is a rate limit. Returns whether the service describes
    /// its quota in headers that are believed (the pacing then follows
    /// them; otherwise the caller narrows its window of requests in flight).
    pub fn on_refused(
        &self,
        ticket: Ticket,
        headers: Option<RateLimitHeaders>,
        error: &impl Fault,
    ) -> bool {
        let retry_after = error.requested_delay();
        let mut state = self.lock();
        state.throttled += 1;
        state.last_refusal = Some(error.to_string());
        state.release(ticket);
        #[allow(clippy::cast_precision_loss)]
        let tokens = ticket.local_tokens as f64 * state.ratio();
        if headers.is_some_and(|h| h.covers(tokens)) {
            // Headers that say the refused request fits are not believed until a success.
            state.distrust = true;
        }
        let described = headers.is_some() && !state.distrust;
        let now = Instant::now();
        state.pace.heard(ticket.seq, now);
        state.observe(ticket, headers, true);
        let window = state.window();
        state.pace.refused(now, ticket.sent_at, window);
        state.pace.untook_tokens(ticket.seq);
        if state.probe {
            // Shards also count on less of the budget the headers show.
            state.yield_share(now);
        }
        if let (Some(headers), Some(asked)) = (headers.filter(|_| described), retry_after) {
            // The service says when the refused request fits: until then, nothing is ours.
            if let Some(until) = now.checked_add(asked.min(MAX_PAUSE)) {
                state.refused(&headers, ticket, until);
            }
        }
        let floor = state.raise_floor(ticket, now);
        let pause = retry_after.map_or(floor, |asked| asked.min(MAX_PAUSE).max(floor));
        // Processes refused together would come back together and be
        // refused again: each waits a random part longer.
        let spread = if described { 0.25 } else { 0.1 };
        let jitter = pause.mul_f64(state.rng.random_range(0.0..spread));
        if let Some(until) = now.checked_add(pause + jitter) {
            state.paused_until = Some(state.paused_until.map_or(until, |p| p.max(until)));
        }
        described
    }

    /// 429s received.
    pub fn throttled(&self) -> u64 {
        self.lock().throttled
    }

    /// The time requests spent waiting for the quota (or a configured limit).
    pub fn waited(&self) -> Duration {
        let state = self.lock();
        state.waited + state.waiting_since.map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// The most tokens (by the local count) a request should hold for the
    /// service's token quota, once its headers tell it: [`REQUEST_GRAIN`] of
    /// the quota, or where requests that small would fill more than a
    /// [`REQUEST_ROOM`]th of the request quota, as small as leaves that
    /// room. `None` while the headers tell no token quota, or tell a request
    /// quota whose rate is not known yet.
    pub fn request_tokens(&self) -> Option<u64> {
        self.lock().request_tokens()
    }

    /// Billed tokens over local tokens, as learned from the answers.
    #[cfg(test)]
    fn ratio(&self) -> f64 {
        self.lock().ratio()
    }

    /// The longest of the quotas' windows, as this process counts it.
    #[cfg(test)]
    pub(super) fn window(&self) -> Duration {
        self.lock().window()
    }
}

impl State {
    /// See [`Pacing::request_tokens`].
    fn request_tokens(&self) -> Option<u64> {
        let tokens = self.tokens.filter(|_| !self.distrust)?;
        let mut most = tokens.limit * REQUEST_GRAIN;
        let service = match self.requests {
            Some(requests) if requests.rate > 0.0 && tokens.rate > 0.0 => Some(requests.rate),
            Some(_) => return None,
            None => None,
        };
        // The job's own request limit leaves room too.
        let rate = [service, self.own_request_rate]
            .into_iter()
            .flatten()
            .reduce(f64::min);
        if let Some(rate) = rate.filter(|&rate| rate > 0.0 && tokens.rate > 0.0) {
            most = most.max(REQUEST_ROOM * tokens.rate / rate);
        }
        let local = (most / self.ratio()).floor();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        local.is_finite().then(|| local.max(1.0) as u64)
    }

    fn ratio(&self) -> f64 {
        if self.local > 0.0 && self.billed > 0.0 {
            self.billed / self.local
        } else {
            1.0
        }
    }

    /// The wait before a request of `local_tokens` may go; zero if it may now.
    fn wait(&self, now: Instant, local_tokens: u64) -> Duration {
        if let Some(first) = self.probing.filter(|_| self.probe && !self.answered) {
            let left = (first + PROBE).saturating_duration_since(now);
            if !left.is_zero() {
                return left.min(PROBE_STEP);
            }
        }
        let mut wait = self
            .paused_until
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
        // While refusals go on, one request at a time; one never told of
        // (given up on) holds the others back no longer than the floor's cap.
        if let Some((_, sent)) = self.alone {
            let left = (sent + MAX_BACKOFF).saturating_duration_since(now);
            wait = wait.max(left.min(PROBE_STEP));
        }
        #[allow(clippy::cast_precision_loss)]
        let tokens = local_tokens as f64 * self.ratio();
        for (k, (budget, cost)) in [(&self.requests, 1.0), (&self.tokens, tokens)]
            .into_iter()
            .enumerate()
        {
            let Some(budget) = budget else { continue };
            let share = self.counted_share();
            let sliding = budget.refill.sliding_rate(budget.limit).is_some();
            let need = cost + sliding_margin(budget.limit, cost, share, k == 0);
            let mut until = if sliding {
                budget.wait(now, need, share)
            } else {
                self.level_wait(k, budget, now, cost)
            };
            if !until.is_zero() && sliding {
                // A sliding window frees this process's own uses a window
                // after it sent them, all of them its own: its next burst
                // need not wait for the rate.
                let missing = own_to_free(budget, cost, need, share, self.one_for_one(k, budget));
                let own = self
                    .pace
                    .freed_by(k, budget.seen, now, self.window(), missing);
                until = until.min(own.unwrap_or(until));
            }
            wait = wait.max(until);
        }
        wait.max(
            self.pace
                .wait(now, self.sliding_quotas(tokens), self.window()),
        )
    }

    /// The quotas that are sliding windows, for a request of `tokens`
    /// (billed): under a sliding window the share is a window of the
    /// process's own; under a bucket, the part of the level counted on is
    /// enough.
    fn sliding_quotas(&self, tokens: f64) -> [Option<Quota>; 2] {
        let sliding =
            |budget: &Option<Budget>| budget.filter(|b| b.refill.sliding_rate(b.limit).is_some());
        let quotas = self.quotas(tokens);
        [
            quotas[0].filter(|_| sliding(&self.requests).is_some()),
            quotas[1].filter(|_| sliding(&self.tokens).is_some()),
        ]
    }

    /// The wait on a bucket before a request costing `cost` of quota `k`,
    /// for a stranger and a shard alike: the level decides its rate, not a
    /// share (see [`Share::bucket_wait`]). Until two answers tell how the
    /// quota refills, one request at a time: the others on it may be many.
    fn level_wait(&self, k: usize, budget: &Budget, now: Instant, cost: f64) -> Duration {
        let until = budget.wait(now, cost + MARGIN * budget.limit, 1.0);
        if !budget.refill.is_bucket() {
            // For at most the probe's time, should an answer never be told of.
            let waiting_on = self
                .uncovered
                .iter()
                .any(|s| now.saturating_duration_since(s.at) < PROBE);
            return if waiting_on {
                until.max(PROBE_STEP)
            } else {
                until
            };
        }
        // The level the latest header showed, less this process's sends it
        // does not cover, and a part of the refill since.
        let uncovered: f64 = self
            .uncovered
            .iter()
            .map(|s| if k == 0 { 1.0 } else { s.tokens })
            .sum();
        let since = now.saturating_duration_since(budget.seen).as_secs_f64();
        let level = budget.shown - uncovered + OTHERS_LEAVE * budget.rate * since;
        let need = cost + MARGIN * budget.limit;
        let spacing = self
            .pace
            .bucket_wait(now, [level, budget.limit, budget.rate], need, cost);
        until.max(spacing)
    }

    /// Whether, among others on the quota described by `budget`, a sliding
    /// window whose resets tell when it is whole again, this process
    /// replaces its uses one for one (see [`own_to_free`]). A bucket's busy
    /// resets (the time until it is full) may agree as closely, but it
    /// refills from its level.
    ///
    /// Where the job says how long a use stays in the window
    /// (`backend.quota_window_seconds`), whichever the reset tells, on a
    /// coarse window (a request more than 1.5% of it, [`Share::coarse`]):
    /// the process knows when each of its uses leaves, and nothing but
    /// those frees room for it before a window after its latest answer
    /// (`State::observe`). Untold, a process that came to the window in
    /// use reads its length late or never, and one for one there refused
    /// more than it gained. Four strangers on the quota bench's window of
    /// 20 requests under the oldest-use reset used 84.2% of it untold and
    /// 91.5% told, 1.6% and 0.7% refused (paused time, every set-up of the
    /// grid; docs/benchmark.md, "The window's length told"). On a fine
    /// window the pull evens the parts, and one for one, which holds any
    /// split, lowered the grid's fairness there (0.978 to 0.887 on the
    /// window of 200 requests).
    fn one_for_one(&self, k: usize, budget: &Budget) -> bool {
        self.counted_share() < 1.0
            && budget.refill.sliding_rate(budget.limit).is_some()
            && (budget.refill.resets_when_whole()
                || (budget.refill.is_given() && self.pace.coarse(k, budget.limit)))
    }

    /// The part of what a sliding window's headers show left that this
    /// process counts on: a shard's part of the job, or its share among
    /// strangers. It keeps processes that see the same window from all
    /// spending it.
    fn counted_share(&self) -> f64 {
        self.share.min(self.pace.share())
    }

    /// The quotas as this process's share sees them, for a request of
    /// `tokens` (billed).
    fn quotas(&self, tokens: f64) -> [Option<Quota>; 2] {
        let quota = |budget: &Option<Budget>, cost: f64| {
            budget.map(|b| Quota {
                limit: b.limit,
                cost,
            })
        };
        [quota(&self.requests, 1.0), quota(&self.tokens, tokens)]
    }

    /// Moves this process's share by what the headers of the answer to
    /// `ticket`'s request show used of the quotas that are sliding windows
    /// (on a bucket the level decides, not a share).
    fn pace_by(&mut self, ticket: Ticket, headers: &RateLimitHeaders) {
        let shown = |k: usize, budget: &Option<Budget>, header: Option<QuotaHeader>| {
            let budget = budget
                .as_ref()
                .filter(|b| b.refill.sliding_rate(b.limit).is_some())?;
            header.map(|h| Shown {
                limit: h.limit,
                remaining: h.remaining,
                one_for_one: self.one_for_one(k, budget),
            })
        };
        let quotas = [
            shown(0, &self.requests, headers.requests),
            shown(1, &self.tokens, headers.tokens),
        ];
        let window = self.window();
        self.pace
            .answered(Instant::now(), ticket.sent_at, quotas, window);
    }

    /// The longest of the quotas' windows (limit over rate), at most the
    /// longest reset believed: a bucket whose headers say a sliver of it
    /// refills in a day implies a window no clock reaches.
    fn window(&self) -> Duration {
        [&self.requests, &self.tokens]
            .into_iter()
            .flatten()
            .filter(|b| b.rate > 0.0)
            .map(|b| {
                Duration::try_from_secs_f64(b.limit / b.rate)
                    .map_or(MAX_RESET, |window| window.min(MAX_RESET))
            })
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// A refusal raises the floor of the pause, unless its request went
    /// before the last raise (refused in the same burst). Returns the floor.
    fn raise_floor(&mut self, ticket: Ticket, now: Instant) -> Duration {
        if self.raised_at.is_none_or(|at| ticket.sent_at >= at) {
            self.refusals = self.refusals.saturating_add(1);
            self.raised_at = Some(now);
        }
        let doublings = self.refusals.saturating_sub(1).min(16);
        (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
    }

    /// The request sent alone was told of.
    fn release(&mut self, ticket: Ticket) {
        if self.alone.is_some_and(|(seq, _)| seq == ticket.seq) {
            self.alone = None;
        }
        self.uncovered.retain(|s| s.seq != ticket.seq);
    }

    /// A refusal: others on the quota took what this process counted on,
    /// so it counts on less of the refill between answers (halved at most
    /// once per spacing; successes win it back).
    fn yield_share(&mut self, now: Instant) {
        if self
            .share_lowered
            .is_none_or(|at| now.saturating_duration_since(at) >= SHARE_SPACING)
        {
            self.share = (self.share / 2.0).max(self.least_share);
            self.share_lowered = Some(now);
        }
    }

    /// The budgets the refusal's headers show short of the refused request
    /// fit it at `until`, as the service's `Retry-After` said.
    fn refused(&mut self, headers: &RateLimitHeaders, ticket: Ticket, until: Instant) {
        #[allow(clippy::cast_precision_loss)]
        let tokens = ticket.local_tokens as f64 * self.ratio();
        if let (Some(budget), Some(header)) = (self.requests.as_mut(), headers.requests) {
            if header.remaining < 1.0 {
                budget.refused(1.0, until);
            }
        }
        if let (Some(budget), Some(header)) = (self.tokens.as_mut(), headers.tokens) {
            if header.remaining < tokens {
                budget.refused(tokens, until);
            }
        }
    }

    fn send(&mut self, now: Instant, local_tokens: u64) -> Ticket {
        let seq = self.next_seq;
        if seq == 0 {
            // The stall timeout counts from the first send until a success.
            self.last_success = now;
        }
        self.next_seq += 1;
        self.probing.get_or_insert(now);
        if self.refusals > 0 {
            self.alone = Some((seq, now));
        }
        #[allow(clippy::cast_precision_loss)]
        let tokens = local_tokens as f64 * self.ratio();
        let window = self.window();
        let due = self.pace.due(self.sliding_quotas(tokens), window);
        self.pace.sent(seq, (now, due), [1.0, tokens], window);
        if self.requests.is_some() || self.tokens.is_some() {
            if self.uncovered.len() >= MAX_UNCOVERED {
                self.uncovered.pop_front();
            }
            #[allow(clippy::cast_precision_loss)]
            let tokens = local_tokens as f64 * self.ratio();
            let sent = Sent {
                seq,
                at: now,
                tokens,
            };
            self.spend(sent);
            self.uncovered.push_back(sent);
        }
        Ticket {
            seq,
            sent_at: now,
            local_tokens,
        }
    }

    /// Takes in what an answer's headers say, when they are newer than
    /// what is known: as of the send of `ticket`'s request, which they
    /// cover with every request sent before it.
    fn observe(&mut self, ticket: Ticket, headers: Option<RateLimitHeaders>, refused: bool) {
        self.answered = true;
        let Some(headers) = headers.filter(|_| !self.distrust) else {
            return;
        };
        if self.observed_seq.is_some_and(|seen| seen > ticket.seq) {
            return;
        }
        self.observed_seq = Some(ticket.seq);
        let given = self.given_window;
        for (budget, header) in [
            (&mut self.requests, headers.requests),
            (&mut self.tokens, headers.tokens),
        ] {
            if let Some(header) = header {
                match budget {
                    Some(budget) => budget.update(header, ticket.sent_at, refused),
                    None => *budget = Some(Budget::new(header, ticket.sent_at, refused, given)),
                }
            }
        }
        // Which quotas this process replaces its uses of one for one.
        let replaced = [0, 1].map(|k| {
            let budget = if k == 0 { &self.requests } else { &self.tokens };
            budget.as_ref().is_some_and(|b| self.one_for_one(k, b))
        });
        // Where a sliding window's reset tells when its oldest use leaves,
        // the process's own sends tell how long the window is: the longest
        // reset a process that came to the window in use saw may be far
        // shorter (`Share::stay`).
        for (k, (budget, header)) in [
            (&mut self.requests, headers.requests),
            (&mut self.tokens, headers.tokens),
        ]
        .into_iter()
        .enumerate()
        {
            let Some(budget) = budget.as_mut().filter(|b| {
                b.refill.sliding_rate(b.limit).is_some() && !b.refill.resets_when_whole()
            }) else {
                continue;
            };
            if given.is_some() {
                // The job says how long a use stays.
                continue;
            }
            let Some(reset) = header
                .filter(|h| h.remaining < h.limit)
                .and_then(|h| h.reset)
                .filter(|r| !r.is_zero())
            else {
                continue;
            };
            let stay = self
                .pace
                .stay(k, ticket.sent_at, reset, budget.refill.longest());
            budget.refill.stay(stay);
            if let Some(rate) = budget.refill.sliding_rate(budget.limit) {
                budget.rate = rate;
            }
        }
        // A sliding window frees nothing before its reset when the reset
        // tells when its oldest use leaves; when it tells when the window
        // is whole again, this process's own first use it counted leaves
        // sooner. Held to that reset, a job alone whose sends left a gap a
        // window before saw nothing freed, sent nothing, and left the gap
        // again a window on, every window.
        let window = self.window();
        for (k, budget) in [&mut self.requests, &mut self.tokens]
            .into_iter()
            .enumerate()
        {
            let Some(budget) = budget
                .as_mut()
                .filter(|b| b.refill.sliding_rate(b.limit).is_some())
            else {
                continue;
            };
            if let Some(given) = given.filter(|_| replaced[k]) {
                // Its own uses free its room (`State::one_for_one`), and the
                // others' none: nothing refills before a window on (where
                // the reset tells when the window is whole, it is about
                // then already). Counted as refilling at the window's rate
                // from the first of its own to leave, the budget would take
                // the others' uses leaving as room too. (In paused time,
                // four strangers started 100 ms apart used 91.0% and 91.2%
                // of the bench's window of 20 requests with and without
                // that, none of 40 runs each refused more than 5%.)
                let whole = ticket
                    .sent_at
                    .checked_add(given.max(budget.refill.longest()));
                if let Some(whole) = whole.filter(|_| !budget.refill.resets_when_whole()) {
                    budget.at = budget.at.max(whole);
                }
                continue;
            }
            if let Some(leaves) = self.pace.first_leaving(k, ticket.sent_at, window) {
                budget.at = budget.at.min(leaves.max(ticket.sent_at));
            }
        }
        // Requests sent a little before that one may reach the service
        // after it: they count as not in the headers until answered, or
        // sent a round trip before it.
        let round_trip = Instant::now().saturating_duration_since(ticket.sent_at);
        while self
            .uncovered
            .front()
            .is_some_and(|s| s.seq <= ticket.seq && s.at + round_trip <= ticket.sent_at)
        {
            self.uncovered.pop_front();
        }
        self.uncovered.retain(|s| s.seq != ticket.seq);
        // What was sent after that request is not in the headers yet.
        let uncovered: Vec<Sent> = self.uncovered.iter().copied().collect();
        for sent in uncovered {
            self.spend(sent);
        }
    }

    /// Takes a send from the budgets. Under a sliding window a process
    /// counts on its share of what the headers show: its own sends take
    /// from that share, so they weigh `1 / share` on the whole window it
    /// models. On a bucket every process follows the level
    /// ([`State::level_wait`]): its sends take their cost.
    fn spend(&mut self, sent: Sent) {
        let weight = |budget: &Budget| {
            if budget.refill.sliding_rate(budget.limit).is_some() {
                1.0 / self.share
            } else {
                1.0
            }
        };
        let weights = [
            self.requests.as_ref().map_or(1.0, weight),
            self.tokens.as_ref().map_or(1.0, weight),
        ];
        if let Some(budget) = self.requests.as_mut() {
            budget.spend(sent.at, weights[0]);
        }
        if let Some(budget) = self.tokens.as_mut() {
            budget.spend(sent.at, sent.tokens * weights[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::tests::TestFault;

    fn headers(
        requests: Option<(f64, f64, u64)>,
        tokens: Option<(f64, f64, u64)>,
    ) -> RateLimitHeaders {
        let quota = |(limit, remaining, reset_ms): (f64, f64, u64)| QuotaHeader {
            limit,
            remaining,
            reset: Some(Duration::from_millis(reset_ms)),
        };
        RateLimitHeaders {
            requests: requests.map(quota),
            tokens: tokens.map(quota),
        }
    }

    fn rate_limited(retry_after: Option<Duration>) -> TestFault {
        TestFault::refusal("Rate limit reached", retry_after)
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_until_the_headers_say_the_budget_covers_it() {
        let pacing = Pacing::new(Duration::from_secs(600));
        let first = pacing.admit(100).await.unwrap();
        // 1000 tokens a second; 100 left: a request of 500 waits for 400 more and the margin.
        pacing.on_answer(
            first,
            Some(headers(None, Some((1000.0, 100.0, 900)))),
            Some(100),
        );
        let start = Instant::now();
        let _second = pacing.admit(500).await.unwrap();
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(420) && waited < Duration::from_millis(520),
            "waited {waited:?}"
        );
        assert!(pacing.waited() >= Duration::from_millis(420));
        // The second is counted as sent: a third of 500 waits for its own 500 too.
        let start = Instant::now();
        let _third = pacing.admit(500).await.unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(480),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_holds_a_hundredth_of_the_token_quota_unless_the_request_quota_needs_more() {
        let answered = |requests, tokens| async move {
            let pacing = Pacing::new(Duration::from_secs(600));
            assert_eq!(pacing.request_tokens(), None);
            let ticket = pacing.admit(100).await.unwrap();
            // Billed 1.25 tokens for each of the local count.
            pacing.on_answer(ticket, Some(headers(requests, tokens)), Some(125));
            pacing.request_tokens()
        };
        // No token quota told: no bound.
        assert_eq!(answered(Some((20.0, 19.0, 100)), None).await, None);
        // 20,000 tokens: a request of 200 billed, 160 by the local count.
        assert_eq!(
            answered(None, Some((20_000.0, 19_875.0, 100))).await,
            Some(160)
        );
        // With 20 requests a window as well (both refilling in two
        // seconds), requests of 200 would take 100 a window to fill the
        // token quota: they hold twice 1000 billed instead, 1600 local.
        assert_eq!(
            answered(Some((20.0, 19.0, 100)), Some((20_000.0, 19_000.0, 100))).await,
            Some(1600)
        );
        // A day's request quota beside a minute's token quota: a request
        // holds what fills the token quota with half the day's requests.
        let day = answered(
            Some((10_000.0, 9_999.0, 8_640)),
            Some((1_000_000.0, 999_000.0, 60)),
        )
        .await
        .unwrap();
        let expected = 2.0 * (1e6 / 60.0) / (10_000.0 / 86_400.0) / 1.25;
        assert!(
            (day as f64 - expected).abs() / expected < 0.05,
            "{day} against {expected}"
        );
        // The job's own limit of 300 requests a minute (5 a second) beside
        // 20,000 tokens refilling at 10,000 a second: twice 2,000 billed.
        let pacing = Pacing::new(Duration::from_secs(600)).limited_to(300);
        let ticket = pacing.admit(100).await.unwrap();
        let told = headers(None, Some((20_000.0, 19_000.0, 100)));
        pacing.on_answer(ticket, Some(told), Some(125));
        assert_eq!(pacing.request_tokens(), Some(3200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_that_refills_a_sliver_a_day_implies_a_window_of_a_day_at_most() {
        // A limit of 14 trillion requests, an eighth of one more used at
        // every answer, whole again in a day: the rate these imply makes a
        // window of 3 x 10^11 years, past what a clock can add.
        let pacing = Pacing::new(Duration::from_secs(600));
        for n in 1..=6 {
            let ticket = pacing.admit(100).await.unwrap();
            let limit = 1.4e13;
            let answer = RateLimitHeaders {
                requests: Some(QuotaHeader {
                    limit,
                    remaining: limit - 0.125 * f64::from(n),
                    reset: Some(Duration::from_secs(86_400)),
                }),
                tokens: None,
            };
            pacing.on_answer(ticket, Some(answer), Some(100));
            assert!(pacing.lock().window() <= MAX_RESET);
        }
        // Requests still go: the budget covers them.
        let start = Instant::now();
        pacing.admit(100).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[test]
    fn a_share_of_a_sliding_window_waits_for_half_a_request_beyond_it_at_most() {
        // A window of 125 requests shows 6 free, the part the shares leave:
        // a quarter share counts on 1.5 of them, its request and half of it.
        let now = Instant::now();
        let header = QuotaHeader {
            limit: 125.0,
            remaining: 6.0,
            reset: Some(Duration::from_millis(100)),
        };
        let budget = Budget::new(header, now, false, None);
        let need = 1.0 + sliding_margin(125.0, 1.0, 0.25, true);
        assert!((need - 1.5).abs() < 1e-9, "{need}");
        assert_eq!(budget.wait(now, need, 0.25), Duration::ZERO);
        // 2% of the quota beyond the request would have it wait for 14 free.
        assert!(!budget.wait(now, 1.0 + MARGIN * 125.0, 0.25).is_zero());
        // The whole window keeps 2% of it, or a request where the cost is
        // exact; so does a share of a window where that is less than half a
        // request (20 requests: 0.4).
        assert!((sliding_margin(125.0, 1.0, 1.0, false) - 2.5).abs() < 1e-9);
        assert!((sliding_margin(125.0, 1.0, 1.0, true) - 1.0).abs() < 1e-9);
        assert!((sliding_margin(20.0, 1.0, 1.0, true) - 0.4).abs() < 1e-9);
        assert!((sliding_margin(20.0, 1.0, 0.25, true) - 0.4).abs() < 1e-9);
    }

    #[test]
    fn a_refusals_headers_do_not_tell_how_a_bucket_refills() {
        let header = |remaining: f64, reset_ms: u64| QuotaHeader {
            limit: 20.0,
            remaining,
            reset: Some(Duration::from_millis(reset_ms)),
        };
        let now = Instant::now();
        // A bucket of 20 refilling 10 a second: 19 left, whole in 100 ms.
        let mut budget = Budget::new(header(19.0, 100), now, false, None);
        // Refused while 30 in debt: none shown left, whole in 5 s. Read as a
        // rate, that is 4 a second, which the next success's 10 a second
        // would contradict, and nothing would be known for a bucket.
        budget.update(header(0.0, 5000), now, true);
        budget.update(header(18.0, 200), now, false);
        assert!(budget.refill.is_bucket());
    }

    #[test]
    fn a_refusals_reset_tells_how_long_a_sliding_window_is_at_least() {
        let header = |remaining: f64, reset_ms: u64| QuotaHeader {
            limit: 200.0,
            remaining,
            reset: Some(Duration::from_millis(reset_ms)),
        };
        let now = Instant::now();
        // A window of 200 requests a minute, found in use: its oldest use
        // leaves in 0.3 s, then in 1.2 s. Those answers show a sliding window
        // (no one rate gives both) whose length is 1.2 s at least.
        let mut budget = Budget::new(header(1.0, 300), now, false, None);
        budget.update(header(2.0, 1200), now, false);
        let rate = budget.refill.sliding_rate(200.0).unwrap();
        assert!((rate - 200.0 / 1.2).abs() < 1e-6, "{rate}");
        // Refused while a burst fills the window, 58 s from leaving it: the
        // window is that long at least, and refills no faster than its
        // limit over that.
        budget.update(header(0.0, 58_000), now, true);
        let rate = budget.refill.sliding_rate(200.0).unwrap();
        assert!((rate - 200.0 / 58.0).abs() < 1e-6, "{rate}");
        assert!((budget.rate - rate).abs() < 1e-9, "{}", budget.rate);
        // A shorter reset later leaves it so.
        budget.update(header(0.0, 500), now, true);
        assert!((budget.rate - 200.0 / 58.0).abs() < 1e-6, "{}", budget.rate);
    }

    #[tokio::test(start_paused = true)]
    async fn alone_on_a_window_whose_reset_tells_when_it_is_whole_its_first_use_frees_room() {
        // A sliding window of 10 requests a second whose reset tells when it
        // is whole again: one request at 0, answered at 0.51 s, and 9 more at
        // 0.5 s, answered at 1 s. The first, taken in at once, showed 1 used,
        // whole in 0.995 s; the last of the 9 shows the window full, whole in
        // 0.995 s.
        let pacing = Pacing::new(Duration::from_secs(600));
        let start = Instant::now();
        let first = pacing.admit(1).await.unwrap();
        tokio::time::advance(Duration::from_millis(500)).await;
        let mut burst = Vec::new();
        for _ in 0..9 {
            burst.push(pacing.admit(1).await.unwrap());
        }
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(500),
            "nothing said to wait"
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        pacing.on_answer(first, Some(headers(Some((10.0, 9.0, 995)), None)), None);
        tokio::time::advance(Duration::from_millis(490)).await;
        for ticket in burst {
            pacing.on_answer(ticket, Some(headers(Some((10.0, 0.0, 995)), None)), None);
        }
        // The window is whole at 1.495 s, and the others of this process's
        // uses leave it by 1.51 s. The first's round trip was 10 ms longer
        // than theirs: it leaves a window after it went, those 10 ms and a
        // hundredth of the window, at 1.02 s, and from then on the window
        // frees room at its rate: the request and the margin (1.2 requests)
        // in 0.12 s, at 1.14 s. The sleep that waits for it lasts up to the
        // wake's jitter longer.
        let _next = pacing.admit(1).await.unwrap();
        let went = start.elapsed();
        assert!(went >= Duration::from_millis(1020), "{went:?}");
        let latest = Duration::from_millis(1140) + Duration::from_millis(140).mul_f64(WAKE_JITTER);
        assert!(went <= latest, "{went:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn come_to_a_busy_window_whose_reset_tells_when_it_is_whole_a_process_paces_by_a_share() {
        // A window of 20 requests over 2 s that others keep near full, whose
        // reset tells when it is whole again: each answer, 20 ms after its
        // request, shows 15 to 20 used and the window whole about 2 s after
        // the use just made.
        let pacing = Pacing::new(Duration::from_secs(600));
        for (remaining, reset) in [(3.0, 1998), (1.0, 1990), (4.0, 1995), (5.0, 1985)] {
            let ticket = pacing.admit(1).await.unwrap();
            tokio::time::advance(Duration::from_millis(20)).await;
            pacing.on_answer(
                ticket,
                Some(headers(Some((20.0, remaining, reset)), None)),
                None,
            );
        }
        // Four answers no one rate gives: a sliding window, of which this
        // process counts on its part of the use, its 4 requests of the 15
        // shown used. Its part of the 5 left (1.33) is less than a request
        // and the margin (1.4): it waits for its first use to leave the
        // window, about 2 s after it went (1.9 s from now), and at the least
        // for that share's pace (2 s over 20 x 4 / 15 requests, 0.375 s from
        // its latest send, 20 ms ago). Taken for neither kind, the window's
        // 5 left went to this process, the next request at once.
        let start = Instant::now();
        let _next = pacing.admit(1).await.unwrap();
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(355), "{waited:?}");
    }

    /// Requests of this process 200 ms apart on a window of 20 requests,
    /// each answered 20 ms after it went with the `(remaining, reset in
    /// ms)` given: when each went.
    async fn answered_200_ms_apart(pacing: &Pacing, answers: [(f64, u64); 4]) -> Vec<Instant> {
        let mut sent = Vec::new();
        for (remaining, reset) in answers {
            let ticket = pacing.admit(1).await.unwrap();
            sent.push(ticket.sent_at());
            tokio::time::advance(Duration::from_millis(20)).await;
            pacing.on_answer(
                ticket,
                Some(headers(Some((20.0, remaining, reset)), None)),
                None,
            );
            tokio::time::advance(Duration::from_millis(180)).await;
        }
        sent
    }

    #[tokio::test(start_paused = true)]
    async fn among_others_on_a_window_whose_reset_tells_when_it_is_whole_a_process_replaces_its_uses_one_for_one(
    ) {
        // A window of 20 requests over 2 s that others keep near full, whose
        // reset tells when it is whole again: four requests of this process,
        // 200 ms apart, each answered 20 ms after it went, showing 15 to 19
        // used and the window whole about 2 s after the use just made.
        let pacing = Pacing::new(Duration::from_secs(600));
        let sent = answered_200_ms_apart(
            &pacing,
            [(3.0, 1998), (4.0, 1990), (5.0, 1995), (1.0, 1985)],
        )
        .await;
        // Its part is 4 of the 19 used; its share of the 1 left (0.21) is
        // less than a request. Such resets tell it nothing of when a use
        // leaves but its own: it replaces the first of its uses as it
        // leaves, about a window after it went. Waiting for the margin too
        // (1.4 requests), it waited for its second use to leave as well, a
        // window after that one went.
        let _next = pacing.admit(1).await.unwrap();
        let window = Duration::from_secs(2);
        let went = Instant::now();
        assert!(went >= sent[0] + window, "{:?}", went - sent[0]);
        assert!(went < sent[1] + window, "{:?}", went - sent[0]);
    }

    #[tokio::test(start_paused = true)]
    async fn among_others_told_the_windows_length_a_process_replaces_its_uses_one_for_one() {
        // A window of 20 requests over 2 s that others use, whose reset
        // tells when its oldest use leaves: at every answer one is about
        // to. Four requests of this process, 200 ms apart, each answered
        // 20 ms after it went, showing 10, 11, 12 and 19 used. The job says
        // the window is 2 s long.
        let pacing =
            Pacing::new(Duration::from_secs(600)).window_given(Some(Duration::from_secs(2)));
        let sent =
            answered_200_ms_apart(&pacing, [(10.0, 300), (9.0, 120), (8.0, 450), (1.0, 80)]).await;
        // Untold, it counts in the longest reset (0.45 s).
        assert_eq!(pacing.window(), Duration::from_secs(2));
        // A request is 5% of the window: it replaces the first of its uses
        // as it leaves, a window after it went, and takes none of the room
        // the others' uses leaving free (untold, it went at its share's
        // pace, 0.85 s after its first).
        let _next = pacing.admit(1).await.unwrap();
        let window = Duration::from_secs(2);
        let went = Instant::now();
        assert!(went >= sent[0] + window, "{:?}", went - sent[0]);
        assert!(went < sent[1] + window, "{:?}", went - sent[0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_on_a_busy_bucket_is_not_taken_for_a_window_replaced_one_for_one() {
        // A shard of four on a bucket of 20 requests refilling 10 a second,
        // at least half used at each answer: its resets (the time until the
        // bucket is full) are all within three quarters of the longest, as
        // those of a sliding window whose reset tells when it is whole again,
        // and its requests are 5% of it. But one rate gives them all: a
        // bucket, which refills from its level, not one use at a time.
        let pacing = Pacing::new(Duration::from_secs(600)).shared_by(4);
        for (remaining, reset) in [(6.0, 1400), (5.0, 1500), (7.0, 1300), (4.0, 1600)] {
            let ticket = pacing.admit(1).await.unwrap();
            pacing.on_answer(
                ticket,
                Some(headers(Some((20.0, remaining, reset)), None)),
                Some(1),
            );
        }
        let state = pacing.lock();
        let budget = state.requests.unwrap();
        assert!(budget.refill.is_bucket());
        assert!(budget.refill.resets_when_whole());
        assert!(!state.one_for_one(0, &budget));
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_bucket_a_stranger_and_a_shard_go_one_at_a_time_then_at_the_rate_the_level_allows()
    {
        // A shard of four follows the level as a stranger does: it knows
        // its part of the job, not what the others on the key send.
        for processes in [1, 4] {
            let pacing = Pacing::new(Duration::from_secs(600)).shared_by(processes);
            let first = pacing.admit(1).await.unwrap();
            // 20 requests left of 30, whole again in 20 s: half a request a
            // second, or a sliding window's first uses: one answer cannot tell.
            pacing.on_answer(
                first,
                Some(headers(Some((30.0, 20.0, 20_000)), None)),
                Some(1),
            );
            let second = pacing.admit(1).await.unwrap();
            let held = tokio::time::timeout(Duration::from_secs(1), pacing.admit(1)).await;
            assert!(
                held.is_err(),
                "{processes}: a third went before the second's answer"
            );
            // 19 left, whole in 22 s: the same rate, a bucket. The rate it may
            // send at is 1.5 x the refill x (19 - 1.6) / 30 of a bucket, 0.435
            // a second (a quarter of the refill since the header adds a little):
            // the next goes about 2.3 s after the second.
            pacing.on_answer(
                second,
                Some(headers(Some((30.0, 19.0, 22_000)), None)),
                Some(1),
            );
            let _third = pacing.admit(1).await.unwrap();
            let after = second.sent_at().elapsed();
            assert!(
                after >= Duration::from_millis(2200) && after <= Duration::from_millis(2350),
                "{processes}: the third went {after:?} after the second"
            );
            // Past three quarters of the bucket nobody counts on the level.
            let pacing = Pacing::new(Duration::from_secs(600)).shared_by(processes);
            for remaining in [28.0, 27.0] {
                let ticket = pacing.admit(1).await.unwrap();
                let reset = (30.0 - remaining) * 2000.0;
                pacing.on_answer(
                    ticket,
                    Some(headers(Some((30.0, remaining, reset as u64)), None)),
                    Some(1),
                );
            }
            let start = Instant::now();
            for _ in 0..4 {
                let _ticket = pacing.admit(1).await.unwrap();
            }
            assert_eq!(start.elapsed(), Duration::ZERO, "{processes}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_billed_ratio_scales_the_tokens_a_request_needs() {
        let pacing = Pacing::new(Duration::from_secs(600));
        let first = pacing.admit(100).await.unwrap();
        // The service bills twice the local count.
        pacing.on_answer(
            first,
            Some(headers(None, Some((1000.0, 800.0, 200)))),
            Some(200),
        );
        assert!((pacing.ratio() - 2.0).abs() < 1e-9);
        let start = Instant::now();
        // 300 local tokens are 600 billed; 800 left covers them at once.
        let second = pacing.admit(300).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        pacing.on_answer(
            second,
            Some(headers(None, Some((1000.0, 200.0, 800)))),
            Some(600),
        );
        let start = Instant::now();
        let _third = pacing.admit(300).await.unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(400),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn older_answers_do_not_overwrite_newer_ones() {
        let pacing = Pacing::new(Duration::from_secs(600));
        let a = pacing.admit(1).await.unwrap();
        let b = pacing.admit(1).await.unwrap();
        pacing.on_answer(b, Some(headers(Some((10.0, 0.0, 1000)), None)), None);
        // a's answer, older, says more was left: b's holds.
        pacing.on_answer(a, Some(headers(Some((10.0, 9.0, 100)), None)), None);
        let start = Instant::now();
        let _c = pacing.admit(1).await.unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_without_headers_pauses_everyone_and_backs_off() {
        let pacing = Pacing::new(Duration::from_secs(600));
        let t = pacing.admit(1).await.unwrap();
        assert!(!pacing.on_refused(t, None, &rate_limited(None)));
        let start = Instant::now();
        let t = pacing.admit(1).await.unwrap();
        let first = start.elapsed();
        assert!(first >= FIRST_BACKOFF, "{first:?}");
        pacing.on_refused(t, None, &rate_limited(None));
        let start = Instant::now();
        let t = pacing.admit(1).await.unwrap();
        assert!(
            start.elapsed() >= FIRST_BACKOFF * 2,
            "{:?}",
            start.elapsed()
        );
        // Retry-After is honoured; an overlong one is capped, never a panic.
        pacing.on_refused(t, None, &rate_limited(Some(Duration::MAX)));
        let start = Instant::now();
        let _ = pacing.admit(1).await.unwrap();
        let waited = start.elapsed();
        assert!(
            waited >= MAX_PAUSE && waited <= MAX_PAUSE.mul_f64(1.11),
            "{waited:?}"
        );
        assert_eq!(pacing.throttled(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_holds_the_budget_until_the_retry_after_and_lowers_the_share() {
        let pacing = Pacing::new(Duration::from_secs(600));
        let t = pacing.admit(1).await.unwrap();
        // Nothing left and 4 s until whole: the quota may be in debt, and
        // the service says the next request fits in 2 s.
        let refused = headers(Some((20.0, 0.0, 4000)), None);
        assert!(pacing.on_refused(
            t,
            Some(refused),
            &rate_limited(Some(Duration::from_secs(2)))
        ));
        let start = Instant::now();
        let t = pacing.admit(1).await.unwrap();
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        // Counting on half the refill now, the next waits longer than one request's refill.
        pacing.on_answer(t, Some(headers(Some((20.0, 0.0, 4000)), None)), None);
        let start = Instant::now();
        let _ = pacing.admit(1).await.unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(250),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_succeeding_for_the_stall_timeout_stops() {
        let pacing = Pacing::new(Duration::from_secs(10));
        let mut refusals = 0;
        let stop = loop {
            match pacing.admit(1).await {
                Ok(t) => {
                    refusals += 1;
                    pacing.on_refused(t, None, &rate_limited(Some(Duration::from_secs(3))));
                }
                Err(stop) => break stop,
            }
        };
        assert!(
            matches!(stop, QuotaStop::Stalled { seconds: 10, .. }),
            "{stop}"
        );
        assert!(stop.to_string().contains("stall_timeout_seconds"));
        assert!((3..=4).contains(&refusals), "{refusals} refusals");
        let t = Ticket {
            seq: 99,
            sent_at: Instant::now(),
            local_tokens: 1,
        };
        pacing.on_answer(t, None, None);
        assert!(
            pacing.admit(1).await.is_ok(),
            "a success starts the clock again"
        );
    }

    /// Headers that claim a whole quota: 10,000 requests and 10M tokens left.
    fn whole_quota() -> RateLimitHeaders {
        headers(
            Some((10_000.0, 10_000.0, 0)),
            Some((10_000_000.0, 10_000_000.0, 0)),
        )
    }

    /// `c` senders against a server that answers each request after 1 ms as
    /// `answer` says (given the request's number), until the stall timeout
    /// stops them or 10,000 requests went. Returns the requests sent, the
    /// refusals and the stops.
    async fn senders(
        pacing: &Pacing,
        c: usize,
        answer: impl Fn(u64) -> Option<(Option<RateLimitHeaders>, TestFault)>,
    ) -> (u64, u64, Vec<QuotaStop>) {
        let sent = std::cell::Cell::new(0u64);
        let refused = std::cell::Cell::new(0u64);
        let sender = || async {
            loop {
                let ticket = match pacing.admit(1).await {
                    Ok(ticket) => ticket,
                    Err(stop) => return Some(stop),
                };
                let n = sent.get();
                sent.set(n + 1);
                tokio::time::sleep(Duration::from_millis(1)).await;
                if n >= 10_000 {
                    pacing.on_answer(ticket, None, None);
                    return None;
                }
                match answer(n) {
                    Some((headers, fault)) => {
                        refused.set(refused.get() + 1);
                        pacing.on_refused(ticket, headers, &fault);
                    }
                    None => pacing.on_answer(ticket, None, None),
                }
            }
        };
        let stops = futures::future::join_all((0..c).map(|_| sender())).await;
        (
            sent.get(),
            refused.get(),
            stops.into_iter().flatten().collect(),
        )
    }

    /// The most requests `c` senders make when every one is refused, until
    /// the stall timeout `t`: the window before the first refusal, then one
    /// at a time, the n-th once the floors 1..=n have passed (all within `t`).
    fn storm_bound(c: u64, t: Duration) -> u64 {
        let mut n = 0;
        let mut waited = Duration::ZERO;
        loop {
            let floor = (FIRST_BACKOFF * 2u32.pow(n)).min(MAX_BACKOFF);
            if waited + floor >= t {
                return c + u64::from(n);
            }
            waited += floor;
            n += 1;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_refuses_everything_gets_the_window_and_one_request_a_floor() {
        let stall = Duration::from_secs(10);
        assert_eq!(
            storm_bound(8, stall),
            14,
            "0.1 + ... + 3.2 = 6.3 s fit in 10 s"
        );
        // Headers that claim a whole quota on every 429, then Retry-After: 0
        // with and without them.
        let servers: [(Option<RateLimitHeaders>, Option<Duration>); 3] = [
            (Some(whole_quota()), None),
            (None, Some(Duration::ZERO)),
            (Some(whole_quota()), Some(Duration::ZERO)),
        ];
        for (refusal_headers, retry_after) in servers {
            let pacing = Pacing::new(stall);
            let start = Instant::now();
            let (sent, refused, stops) = senders(&pacing, 8, |_| {
                Some((refusal_headers, rate_limited(retry_after)))
            })
            .await;
            let case = format!(
                "headers {:?}, Retry-After {retry_after:?}",
                refusal_headers.is_some()
            );
            assert!(sent <= storm_bound(8, stall), "{case}: {sent} sent");
            assert_eq!(refused, sent, "{case}");
            assert_eq!(stops.len(), 8, "{case}: every sender stopped");
            assert!(
                stops
                    .iter()
                    .all(|s| matches!(s, QuotaStop::Stalled { seconds: 10, .. })),
                "{case}: {stops:?}"
            );
            assert!(
                start.elapsed() <= stall + MAX_STEP,
                "{case}: {:?}",
                start.elapsed()
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_refuses_every_other_request_gets_a_floor_after_each() {
        let pacing = Pacing::new(Duration::from_secs(600));
        let start = Instant::now();
        // 400 requests, every other one refused with Retry-After: 0 and a whole quota.
        let (sent, refused, stops) = senders(&pacing, 8, |n| {
            (n % 2 == 1 && n < 400)
                .then(|| (Some(whole_quota()), rate_limited(Some(Duration::ZERO))))
        })
        .await;
        assert!(stops.is_empty(), "{stops:?}");
        assert!(
            sent > 400 && refused == 200,
            "{sent} sent, {refused} refused"
        );
        // After a refusal nothing new goes for the floor: only the 8 in
        // flight can be refused before it ends, then one more alone, at the
        // floor or longer apart. So in `elapsed`, at most 9 refusals a floor.
        let floors = start.elapsed().as_secs_f64() / FIRST_BACKOFF.as_secs_f64();
        assert!(
            refused as f64 <= 9.0 * (floors + 1.0),
            "{refused} refusals in {:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_process_alone_sends_its_window_at_once_and_a_shard_probes_first() {
        let alone = Pacing::new(Duration::from_secs(600));
        let start = Instant::now();
        for _ in 0..8 {
            let _ = alone.admit(1).await.unwrap();
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "nothing said to wait");
        assert_eq!(alone.waited(), Duration::ZERO);

        let shard = Pacing::new(Duration::from_secs(600)).shared_by(4);
        let first = shard.admit(1).await.unwrap();
        let second = tokio::time::timeout(Duration::from_secs(1), shard.admit(1)).await;
        assert!(second.is_err(), "a shard waits for the first answer");
        shard.on_answer(first, None, None);
        let start = Instant::now();
        let _ = shard.admit(1).await.unwrap();
        assert!(start.elapsed() <= PROBE_STEP, "{:?}", start.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn headers_that_contradict_a_refusal_are_not_believed_until_a_success() {
        let pacing = Pacing::new(Duration::from_secs(600));
        let t = pacing.admit(1).await.unwrap();
        // Nothing left of 10 requests, whole again in 10 s.
        pacing.on_answer(t, Some(headers(Some((10.0, 0.0, 10_000)), None)), None);
        tokio::time::advance(Duration::from_secs(2)).await;
        let t = pacing.admit(1).await.unwrap();
        assert!(
            !pacing.on_refused(t, Some(whole_quota()), &rate_limited(None)),
            "a 429 whose headers say it fits is not described by them"
        );
        // The whole quota claimed is not taken in: one request a second still.
        let start = Instant::now();
        let t = pacing.admit(1).await.unwrap();
        assert!(start.elapsed() >= FIRST_BACKOFF, "{:?}", start.elapsed());
        pacing.on_answer(t, None, None);
        // Two more take two seconds: the budget and the pace of the
        // process's share (cut by the refusal) decide which of them waits.
        let start = Instant::now();
        let _ = pacing.admit(1).await.unwrap();
        let _ = pacing.admit(1).await.unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(1800),
            "the earlier headers still pace: {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn insufficient_quota_is_told_from_a_rate_limit() {
        assert!(!is_insufficient_quota("Rate limit reached"));
        assert!(is_insufficient_quota(
            "You exceeded your current quota, please check your plan and billing details. [insufficient_quota]"
        ));
        assert!(is_larger_than_quota(
            "Request too large for model on tokens per min (TPM): Limit 1000000, Requested 1200000"
        ));
        assert!(!is_larger_than_quota("Rate limit reached"));
    }
}
