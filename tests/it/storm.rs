//! Servers that lie or storm: every request refused while the headers claim
//! a whole quota, or refused with `Retry-After: 0`. The run sends no faster
//! than the floor of backoff allows, stops resumably (exit 4) at the stall
//! timeout, and a server that says nothing of a quota gets a full window of
//! requests from the start.

use std::process::Output;

use embedjob::simulate::{Faults, QuotaConfig, SimConfig};
use serde_json::Value;

use crate::support::{
    corpus, expected_chunks, files_source, no_key, run_job, simulator, write_job, KEY,
};

/// Requests in flight in these runs.
const CONCURRENCY: u64 = 8;

/// The stall timeout of these runs, in seconds.
const STALL_SECONDS: f64 = 2.0;

/// The floor after the k-th refusal in a row: 0.1 s doubled each time, at
/// most 30 s (docs/service.md).
fn floor_seconds(k: u32) -> f64 {
    (0.1 * 2f64.powi(k as i32 - 1)).min(30.0)
}

/// The most requests a run may send when every one is refused, from its
/// first send to the stall timeout `t`: the window of `c` goes before the
/// first refusal comes back; after it, one request at a time, the n-th only
/// once the floors 1..=n have passed since the first refusal, all before
/// `t` (the stall stops anything later).
fn storm_bound(c: u64, t: f64) -> u64 {
    let mut n = 0;
    let mut waited = 0.0;
    while waited + floor_seconds(n + 1) < t {
        n += 1;
        waited += floor_seconds(n);
    }
    c + u64::from(n)
}

fn summary(output: &Output) -> (Value, String) {
    let (stdout, stderr) = no_key(output, KEY);
    let summary = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("no summary ({e}): {stdout}\n{stderr}"));
    (summary, stderr)
}

/// Runs a 12-document job (one input a request, eight in flight, a stall
/// timeout of two seconds) against `config`, then the same job against a
/// well-behaved service, which finishes it. Returns the embeddings
/// requests the first service received.
async fn storm(name: &str, config: SimConfig) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let chunks = expected_chunks(&root).len() as u64;
    let sim = simulator(SimConfig {
        latency_ms: 5,
        ..config
    })
    .await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &format!("stall_timeout_seconds = {STALL_SECONDS}"),
    );
    let concurrency = format!("backend.concurrency={CONCURRENCY}");
    // The time limit only ends a run that the stall timeout did not stop.
    let settings = [
        "--json",
        "--max-duration",
        "20s",
        "--set",
        &concurrency,
        "--set",
        "backend.max_inputs_per_request=1",
    ];
    let output = run_job(&job, &settings).await;
    let (summary, stderr) = summary(&output);
    let requests = sim.ledger().embedding_requests;
    eprintln!(
        "{name}: {requests} requests, stopped: {}",
        summary["stopped"]
    );
    assert_eq!(output.status.code(), Some(4), "{name}: {stderr}");
    let stopped = summary["stopped"].as_str().unwrap_or_default();
    assert!(
        stopped.contains("stall_timeout_seconds") && stopped.contains("nothing succeeded"),
        "{name}: {stopped}"
    );
    let bound = storm_bound(CONCURRENCY, STALL_SECONDS);
    assert!(
        requests <= bound,
        "{name}: {requests} requests in a run stopped at the stall timeout, more than {bound}"
    );
    assert_eq!(sim.ledger().billed_requests, 0, "{name}: nothing succeeded");

    // Resumable: the same job against a service that answers finishes it.
    let fresh = simulator(SimConfig::default()).await;
    let base = format!("backend.base_url={}", fresh.base_url());
    let output = run_job(&job, &["--json", "--set", &base]).await;
    let (summary, stderr) = self::summary(&output);
    assert_eq!(output.status.code(), Some(0), "{name}: {stderr}");
    assert_eq!(summary["written"].as_u64(), Some(chunks), "{name}");
    requests
}

#[test]
fn the_bound_is_the_window_and_the_floors_that_fit_in_the_stall_timeout() {
    // 0.1 + 0.2 + 0.4 + 0.8 = 1.5 s fit in 2 s; the next floor (1.6 s) does not.
    assert_eq!(storm_bound(8, 2.0), 12);
    // 0.1 + ... + 3.2 = 6.3 s fit in 10 s; 6.4 s more do not.
    assert_eq!(storm_bound(8, 10.0), 14);
}

#[tokio::test]
async fn a_server_refusing_everything_while_its_headers_claim_a_whole_quota() {
    storm(
        "lying headers",
        SimConfig {
            faults: Faults {
                rate_lying_429: 1.0,
                ..Faults::default()
            },
            ..SimConfig::default()
        },
    )
    .await;
}

#[tokio::test]
async fn a_server_refusing_everything_with_retry_after_zero() {
    storm(
        "Retry-After: 0, no headers",
        SimConfig {
            faults: Faults {
                rate_429: 1.0,
                zero_retry_after: true,
                ..Faults::default()
            },
            ..SimConfig::default()
        },
    )
    .await;
    // The same under a quota whose headers show plenty left.
    storm(
        "Retry-After: 0 under a quota",
        SimConfig {
            faults: Faults {
                rate_429: 1.0,
                zero_retry_after: true,
                ..Faults::default()
            },
            quota: QuotaConfig {
                requests_per_minute: Some(100_000),
                ..QuotaConfig::default()
            },
            ..SimConfig::default()
        },
    )
    .await;
}

/// Half the requests refused with `Retry-After: 0`: the run waits a floor
/// after each refusal and finishes, every text billed once.
#[tokio::test]
async fn a_server_refusing_half_with_retry_after_zero_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    let chunks = expected_chunks(&root).len() as u64;
    let sim = simulator(SimConfig {
        latency_ms: 5,
        faults: Faults {
            seed: 7,
            rate_429: 0.5,
            zero_retry_after: true,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let settings = ["--json", "--set", "backend.max_inputs_per_request=1"];
    let output = run_job(&job, &settings).await;
    let (summary, stderr) = summary(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(summary["written"].as_u64(), Some(chunks));
    let ledger = sim.ledger();
    assert!(ledger.faults.get("429").copied().unwrap_or(0) > 0);
    assert_eq!(
        summary["throttled"].as_u64(),
        ledger.faults.get("429").copied()
    );
    assert!(
        ledger.texts.values().all(|&n| n == 1),
        "each text billed once"
    );
}

/// A server that says nothing of a quota gets the whole window at once: the
/// first answer takes a second to leave, and by then every request of the
/// window has arrived.
#[tokio::test]
async fn the_first_requests_go_together_when_nothing_says_to_wait() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let chunks = expected_chunks(&root).len() as u64;
    assert!(chunks >= CONCURRENCY, "a window's worth of chunks");
    let sim = simulator(SimConfig {
        latency_ms: 1000,
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let concurrency = format!("backend.concurrency={CONCURRENCY}");
    let settings = [
        "--json",
        "--set",
        &concurrency,
        "--set",
        "backend.max_inputs_per_request=1",
    ];
    let output = run_job(&job, &settings).await;
    let (summary, stderr) = summary(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(summary["written"].as_u64(), Some(chunks));
    assert_eq!(
        sim.ledger().in_flight_before_first_answer,
        CONCURRENCY,
        "the window went out before the first answer"
    );
    assert_eq!(
        summary["quota_wait_seconds"].as_f64(),
        Some(0.0),
        "nothing said to wait: {summary}"
    );
}
