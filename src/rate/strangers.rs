//! Independent processes on one key, in process and in paused time: each a
//! [`RateControl`] of its own sending to one simulated quota, so that what
//! the controller does with a quota shared by strangers is measured without
//! a clock of the machine's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::tests::TestFault;
use super::{RateControl, RateLimitHeaders, RateSettings, RetryPolicy};
use crate::simulate::{QuotaConfig, QuotaWindow, Quotas};

/// What a run of several processes did to the quota.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    /// Requests the service received, and refused.
    pub received: u64,
    pub refused: u64,
    /// Useful work after the first window over the quota's rate times the
    /// time after it (the bench's utilisation).
    pub utilisation: f64,
    pub seconds: f64,
}

/// `processes` jobs of `requests` requests of `tokens` billed tokens each,
/// `concurrency` in flight (`None`: auto up to 16), answered after
/// `latency`, on one quota of `quota`.
pub(crate) async fn run(
    quota: QuotaConfig,
    processes: usize,
    requests: u64,
    tokens: u64,
    concurrency: Option<usize>,
    latency: Duration,
) -> Outcome {
    let window = quota.window;
    let by_tokens = quota.tokens_per_minute.is_some();
    #[allow(clippy::cast_precision_loss)]
    let rate = if by_tokens {
        quota.tokens_per_minute.unwrap_or(1) as f64
    } else {
        quota.requests_per_minute.unwrap_or(1) as f64
    } / window.as_secs_f64();
    let quotas = Arc::new(Quotas::new(quota));
    let received = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    // Work done by the end of the first window, read then.
    let at_first = {
        let done = done.clone();
        tokio::spawn(async move {
            tokio::time::sleep(window).await;
            done.load(Ordering::SeqCst)
        })
    };
    let jobs = (0..processes).map(|id| {
        let quotas = quotas.clone();
        let (received, refused, done) = (received.clone(), refused.clone(), done.clone());
        async move {
            // Processes started together still begin apart: what they read first differs.
            let stagger: u64 = std::env::var("STRANGERS_STAGGER_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(stagger * id as u64)).await;
            let control = Arc::new(RateControl::new(&RateSettings {
                concurrency: concurrency.unwrap_or(16),
                adaptive: concurrency.is_none(),
                timeout: Some(Duration::from_secs(60)),
                stall_timeout: Duration::from_secs(600),
                ..RateSettings::new(RetryPolicy::with_max_retries(3))
            }));
            let next = Arc::new(AtomicU64::new(0));
            let workers = (0..concurrency.unwrap_or(16)).map(|_| {
                let (control, next, quotas) = (control.clone(), next.clone(), quotas.clone());
                let (received, refused, done) = (received.clone(), refused.clone(), done.clone());
                async move {
                    while next.fetch_add(1, Ordering::SeqCst) < requests {
                        let result = control
                            .call(tokens, || {
                                let (quotas, received, refused) =
                                    (quotas.clone(), received.clone(), refused.clone());
                                async move {
                                    // The simulator's latency comes before the quota, as in
                                    // `embedjob simulate`.
                                    tokio::time::sleep(latency).await;
                                    received.fetch_add(1, Ordering::SeqCst);
                                    let answer = quotas.admit("key", tokens);
                                    if std::env::var_os("STRANGERS_TRACE").is_some() {
                                        println!(
                                            "{:.3} {} {}",
                                            start.elapsed().as_secs_f64(),
                                            id,
                                            if answer.is_ok() { "ok" } else { "REFUSED" }
                                        );
                                    }
                                    match answer {
                                        Ok(headers) => (Ok(()), RateLimitHeaders::parse(&headers)),
                                        Err(refusal) => {
                                            refused.fetch_add(1, Ordering::SeqCst);
                                            let asked = super::retry_after(
                                                &refusal.headers,
                                                std::time::SystemTime::now(),
                                            );
                                            (
                                                Err(TestFault::refusal(
                                                    "Rate limit reached",
                                                    asked,
                                                )),
                                                RateLimitHeaders::parse(&refusal.headers),
                                            )
                                        }
                                    }
                                }
                            })
                            .await;
                        assert!(result.is_ok(), "a request failed");
                        done.fetch_add(if by_tokens { tokens } else { 1 }, Ordering::SeqCst);
                    }
                }
            });
            futures::future::join_all(workers).await;
        }
    });
    futures::future::join_all(jobs).await;
    let seconds = start.elapsed().as_secs_f64();
    let before = at_first.await.unwrap_or(0);
    #[allow(clippy::cast_precision_loss)]
    let after = (done.load(Ordering::SeqCst) - before) as f64;
    Outcome {
        received: received.load(Ordering::SeqCst),
        refused: refused.load(Ordering::SeqCst),
        utilisation: after / (rate * (seconds - window.as_secs_f64())),
        seconds,
    }
}

fn quota(kind: QuotaWindow, by_tokens: bool) -> QuotaConfig {
    QuotaConfig {
        requests_per_minute: (!by_tokens).then_some(20),
        tokens_per_minute: by_tokens.then_some(20_000),
        window: Duration::from_secs(2),
        kind,
        ..QuotaConfig::default()
    }
}

/// Prints what the controller does for one and four processes under each
/// kind of quota, as the quota bench's cases (`cargo test --lib
/// strangers -- --ignored --nocapture`; `STRANGERS_ONLY` picks cases by
/// their label, `STRANGERS_STAGGER_MS` starts the processes that far apart,
/// `STRANGERS_TRACE` prints every request the quota met).
#[tokio::test(start_paused = true)]
#[ignore = "a report, not a test: the bench's cases in paused time"]
async fn report() {
    for kind in [QuotaWindow::Bucket, QuotaWindow::Sliding] {
        for by_tokens in [true, false] {
            for processes in [1, 4] {
                let (requests, tokens) = if by_tokens { (125, 1600) } else { (200, 1600) };
                for concurrency in [None, Some(16)] {
                    let label =
                        format!("{kind:?} tokens={by_tokens} n={processes} c={concurrency:?}");
                    if std::env::var("STRANGERS_ONLY").is_ok_and(|only| !label.contains(&only)) {
                        continue;
                    }
                    let o = run(
                        quota(kind, by_tokens),
                        processes,
                        requests / processes as u64,
                        tokens,
                        concurrency,
                        Duration::from_millis(20),
                    )
                    .await;
                    println!(
                        "{label}: {:.1}% used, {} of {} refused ({:.1}%), {:.1}s",
                        o.utilisation * 100.0,
                        o.refused,
                        o.received,
                        o.refused as f64 * 100.0 / o.received as f64,
                        o.seconds
                    );
                }
            }
        }
    }
}
