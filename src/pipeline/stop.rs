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
/// flight (by local token count, as input) and the request itself stay
/// within it.
pub(super) struct Budget {
    max_cost: f64,
    prices: Prices,
    state: std::sync::Mutex<BudgetState>,
}

/// The model's prices per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Prices {
    pub input: f64,
    pub output: f64,
}

#[derive(Default)]
struct BudgetState {
    billed: Usage,
    in_flight_tokens: u64,
    exceeded: Option<String>,
}

impl Budget {
    pub(super) fn new(max_cost: f64, prices: Prices) -> Budget {
        Budget {
            max_cost,
            prices,
            state: std::sync::Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What `input` and `output` tokens cost.
    #[allow(clippy::cast_precision_loss)]
    fn cost(&self, input: u64, output: u64) -> f64 {
        input as f64 * self.prices.input + output as f64 * self.prices.output
    }

    /// Reserves a request of `tokens`, unless it would take the run over budget.
    pub(super) fn admit(&self, tokens: u64) -> bool {
        let mut state = self.state();
        let output = state.billed.completion_tokens;
        let spent = self.cost(state.billed.prompt_tokens, output);
        let input = state
            .billed
            .prompt_tokens
            .saturating_add(state.in_flight_tokens)
            .saturating_add(tokens);
        let projected = self.cost(input, output);
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

    /// Replaces a finished request's reservation of `reserved` tokens with
    /// what it was `billed`.
    pub(super) fn settle(&self, reserved: u64, billed: Usage) {
        let mut state = self.state();
        state.in_flight_tokens = state.in_flight_tokens.saturating_sub(reserved);
        state.billed += billed;
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
        let budget = Budget::new(
            0.01,
            Prices {
                input: 0.001,
                output: 0.002,
            },
        );
        assert!(budget.admit(4));
        assert!(budget.admit(4));
        assert!(!budget.admit(4), "4 + 4 + 4 in flight would be 12 tokens");
        assert!(budget.exceeded().unwrap().contains("budget of 0.01"));
        assert!(budget.admit(2), "a smaller request still fits");
    }

    #[test]
    fn output_tokens_are_priced_at_the_output_price() {
        let prices = Prices {
            input: 0.001,
            output: 0.002,
        };
        let budget = Budget::new(0.0105, prices);
        assert!(budget.admit(2));
        // Two input tokens and two output tokens billed: 0.002 + 0.004.
        budget.settle(
            2,
            Usage {
                prompt_tokens: 2,
                completion_tokens: 2,
                total_tokens: 4,
            },
        );
        assert!(budget.admit(4), "0.006 billed and 0.004 more fit");
        assert!(!budget.admit(1));
        let stop = budget.exceeded().unwrap();
        assert!(stop.contains("0.006000 billed"), "{stop}");
        assert!(stop.contains("0.011000"), "{stop}");
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
