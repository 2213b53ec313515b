//! Rate control for the requests a stage sends to a service: the embeddings
//! backend and the `chat` command each send through a [`RateControl`].
//!
//! A request waits, in turn, for the job's own limits ([`limits`]: requests
//! and tokens per minute), for a place among the requests in flight
//! ([`concurrency`]: a fixed most, or a limit found from round-trip times), and
//! for the service's quota as its headers describe it ([`pacing`], reading
//! [`headers`]). A request of several inputs larger than a hundredth of the
//! service's token quota is handed back instead, to be cut and sent in parts
//! ([`Held::Cut`]). What became of it is told back through the [`Admission`] it
//! was given: answered, refused (a 429, which is waited out rather than
//! counted as a failed attempt), or failed. Failed attempts are retried by
//! the policy of [`retry`].
//!
//! Every outcome passes through [`Admission`], which knows when its request
//! went: the round-trip times of the answers drive the limit of requests in
//! flight under `backend.concurrency = "auto"`.

mod budget;
mod concurrency;
mod headers;
#[cfg(test)]
mod hostile;
mod limits;
mod pacing;
mod retry;
mod share;
mod stay;
#[cfg(test)]
mod strangers;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

pub use self::concurrency::{
    band as auto_band, Limit as ConcurrencyLimit, Settled as SettledConcurrency,
};
pub use self::headers::{retry_after, QuotaHeader, RateLimitHeaders};
pub use self::limits::RateLimits;
pub use self::pacing::{Held, QuotaStop};
pub use self::retry::{with_retries, with_retries_notify, RetryPolicy, Retryable};

use self::concurrency::{Concurrency, Permit};
use self::limits::Limiter;
use self::pacing::{is_insufficient_quota, is_larger_than_quota, Pacing, Ticket};

/// A failed request as rate control reads it.
pub trait Fault: Retryable + std::fmt::Display {
    /// A 429: the service's rate limit or quota refused the request.
    fn is_refusal(&self) -> bool;
    /// The service's own words, which tell a used-up quota from a rate limit.
    fn message(&self) -> &str;
    /// No answer came within the client's timeout.
    fn timed_out(&self) -> bool;
}

/// How the requests to one service are limited and retried.
#[derive(Debug, Clone, PartialEq)]
pub struct RateSettings {
    /// The most requests in flight; a fixed window starts there.
    pub concurrency: usize,
    /// Find the limit below `concurrency` from round-trip times (`auto`).
    pub adaptive: bool,
    /// The client's timeout, which `auto` keeps answers well within.
    pub timeout: Option<Duration>,
    /// `backend.requests_per_minute`; 0 for no limit of the job's own.
    pub requests_per_minute: u32,
    /// `backend.tokens_per_minute`; 0 for no limit of the job's own.
    pub tokens_per_minute: u64,
    /// The largest request, in tokens: the token bucket must hold one.
    pub max_tokens_per_request: u64,
    pub retry: RetryPolicy,
    /// Requests stop when nothing has succeeded for this long (since the
    /// first send) while the service refuses them or its quota holds them back.
    pub stall_timeout: Duration,
    /// How many processes share the key's quota (the shards of a split job):
    /// each counts on its part of it from the start.
    pub sharing: u32,
    /// `backend.quota_window_seconds`: how long a use stays in the
    /// service's sliding windows; `None` to learn it from the answers.
    pub quota_window: Option<Duration>,
}

impl RateSettings {
    /// One request in flight, no limits of the job's own, `retry`'s retries,
    /// a stall timeout of ten minutes.
    pub fn new(retry: RetryPolicy) -> Self {
        RateSettings {
            concurrency: 1,
            adaptive: false,
            timeout: None,
            requests_per_minute: 0,
            tokens_per_minute: 0,
            max_tokens_per_request: 0,
            retry,
            stall_timeout: Duration::from_secs(600),
            sharing: 1,
            quota_window: None,
        }
    }

    /// The job's own limits, as requests wait on them.
    pub fn limits(&self) -> RateLimits {
        RateLimits::new(
            self.requests_per_minute,
            self.tokens_per_minute,
            self.max_tokens_per_request,
        )
    }
}

/// The rate control of one service, shared by every request sent to it.
#[derive(Debug)]
pub struct RateControl {
    retry: RetryPolicy,
    limits: Limiter,
    window: Concurrency,
    pacing: Pacing,
}

/// What a 429 means for the request it refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A rate limit: send the request again; admitting it waits as long as
    /// the service asked. It uses up no retry.
    Wait,
    /// The quota is used up (billing): waiting will not help.
    Stop(QuotaStop),
    /// The request is larger than the whole quota: it must be split.
    TooLarge,
}

/// Why [`RateControl::call`] gave up.
#[derive(Debug, thiserror::Error)]
pub enum CallError<E> {
    /// The request failed for good, or its retries ran out.
    #[error(transparent)]
    Fault(E),
    /// The request is larger than the service's whole quota.
    #[error(transparent)]
    TooLarge(E),
    /// The service's quota stopped the requests.
    #[error(transparent)]
    Quota(QuotaStop),
}

impl<E: Retryable> Retryable for CallError<E> {
    fn should_retry(&self) -> bool {
        match self {
            CallError::Fault(e) => e.should_retry(),
            CallError::TooLarge(_) | CallError::Quota(_) => false,
        }
    }

    fn requested_delay(&self) -> Option<Duration> {
        match self {
            CallError::Fault(e) => e.requested_delay(),
            CallError::TooLarge(_) | CallError::Quota(_) => None,
        }
    }
}

impl RateControl {
    pub fn new(settings: &RateSettings) -> RateControl {
        RateControl {
            retry: settings.retry,
            limits: Limiter::new(settings.limits()),
            window: Concurrency::new(
                if settings.adaptive {
                    ConcurrencyLimit::Auto {
                        most: settings.concurrency,
                    }
                } else {
                    ConcurrencyLimit::Fixed(settings.concurrency)
                },
                settings.timeout,
            ),
            pacing: Pacing::new(settings.stall_timeout)
                .shared_by(settings.sharing)
                .limited_to(settings.requests_per_minute)
                .window_given(settings.quota_window),
        }
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The service's quota window as the pacing counts it.
    #[cfg(test)]
    pub(crate) fn quota_window(&self) -> Duration {
        self.pacing.window()
    }

    /// Waits until a request of `tokens` (by the local count) may go: the
    /// job's own limits, a place in flight, then the service's quota.
    ///
    /// # Errors
    /// Nothing has succeeded for the stall timeout.
    pub async fn admit(&self, tokens: u64) -> Result<Admission<'_>, QuotaStop> {
        loop {
            match self.admit_or_cut(tokens, false).await {
                Ok(admission) => return Ok(admission),
                Err(Held::Stop(stop)) => return Err(stop),
                // Only a divisible request is cut.
                Err(Held::Cut(_)) => {}
            }
        }
    }

    /// As [`RateControl::admit`]; a `divisible` request (of several inputs)
    /// larger than [`RateControl::request_tokens`] is handed back to be cut
    /// instead, once the service's headers tell that size, before it goes.
    ///
    /// # Errors
    /// Nothing has succeeded for the stall timeout, or the request is to be cut.
    pub async fn admit_or_cut(&self, tokens: u64, divisible: bool) -> Result<Admission<'_>, Held> {
        // Before the job's own limits, which would count it whole.
        if let Some(most) = self
            .request_tokens()
            .filter(|&most| divisible && tokens > most)
        {
            return Err(Held::Cut(most));
        }
        if self.limits.is_limited() {
            let _waiting = self.pacing.waiting();
            self.limits.until_ready(tokens).await;
        }
        // A place in flight first, then the quota: a pause set while
        // waiting for the place still holds the request back.
        let permit = self.window.acquire(tokens).await;
        let ticket = self.pacing.admit_or_cut(tokens, divisible).await?;
        Ok(Admission {
            control: self,
            permit,
            ticket,
        })
    }

    /// Sends a request until it is answered, fails for good, or its retries
    /// run out. `send` makes one attempt and returns its result with the
    /// quota headers of its answer (see `Client::with_quota_headers`). A
    /// rate limit's refusal is waited out and uses up no retry.
    ///
    /// # Errors
    /// The last failure, a request larger than the whole quota, or the
    /// quota's stop.
    pub async fn call<T, E, F, Fut>(&self, tokens: u64, send: F) -> Result<T, CallError<E>>
    where
        E: Fault,
        F: Fn() -> Fut,
        Fut: Future<Output = (Result<T, E>, Option<RateLimitHeaders>)>,
    {
        with_retries(&self.retry, || async {
            loop {
                let admission = self.admit(tokens).await.map_err(CallError::Quota)?;
                let (result, headers) = send().await;
                let error = match result {
                    Ok(answer) => {
                        admission.answered(headers, None);
                        return Ok(answer);
                    }
                    Err(error) => error,
                };
                if !error.is_refusal() {
                    admission.failed(headers, error.timed_out());
                    return Err(CallError::Fault(error));
                }
                match admission.refused(headers, &error) {
                    Refusal::Wait => {}
                    Refusal::Stop(stop) => return Err(CallError::Quota(stop)),
                    Refusal::TooLarge => return Err(CallError::TooLarge(error)),
                }
            }
        })
        .await
    }

    /// The most tokens (by the local count) a request should hold for the
    /// service's token quota, once its headers tell it: a hundredth of it,
    /// so that processes sharing it can split it finely.
    pub fn request_tokens(&self) -> Option<u64> {
        self.pacing.request_tokens()
    }

    /// 429s received.
    pub fn throttled(&self) -> u64 {
        self.pacing.throttled()
    }

    /// The time requests spent waiting for the quota or the job's own limits.
    pub fn waited(&self) -> Duration {
        self.pacing.waited()
    }

    /// The requests in flight allowed, when timeouts lowered it below the configured most.
    pub fn lowered(&self) -> Option<usize> {
        self.window.lowered()
    }

    /// What `auto` settled on; `None` for a fixed limit.
    pub fn settled(&self) -> Option<SettledConcurrency> {
        self.window.settled()
    }
}

/// A request let through. Tell what became of it with one of its methods;
/// dropped untold (a request given up on), it only frees its place in flight.
#[must_use = "tell the rate control what became of the request"]
#[derive(Debug)]
pub struct Admission<'a> {
    control: &'a RateControl,
    permit: Permit<'a>,
    ticket: Ticket,
}

impl Admission<'_> {
    /// When the request was let through.
    pub fn sent_at(&self) -> Instant {
        self.ticket.sent_at()
    }

    /// Whether no other request was in flight when this one went.
    pub fn alone(&self) -> bool {
        self.permit.alone()
    }

    /// An answer, with its quota headers and, when its usage says, the
    /// tokens it was billed.
    pub fn answered(self, headers: Option<RateLimitHeaders>, billed_tokens: Option<u64>) {
        let Admission {
            control,
            permit,
            ticket,
        } = self;
        control.window.on_answer(&permit, ticket.sent_at());
        drop(permit);
        control.pacing.on_answer(ticket, headers, billed_tokens);
    }

    /// A 429, sorted: a rate limit to wait out, a used-up quota, or a
    /// request larger than the whole quota.
    pub fn refused(self, headers: Option<RateLimitHeaders>, error: &impl Fault) -> Refusal {
        let Admission {
            control,
            permit,
            ticket,
        } = self;
        drop(permit);
        if is_insufficient_quota(error.message()) {
            control.pacing.on_failure(ticket, headers);
            return Refusal::Stop(QuotaStop::InsufficientQuota(error.message().to_string()));
        }
        if is_larger_than_quota(error.message()) {
            control.pacing.on_failure(ticket, headers);
            return Refusal::TooLarge;
        }
        if !control.pacing.on_refused(ticket, headers, error) {
            // No headers to pace by: fewer requests in flight (the pause is the pacing's).
            control.window.on_throttled(None);
        }
        Refusal::Wait
    }

    /// Any other failure (a 5xx, a refused parameter, a timeout): its
    /// headers still describe the quota, and a timeout lowers the requests
    /// in flight for good.
    pub fn failed(self, headers: Option<RateLimitHeaders>, timed_out: bool) {
        let Admission {
            control,
            permit,
            ticket,
        } = self;
        drop(permit);
        control.pacing.on_failure(ticket, headers);
        if timed_out {
            control.window.on_timeout();
        }
    }

    /// A 503: the server sheds load, so fewer requests go in flight.
    pub fn shed(self, headers: Option<RateLimitHeaders>) {
        self.control.window.on_throttled(None);
        self.failed(headers, false);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A failure as a service's error would read.
    #[derive(Debug, Clone)]
    pub(crate) struct TestFault {
        status: u16,
        message: String,
        retry_after: Option<Duration>,
        timed_out: bool,
    }

    impl TestFault {
        pub(crate) fn refusal(message: &str, retry_after: Option<Duration>) -> TestFault {
            TestFault {
                status: 429,
                message: message.to_string(),
                retry_after,
                timed_out: false,
            }
        }

        fn status(status: u16, message: &str) -> TestFault {
            TestFault {
                status,
                ..TestFault::refusal(message, None)
            }
        }
    }

    impl std::fmt::Display for TestFault {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "HTTP {}: {}", self.status, self.message)
        }
    }

    impl Retryable for TestFault {
        fn should_retry(&self) -> bool {
            self.status == 429 || self.status >= 500
        }

        fn requested_delay(&self) -> Option<Duration> {
            self.retry_after
        }
    }

    impl Fault for TestFault {
        fn is_refusal(&self) -> bool {
            self.status == 429
        }

        fn message(&self) -> &str {
            &self.message
        }

        fn timed_out(&self) -> bool {
            self.timed_out
        }
    }

    fn control(concurrency: usize, retries: usize) -> RateControl {
        RateControl::new(&RateSettings {
            concurrency,
            ..RateSettings::new(RetryPolicy::with_max_retries(retries))
        })
    }

    /// An attempt that fails with each of `faults` in turn, then succeeds
    /// with the number of attempts made.
    async fn attempt(
        calls: &AtomicUsize,
        faults: &[TestFault],
    ) -> (Result<usize, TestFault>, Option<RateLimitHeaders>) {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        match faults.get(n) {
            Some(fault) => (Err(fault.clone()), None),
            None => (Ok(n + 1), None),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limits_are_waited_out_without_using_up_retries() {
        let control = control(1, 1);
        let calls = AtomicUsize::new(0);
        let faults =
            vec![TestFault::refusal("Rate limit reached", Some(Duration::from_secs(2))); 3];
        let start = Instant::now();
        let answer = control.call(10, || attempt(&calls, &faults)).await;
        assert_eq!(answer.unwrap(), 4, "three refusals, then the answer");
        assert_eq!(control.throttled(), 3);
        assert!(
            start.elapsed() >= Duration::from_secs(6),
            "each refusal's Retry-After is waited: {:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_retried_by_the_policy_until_it_runs_out() {
        let control = control(1, 2);
        let calls = AtomicUsize::new(0);
        let faults = vec![TestFault::status(503, "busy"); 5];
        let result = control.call(10, || attempt(&calls, &faults)).await;
        assert!(matches!(result, Err(CallError::Fault(ref e)) if e.status == 503));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "one attempt and two retries"
        );

        let calls = AtomicUsize::new(0);
        let faults = [TestFault::status(400, "bad request")];
        let result = control.call(10, || attempt(&calls, &faults)).await;
        assert!(matches!(result, Err(CallError::Fault(_))));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "a permanent fault is not retried"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_used_up_quota_stops_and_a_request_over_it_is_too_large() {
        let control = control(1, 5);
        let calls = AtomicUsize::new(0);
        let faults = [TestFault::refusal(
            "You exceeded your current quota [insufficient_quota]",
            None,
        )];
        let result = control.call(10, || attempt(&calls, &faults)).await;
        assert!(
            matches!(
                result,
                Err(CallError::Quota(QuotaStop::InsufficientQuota(_)))
            ),
            "{result:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        let calls = AtomicUsize::new(0);
        let faults = [TestFault::refusal(
            "Request too large for model on tokens per min",
            None,
        )];
        let result = control.call(10, || attempt(&calls, &faults)).await;
        assert!(matches!(result, Err(CallError::TooLarge(_))), "{result:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_admission_holds_a_place_in_flight_until_told() {
        let control = control(1, 0);
        let first = control.admit(1).await.unwrap();
        let sent = first.sent_at();
        let second = tokio::time::timeout(Duration::from_secs(1), control.admit(1)).await;
        assert!(second.is_err(), "one request in flight at most");
        first.answered(None, Some(1));
        let second = tokio::time::timeout(Duration::from_secs(1), control.admit(1))
            .await
            .expect("the answer frees the place")
            .unwrap();
        assert!(second.sent_at() > sent);
        second.failed(None, true);
        assert_eq!(control.lowered(), None, "a window of one is not lowered");
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_lowers_the_requests_in_flight() {
        let control = control(8, 0);
        control.admit(1).await.unwrap().failed(None, true);
        assert_eq!(control.lowered(), Some(4));
    }

    /// The job's own limits run on governor's clock, not tokio's: real time.
    #[tokio::test]
    async fn the_jobs_own_limits_hold_requests_back_and_count_as_waiting() {
        let control = RateControl::new(&RateSettings {
            requests_per_minute: 60,
            ..RateSettings::new(RetryPolicy::with_max_retries(0))
        });
        let start = std::time::Instant::now();
        for _ in 0..2 {
            control.admit(1).await.unwrap().answered(None, None);
        }
        // One a second, a burst of one: the second waits a second.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(3),
            "{elapsed:?}"
        );
        assert!(
            control.waited() >= Duration::from_millis(900),
            "{:?}",
            control.waited()
        );
    }
}
