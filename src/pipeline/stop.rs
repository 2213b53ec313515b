//! Stopping a run before its end: on a signal, at a time limit, or before a
//! request would take it over its budget. A stopped run keeps what it paid
//! for (in the checkpoint) and exits 4; the next run carries on.

use std::time::Duration;

use tokio::sync::watch;

use crate::types::Usage;

/// Asks a running job to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopRequest {
    Running,
    /// Send nothing more, wait for the requests in flight, commit, exit 4.
    Graceful(String),
    /// As `Graceful`, without waiting for the requests in flight.
    Now(String),
}

/// What the run should do next about stopping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stopping {
    /// Stop sending; wait for the requests in flight until the deadline.
    Drain(String),
    /// Stop at once.
    Now(String),
}

/// The ways a run is told to stop: stop requests (signals) and a time limit.
pub(super) struct Stops {
    requests: Option<watch::Receiver<StopRequest>>,
    deadline: Option<tokio::time::Instant>,
    max_duration: Option<Duration>,
    deadline_passed: bool,
}

impl Stops {
    pub(super) fn new(
        requests: Option<watch::Receiver<StopRequest>>,
        started: std::time::Instant,
        max_duration: Option<Duration>,
    ) -> Stops {
        Stops {
            requests,
            deadline: max_duration
                .and_then(|d| tokio::time::Instant::from_std(started).checked_add(d)),
            max_duration,
            deadline_passed: false,
        }
    }

    /// Waits until the run is asked to stop. Pending forever if it never is.
    pub(super) async fn next(&mut self) -> Stopping {
        loop {
            let request = async {
                match self.requests.as_mut() {
                    Some(rx) => {
                        if rx.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            let time_limit = async {
                match self.deadline {
                    Some(at) if !self.deadline_passed => tokio::time::sleep_until(at).await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                () = request => {
                    let request = self.requests.as_ref().map(|rx| rx.borrow().clone());
                    match request {
                        Some(StopRequest::Graceful(reason)) => return Stopping::Drain(reason),
                        Some(StopRequest::Now(reason)) => return Stopping::Now(reason),
                        _ => {}
                    }
                }
                () = time_limit => {
                    self.deadline_passed = true;
                    return Stopping::Drain(format!(
                        "the time limit of {:.0}s was reached",
                        self.max_duration.unwrap_or_default().as_secs_f64()
                    ));
                }
            }
        }
    }
}

/// `budget.max_cost`: a request is sent only if what was billed, what is in
/// flight (by local token count) and the request itself stay within it.
pub(super) struct Budget {
    max_cost: f64,
    price_per_token: f64,
    state: std::sync::Mutex<BudgetState>,
}

#[derive(Default)]
struct BudgetState {
    billed_tokens: u64,
    in_flight_tokens: u64,
    exceeded: Option<String>,
}

impl Budget {
    pub(super) fn new(max_cost: f64, price_per_token: f64) -> Budget {
        Budget {
            max_cost,
            price_per_token,
            state: std::sync::Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reserves a request of `tokens`, unless it would take the run over budget.
    pub(super) fn admit(&self, tokens: u64) -> bool {
        let mut state = self.state();
        let spent = state.billed_tokens as f64 * self.price_per_token;
        let projected = state
            .billed_tokens
            .saturating_add(state.in_flight_tokens)
            .saturating_add(tokens) as f64
            * self.price_per_token;
        if projected > self.max_cost {
            state.exceeded.get_or_insert_with(|| {
                format!(
                    "stopped at the budget of {}: {spent:.6} billed, the next request would bring it to {projected:.6}",
                    self.max_cost
                )
            });
            return false;
        }
        state.in_flight_tokens = state.in_flight_tokens.saturating_add(tokens);
        true
    }

    /// Replaces a finished request's reservation (`reserved` tokens) with
    /// what it was billed.
    pub(super) fn settle(&self, reserved: u64, billed: Usage) {
        let mut state = self.state();
        state.in_flight_tokens = state.in_flight_tokens.saturating_sub(reserved);
        state.billed_tokens = state.billed_tokens.saturating_add(billed.prompt_tokens);
    }

    /// Why the budget stopped the run, once it did.
    pub(super) fn exceeded(&self) -> Option<String> {
        self.state().exceeded.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_admits_requests_until_the_next_would_go_over() {
        // 1 per 1000 tokens: a budget of 0.01 is 10 tokens.
        let budget = Budget::new(0.01, 0.001);
        assert!(budget.admit(4));
        assert!(budget.admit(4));
        assert!(!budget.admit(4), "4 + 4 + 4 in flight would be 12 tokens");
        assert!(budget.exceeded().unwrap().contains("budget of 0.01"));
        assert!(budget.admit(2), "a smaller request still fits");
    }

    #[tokio::test(start_paused = true)]
    async fn a_time_limit_asks_to_drain_and_a_second_signal_to_stop_now() {
        let (tx, rx) = watch::channel(StopRequest::Running);
        let mut stops = Stops::new(
            Some(rx),
            std::time::Instant::now(),
            Some(Duration::from_secs(30)),
        );
        let drain = stops.next().await;
        assert_eq!(
            drain,
            Stopping::Drain("the time limit of 30s was reached".into())
        );
        tx.send(StopRequest::Now("stopped by SIGTERM".into()))
            .unwrap();
        assert_eq!(
            stops.next().await,
            Stopping::Now("stopped by SIGTERM".into())
        );
    }
}
