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
/// flight and the request itself stay within it. What is in flight is
/// counted in local tokens scaled by what the answers so far were billed
/// for theirs: a service may bill by its own count (infinity bills
/// characters, 3.3 times the local count of this repository's docs), and
/// counted as local tokens, a run with `--max-cost 0.005` behind LiteLLM
/// was billed 0.0085. Until an answer tells how the service bills, what
/// is in flight counts at the ratio the job's last run recorded; without
/// one, one request is in flight at a time, holding one chunk
/// ([`Budget::next_tells`]): the first answer sets the scale before a
/// second request is reserved.
pub(super) struct Budget {
    max_cost: f64,
    prices: Prices,
    state: std::sync::Mutex<BudgetState>,
    /// Bumped at every answer settled: a request held until the first
    /// answer waits on it.
    answers: watch::Sender<u64>,
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
    in_flight: u64,
    /// Local tokens of the chunks whose answers told their usage, and the
    /// input tokens billed for them: the scale of what is in flight.
    counted_local: u64,
    counted_billed: u64,
    /// Whether an answer with vectors has come, or an earlier run's ratio
    /// was given: how the service bills is known.
    told: bool,
    /// Input tokens billed per local token, as an earlier run of the job
    /// recorded: the scale until this run's answers tell.
    recorded: Option<f64>,
    /// Nothing is admitted: the run stopped before its first request.
    closed: bool,
    exceeded: Option<String>,
}

impl BudgetState {
    /// Input tokens billed per local token, as the answers so far tell;
    /// one until they tell.
    #[allow(clippy::cast_precision_loss)]
    fn scale(&self) -> f64 {
        if self.counted_local == 0 {
            self.recorded.unwrap_or(1.0)
        } else {
            self.counted_billed as f64 / self.counted_local as f64
        }
    }
}

/// What a request's answer settles in the budget.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Settled {
    /// The local tokens the request reserved.
    pub reserved: u64,
    /// What it was billed.
    pub billed: Usage,
    /// The local tokens of the chunks it brought vectors for.
    pub embedded: u64,
}

impl Budget {
    /// A budget of `max_cost` at `prices`, of which `already` input
    /// tokens were billed before the first request (the window probe).
    pub(super) fn new(max_cost: f64, prices: Prices, already: u64) -> Budget {
        let state = BudgetState {
            billed: Usage {
                prompt_tokens: already,
                completion_tokens: 0,
                total_tokens: already,
            },
            ..BudgetState::default()
        };
        Budget {
            max_cost,
            prices,
            state: std::sync::Mutex::new(state),
            answers: watch::channel(0).0,
        }
    }

    /// Counts what is in flight at `ratio` (billed input tokens per local
    /// token, as the job's last run recorded it) until this run's answers
    /// tell: the first request need not go alone, and is not counted short
    /// by a service that bills more than the local count.
    #[must_use]
    pub(super) fn recorded_ratio(self, ratio: Option<f64>) -> Budget {
        if let Some(ratio) = ratio.filter(|r| r.is_finite() && *r > 0.0) {
            let mut state = self.state();
            state.recorded = Some(ratio);
            state.told = true;
        }
        self
    }

    /// A budget that admits nothing, for `why` (the window probe could
    /// cost more than it before the first request): the run stops at its
    /// first request as over the budget.
    #[must_use]
    pub(super) fn spent_before(self, why: Option<String>) -> Budget {
        if let Some(why) = why {
            let mut state = self.state();
            state.exceeded = Some(why);
            state.closed = true;
        }
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What `input` and `output` tokens cost.
    #[allow(clippy::cast_precision_loss)]
    fn cost(&self, input: f64, output: u64) -> f64 {
        input * self.prices.input + output as f64 * self.prices.output
    }

    /// Reserves a request of `tokens` (local), once the budget can tell
    /// whether it fits: `false` if it would take the run over budget, or
    /// if `halted` says the run stopped meanwhile.
    pub(super) async fn admit(&self, tokens: u64, halted: impl Fn() -> bool) -> bool {
        let mut answers = self.answers.subscribe();
        loop {
            if halted() {
                return false;
            }
            if let Some(fits) = self.try_admit(tokens) {
                return fits;
            }
            if answers.changed().await.is_err() {
                return false;
            }
        }
    }

    /// Reserves a request of `tokens` (local) unless it would take the run
    /// over budget; `None` while a request is in flight and no answer has
    /// told how the service bills.
    #[allow(clippy::cast_precision_loss)]
    fn try_admit(&self, tokens: u64) -> Option<bool> {
        let mut state = self.state();
        if state.closed {
            return Some(false);
        }
        if !state.told && state.in_flight > 0 {
            return None;
        }
        let output = state.billed.completion_tokens;
        let spent = self.cost(state.billed.prompt_tokens as f64, output);
        let pending = state.in_flight_tokens.saturating_add(tokens) as f64 * state.scale();
        let projected = self.cost(state.billed.prompt_tokens as f64 + pending, output);
        if projected > self.max_cost {
            state.exceeded.get_or_insert_with(|| {
                format!(
                    "stopped at the budget of {}: {spent:.6} billed, the next request would bring it to {projected:.6}",
                    self.max_cost
                )
            });
            return Some(false);
        }
        state.in_flight_tokens = state.in_flight_tokens.saturating_add(tokens);
        state.in_flight += 1;
        Some(true)
    }

    /// Whether the next request is the one that tells how the service
    /// bills: no answer (nor an earlier run) told yet, and none in flight.
    /// It is counted at its local count, so the dispatcher sends it with
    /// one chunk: a service that bills more can take the run past the
    /// budget by that chunk's difference at most, not a whole request's.
    pub(super) fn next_tells(&self) -> bool {
        let state = self.state();
        !state.told && !state.closed && state.in_flight == 0
    }

    /// Replaces a finished request's reservation with what it was billed.
    pub(super) fn settle(&self, settled: Settled) {
        {
            let mut state = self.state();
            state.in_flight_tokens = state.in_flight_tokens.saturating_sub(settled.reserved);
            state.in_flight = state.in_flight.saturating_sub(1);
            state.billed += settled.billed;
            if settled.embedded > 0 {
                state.told = true;
                if settled.billed.prompt_tokens > 0 {
                    state.counted_local = state.counted_local.saturating_add(settled.embedded);
                    state.counted_billed = state
                        .counted_billed
                        .saturating_add(settled.billed.prompt_tokens);
                }
            }
        }
        self.answers.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Why the budget stopped the run, once it did.
    pub(super) fn exceeded(&self) -> Option<String> {
        self.state().exceeded.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// 1 per 1000 input tokens, 2 per 1000 output tokens.
    const PRICES: Prices = Prices {
        input: 0.001,
        output: 0.002,
    };

    /// An answer to a request of `local` tokens, billed `input` of them.
    fn answered(local: u64, input: u64) -> Settled {
        Settled {
            reserved: local,
            billed: Usage {
                prompt_tokens: input,
                completion_tokens: 0,
                total_tokens: input,
            },
            embedded: local,
        }
    }

    #[test]
    fn the_budget_admits_requests_until_the_next_would_go_over() {
        // A budget of 0.01 is 10 input tokens.
        let budget = Budget::new(0.01, PRICES, 0);
        assert_eq!(budget.try_admit(4), Some(true));
        budget.settle(answered(4, 4));
        assert_eq!(budget.try_admit(4), Some(true));
        assert_eq!(
            budget.try_admit(4),
            Some(false),
            "4 billed and 4 + 4 in flight would be 12 tokens"
        );
        assert!(budget.exceeded().unwrap().contains("budget of 0.01"));
        assert_eq!(
            budget.try_admit(2),
            Some(true),
            "a smaller request still fits"
        );
    }

    #[test]
    fn output_tokens_are_priced_at_the_output_price() {
        let budget = Budget::new(0.0105, PRICES, 0);
        assert_eq!(budget.try_admit(2), Some(true));
        // Two input tokens and two output tokens billed: 0.002 + 0.004.
        budget.settle(Settled {
            billed: Usage {
                prompt_tokens: 2,
                completion_tokens: 2,
                total_tokens: 4,
            },
            ..answered(2, 2)
        });
        assert_eq!(
            budget.try_admit(4),
            Some(true),
            "0.006 billed and 0.004 more fit"
        );
        assert_eq!(budget.try_admit(1), Some(false));
        let stop = budget.exceeded().unwrap();
        assert!(stop.contains("0.006000 billed"), "{stop}");
        assert!(stop.contains("0.011000"), "{stop}");
    }

    #[test]
    fn what_is_in_flight_counts_as_the_service_bills_it() {
        // A budget of 0.02 is 20 input tokens; the service bills three for
        // every local token (as infinity bills characters).
        let budget = Budget::new(0.02, PRICES, 0);
        assert_eq!(budget.try_admit(2), Some(true));
        budget.settle(answered(2, 6));
        // 6 billed, and 2 local tokens in flight count as 6.
        assert_eq!(budget.try_admit(2), Some(true), "6 + 6 of 20");
        assert_eq!(budget.try_admit(2), Some(true), "6 + 12 of 20");
        assert_eq!(
            budget.try_admit(2),
            Some(false),
            "6 + 18 is over 20, though 6 + 6 local tokens are not"
        );
        // The scale is what every answer so far was billed for its chunks.
        budget.settle(answered(2, 2));
        budget.settle(answered(2, 2));
        assert_eq!(
            budget.try_admit(2),
            Some(true),
            "10 billed for 6 local tokens: 2 more count as 3.3"
        );
    }

    #[test]
    fn what_the_window_probe_was_billed_counts_from_the_start() {
        let budget = Budget::new(0.01, PRICES, 9);
        assert_eq!(budget.try_admit(2), Some(false), "9 + 2 is over 10");
        let budget = Budget::new(0.01, PRICES, 8);
        assert_eq!(budget.try_admit(2), Some(true), "8 + 2 is 10");
    }

    #[test]
    fn a_ratio_an_earlier_run_recorded_scales_what_is_in_flight_from_the_first_request() {
        // A budget of 0.02 is 20 input tokens; the last run was billed
        // three for every local token.
        let budget = Budget::new(0.02, PRICES, 0).recorded_ratio(Some(3.0));
        assert_eq!(budget.try_admit(3), Some(true), "9 of 20");
        assert_eq!(
            budget.try_admit(3),
            Some(true),
            "18 of 20, without waiting for the first answer"
        );
        assert_eq!(budget.try_admit(1), Some(false), "21 is over 20");
        // This run's answers replace the recorded ratio.
        budget.settle(answered(3, 3));
        assert_eq!(
            budget.try_admit(3),
            Some(true),
            "3 billed and 3 + 3 in flight at 1"
        );
        // A ratio that is no number is none.
        for ratio in [f64::NAN, 0.0, -1.0] {
            let budget = Budget::new(0.02, PRICES, 0).recorded_ratio(Some(ratio));
            assert_eq!(budget.try_admit(15), Some(true));
            assert_eq!(budget.try_admit(1), None, "held until the first answer");
        }
    }

    #[test]
    fn the_next_request_tells_how_the_service_bills_until_an_answer_or_a_ratio_did() {
        let budget = Budget::new(1.0, PRICES, 0);
        assert!(budget.next_tells());
        assert_eq!(budget.try_admit(1), Some(true));
        assert!(!budget.next_tells(), "one is on its way to tell");
        // An answer without vectors tells nothing: the next goes to tell.
        budget.settle(Settled {
            embedded: 0,
            ..answered(1, 0)
        });
        assert!(budget.next_tells());
        assert_eq!(budget.try_admit(1), Some(true));
        budget.settle(answered(1, 3));
        assert!(!budget.next_tells(), "told");
        let recorded = Budget::new(1.0, PRICES, 0).recorded_ratio(Some(3.0));
        assert!(!recorded.next_tells(), "an earlier run told");
        let spent = Budget::new(1.0, PRICES, 0).spent_before(Some("the probe".into()));
        assert!(!spent.next_tells(), "nothing goes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_budget_spent_before_the_run_admits_nothing_and_says_why() {
        let budget = Budget::new(1.0, PRICES, 0).spent_before(Some("the probe".into()));
        assert!(!budget.admit(1, || false).await);
        assert_eq!(budget.exceeded().as_deref(), Some("the probe"));
        let open = Budget::new(1.0, PRICES, 0).spent_before(None);
        assert_eq!(open.try_admit(1), Some(true));
        assert_eq!(open.exceeded(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn until_an_answer_tells_how_the_service_bills_one_request_is_in_flight() {
        let budget = Arc::new(Budget::new(1.0, PRICES, 0));
        let running = || false;
        assert!(budget.admit(10, running).await);
        let second = {
            let budget = Arc::clone(&budget);
            tokio::spawn(async move { budget.admit(10, || false).await })
        };
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!second.is_finished(), "held while the first is unanswered");
        // An answer without vectors (its chunks quarantined) tells nothing.
        budget.settle(Settled {
            embedded: 0,
            ..answered(10, 0)
        });
        assert!(second.await.unwrap(), "nothing in flight: it goes alone");
        let third = {
            let budget = Arc::clone(&budget);
            tokio::spawn(async move { budget.admit(10, || false).await })
        };
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!third.is_finished());
        budget.settle(answered(10, 12));
        assert!(third.await.unwrap());
        // Told: several go at once.
        assert_eq!(budget.try_admit(10), Some(true));
        assert_eq!(budget.try_admit(10), Some(true));
        // A run that stops meanwhile admits nothing more.
        let held = Budget::new(1.0, PRICES, 0);
        assert!(held.admit(10, running).await);
        assert!(!held.admit(10, || true).await);
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
