//! Whatever a server writes in its rate-limit headers and `Retry-After`
//! (numbers out of range, `inf`, `NaN`, garbage, limits of one or of 10^308,
//! resets of a day, budgets that contradict the refusals), a stranger's or a
//! shard's rate control neither panics nor holds a request past the stall
//! timeout: every wait on the quota is cut at `stall_timeout` after the last
//! success, whereupon the request stops resumably.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

use super::tests::TestFault;
use super::{retry_after, CallError, RateControl, RateLimitHeaders, RateSettings, RetryPolicy};

/// What a server may write where a number or a duration belongs.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("inf".to_string()),
        Just("NaN".to_string()),
        Just("1e308".to_string()),
        Just("1h30m".to_string()),
        Just("99999999h".to_string()),
        Just("Wed, 21 Oct 2015 07:28:00 GMT".to_string()),
        Just("Fri, 01 Jan 2100 00:00:00 GMT".to_string()),
        (0u64..=u64::MAX).prop_map(|n| n.to_string()),
        (0u64..100_000).prop_map(|n| n.to_string()),
        (0.0f64..1e4).prop_map(|x| format!("{x}s")),
        (0u64..5_000).prop_map(|n| format!("{n}ms")),
        "[0-9a-z.µ-]{1,12}",
    ]
}

/// One answer: a success or a 429, and the headers it came with.
#[derive(Debug, Clone)]
struct Answer {
    refused: bool,
    headers: Vec<(&'static str, String)>,
}

const NAMES: [&str; 8] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "retry-after",
    "retry-after-ms",
];

fn answer() -> impl Strategy<Value = Answer> {
    (
        prop::bool::weighted(0.6),
        prop::collection::vec((0..NAMES.len(), value()), 0..10),
    )
        .prop_map(|(refused, headers)| Answer {
            refused,
            headers: headers.into_iter().map(|(k, v)| (NAMES[k], v)).collect(),
        })
}

/// Answers that describe one quota alike from answer to answer: a limit of
/// one or of 1.4 x 10^13, an eighth more of it used at every answer or a
/// thousand more, whole again in a millisecond or in a day. An eighth of
/// that huge limit refilling in a day implies a bucket slower than any
/// clock can count (its window once panicked the pacing).
fn steady() -> impl Strategy<Value = Vec<Answer>> {
    (
        prop_oneof![Just(1.0), Just(1.4e13)],
        prop_oneof![Just(0.125), Just(1000.0)],
        prop_oneof![Just("1ms"), Just("86400s")],
        // The request quota's names, or the token quota's (NAMES[3..6]).
        prop_oneof![Just(0usize), Just(3usize)],
        0u32..40,
    )
        .prop_map(|(limit, used, reset, quota, n)| {
            (1..=n)
                .map(|i| Answer {
                    refused: false,
                    headers: vec![
                        (NAMES[quota], format!("{limit}")),
                        (
                            NAMES[quota + 1],
                            format!("{}", (limit - used * f64::from(i)).max(0.0)),
                        ),
                        (NAMES[quota + 2], reset.to_string()),
                    ],
                })
                .collect()
        })
}

fn header_map(answer: &Answer) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in &answer.headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            map.insert(HeaderName::from_static(name), value);
        }
    }
    map
}

/// The stall timeout the runs use, and a bound on one call: its waits on
/// the quota end at the stall timeout after the last success of any
/// request, or after the call began if that was later (the check sleeps at
/// most the time left), and the scripted answers take no time; 1 ms more
/// for the timer, which rounds a sleep up to the next millisecond.
const STALL: Duration = Duration::from_secs(10);
const ONE_CALL: Duration = Duration::from_millis(10_001);

/// `workers` at once send 12 requests each through one control, answered
/// from `answers` in turn (then successes without headers). One worker also
/// checks that a stop comes no earlier than the stall timeout after the
/// last success; with several, another's success may land in the same
/// instant as the stop.
async fn run(answers: Vec<Answer>, sharing: u32, workers: usize) -> Result<(), TestCaseError> {
    let control = RateControl::new(&RateSettings {
        concurrency: 4,
        stall_timeout: STALL,
        sharing,
        ..RateSettings::new(RetryPolicy::with_max_retries(2))
    });
    let script = Mutex::new(answers.into_iter());
    // Any worker's latest success: the stall timeout counts from it.
    let latest = Mutex::new(Instant::now());
    let worker = || async {
        let mut last_success = Instant::now();
        for _ in 0..12 {
            let started = Instant::now();
            let result = control
                .call(1_000, || {
                    let next = script.lock().map(|mut s| s.next()).ok().flatten();
                    async move {
                        let Some(answer) = next else {
                            return (Ok(()), None);
                        };
                        let map = header_map(&answer);
                        let headers = RateLimitHeaders::parse(&map);
                        if answer.refused {
                            let asked = retry_after(&map, SystemTime::now());
                            (
                                Err(TestFault::refusal("Rate limit reached", asked)),
                                headers,
                            )
                        } else {
                            (Ok(()), headers)
                        }
                    }
                })
                .await;
            let now = Instant::now();
            let since = latest.lock().map_or(started, |at| (*at).max(started));
            match result {
                Ok(()) => {
                    last_success = now;
                    if let Ok(mut at) = latest.lock() {
                        *at = now;
                    }
                }
                Err(CallError::Quota(_)) => prop_assert!(
                    workers > 1 || now.saturating_duration_since(last_success) >= STALL,
                    "stopped {:?} after the last success",
                    now.saturating_duration_since(last_success)
                ),
                Err(other) => prop_assert!(false, "a call failed otherwise: {other:?}"),
            }
            prop_assert!(
                now.saturating_duration_since(since) <= ONE_CALL,
                "one call took {:?}, {:?} after the call began or another's success",
                now.saturating_duration_since(started),
                now.saturating_duration_since(since)
            );
        }
        Ok(())
    };
    for outcome in futures::future::join_all((0..workers).map(|_| worker())).await {
        outcome?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn no_header_panics_the_rate_control_or_holds_a_request_past_the_stall_timeout(
        answers in prop_oneof![
            prop::collection::vec(answer(), 0..40),
            steady(),
        ],
        sharing in prop_oneof![Just(1u32), Just(4u32)],
        workers in 1usize..=4,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        runtime.block_on(run(answers, sharing, workers))?;
    }
}
