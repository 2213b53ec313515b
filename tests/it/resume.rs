//! Never paying twice: runs killed at random points and resumed, graceful
//! stops, re-runs over edited inputs, the job lock, and changed configuration.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use embedjob::simulate::SimConfig;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::support::{
    assert_complete, bin, corpus, edit_one_add_one_delete_one, expected_chunks, files_source,
    no_key, read_output, run, run_job, simulator, spawn_job, text, text_hash, wait,
    wait_for_billed, write_job, Edits, Rows, KEY,
};

fn slow_simulator(latency_ms: u64) -> SimConfig {
    SimConfig {
        latency_ms,
        ..SimConfig::default()
    }
}

fn signal(child: &Child, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

fn json(output: &Output) -> Value {
    let (stdout, stderr) = no_key(output, KEY);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

/// Asserts the exit code, showing stderr when it is not the one expected.
fn expect_exit(output: &Output, code: i32) {
    assert_eq!(output.status.code(), Some(code), "{}", text(&output.stderr));
}

#[tokio::test]
async fn a_job_killed_at_random_points_resumes_without_paying_twice() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 60);
    let expected = expected_chunks(&root);
    let sim = simulator(slow_simulator(30)).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let (max_inputs, concurrency) = (4u64, 4u64);
    let settings = [
        "--quiet",
        "--set",
        "backend.max_inputs_per_request=4",
        "--set",
        "backend.concurrency=4",
    ];
    let distinct: HashSet<&String> = expected.values().collect();
    let total_requests = (distinct.len() as u64).div_ceil(max_inputs);
    assert!(total_requests > 40, "{total_requests} requests");

    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut kills = 0u64;
    for _ in 0..4 {
        let billed = sim.ledger().billed_requests;
        // A point somewhere in the work still to do.
        let at = billed + rng.random_range(2..=10);
        let mut child = spawn_job(&job, &settings);
        if !wait_for_billed(&sim, &mut child, at).await {
            let output = wait(child).await;
            expect_exit(&output, 0);
            break;
        }
        child.kill().unwrap();
        let output = wait(child).await;
        assert_eq!(
            output.status.code(),
            None,
            "killed by a signal (seed {seed})"
        );
        kills += 1;
        assert!(
            dir.path().join("out/result.parquet.lock").exists(),
            "a killed run leaves its lock file behind"
        );
    }
    assert!(
        kills >= 2,
        "the job was killed mid-way at least twice (seed {seed})"
    );
    let before_resume = sim.ledger().billed_requests;

    let output = run_job(&job, &[&settings[..], &["--json"]].concat()).await;
    assert_eq!(
        output.status.code(),
        Some(0),
        "seed {seed}: {}",
        text(&output.stderr)
    );
    let summary = json(&output);
    assert!(summary["resumed"].as_u64().unwrap() > 0, "{summary}");
    assert!(
        sim.ledger().billed_requests - before_resume < total_requests,
        "the last run did not start over"
    );

    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    assert!(!dir.path().join("out/result.parquet.checkpoint").exists());
    assert!(!dir.path().join("out/result.parquet.lock").exists());

    let ledger = sim.ledger();
    let mut billed_twice = 0u64;
    for text in &distinct {
        let count = ledger.texts.get(&text_hash(text)).copied().unwrap_or(0);
        assert!(count >= 1, "every chunk was billed");
        billed_twice += count - 1;
    }
    // What a kill loses (docs/running.md): the texts paid for and not yet
    // committed, at most `concurrency` requests of `max_inputs` in flight plus
    // as many texts answered and waiting for their commit (no request is sent
    // while more wait). Each loss is billed once more by a later run.
    let lost_per_kill = 2 * concurrency * max_inputs;
    println!(
        "seed {seed}: {kills} kills, {billed_twice} of {} chunks billed twice \
         (at most {lost_per_kill} can be lost at a kill)",
        distinct.len(),
    );
    assert!(
        billed_twice <= kills * lost_per_kill,
        "seed {seed}: {billed_twice} chunks billed twice in {kills} kills"
    );
    // What the output says it cost is what was billed for the vectors it kept.
    let kept: u64 = rows.metadata["embedjob.usage.prompt_tokens"]
        .parse()
        .unwrap();
    assert!(kept <= ledger.prompt_tokens);
    assert_eq!(
        kept,
        rows.token_counts.iter().map(|&t| u64::from(t)).sum::<u64>()
            - duplicate_tokens(&rows.texts, &rows.token_counts),
        "usage recorded for each vector paid for, once"
    );
}

/// Tokens of rows whose text appears in an earlier row (billed once for all).
fn duplicate_tokens(texts: &[String], tokens: &[u32]) -> u64 {
    let mut seen = HashSet::new();
    texts
        .iter()
        .zip(tokens)
        .filter(|(t, _)| !seen.insert(t.as_str()))
        .map(|(_, &n)| u64::from(n))
        .sum()
}

#[tokio::test]
async fn a_signal_or_the_time_limit_stops_gracefully_and_the_next_run_completes() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 40);
    let expected = expected_chunks(&root);
    let sim = simulator(slow_simulator(40)).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let settings = ["--json", "--set", "backend.max_inputs_per_request=2"];

    let mut child = spawn_job(&job, &settings);
    assert!(wait_for_billed(&sim, &mut child, 5).await);
    signal(&child, "TERM");
    let output = wait(child).await;
    expect_exit(&output, 4);
    let first = json(&output);
    assert_eq!(first["stopped"], "stopped by SIGTERM");
    assert_eq!(first["exit_code"], 4);
    assert!(text(&output.stderr).contains("SIGTERM"));
    assert!(
        !dir.path().join("out/result.parquet").exists(),
        "no partial output"
    );
    assert!(dir
        .path()
        .join("out/result.parquet.checkpoint/manifest.json")
        .exists());
    // Requests in flight were waited for: everything billed was kept.
    let billed = sim.ledger();
    assert_eq!(first["requests"].as_u64(), Some(billed.billed_requests));
    assert_eq!(
        first["usage"]["prompt_tokens"].as_u64(),
        Some(billed.prompt_tokens)
    );

    let output = run_job(&job, &[&settings[..], &["--max-duration", "0.3s"]].concat()).await;
    expect_exit(&output, 4);
    let second = json(&output);
    assert!(
        second["stopped"].as_str().unwrap().contains("time limit"),
        "{second}"
    );
    let resumed = second["resumed"].as_u64().unwrap();
    assert!(
        resumed > 0 && resumed <= first["embedded"].as_u64().unwrap(),
        "{second}"
    );
    assert_eq!(second["resumed_usage"], first["usage"]);

    let output = run_job(&job, &settings).await;
    expect_exit(&output, 0);
    let last = json(&output);
    assert!(last["stopped"].is_null());
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    let ledger = sim.ledger();
    assert!(
        ledger.texts.values().all(|&n| n == 1),
        "no text was billed twice across the three runs"
    );
    let earlier = first["usage"]["prompt_tokens"].as_u64().unwrap()
        + second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        last["resumed_usage"]["prompt_tokens"].as_u64(),
        Some(earlier)
    );
    assert_eq!(
        rows.metadata["embedjob.usage.prompt_tokens"],
        ledger.prompt_tokens.to_string(),
        "the output's usage covers every run that built it"
    );
    assert_eq!(
        rows.metadata["embedjob.requests"],
        ledger.billed_requests.to_string()
    );
}

#[tokio::test]
async fn a_rerun_after_edits_sends_only_new_and_changed_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 24);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--json"]).await;
    expect_exit(&output, 0);
    let before = expected_chunks(&root);
    let first_ledger = sim.ledger();

    let Edits {
        after,
        to_send,
        unchanged,
        changed,
        added,
        removed,
    } = edit_one_add_one_delete_one(&root, &before);
    assert!(!to_send.is_empty());
    assert!(changed > 0 && added > 0 && removed > 0);

    // The estimate counts only what the re-run will send.
    sim.reset_ledger();
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .arg("estimate")
        .arg(&job)
        .arg("--json");
    let estimate = json(&run(command).await);
    assert_eq!(
        sim.ledger().embedding_requests,
        0,
        "an estimate embeds nothing"
    );
    assert_eq!(
        estimate["unchanged_chunks"].as_u64(),
        Some(unchanged),
        "{estimate}"
    );

    let output = run_job(&job, &["--json"]).await;
    expect_exit(&output, 0);
    let summary = json(&output);
    let ledger = sim.ledger();
    assert_eq!(
        estimate["requests"].as_u64(),
        Some(ledger.billed_requests),
        "{estimate}"
    );
    assert_eq!(
        estimate["tokens"].as_u64(),
        Some(ledger.prompt_tokens),
        "{estimate}"
    );
    assert_eq!(estimate["tokens"], summary["estimated_tokens"]);
    let sent: HashSet<String> = ledger.texts.keys().cloned().collect();
    assert_eq!(sent, to_send, "exactly the new and changed texts were sent");
    assert!(ledger.texts.values().all(|&n| n == 1));
    assert_eq!(summary["unchanged"].as_u64(), Some(unchanged), "{summary}");
    assert_eq!(summary["changed"].as_u64(), Some(changed), "{summary}");
    assert_eq!(summary["added"].as_u64(), Some(added), "{summary}");
    assert_eq!(summary["removed"].as_u64(), Some(removed), "{summary}");
    assert_eq!(summary["reused"].as_u64(), Some(unchanged));
    assert_eq!(
        summary["usage"]["prompt_tokens"].as_u64(),
        Some(ledger.prompt_tokens)
    );
    assert!(
        summary["tokens_saved"].as_u64().unwrap() > 0
            && summary["tokens_saved"].as_u64().unwrap() < first_ledger.prompt_tokens + 1
    );

    // The output equals what a fresh run over the new inputs writes.
    let incremental = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&incremental, &after, 1024);
    assert_equals_a_fresh_run(dir.path(), &job, &incremental).await;

    // A third run over unchanged inputs sends nothing.
    sim.reset_ledger();
    let output = run_job(&job, &["--json"]).await;
    assert_eq!(output.status.code(), Some(0));
    let summary = json(&output);
    assert_eq!(sim.ledger().embedding_requests, 0);
    assert_eq!(summary["unchanged"].as_u64(), Some(after.len() as u64));
    assert_eq!(summary["removed"], 0);
}

/// The output of an incremental run equals what a fresh run over the same
/// inputs writes.
async fn assert_equals_a_fresh_run(
    dir: &std::path::Path,
    job: &std::path::Path,
    incremental: &Rows,
) {
    let output = run_job(
        job,
        &[
            "--quiet",
            "--set",
            &format!(
                "output.path=\"{}\"",
                dir.join("fresh/result.parquet").display()
            ),
        ],
    )
    .await;
    expect_exit(&output, 0);
    let fresh = read_output(&dir.join("fresh/result.parquet"));
    assert_eq!(rows_by_id(incremental), rows_by_id(&fresh));
    for key in [
        "embedjob.model",
        "embedjob.dimensions",
        "embedjob.fingerprint",
    ] {
        assert_eq!(incremental.metadata[key], fresh.metadata[key], "{key}");
    }
}

fn rows_by_id(rows: &Rows) -> BTreeMap<String, (String, u32, Vec<u32>)> {
    rows.ids
        .iter()
        .zip(&rows.texts)
        .zip(&rows.token_counts)
        .zip(&rows.vectors)
        .map(|(((id, text), &tokens), vector)| {
            let bits = vector.iter().map(|v| v.to_bits()).collect();
            (id.clone(), (text.clone(), tokens, bits))
        })
        .collect()
}

#[tokio::test]
async fn identical_chunks_in_one_run_are_embedded_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    for copy in ["copy-a.md", "copy-b.md"] {
        std::fs::copy(root.join("doc004.md"), root.join(copy)).unwrap();
    }
    let expected = expected_chunks(&root);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(
        &job,
        &["--json", "--set", "backend.max_inputs_per_request=2"],
    )
    .await;
    expect_exit(&output, 0);
    let summary = json(&output);
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    let ledger = sim.ledger();
    assert!(ledger.texts.values().all(|&n| n == 1), "{:?}", ledger.texts);
    let distinct: HashSet<&String> = expected.values().collect();
    assert_eq!(ledger.texts.len(), distinct.len());
    assert_eq!(
        summary["deduplicated"].as_u64(),
        Some((expected.len() - distinct.len()) as u64)
    );
    assert!(summary["deduplicated"].as_u64().unwrap() >= 2);
}

#[tokio::test]
async fn overlapping_runs_are_refused_and_a_dead_runs_lock_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let sim = simulator(slow_simulator(40)).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let settings = ["--set", "backend.max_inputs_per_request=2"];

    let mut first = spawn_job(&job, &settings);
    assert!(wait_for_billed(&sim, &mut first, 2).await);
    let second = run_job(&job, &settings).await;
    let (_, stderr) = no_key(&second, KEY);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("another run of this job"), "{stderr}");
    assert!(stderr.contains(&format!("pid {}", first.id())), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let output = wait(first).await;
    expect_exit(&output, 0);
    assert!(!dir.path().join("out/result.parquet.lock").exists());

    // A run killed outright leaves its lock file; the next run takes it over.
    std::fs::write(
        root.join("doc999.md"),
        "Something new to embed.\n".repeat(40),
    )
    .unwrap();
    sim.reset_ledger();
    let mut killed = spawn_job(&job, &settings);
    assert!(wait_for_billed(&sim, &mut killed, 1).await);
    let pid = killed.id();
    killed.kill().unwrap();
    wait(killed).await;
    let lock = std::fs::read_to_string(dir.path().join("out/result.parquet.lock")).unwrap();
    assert!(lock.contains(&format!("pid {pid}")), "{lock}");
    let output = run_job(&job, &settings).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("taking over"), "{stderr}");
    assert!(!dir.path().join("out/result.parquet.lock").exists());
}

#[tokio::test]
async fn a_changed_configuration_is_refused_unless_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 20);
    let sim = simulator(slow_simulator(30)).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let settings = ["--quiet", "--set", "backend.max_inputs_per_request=2"];

    // An unfinished run leaves a checkpoint made with svc-embed-1.
    let output = run_job(&job, &[&settings[..], &["--max-duration", "0.2s"]].concat()).await;
    expect_exit(&output, 4);
    let checkpoint = dir.path().join("out/result.parquet.checkpoint");
    assert!(checkpoint.exists());

    sim.reset_ledger();
    let larger = [&settings[..], &["--set", "backend.model=svc-embed-1-l"]].concat();
    let output = run_job(&job, &larger).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("result.parquet.checkpoint"), "{stderr}");
    assert!(
        stderr.contains("backend.model: svc-embed-1 → svc-embed-1-l"),
        "{stderr}"
    );
    assert!(stderr.contains("--fresh"), "{stderr}");
    assert_eq!(
        sim.ledger().embedding_requests,
        0,
        "refused before any work"
    );
    assert!(checkpoint.exists(), "the checkpoint is kept");

    let output = run_job(
        &job,
        &[&larger[..], &["--fresh", "--max-duration", "0.2s"]].concat(),
    )
    .await;
    expect_exit(&output, 4);
    assert!(
        checkpoint.exists(),
        "a checkpoint under the new configuration"
    );
    // Once a fresh start has begun, the next run carries it on without --fresh.
    let output = run_job(&job, &[&larger[..], &["--json"]].concat()).await;
    expect_exit(&output, 0);
    let summary = json(&output);
    assert!(summary["resumed"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(
        summary["reused"], 0,
        "nothing from the old configuration's output"
    );
    assert_eq!(summary["dimensions"], 3072);
    assert!(!checkpoint.exists());

    // A finished output made with other chunking is not mixed with new vectors either.
    sim.reset_ledger();
    let rechunked = [&larger[..], &["--set", "chunking.max_tokens=48"]].concat();
    let output = run_job(&job, &rechunked).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("chunking.max_tokens: 64 → 48"), "{stderr}");
    assert_eq!(sim.ledger().embedding_requests, 0);
    let kept: HashMap<String, String> =
        read_output(&dir.path().join("out/result.parquet")).metadata;
    assert_eq!(
        kept["embedjob.dimensions"], "3072",
        "the output is untouched"
    );
}

#[tokio::test]
async fn a_budget_stops_the_run_and_a_larger_one_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let expected = expected_chunks(&root);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let price_per_token = 0.0001 / 1000.0;
    let distinct: HashSet<&String> = expected.values().collect();
    let full_tokens: u64 = {
        let chunker_tokens = read_tokens(&expected);
        distinct.iter().map(|t| chunker_tokens[*t]).sum()
    };
    let budget = full_tokens as f64 * price_per_token * 0.4;

    let output = run_job(
        &job,
        &[
            "--json",
            "--max-cost",
            &budget.to_string(),
            "--set",
            "backend.max_inputs_per_request=4",
        ],
    )
    .await;
    expect_exit(&output, 4);
    let first = json(&output);
    assert!(
        first["stopped"].as_str().unwrap().contains("budget"),
        "{first}"
    );
    let billed = sim.ledger().prompt_tokens as f64 * price_per_token;
    assert!(
        billed <= budget,
        "billed {billed} within the budget {budget}"
    );
    assert!(
        billed > budget * 0.5,
        "the budget was used, not left idle: {billed} of {budget}"
    );
    assert!(first["cost"].as_f64().unwrap() <= budget);
    assert!(!dir.path().join("out/result.parquet").exists());

    let output = run_job(&job, &["--json", "--set", "budget.max_cost=1.0"]).await;
    expect_exit(&output, 0);
    let second = json(&output);
    assert_eq!(second["resumed_usage"], first["usage"]);
    assert_complete(
        &read_output(&dir.path().join("out/result.parquet")),
        &expected,
        1024,
    );
    assert!(
        sim.ledger().texts.values().all(|&n| n == 1),
        "nothing embedded twice"
    );

    let output = run_job(&job, &["--set", "budget.max_cost=-1"]).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("budget.max_cost"), "{stderr}");
}

/// Each chunk text's local token count.
fn read_tokens(expected: &BTreeMap<String, String>) -> HashMap<String, u64> {
    let bpe = tiktoken_rs::cl100k_base().unwrap();
    expected
        .values()
        .map(|t| (t.clone(), bpe.encode_ordinary(t).len() as u64))
        .collect()
}

#[tokio::test]
async fn a_second_signal_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 10);
    // Responses take far longer than the test waits.
    let sim = simulator(slow_simulator(20_000)).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let mut child = spawn_job(&job, &["--json", "--set", "backend.timeout_seconds=60"]);
    let started = Instant::now();
    while sim.ledger().embedding_requests == 0 {
        assert!(child.try_wait().unwrap().is_none());
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no request was sent"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    signal(&child, "TERM");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first signal waits for the requests in flight"
    );
    let second = Instant::now();
    signal(&child, "TERM");
    let output = wait(child).await;
    expect_exit(&output, 4);
    assert!(
        second.elapsed() < Duration::from_secs(10),
        "the second signal did not wait for the responses: {:?}",
        second.elapsed()
    );
    assert!(text(&output.stderr).contains("again to stop at once"));
    assert_eq!(json(&output)["stopped"], "stopped by SIGTERM");
    assert_eq!(sim.ledger().billed_requests, 0);
}

/// Answers whose vectors failed a check were billed too: a run stopped
/// and resumed under such faults puts every one of them in its output's bill.
#[tokio::test]
async fn a_resumed_run_bills_the_discarded_answers_of_the_runs_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let expected = expected_chunks(&root);
    let sim = simulator(SimConfig {
        latency_ms: 30,
        faults: embedjob::simulate::Faults {
            seed: 3,
            rate_nan: 0.2,
            rate_wrong_dimensions: 0.2,
            ..embedjob::simulate::Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let settings = ["--json", "--set", "backend.max_inputs_per_request=3"];
    let mut child = spawn_job(&job, &settings);
    assert!(wait_for_billed(&sim, &mut child, 8).await);
    signal(&child, "TERM");
    let output = wait(child).await;
    expect_exit(&output, 4);
    let first = json(&output);
    let ledger = sim.ledger();
    assert_eq!(
        first["usage"]["prompt_tokens"].as_u64(),
        Some(ledger.prompt_tokens),
        "{first}"
    );

    let output = run_job(&job, &settings).await;
    expect_exit(&output, 0);
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    let ledger = sim.ledger();
    assert!(
        ledger.faults.values().sum::<u64>() >= 3,
        "{:?}",
        ledger.faults
    );
    let by_hash: HashMap<String, &String> = expected.values().map(|t| (text_hash(t), t)).collect();
    let discarded: u64 = ledger
        .texts
        .iter()
        .map(|(hash, &n)| (n - 1) * u64::from(embedjob::simulate::count_tokens(by_hash[hash])))
        .sum();
    assert_eq!(
        rows.metadata["embedjob.usage.prompt_tokens"],
        ledger.prompt_tokens.to_string()
    );
    assert_eq!(
        rows.metadata["embedjob.usage.discarded_tokens"],
        discarded.to_string()
    );
    assert_eq!(
        rows.metadata["embedjob.requests"],
        ledger.billed_requests.to_string()
    );
}
