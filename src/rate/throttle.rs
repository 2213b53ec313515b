//! Adaptive control of requests in flight.
//!
//! A window of allowed requests in flight grows by one per window's worth of
//! successes and halves on a 429 (additive increase, multiplicative
//! decrease), and a 429's `Retry-After` pauses every sender, not only the one
//! that got it. A run that starts faster than the service allows therefore
//! settles just under the limit instead of hammering it.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Decreases closer together than this count as one congestion event: the
/// requests in flight when the limit was hit all come back with 429 together.
const DECREASE_SPACING: Duration = Duration::from_millis(500);

#[derive(Debug)]
pub struct Throttle {
    max: usize,
    state: Mutex<State>,
    notify: Notify,
}

#[derive(Debug)]
struct State {
    window: f64,
    /// The most the window may grow to: `max`, until timeouts lower it.
    ceiling: usize,
    in_flight: usize,
    paused_until: Option<Instant>,
    last_decrease: Option<Instant>,
}

/// A request's place in flight; dropping it frees the place.
#[derive(Debug)]
pub struct Permit<'a> {
    throttle: &'a Throttle,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.throttle.lock().in_flight -= 1;
        self.throttle.notify.notify_waiters();
    }
}

impl Throttle {
    /// At most `max` requests in flight; the window starts there.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Throttle {
            max,
            state: Mutex::new(State {
                window: max as f64,
                ceiling: max,
                in_flight: 0,
                paused_until: None,
                last_decrease: None,
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

    /// Waits for a place in the window and for any pause to pass.
    pub async fn acquire(&self) -> Permit<'_> {
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
                        if state.in_flight < state.window.floor() as usize {
                            state.in_flight += 1;
                            return Permit { throttle: self };
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

    pub fn on_success(&self) {
        let mut state = self.lock();
        let grown = state.window + 1.0 / state.window;
        state.window = grown.min(state.ceiling as f64);
        drop(state);
        self.notify.notify_waiters();
    }

    /// A 429: shrink the window and pause everyone for the delay asked for.
    pub fn on_throttled(&self, retry_after: Option<Duration>) {
        let mut state = self.lock();
        let now = Instant::now();
        let recent = state
            .last_decrease
            .is_some_and(|at| now.duration_since(at) < DECREASE_SPACING);
        if !recent {
            state.window = (state.window / 2.0).max(1.0);
            state.last_decrease = Some(now);
        }
        if let Some(until) = retry_after.and_then(|delay| now.checked_add(delay)) {
            state.paused_until = Some(state.paused_until.map_or(until, |p| p.max(until)));
        }
    }

    /// A request timed out: the server is slower than the client waits, so
    /// fewer requests go in flight, for the rest of the run. Timeouts close
    /// together count once, as 429s do.
    pub fn on_timeout(&self) {
        let mut state = self.lock();
        let now = Instant::now();
        let recent = state
            .last_decrease
            .is_some_and(|at| now.duration_since(at) < DECREASE_SPACING);
        if !recent {
            let lowered = (state.window / 2.0).floor().max(1.0);
            state.window = lowered;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let ceiling = lowered as usize;
            state.ceiling = state.ceiling.min(ceiling);
            state.last_decrease = Some(now);
        }
    }

    /// The requests in flight allowed, when timeouts lowered it below the configured most.
    pub fn lowered(&self) -> Option<usize> {
        let ceiling = self.lock().ceiling;
        (ceiling < self.max).then_some(ceiling)
    }

    /// The current window, in requests.
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

    #[tokio::test(start_paused = true)]
    async fn the_window_caps_requests_in_flight() {
        let throttle = Throttle::new(2);
        let a = throttle.acquire().await;
        let _b = throttle.acquire().await;
        assert_eq!(throttle.in_flight(), 2);
        let third = tokio::time::timeout(Duration::from_secs(1), throttle.acquire()).await;
        assert!(third.is_err(), "a third request must wait");
        drop(a);
        let _c = tokio::time::timeout(Duration::from_secs(1), throttle.acquire())
            .await
            .expect("a freed place is handed on");
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_halves_once_per_event_and_success_climbs_back() {
        let throttle = Throttle::new(16);
        throttle.on_throttled(None);
        throttle.on_throttled(None);
        assert_eq!(throttle.window(), 8.0, "two 429s together are one event");
        tokio::time::advance(DECREASE_SPACING).await;
        throttle.on_throttled(None);
        assert_eq!(throttle.window(), 4.0);
        for _ in 0..100 {
            throttle.on_success();
        }
        assert!(throttle.window() > 12.0, "window {}", throttle.window());
        for _ in 0..10_000 {
            throttle.on_success();
        }
        assert_eq!(
            throttle.window(),
            16.0,
            "never above the configured concurrency"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_pauses_every_sender() {
        let throttle = Throttle::new(4);
        let start = Instant::now();
        throttle.on_throttled(Some(Duration::from_secs(3)));
        let _permit = throttle.acquire().await;
        assert!(start.elapsed() >= Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_lowers_the_ceiling_for_good() {
        let throttle = Throttle::new(8);
        assert_eq!(throttle.lowered(), None);
        throttle.on_timeout();
        throttle.on_timeout();
        assert_eq!(throttle.window(), 4.0, "timeouts together are one event");
        assert_eq!(throttle.lowered(), Some(4));
        for _ in 0..1000 {
            throttle.on_success();
        }
        assert_eq!(throttle.window(), 4.0, "successes do not climb past it");
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_never_drops_below_one() {
        let throttle = Throttle::new(4);
        for _ in 0..10 {
            tokio::time::advance(DECREASE_SPACING).await;
            throttle.on_throttled(None);
        }
        assert_eq!(throttle.window(), 1.0);
        let _permit = throttle.acquire().await;
    }
}
