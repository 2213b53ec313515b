//! The retry policy: jittered exponential backoff (backon) that honours the
//! delay a server asks for.
//!
//! What to retry is decided by the error itself through [`Retryable`], so
//! the policy stays the same for every caller.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};

use super::headers::MAX_RETRY_AFTER;

/// Sorts a failure into "try again" or "give up".
pub trait Retryable {
    fn should_retry(&self) -> bool;
    /// The delay the other side asked for, if any.
    fn requested_delay(&self) -> Option<Duration>;
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; 0 means try once.
    pub max_retries: usize,
    pub min_delay: Duration,
    pub max_delay: Duration,
    /// A server's `Retry-After` is honoured up to this long.
    pub max_requested_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 8,
            min_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(30),
            max_requested_delay: MAX_RETRY_AFTER,
        }
    }
}

impl RetryPolicy {
    pub fn with_max_retries(max_retries: usize) -> Self {
        RetryPolicy {
            max_retries,
            ..RetryPolicy::default()
        }
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.max_retries)
            .with_jitter()
    }

    /// The wait before the next attempt: the server's request when it made
    /// one (capped), never shorter than the backoff's (a `Retry-After: 0`
    /// does not make a retry loop); `None` once retries are used up.
    fn next_delay(
        &self,
        requested: Option<Duration>,
        backoff: Option<Duration>,
    ) -> Option<Duration> {
        let backoff = backoff?;
        Some(match requested {
            Some(asked) => asked.min(self.max_requested_delay).max(backoff),
            None => backoff,
        })
    }
}

/// Runs `op` until it succeeds, fails for good, or runs out of retries.
pub async fn with_retries<T, E, F, Fut>(policy: &RetryPolicy, op: F) -> Result<T, E>
where
    E: Retryable,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    with_retries_notify(policy, op, |_, _| {}).await
}

/// As [`with_retries`], calling `notify` with each failure that will be retried and the wait before it.
pub async fn with_retries_notify<T, E, F, Fut, N>(
    policy: &RetryPolicy,
    op: F,
    notify: N,
) -> Result<T, E>
where
    E: Retryable,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    N: FnMut(&E, Duration),
{
    op.retry(policy.backoff())
        .sleep(tokio::time::sleep)
        .when(E::should_retry)
        .adjust(|err: &E, backoff| policy.next_delay(err.requested_delay(), backoff))
        .notify(notify)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug)]
    struct Fault {
        transient: bool,
        delay: Option<Duration>,
    }

    impl Retryable for Fault {
        fn should_retry(&self) -> bool {
            self.transient
        }
        fn requested_delay(&self) -> Option<Duration> {
            self.delay
        }
    }

    #[tokio::test(start_paused = true)]
    async fn transient_faults_are_retried_until_success() {
        let calls = AtomicUsize::new(0);
        let result = with_retries(&RetryPolicy::with_max_retries(5), || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0..=2 => Err(Fault {
                    transient: true,
                    delay: None,
                }),
                n => Ok(n),
            }
        })
        .await;
        assert_eq!(result.unwrap(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_faults_stop_at_once() {
        let calls = AtomicUsize::new(0);
        let result: Result<(), Fault> = with_retries(&RetryPolicy::default(), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Fault {
                transient: false,
                delay: None,
            })
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_run_out() {
        let calls = AtomicUsize::new(0);
        let result: Result<(), Fault> = with_retries(&RetryPolicy::with_max_retries(3), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Fault {
                transient: true,
                delay: Some(Duration::from_secs(1)),
            })
        })
        .await;
        assert!(result.is_err());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4,
            "one attempt and three retries"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_servers_delay_is_honoured() {
        let start = tokio::time::Instant::now();
        let calls = AtomicUsize::new(0);
        let mut waits = Vec::new();
        let result = with_retries_notify(
            &RetryPolicy::with_max_retries(3),
            || async {
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0 => Err(Fault {
                        transient: true,
                        delay: Some(Duration::from_secs(7)),
                    }),
                    _ => Ok(()),
                }
            },
            |_, wait| waits.push(wait),
        )
        .await;
        assert!(result.is_ok());
        assert_eq!(waits, vec![Duration::from_secs(7)]);
        assert!(start.elapsed() >= Duration::from_secs(7));
    }

    #[test]
    fn a_requested_delay_of_zero_waits_the_backoff() {
        let policy = RetryPolicy::default();
        let backoff = Some(Duration::from_millis(400));
        assert_eq!(policy.next_delay(Some(Duration::ZERO), backoff), backoff);
        assert_eq!(
            policy.next_delay(Some(Duration::from_secs(2)), backoff),
            Some(Duration::from_secs(2)),
            "a longer delay asked for is honoured"
        );
    }

    #[test]
    fn requested_delays_are_capped() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.next_delay(
                Some(Duration::from_secs(3600)),
                Some(Duration::from_secs(1))
            ),
            Some(policy.max_requested_delay)
        );
        assert_eq!(policy.next_delay(Some(Duration::from_secs(1)), None), None);
    }
}
