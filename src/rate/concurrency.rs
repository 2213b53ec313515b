//! The requests in flight: a fixed most, or a limit found by listening to
//! round-trip times (`backend.concurrency = "auto"`).
//!
//! **Fixed** (a number): a window that starts at the number, halves on a
//! 429 or a timeout (a timeout also lowers its ceiling for good) and grows
//! back by one per window's worth of successes.
//!
//! **Auto**: vector's adaptive request concurrency (RTT-based AIMD), with
//! TCP Vegas's estimate of the queue. The limit starts at [`START`]. Every
//! window of `limit` answers, the requests this client keeps queued at the
//! server are estimated from how much longer the answers took (the mean
//! of the window: a quantile misses the queue when requests go in bursts,
//! as after slow start, where K of each round wait for nothing and the
//! rest a whole service time) than the
//! same-sized answers with no queue (Little's law: with `c` requests in
//! flight and RTTs `r` times the no-queue RTT on average, the server works
//! on `c / r` of them and `q = c (1 - 1/r)` wait; it works on one at least,
//! so `q ≤ c - 1`: the rest of a longer RTT is the client's own delay, which
//! fewer requests would not shorten, and a limit of 1 or 2 is never held
//! down by it). While `q` stays under half the
//! allowed queue, `max(1, TOLERANCE × c)`, the limit grows: doubling a
//! window until the first sign of a queue (slow start), then by
//! half the allowed queue (one at least), which keeps the queue within it;
//! after slow start, the window after a change counts only answers sent
//! under the new limit.
//! Doubling rather than more: a size class's baseline first seen behind the
//! client's own queue hides that queue, and a deeper first queue hid it in
//! the simulator's tests. Over the
//! allowed queue it is cut to the estimated capacity plus half the allowed
//! queue, by 10% at least and by half at most. A timeout, a 429 or a 503 halves the limit, and so
//! does an answer that took [`TIMEOUT_SHARE`] of the timeout, so that
//! queueing never takes a request to its timeout.
//!
//! Requests differ in size, so an RTT is compared with the no-queue RTT of
//! requests of about the same size: the least RTT per token seen in its
//! size class (an eighth of an octave of tokens wide, so that a fixed
//! per-request cost shifts the ratio by 9% at most), times its tokens. A
//! plain RTT per token would take a small request for a slow one whenever
//! the server has a fixed cost per request.
//!
//! The limit it settles on, for a server of `K` workers and a constant
//! service time, is at least `K` (below it no request waits, `q = 0`, so the
//! limit grows) and at most `max(K + 1, K / (1 - TOLERANCE))` (beyond it
//! `q = c - K` exceeds the allowed queue and the limit is cut).

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Decreases closer together than this count as one congestion event: the
/// requests in flight when the limit was hit all come back with 429 together.
const DECREASE_SPACING: Duration = Duration::from_millis(500);
/// The limit `auto` starts at: the first answer then comes with no queue
/// of this client's own, and is the baseline later ones are compared with
/// (and counts as an answer with none).
pub const START: usize = 1;
/// The queue `auto` allows at the server, as a share of the requests in flight.
pub const TOLERANCE: f64 = 0.25;
/// An answer that took this share of the timeout halves the limit.
pub const TIMEOUT_SHARE: f64 = 0.5;

/// The band `auto` settles in against a server of `workers` workers: at
/// least the workers (none idle), at most `max(K + 1, K / (1 - TOLERANCE))`
/// (the queue within the tolerance; see the module's docs).
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
pub fn band(workers: usize) -> std::ops::RangeInclusive<usize> {
    let high = (workers + 1).max((workers as f64 / (1.0 - TOLERANCE)).floor() as usize);
    workers..=high
}

/// No increase while an answer of the window took this share of the timeout.
const GROWTH_SHARE: f64 = 0.25;
/// Size classes per octave of tokens.
const CLASSES_PER_OCTAVE: f64 = 8.0;
const CLASSES: usize = 64 * 8;

/// How many requests may be in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// This many, lowered by refusals and timeouts.
    Fixed(usize),
    /// Found from round-trip times, up to `most`.
    Auto { most: usize },
}

/// What `auto` settled on, for the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Settled {
    /// The limit at the last decision.
    pub settled: usize,
    /// The lowest and highest limit after the first sign of a queue (or
    /// over the whole run, when none came).
    pub lowest: usize,
    pub highest: usize,
}

#[derive(Debug)]
pub struct Concurrency {
    max: usize,
    auto: bool,
    timeout: Option<Duration>,
    state: Mutex<State>,
    notify: Notify,
}

#[derive(Debug)]
struct State {
    window: f64,
    /// The most the window may grow to: `max`, until timeouts lower it (fixed).
    ceiling: usize,
    in_flight: usize,
    paused_until: Option<Instant>,
    last_decrease: Option<Instant>,
    vegas: Vegas,
}

/// A request's place in flight; dropping it frees the place.
#[derive(Debug)]
pub struct Permit<'a> {
    limiter: &'a Concurrency,
    tokens: u64,
    /// Requests in flight when it went, itself included.
    in_flight: usize,
    /// It took the last place the limit allowed.
    full: bool,
}

impl Permit<'_> {
    /// Whether no other request was in flight when this one went.
    pub fn alone(&self) -> bool {
        self.in_flight <= 1
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.limiter.lock().in_flight -= 1;
        self.limiter.notify.notify_waiters();
    }
}

/// One answer, as the controller learns from it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    sent_at: Instant,
    rtt: Duration,
    tokens: u64,
    in_flight: usize,
    /// It took the last place the limit allowed.
    full: bool,
}

/// The state of `auto` between answers.
#[derive(Debug)]
struct Vegas {
    slow_start: bool,
    /// The least RTT per token seen, in seconds, by size class.
    baseline: Vec<Option<f64>>,
    /// Answers to requests sent before this were sent under an older limit.
    changed_at: Option<Instant>,
    samples: usize,
    /// How much longer than with no queue each answer of the window took.
    ratios: Vec<f64>,
    in_flight: f64,
    /// A request of the window took the last place the limit allowed: the
    /// limit, not the client's supply of work, held the requests back.
    reached: bool,
    longest: Duration,
    settled: Option<Settled>,
    /// The range is kept from the first decision after slow start.
    ranging: bool,
}

/// What one window of answers decided.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Decision {
    Grow,
    Hold,
    Cut(f64),
}

fn size_class(tokens: u64) -> usize {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let class = ((tokens.max(1) as f64).log2() * CLASSES_PER_OCTAVE) as usize;
    class.min(CLASSES - 1)
}

impl Vegas {
    fn new() -> Vegas {
        Vegas {
            slow_start: true,
            baseline: vec![None; CLASSES],
            changed_at: None,
            samples: 0,
            ratios: Vec::new(),
            in_flight: 0.0,
            reached: false,
            longest: Duration::ZERO,
            settled: None,
            ranging: false,
        }
    }

    /// How much longer than with no queue `sample` took; `None` for the
    /// first of its size, which sets the baseline.
    #[allow(clippy::cast_precision_loss)]
    fn ratio(&mut self, sample: &Sample) -> Option<f64> {
        let tokens = sample.tokens.max(1) as f64;
        let per_token = sample.rtt.as_secs_f64() / tokens;
        let class = &mut self.baseline[size_class(sample.tokens)];
        let known = *class;
        *class = Some(known.map_or(per_token, |b| b.min(per_token)));
        // An answer sent alone met no queue of this client's own: it is its
        // size's baseline, and counts.
        let base = known.or((sample.in_flight <= 1).then_some(per_token))?;
        let base = base.min(per_token);
        (base > 0.0).then(|| per_token / base)
    }

    /// Takes in an answer; at the end of a window of `limit` answers, the decision.
    #[allow(clippy::cast_precision_loss)]
    fn sample(&mut self, sample: Sample, limit: f64) -> Option<Decision> {
        let ratio = self.ratio(&sample);
        if self.changed_at.is_some_and(|at| sample.sent_at < at) {
            return None;
        }
        let ratio = ratio?;
        self.samples += 1;
        self.ratios.push(ratio);
        self.in_flight += sample.in_flight as f64;
        self.reached |= sample.full;
        self.longest = self.longest.max(sample.rtt);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let window = (limit.floor() as usize).max(1);
        (self.samples >= window).then(|| self.decide(limit))
    }

    #[allow(clippy::cast_precision_loss)]
    fn decide(&mut self, limit: f64) -> Decision {
        let n = self.samples as f64;
        // Little's law holds for the mean: with c in flight and K workers
        // the RTTs average c/K service times however the answers are spread.
        // A quantile does not: when slow start or a cut sends the requests
        // in bursts, K of every round find a worker freed at that instant
        // and wait for nothing, the c - K others wait a whole service time;
        // the first quartile read no queue until c - K reached 3K/4.
        let ratio = (self.ratios.iter().sum::<f64>() / n).max(1.0);
        // A window the limit held back had the limit in flight throughout
        // (a closed loop); counted at each send, a burst counts those not
        // yet sent after it as not in flight.
        let in_flight = if self.reached {
            limit.floor()
        } else {
            self.in_flight / n
        };
        // A server working for this client serves at least one of its
        // requests while it holds any: RTTs of more than `c` no-queue RTTs
        // were stretched by something fewer requests would not shorten (the
        // client's own delays on a loaded machine), and at most `c - 1` wait.
        let capacity = (in_flight / ratio).max(1.0);
        let queue = in_flight - capacity;
        let allowed = (TOLERANCE * in_flight).max(1.0);
        let queued = queue >= allowed / 2.0;
        let decision = if queue > allowed {
            Decision::Cut((capacity + allowed / 2.0).clamp(limit * 0.5, limit * 0.9))
        } else if !queued && self.reached {
            Decision::Grow
        } else {
            Decision::Hold
        };
        if queued {
            self.slow_start = false;
        }

        self.samples = 0;
        self.ratios.clear();
        self.in_flight = 0.0;
        self.reached = false;
        decision
    }

    /// Notes the limit decided on, for the summary.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn record(&mut self, limit: f64) {
        let limit = limit.floor() as usize;
        let settled = match self.settled {
            // The climb of slow start and its overshoot are no part of the range.
            Some(s) if !self.slow_start && self.ranging => Settled {
                settled: limit,
                lowest: s.lowest.min(limit),
                highest: s.highest.max(limit),
            },
            _ => Settled {
                settled: limit,
                lowest: limit,
                highest: limit,
            },
        };
        self.ranging = !self.slow_start;
        self.settled = Some(settled);
    }
}

impl Concurrency {
    /// At most `limit`'s requests in flight; `timeout` is the client's, which
    /// `auto` keeps every answer well within.
    pub fn new(limit: Limit, timeout: Option<Duration>) -> Self {
        let (max, auto) = match limit {
            Limit::Fixed(max) => (max.max(1), false),
            Limit::Auto { most } => (most.max(1), true),
        };
        #[allow(clippy::cast_precision_loss)]
        let window = if auto { START.min(max) } else { max } as f64;
        let mut vegas = Vegas::new();
        if auto {
            vegas.record(window);
        }
        Concurrency {
            max,
            auto,
            timeout,
            state: Mutex::new(State {
                window,
                ceiling: max,
                in_flight: 0,
                paused_until: None,
                last_decrease: None,
                vegas,
            }),
            notify: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked: every update is a single step.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for a place for a request of `tokens` and for any pause to pass.
    pub async fn acquire(&self, tokens: u64) -> Permit<'_> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let pause = {
                let mut state = self.lock();
                let now = Instant::now();
                match state.paused_until {
                    Some(until) if until > now => Some(until),
                    _ => {
                        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                        let window = (state.window.floor() as usize).max(1);
                        if state.in_flight < window {
                            state.in_flight += 1;
                            return Permit {
                                limiter: self,
                                tokens,
                                in_flight: state.in_flight,
                                full: state.in_flight >= window,
                            };
                        }
                        None
                    }
                }
            };
            match pause {
                Some(until) => tokio::time::sleep_until(until).await,
                None => notified.await,
            }
        }
    }

    /// An answer to the request of `permit`, sent at `sent_at`.
    pub fn on_answer(&self, permit: &Permit<'_>, sent_at: Instant) {
        let now = Instant::now();
        let sample = Sample {
            sent_at,
            rtt: now.saturating_duration_since(sent_at),
            tokens: permit.tokens,
            in_flight: permit.in_flight,
            full: permit.full,
        };
        self.on_sample(sample, now);
    }

    fn on_sample(&self, sample: Sample, now: Instant) {
        let mut state = self.lock();
        if !self.auto {
            let grown = state.window + 1.0 / state.window;
            state.window = grown.min(state.ceiling as f64);
        } else if self
            .timeout
            .is_some_and(|t| sample.rtt.as_secs_f64() >= t.as_secs_f64() * TIMEOUT_SHARE)
            && state.vegas.changed_at.is_none_or(|at| sample.sent_at >= at)
        {
            // Close to the timeout: cut hard, before any request reaches it.
            let to = state.window * 0.5;
            self.cut(&mut state, now, to);
        } else {
            let limit = state.window;
            match state.vegas.sample(sample, limit) {
                None | Some(Decision::Hold) => {}
                Some(Decision::Grow) => {
                    let near_timeout = self.timeout.is_some_and(|t| {
                        state.vegas.longest.as_secs_f64() >= t.as_secs_f64() * GROWTH_SHARE
                    });
                    if !near_timeout {
                        // Half the allowed queue at a time: the queue, under
                        // half of it before, stays within it after.
                        let grown = if state.vegas.slow_start {
                            limit * 2.0
                        } else {
                            limit + (TOLERANCE * limit / 2.0).floor().max(1.0)
                        };
                        state.window = grown.min(self.max as f64);
                        if !state.vegas.slow_start {
                            // The next window judges the grown limit alone:
                            // answers sent under the last one met less queue.
                            state.vegas.changed_at = Some(now);
                        }
                    }
                    let window = state.window;
                    state.vegas.record(window);
                }
                Some(Decision::Cut(to)) => self.cut(&mut state, now, to),
            }
            if state.vegas.samples == 0 {
                state.vegas.longest = Duration::ZERO;
            }
        }
        drop(state);
        self.notify.notify_waiters();
    }

    /// Lowers `auto`'s limit to `to`; answers to requests sent before now
    /// no longer count.
    fn cut(&self, state: &mut State, now: Instant, to: f64) {
        state.window = to.floor().max(1.0);
        state.last_decrease = Some(now);
        let vegas = &mut state.vegas;
        vegas.slow_start = false;
        vegas.changed_at = Some(now);
        vegas.samples = 0;
        vegas.ratios.clear();
        vegas.in_flight = 0.0;
        vegas.reached = false;
        vegas.longest = Duration::ZERO;
        let window = state.window;
        state.vegas.record(window);
    }

    fn recently_decreased(state: &State, now: Instant) -> bool {
        state
            .last_decrease
            .is_some_and(|at| now.duration_since(at) < DECREASE_SPACING)
    }

    /// A 429 or a 503: the server sheds load. Halve the window and pause
    /// everyone for the delay asked for.
    pub fn on_throttled(&self, retry_after: Option<Duration>) {
        let mut state = self.lock();
        let now = Instant::now();
        if !Self::recently_decreased(&state, now) {
            if self.auto {
                let to = state.window * 0.5;
                self.cut(&mut state, now, to);
            } else {
                state.window = (state.window / 2.0).max(1.0);
                state.last_decrease = Some(now);
            }
        }
        if let Some(until) = retry_after.and_then(|delay| now.checked_add(delay)) {
            state.paused_until = Some(state.paused_until.map_or(until, |p| p.max(until)));
        }
    }

    /// A request timed out: the server is slower than the client waits, so
    /// fewer requests go in flight; a fixed window for the rest of the run.
    /// Timeouts close together count once, as 429s do.
    pub fn on_timeout(&self) {
        let mut state = self.lock();
        let now = Instant::now();
        if Self::recently_decreased(&state, now) {
            return;
        }
        let lowered = (state.window / 2.0).floor().max(1.0);
        if self.auto {
            self.cut(&mut state, now, lowered);
            return;
        }
        state.window = lowered;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ceiling = lowered as usize;
        state.ceiling = state.ceiling.min(ceiling);
        state.last_decrease = Some(now);
    }

    /// The requests in flight allowed, when timeouts lowered a fixed
    /// window below the configured most.
    pub fn lowered(&self) -> Option<usize> {
        let ceiling = self.lock().ceiling;
        (ceiling < self.max).then_some(ceiling)
    }

    /// What `auto` settled on; `None` for a fixed limit.
    pub fn settled(&self) -> Option<Settled> {
        if !self.auto {
            return None;
        }
        self.lock().vegas.settled
    }

    /// The current window, in requests.
    #[cfg(test)]
    fn limit(&self) -> usize {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let limit = self.lock().window.floor() as usize;
        limit
    }

    #[cfg(test)]
    fn window(&self) -> f64 {
        self.lock().window
    }

    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.lock().in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    /// What a server may do with one request: answer after a delay (of any
    /// length, for a request of any size), shed it (429/503, with or without
    /// a delay asked for), or hold it past the client's timeout.
    #[derive(Debug, Clone, Copy)]
    enum Event {
        Answer { after_ms: u64, tokens: u64 },
        Shed { retry_after_ms: Option<u64> },
        Timeout { after_ms: u64 },
    }

    fn event() -> impl Strategy<Value = Event> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u64..200_000, prop_oneof![Just(0u64), Just(u64::MAX), 0u64..100_000])
                .prop_map(|(after_ms, tokens)| Event::Answer { after_ms, tokens }),
            1 => proptest::option::of(0u64..120_000)
                .prop_map(|retry_after_ms| Event::Shed { retry_after_ms }),
            1 => (0u64..120_000).prop_map(|after_ms| Event::Timeout { after_ms }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

        /// However a server answers, sheds and stalls (or answers every
        /// request alike), `auto` (and a fixed window) keeps its limit
        /// between 1 and the configured most, and
        /// every request gets a place: each waits at most for the requests
        /// ahead of it in flight and the pauses asked for, so the script
        /// ends within the sum of every delay (paused time).
        #[test]
        fn no_server_behaviour_takes_the_limit_out_of_its_range_or_stops_the_requests(
            events in proptest::prop_oneof![
                proptest::collection::vec(event(), 1..60),
                // A steady server, which `auto` grows on up to the most.
                (1u64..500, 20usize..200)
                    .prop_map(|(after_ms, n)| vec![Event::Answer { after_ms, tokens: 100 }; n]),
            ],
            most in 1usize..=64,
            auto in proptest::bool::ANY,
            workers in 1usize..=8,
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            let limit = if auto { Limit::Auto { most } } else { Limit::Fixed(most) };
            let throttle = Concurrency::new(limit, Some(Duration::from_secs(60)));
            let bound: u64 = events
                .iter()
                .map(|e| match *e {
                    Event::Answer { after_ms, .. } | Event::Timeout { after_ms } => after_ms,
                    Event::Shed { retry_after_ms } => retry_after_ms.unwrap_or(0),
                })
                .sum();
            let next = std::sync::atomic::AtomicUsize::new(0);
            let in_range = std::sync::atomic::AtomicBool::new(true);
            let took = runtime.block_on(async {
                let started = Instant::now();
                let worker = || async {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let Some(event) = events.get(i).copied() else { break };
                        let tokens = match event {
                            Event::Answer { tokens, .. } => tokens,
                            _ => 100,
                        };
                        let permit = throttle.acquire(tokens).await;
                        let sent_at = Instant::now();
                        match event {
                            Event::Answer { after_ms, .. } => {
                                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                                throttle.on_answer(&permit, sent_at);
                            }
                            Event::Shed { retry_after_ms } => {
                                throttle.on_throttled(retry_after_ms.map(Duration::from_millis));
                            }
                            Event::Timeout { after_ms } => {
                                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                                throttle.on_timeout();
                            }
                        }
                        drop(permit);
                        let limit = throttle.limit();
                        if limit < 1 || limit > most {
                            in_range.store(false, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                };
                futures::future::join_all((0..workers).map(|_| worker())).await;
                Instant::now().saturating_duration_since(started)
            });
            proptest::prop_assert!(in_range.load(std::sync::atomic::Ordering::SeqCst));
            if let Some(settled) = throttle.settled() {
                proptest::prop_assert!(settled.lowest >= 1 && settled.highest <= most, "{settled:?}");
            }
            proptest::prop_assert!(took <= Duration::from_millis(bound), "{took:?} for {bound} ms of delays");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_caps_requests_in_flight() {
        let throttle = Concurrency::new(Limit::Fixed(2), None);
        let a = throttle.acquire(1).await;
        let _b = throttle.acquire(1).await;
        assert_eq!(throttle.in_flight(), 2);
        let third = tokio::time::timeout(Duration::from_secs(1), throttle.acquire(1)).await;
        assert!(third.is_err(), "a third request must wait");
        drop(a);
        let _c = tokio::time::timeout(Duration::from_secs(1), throttle.acquire(1))
            .await
            .expect("a freed place is handed on");
    }

    fn success(throttle: &Concurrency) {
        let permit = Permit {
            limiter: throttle,
            tokens: 1,
            in_flight: 1,
            full: true,
        };
        throttle.lock().in_flight += 1;
        throttle.on_answer(&permit, Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_halves_once_per_event_and_success_climbs_back() {
        let throttle = Concurrency::new(Limit::Fixed(16), None);
        throttle.on_throttled(None);
        throttle.on_throttled(None);
        assert_eq!(throttle.window(), 8.0, "two 429s together are one event");
        tokio::time::advance(DECREASE_SPACING).await;
        throttle.on_throttled(None);
        assert_eq!(throttle.window(), 4.0);
        for _ in 0..100 {
            success(&throttle);
        }
        assert!(throttle.window() > 12.0, "window {}", throttle.window());
        for _ in 0..10_000 {
            success(&throttle);
        }
        assert_eq!(
            throttle.window(),
            16.0,
            "never above the configured concurrency"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_pauses_every_sender() {
        let throttle = Concurrency::new(Limit::Fixed(4), None);
        let start = Instant::now();
        throttle.on_throttled(Some(Duration::from_secs(3)));
        let _permit = throttle.acquire(1).await;
        assert!(start.elapsed() >= Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_lowers_the_ceiling_for_good() {
        let throttle = Concurrency::new(Limit::Fixed(8), None);
        assert_eq!(throttle.lowered(), None);
        throttle.on_timeout();
        throttle.on_timeout();
        assert_eq!(throttle.window(), 4.0, "timeouts together are one event");
        assert_eq!(throttle.lowered(), Some(4));
        for _ in 0..1000 {
            success(&throttle);
        }
        assert_eq!(throttle.window(), 4.0, "successes do not climb past it");
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_never_drops_below_one() {
        let throttle = Concurrency::new(Limit::Fixed(4), None);
        for _ in 0..10 {
            tokio::time::advance(DECREASE_SPACING).await;
            throttle.on_throttled(None);
        }
        assert_eq!(throttle.window(), 1.0);
        let _permit = throttle.acquire(1).await;
    }

    /// A server of `workers` that takes `service` per request of `tokens`,
    /// answering `limit` requests in flight as a closed loop does: with `c`
    /// in flight, each answer takes `service × max(1, c / workers)`.
    struct Server {
        workers: f64,
        service: Duration,
        /// Added to every answer by the client itself, whatever is in flight.
        delay: Duration,
        clock: Instant,
    }

    impl Server {
        fn new(workers: usize, service: Duration) -> Server {
            Server {
                #[allow(clippy::cast_precision_loss)]
                workers: workers as f64,
                service,
                delay: Duration::ZERO,
                clock: Instant::now(),
            }
        }

        /// Answers one window of the controller's limit, as many as it allows.
        #[allow(clippy::cast_precision_loss)]
        fn round(&mut self, control: &Concurrency, tokens: u64) {
            let c = control.limit();
            let rtt = self.service.mul_f64((c as f64 / self.workers).max(1.0)) + self.delay;
            let sent_at = self.clock;
            self.clock += rtt;
            for _ in 0..c {
                let sample = Sample {
                    sent_at,
                    rtt,
                    tokens,
                    in_flight: c,
                    full: true,
                };
                control.on_sample(sample, self.clock);
            }
        }
    }

    /// A closed loop against a server of `workers` that serves requests in
    /// order of arrival, `service` each: a request goes whenever the
    /// controller lets it, through [`Concurrency::acquire`] as in a run.
    /// The answers within `until`, and the limit each time it changed.
    async fn closed_loop(
        control: &Concurrency,
        workers: usize,
        service: Duration,
        until: Duration,
    ) -> (usize, Vec<(Duration, usize)>) {
        let start = Instant::now();
        let mut free_at = vec![start; workers];
        let mut flight: Vec<(Instant, Instant, Permit<'_>)> = Vec::new();
        let mut limits = vec![(Duration::ZERO, control.limit())];
        let mut answered = 0;
        loop {
            while control.in_flight() < control.limit() {
                let permit = control.acquire(500).await;
                let now = Instant::now();
                let worker = (0..workers).min_by_key(|&w| free_at[w]).unwrap();
                let done = free_at[worker].max(now) + service;
                free_at[worker] = done;
                flight.push((done, now, permit));
            }
            let next = (0..flight.len()).min_by_key(|&i| flight[i].0).unwrap();
            let (done, sent_at, permit) = flight.swap_remove(next);
            if done > start + until {
                return (answered, limits);
            }
            tokio::time::advance(done.saturating_duration_since(Instant::now())).await;
            control.on_answer(&permit, sent_at);
            drop(permit);
            answered += 1;
            if limits.last().is_some_and(|&(_, l)| l != control.limit()) {
                limits.push((done - start, control.limit()));
            }
        }
    }

    /// `ceil(log2 workers)`: the round trips slow start takes to reach the
    /// workers when every answer is far from the timeout.
    fn doublings(workers: usize) -> u32 {
        workers.next_power_of_two().trailing_zeros()
    }

    #[tokio::test(start_paused = true)]
    async fn slow_start_reaches_the_workers_in_log2_round_trips() {
        // The first answer, alone, counts; then every window of answers
        // comes back one round trip after the limit doubled: after n round
        // trips the limit is 2^n.
        let service = Duration::from_millis(50);
        for workers in [4, 32, 100] {
            let control = auto(1024);
            let (_, limits) = closed_loop(&control, workers, service, service * 20).await;
            let reached = limits.iter().find(|&&(_, l)| l >= workers).unwrap().0;
            assert!(
                reached <= service * doublings(workers),
                "{workers} workers reached at {reached:?}: {limits:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn auto_does_the_work_of_the_best_fixed_limit_but_for_slow_start() {
        // A fixed limit of 2K keeps every worker busy from the first
        // request. `auto` loses the work of slow start and none after it:
        // it never cuts below the estimated workers, and every limit of K
        // or more keeps them busy. Doubling from 1 each round trip, the
        // first n = log2 K round trips do 2^n - 1 = K - 1 requests where the
        // fixed limit does n K: K (n - 1) + 1 lost.
        let service = Duration::from_millis(50);
        let run = service * 60;
        for workers in [1, 4, 32] {
            let control = auto(64);
            let (answered, limits) = closed_loop(&control, workers, service, run).await;
            let fixed = Concurrency::new(Limit::Fixed(2 * workers), Some(Duration::from_secs(60)));
            let (best, _) = closed_loop(&fixed, workers, service, run).await;
            assert_eq!(best, 60 * workers);
            let n = doublings(workers) as usize;
            let lost = (workers * n + 1).saturating_sub(workers);
            assert!(
                answered + lost >= best,
                "{workers} workers: {answered} answers against {best}: {limits:?}"
            );
        }
    }

    fn auto(most: usize) -> Concurrency {
        Concurrency::new(Limit::Auto { most }, Some(Duration::from_secs(60)))
    }

    #[tokio::test(start_paused = true)]
    async fn auto_starts_low_and_settles_between_the_workers_and_the_allowed_queue() {
        for workers in [1, 4, 32, 100] {
            let control = auto(1024);
            assert_eq!(control.limit(), START);
            let mut server = Server::new(workers, Duration::from_millis(20));
            for _ in 0..200 {
                server.round(&control, 500);
            }
            let limit = control.limit();
            assert!(
                band(workers).contains(&limit),
                "{workers} workers: settled at {limit}, not in {:?}",
                band(workers)
            );
            let settled = control.settled().unwrap();
            assert_eq!(settled.settled, limit);
            assert!(settled.lowest <= limit && limit <= settled.highest);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn auto_settles_in_the_band_when_requests_go_in_bursts() {
        // Slow start sends each window at once, and a server of fixed
        // service time keeps the bursts together: per round, K answers met a
        // worker freed that instant and c - K waited a whole service time.
        for workers in [4, 32] {
            let control = auto(1024);
            let service = Duration::from_millis(20);
            let (_, limits) = closed_loop(&control, workers, service, service * 200).await;
            let limit = control.limit();
            assert!(
                band(workers).contains(&limit),
                "{workers} workers: settled at {limit}, not in {:?}: {limits:?}",
                band(workers)
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn auto_holds_while_the_rtt_stays_at_its_baseline_below_the_ceiling() {
        let control = auto(6);
        let mut server = Server::new(1000, Duration::from_millis(20));
        for _ in 0..50 {
            server.round(&control, 500);
        }
        assert_eq!(control.limit(), 6, "grows up to the ceiling, never past it");
    }

    #[tokio::test(start_paused = true)]
    async fn auto_follows_a_server_that_loses_half_its_workers() {
        let control = auto(1024);
        let mut server = Server::new(32, Duration::from_millis(20));
        for _ in 0..100 {
            server.round(&control, 500);
        }
        let before = control.limit();
        server.workers = 16.0;
        // One window shows the queue, the next cuts: a few more settle.
        for _ in 0..10 {
            server.round(&control, 500);
        }
        let after = control.limit();
        assert!(after < before, "{before} -> {after}");
        assert!(band(16).contains(&after), "{after} not in {:?}", band(16));
        let settled = control.settled().unwrap();
        assert_eq!(settled.lowest, after, "{settled:?}");
        assert!(band(32).contains(&settled.highest), "{settled:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_clients_own_delays_never_hold_the_limit_at_one() {
        // 4 workers of 20 ms: slow start ends at 8 (r = 2, 4 queued) and
        // cuts to 4 + 1 = 5. Then the client takes 30 ms more to read every
        // answer (a loaded machine). At 5, r = 55/20 and 3.2 read as queued:
        // cut to 5/r + 5/8 = 2.4, by half at most, so 2. At 2, r = 2.5 > c: a
        // server serving at least one of 2 keeps at most 1 waiting, the
        // allowed queue, so no cut; taking all of the delay for queue read
        // 2 (1 - 1/2.5) = 1.2 and cut to 1.
        let control = auto(1024);
        let mut server = Server::new(4, Duration::from_millis(20));
        for _ in 0..20 {
            server.round(&control, 500);
        }
        assert_eq!(control.limit(), 5);
        server.delay = Duration::from_millis(30);
        for _ in 0..50 {
            server.round(&control, 500);
        }
        assert_eq!(control.limit(), 2);
        // A timeout halves it to 1, where an answer sent alone met no
        // queue of the client's own whatever it took: it grows back to 2
        // (taking the delay for queue read 1 - 1/2.5 = 0.6, and held).
        tokio::time::advance(server.clock - Instant::now() + DECREASE_SPACING).await;
        server.clock = Instant::now();
        control.on_timeout();
        assert_eq!(control.limit(), 1);
        for _ in 0..10 {
            server.round(&control, 500);
        }
        assert_eq!(control.limit(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn rtts_are_compared_with_requests_of_the_same_size() {
        // A server with a fixed cost per request of 10 ms plus 1 ms per 100
        // tokens and room for everyone: small and large requests mixed take
        // very different times per token, and none of it is queueing.
        let control = auto(16);
        let mut clock = Instant::now();
        for round in 0..100u64 {
            let c = control.limit();
            for i in 0..c {
                let tokens = if (round + i as u64).is_multiple_of(2) {
                    50
                } else {
                    5000
                };
                let rtt = Duration::from_millis(10 + tokens / 100);
                control.on_sample(
                    Sample {
                        sent_at: clock,
                        rtt,
                        tokens,
                        in_flight: c,
                        full: true,
                    },
                    clock + rtt,
                );
            }
            clock += Duration::from_millis(60);
        }
        assert_eq!(control.limit(), 16, "no queue is taken for one");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_near_the_timeout_halves_the_limit_at_once() {
        let control = Concurrency::new(Limit::Auto { most: 64 }, Some(Duration::from_secs(10)));
        let mut server = Server::new(1000, Duration::from_millis(20));
        for _ in 0..10 {
            server.round(&control, 500);
        }
        assert_eq!(control.limit(), 64);
        let now = server.clock;
        let slow = Sample {
            sent_at: now,
            rtt: Duration::from_secs(5),
            tokens: 500,
            in_flight: 64,
            full: true,
        };
        control.on_sample(slow, now + Duration::from_secs(5));
        assert_eq!(control.limit(), 32);
        // Answers to requests sent before the cut do not cut again.
        control.on_sample(slow, now + Duration::from_secs(5));
        assert_eq!(control.limit(), 32);
    }

    #[tokio::test(start_paused = true)]
    async fn auto_halves_on_timeouts_and_shedding_and_grows_back() {
        let control = auto(64);
        let mut server = Server::new(1000, Duration::from_millis(20));
        for _ in 0..10 {
            server.round(&control, 500);
        }
        assert_eq!(control.limit(), 64);
        control.on_timeout();
        control.on_timeout();
        assert_eq!(control.limit(), 32, "timeouts together are one event");
        tokio::time::advance(DECREASE_SPACING).await;
        control.on_throttled(None);
        assert_eq!(control.limit(), 16);
        assert_eq!(control.lowered(), None, "auto has no ceiling to lower");
        // Answers sent after the cut count again.
        server.clock = Instant::now();
        for _ in 0..100 {
            server.round(&control, 500);
        }
        assert_eq!(control.limit(), 64, "grows back window by window");
    }
}
