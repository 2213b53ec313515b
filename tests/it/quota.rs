//! Runs against a service that enforces quotas as OpenAI documents them
//! (the simulator's quotas, in windows of a second or two): paced by the
//! headers, 429s waited out without using up retries, and a stall or a used
//! up quota stopping the run resumably.

use std::collections::HashSet;
use std::process::Output;
use std::time::Duration;

use embedjob::simulate::{QuotaConfig, SimConfig, Simulator};
use serde_json::Value;

use crate::support::{
    corpus, expected_chunks, files_source, no_key, run_job, simulator, write_job, KEY,
};

fn quota_sim(quota: QuotaConfig) -> SimConfig {
    SimConfig {
        latency_ms: 5,
        quota,
        ..SimConfig::default()
    }
}

fn summary(output: &Output) -> (Value, String) {
    let (stdout, stderr) = no_key(output, KEY);
    let summary = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("no summary ({e}): {stdout}\n{stderr}"));
    (summary, stderr)
}

/// The texts a simulator billed, by hash.
fn billed_texts(sim: &Simulator) -> HashSet<String> {
    sim.ledger().texts.into_keys().collect()
}

#[tokio::test]
async fn the_headers_keep_refusals_under_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 40);
    let chunks = expected_chunks(&root).len() as u64;
    // About 8 requests a second of a few hundred tokens each: the run takes
    // a few windows, and 16 requests in flight at once would blow through it.
    let sim = simulator(quota_sim(QuotaConfig {
        requests_per_minute: Some(8),
        tokens_per_minute: Some(3000),
        window: Duration::from_secs(1),
        ..QuotaConfig::default()
    }))
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(
        &job,
        &[
            "--json",
            "--set",
            "backend.concurrency=16",
            "--set",
            "backend.max_inputs_per_request=4",
            "--set",
            "backend.max_retries=0",
        ],
    )
    .await;
    let (summary, stderr) = summary(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(summary["written"].as_u64(), Some(chunks));
    let ledger = sim.ledger();
    let refused = ledger.refused_total();
    let requests = ledger.embedding_requests;
    assert!(requests >= 20, "enough requests to matter: {requests}");
    // A process alone starts with its whole window, before any header has
    // told it of a quota: of those 16, the 8 the window holds are admitted
    // and at most 16 - 8 are refused. After that the headers pace it.
    // Without pacing, 16 at a time against 8 a window would refuse most of
    // the rest; paced, none is refused on an idle machine (the benchmark's
    // quota section measures it), and a loaded one, which delays the answers
    // the pacing reads, stays under a fifth of them.
    let first_wave = 16 - 8;
    assert!(
        refused <= first_wave + (requests - 16) / 5,
        "{refused} of {requests} requests refused"
    );
    assert_eq!(summary["throttled"].as_u64(), Some(refused));
    assert!(
        summary["quota_wait_seconds"].as_f64().unwrap() > 0.5,
        "{summary}"
    );
    assert!(summary["requests_per_minute"].as_f64().unwrap() > 0.0);
    assert!(summary["tokens_per_minute"].as_f64().unwrap() > 0.0);
}

/// A request holds at most a hundredth of the token quota the headers
/// tell, unless filling that quota with such requests would take more than
/// half the request quota: where one request is a large part of the window,
/// processes that share it can only part it coarsely (docs/service.md,
/// "Rate").
#[tokio::test]
async fn requests_hold_a_hundredth_of_the_token_quota_unless_the_request_quota_needs_more() {
    // 12,800 tokens a window: a hundredth is 128, where the job's requests
    // hold up to 8 chunks of up to 64 tokens. With 40 requests a window,
    // requests of 128 would take 100 a window to fill it: they stay whole.
    for (requests_per_minute, cut) in [(None, true), (Some(1000), true), (Some(40), false)] {
        let dir = tempfile::tempdir().unwrap();
        let root = corpus(dir.path(), 40);
        let chunks = expected_chunks(&root).len() as u64;
        let sim = simulator(quota_sim(QuotaConfig {
            requests_per_minute,
            tokens_per_minute: Some(12_800),
            window: Duration::from_secs(1),
            ..QuotaConfig::default()
        }))
        .await;
        let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
        // One request in flight: the first is answered before the next goes.
        let output = run_job(&job, &["--json", "--set", "backend.concurrency=1"]).await;
        let (summary, stderr) = summary(&output);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        assert_eq!(summary["written"].as_u64(), Some(chunks));
        let ledger = sim.ledger();
        let (requests, tokens) = (ledger.billed_requests, ledger.prompt_tokens);
        let cut_to = &summary["learned_limits"]["quota_tokens_per_request"];
        if cut {
            // The service counts as the job does: 128 by either count.
            assert_eq!(cut_to.as_u64(), Some(128), "{summary}");
            // The first request went before any header told of the quota
            // (8 chunks of 64 tokens at most); every later one holds at
            // most 128, as no chunk is larger.
            let least = 1 + tokens.saturating_sub(8 * 64).div_ceil(128);
            assert!(
                requests >= least,
                "{requests} requests for {tokens} tokens: {:?}",
                ledger.billed_sizes
            );
        } else {
            assert!(cut_to.is_null(), "{summary}");
            assert!(
                requests * 128 < tokens,
                "{requests} requests for {tokens} tokens: {:?}",
                ledger.billed_sizes
            );
        }
        assert_eq!(ledger.refused_total(), 0, "{ledger:?}");
    }
}

#[tokio::test]
async fn refusals_never_use_up_max_retries() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let chunks = expected_chunks(&root).len() as u64;
    // No headers: the client learns of the quota from 429s alone, and
    // refused requests still count against it.
    let sim = simulator(quota_sim(QuotaConfig {
        requests_per_minute: Some(5),
        window: Duration::from_millis(500),
        headers: false,
        ..QuotaConfig::default()
    }))
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(
        &job,
        &[
            "--json",
            "--set",
            "backend.concurrency=8",
            "--set",
            "backend.max_inputs_per_request=1",
            "--set",
            "backend.max_retries=0",
        ],
    )
    .await;
    let (summary, stderr) = summary(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(summary["written"].as_u64(), Some(chunks));
    let ledger = sim.ledger();
    assert!(
        ledger.refused_total() > 0,
        "the quota refused some: {ledger:?}"
    );
    assert_eq!(summary["throttled"].as_u64(), Some(ledger.refused_total()));
    assert_eq!(summary["retries"].as_u64(), Some(0), "429s are not retries");
    assert_eq!(ledger.billed_requests, chunks, "each chunk paid for once");
}

/// Runs the job against `sim`, then again against a fresh service without
/// a quota: the second run finishes, and no text is billed by both.
async fn resumes_without_paying_twice(first: &Simulator, job: &std::path::Path, chunks: u64) {
    let fresh = simulator(SimConfig::default()).await;
    let base = format!("backend.base_url={}", fresh.base_url());
    let output = run_job(job, &["--json", "--set", &base]).await;
    let (summary, stderr) = summary(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(summary["written"].as_u64(), Some(chunks));
    let before = billed_texts(first);
    let after = billed_texts(&fresh);
    assert!(!before.is_empty(), "the first run paid for some vectors");
    assert!(
        before.is_disjoint(&after),
        "a text paid for by the stopped run was paid for again"
    );
    assert_eq!(summary["resumed"].as_u64(), Some(before.len() as u64));
}

#[tokio::test]
async fn a_stall_stops_the_run_resumably_and_the_next_run_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let chunks = expected_chunks(&root).len() as u64;
    // Three requests a minute: after three, nothing succeeds for 20 s.
    let sim = simulator(quota_sim(QuotaConfig {
        requests_per_minute: Some(3),
        ..QuotaConfig::default()
    }))
    .await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "stall_timeout_seconds = 2",
    );
    let started = std::time::Instant::now();
    let output = run_job(
        &job,
        &["--json", "--set", "backend.max_inputs_per_request=1"],
    )
    .await;
    let (summary, stderr) = summary(&output);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the stall stopped it"
    );
    let stopped = summary["stopped"].as_str().unwrap();
    assert!(
        stopped.contains("stall_timeout_seconds") && stopped.contains("nothing succeeded"),
        "{stopped}"
    );
    assert_eq!(summary["committed"].as_u64(), Some(3));
    resumes_without_paying_twice(&sim, &job, chunks).await;
}

#[tokio::test]
async fn insufficient_quota_stops_the_run_at_once_and_the_next_run_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let chunks = expected_chunks(&root).len() as u64;
    let sim = simulator(quota_sim(QuotaConfig {
        insufficient_after: Some(2),
        ..QuotaConfig::default()
    }))
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let started = std::time::Instant::now();
    let settings = [
        "--set",
        "backend.max_inputs_per_request=1",
        "--set",
        "backend.concurrency=1",
    ];
    let output = run_job(&job, &settings).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(4), "{stdout}\n{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(stdout.contains("insufficient_quota"), "{stdout}");
    assert_eq!(sim.ledger().refused.get("insufficient_quota"), Some(&1));
    resumes_without_paying_twice(&sim, &job, chunks).await;
}

#[tokio::test]
async fn the_simulator_sends_the_quota_headers_and_counts_refusals() {
    let sim = simulator(quota_sim(QuotaConfig {
        requests_per_minute: Some(2),
        tokens_per_minute: Some(1000),
        window: Duration::from_secs(60),
        ..QuotaConfig::default()
    }))
    .await;
    let http = reqwest::Client::new();
    let send = || {
        http.post(format!("{}/v1/embeddings", sim.base_url()))
            .bearer_auth(KEY)
            .json(&serde_json::json!({"model": "svc-embed-1", "input": ["hello there"]}))
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), 200);
    let header =
        |r: &reqwest::Response, name: &str| r.headers()[name].to_str().unwrap().to_string();
    assert_eq!(header(&first, "x-ratelimit-limit-requests"), "2");
    assert_eq!(header(&first, "x-ratelimit-remaining-requests"), "1");
    assert_eq!(header(&first, "x-ratelimit-reset-requests"), "30s");
    assert_eq!(header(&first, "x-ratelimit-limit-tokens"), "1000");
    assert_eq!(header(&first, "x-ratelimit-remaining-tokens"), "998");
    assert_eq!(header(&first, "x-ratelimit-reset-tokens"), "120ms");
    assert_eq!(send().await.unwrap().status(), 200);
    let refused = send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "x-ratelimit-remaining-requests"), "0");
    assert_eq!(header(&refused, "retry-after"), "60");
    let ms: u64 = header(&refused, "retry-after-ms").parse().unwrap();
    assert!((55_000..=60_000).contains(&ms), "{ms}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    let ledger = sim.ledger();
    assert_eq!(ledger.refused.get("requests"), Some(&1));
    assert_eq!(ledger.longest_refusal_run, 1);
    assert_eq!(ledger.billed_requests, 2);
}

/// A request split in two (the service takes at most two inputs) whose
/// second part met a used-up quota lost the first part's vectors, billed:
/// the next run paid for them again. Every part answered before a later one
/// failed now reaches the checkpoint.
#[tokio::test]
async fn regression_a_split_requests_first_part_was_dropped_when_a_later_part_hit_the_quota() {
    // Requests of four, then of three: the failing part is the last one or
    // the middle one of the split.
    for inputs in [4, 3] {
        let dir = tempfile::tempdir().unwrap();
        let root = corpus(dir.path(), 12);
        let chunks = expected_chunks(&root).len() as u64;
        // The request of `inputs` is refused as too large (not admitted), its
        // first part of at most 2 is admitted, and every later part is refused.
        let sim = simulator(SimConfig {
            max_inputs_per_request: Some(2),
            ..quota_sim(QuotaConfig {
                insufficient_after: Some(1),
                ..QuotaConfig::default()
            })
        })
        .await;
        let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
        let max = format!("backend.max_inputs_per_request={inputs}");
        let settings = ["--set", &max, "--set", "backend.concurrency=1"];
        let output = run_job(&job, &settings).await;
        let (stdout, stderr) = no_key(&output, KEY);
        assert_eq!(output.status.code(), Some(4), "{stdout}\n{stderr}");
        assert_eq!(
            billed_texts(&sim).len(),
            2,
            "one part of two texts paid for"
        );
        resumes_without_paying_twice(&sim, &job, chunks).await;
    }
}
