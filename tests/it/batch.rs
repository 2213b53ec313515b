//! Batch mode (`backend.mode = "batch"`) against the simulator's Batch API on
//! its compressed clock: a run submits, later runs collect; the output equals
//! sync mode's, billed at half price, never twice, through kills and faults.

use std::collections::HashMap;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use embedjob::simulate::{BatchConfig, SimConfig, Simulator};
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::support::{
    assert_complete, corpus, embedjob, expected_chunks, files_source, no_key, read_output, run_job,
    simulator, spawn_job, text, wait, write_job, Rows, KEY,
};

/// The simulator with batches that complete `millis` after their creation.
fn batch_sim(millis: u64, tweak: impl FnOnce(&mut BatchConfig)) -> SimConfig {
    let mut batches = BatchConfig {
        duration: Duration::from_millis(millis),
        ..BatchConfig::default()
    };
    tweak(&mut batches);
    SimConfig {
        batches,
        ..SimConfig::default()
    }
}

fn json(output: &Output) -> Value {
    let (stdout, stderr) = no_key(output, KEY);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

const BATCH: &str = "mode = \"batch\"";

/// Runs the job until it exits 0 or 3, at most `runs` times, `pause` apart;
/// the summaries of every run.
async fn run_until_done(job: &Path, runs: usize, pause: Duration) -> Vec<Value> {
    let mut summaries = Vec::new();
    for _ in 0..runs {
        let output = run_job(job, &["--quiet", "--json"]).await;
        let code = output.status.code();
        assert!(
            matches!(code, Some(0 | 3 | 4)),
            "exit {code:?}: {}",
            text(&output.stderr)
        );
        summaries.push(json(&output));
        if code != Some(4) {
            return summaries;
        }
        tokio::time::sleep(pause).await;
    }
    panic!("the job was not done after {runs} runs: {summaries:#?}");
}

fn vectors_by_id(rows: &Rows) -> HashMap<String, Vec<f32>> {
    rows.ids
        .iter()
        .cloned()
        .zip(rows.vectors.iter().cloned())
        .collect()
}

/// The output's billed prompt tokens and cost, from its `embedjob.*` keys.
fn billed(rows: &Rows) -> (u64, f64) {
    let tokens = rows.metadata["embedjob.usage.prompt_tokens"]
        .parse()
        .unwrap();
    let cost = rows.metadata["embedjob.cost"].parse().unwrap();
    (tokens, cost)
}

async fn sync_output(dir: &Path, root: &Path) -> Rows {
    std::fs::create_dir_all(dir).unwrap();
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir, &sim.base_url(), &files_source(root), "");
    let output = run_job(&job, &["--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    read_output(&dir.join("out/result.parquet"))
}

#[tokio::test]
async fn a_batch_job_submits_then_collects_the_sync_rows_at_half_price() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let expected = expected_chunks(&root);
    let sync = sync_output(&dir.path().join("sync"), &root).await;
    let sim = simulator(batch_sim(300, |_| {})).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), BATCH);

    let first = run_job(&job, &["--quiet", "--json"]).await;
    assert_eq!(first.status.code(), Some(4), "{}", text(&first.stderr));
    let first = json(&first);
    let pending = &first["batch"];
    assert!(pending["pending_batches"].as_u64().unwrap() >= 1, "{first}");
    assert_eq!(
        pending["pending_chunks"].as_u64().unwrap(),
        pending["submitted_chunks"].as_u64().unwrap()
    );
    let stopped = first["stopped"].as_str().unwrap();
    let chunks = pending["pending_chunks"].as_u64().unwrap();
    assert!(stopped.starts_with("waiting for "), "{stopped}");
    assert!(
        stopped.contains(&format!("({chunks} chunks, window ending by 20")),
        "{stopped}"
    );
    assert!(!dir.path().join("out/result.parquet").exists());

    // Each run either waits (exit 4) or collects; 300 ms batches need few.
    let summaries = run_until_done(&job, 40, Duration::from_millis(200)).await;
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    assert_eq!(vectors_by_id(&rows), vectors_by_id(&sync));

    let ledger = sim.ledger();
    assert_eq!(ledger.texts_billed_twice(), 0);
    assert_eq!(
        ledger.embedding_requests, 0,
        "batch mode sends no sync request"
    );
    let (tokens, cost) = billed(&rows);
    assert_eq!(tokens, ledger.batch_tokens);
    let (sync_tokens, sync_cost) = billed(&sync);
    assert_eq!(tokens, sync_tokens);
    // Half the price of the same tokens: the listing has no batch price.
    assert!(
        (cost - sync_cost / 2.0).abs() < 1e-12,
        "{cost} vs {sync_cost}"
    );
    let collected: u64 = summaries
        .iter()
        .map(|s| {
            s["batch"]["collected"]["usage"]["prompt_tokens"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(collected, ledger.batch_tokens);
    let price: f64 = rows.metadata["embedjob.batch.input_per_1k"]
        .parse()
        .unwrap();
    assert!((cost - tokens as f64 / 1000.0 * price).abs() < 1e-12);
    let mut inspect = crate::support::bin();
    inspect
        .arg("inspect")
        .arg(dir.path().join("out/result.parquet"));
    let shown = text(&crate::support::run(inspect).await.stdout);
    assert!(
        shown.contains(&format!("(batch mode, {price} per 1k tokens)")),
        "{shown}"
    );
    // The uploaded files are deleted once collected.
    assert!(!dir.path().join("out/result.parquet.checkpoint").exists());
}

#[tokio::test]
async fn run_wait_polls_until_the_job_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 10);
    let sim = simulator(batch_sim(300, |_| {})).await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &format!("{BATCH}\nbatch_poll_seconds = 1"),
    );
    let output = run_job(&job, &["--quiet", "--wait", "--max-duration", "60s"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected_chunks(&root), 1024);
    assert_eq!(sim.ledger().texts_billed_twice(), 0);
}

/// Kills the binary at seeded random moments while it submits and collects,
/// with the first batch creations answered by a dropped connection (created,
/// never recorded), then runs it to the end.
#[tokio::test]
async fn kills_and_lost_creations_never_pay_twice() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 40);
    let expected = expected_chunks(&root);
    let sync = sync_output(&dir.path().join("sync"), &root).await;
    let sim = simulator(batch_sim(400, |b| b.create_drop = 2)).await;
    // Small request files, so that there are many batches to be killed among.
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &format!("{BATCH}\nbatch_max_enqueued_tokens = 1500"),
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    for _ in 0..8 {
        let mut child = spawn_job(&job, &["--quiet"]);
        let delay = rng.random_range(5..120);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let _ = child.kill();
        let _ = wait(child).await;
    }
    run_until_done(&job, 60, Duration::from_millis(200)).await;
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    assert_eq!(vectors_by_id(&rows), vectors_by_id(&sync));
    let ledger = sim.ledger();
    assert!(ledger.batch_creates_dropped >= 1);
    // Without adoption, each lost creation's batch is created again: its texts billed twice.
    assert_eq!(
        ledger.texts_billed_twice(),
        0,
        "{} batches",
        ledger.batches_created
    );
    assert_eq!(billed(&rows).0, ledger.batch_tokens);
}

async fn ends_complete(tweak: impl FnOnce(&mut BatchConfig), extra: &str) -> Simulator {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 20);
    let expected = expected_chunks(&root);
    let sim = simulator(batch_sim(300, tweak)).await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &format!("{BATCH}\n{extra}"),
    );
    run_until_done(&job, 60, Duration::from_millis(200)).await;
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    let ledger = sim.ledger();
    assert_eq!(ledger.texts_billed_twice(), 0);
    assert_eq!(billed(&rows).0, ledger.batch_tokens);
    sim
}

#[tokio::test]
async fn failed_lines_go_again_until_the_output_is_complete() {
    let sim = ends_complete(|b| b.line_failures = 0.3, "").await;
    assert!(sim.ledger().batch_lines_failed > 0);
}

#[tokio::test]
async fn an_expired_batch_gives_its_partial_results_and_the_rest_goes_again() {
    let sim = ends_complete(
        |b| {
            b.expire_after = Some(Duration::from_millis(150));
            b.expire_first = Some(1);
        },
        "",
    )
    .await;
    assert!(sim.ledger().batch_lines_expired > 0);
}

#[tokio::test]
async fn a_batch_that_fails_validation_is_sent_again() {
    let sim = ends_complete(|b| b.fail_validation = 1, "").await;
    assert!(sim.ledger().batches_created >= 2);
}

#[tokio::test]
async fn the_enqueued_token_quota_is_learned_and_kept_under() {
    let sim = ends_complete(|b| b.enqueued_tokens = Some(1200), "").await;
    assert!(sim.ledger().batches_created >= 2);
}

#[tokio::test]
async fn a_text_the_service_refuses_is_quarantined_as_in_sync_mode() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let expected = expected_chunks(&root);
    let poison = "POISONED-TEXT";
    assert!(expected.values().any(|text| text.contains("document 4 ")));
    // Document 4's chunks carry the text the simulator refuses.
    let doc = root.join("doc004.md");
    let body = std::fs::read_to_string(&doc).unwrap();
    std::fs::write(
        &doc,
        body.replace("document 4 ", &format!("document 4 {poison} ")),
    )
    .unwrap();
    let expected = expected_chunks(&root);
    let poisoned: Vec<&String> = expected
        .iter()
        .filter(|(_, text)| text.contains(poison))
        .map(|(id, _)| id)
        .collect();
    assert!(!poisoned.is_empty());
    let config = SimConfig {
        poison: Some(poison.to_string()),
        ..batch_sim(300, |_| {})
    };
    let sim = simulator(config).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), BATCH);
    let summaries = run_until_done(&job, 60, Duration::from_millis(200)).await;
    let last = summaries.last().unwrap();
    assert_eq!(last["exit_code"], 3, "{last}");
    assert_eq!(last["quarantined"].as_u64().unwrap(), poisoned.len() as u64);
    let failures =
        std::fs::read_to_string(dir.path().join("out/result.parquet.failures.jsonl")).unwrap();
    for id in &poisoned {
        assert!(failures.contains(id.as_str()), "{id} not in {failures}");
    }
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_eq!(rows.ids.len(), expected.len() - poisoned.len());
    assert_eq!(sim.ledger().texts_billed_twice(), 0);
}

#[tokio::test]
async fn estimate_shows_the_batch_price_beside_the_sync_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 5);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), BATCH);
    let mut command = crate::support::bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .args(["estimate", job.to_str().unwrap(), "--json"]);
    let output = crate::support::run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let estimate = json(&output);
    let (batch, sync) = (
        estimate["input_per_1k"].as_f64().unwrap(),
        estimate["sync"]["input_per_1k"].as_f64().unwrap(),
    );
    // The simulator lists no batch price: half the synchronous one.
    assert!((batch - sync / 2.0).abs() < 1e-15, "{estimate}");
    let cost = estimate["cost"].as_f64().unwrap();
    assert!((estimate["sync"]["cost"].as_f64().unwrap() - 2.0 * cost).abs() < 1e-12);
    let mut command = crate::support::bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .args(["estimate", job.to_str().unwrap()]);
    let table = text(&crate::support::run(command).await.stdout);
    assert!(table.contains("in batch mode (sync: "), "{table}");
}

#[tokio::test]
async fn batch_mode_is_for_the_api_kind_and_its_keys_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 2);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "mode = \"batch\"\nbatch_completion_window = \"1h\"\nbatch_poll_seconds = 0\n\
         batch_max_enqueued_tokens = 0\nbatch_input_per_1k = -1.0",
    );
    let output = run_job(&job, &["--quiet"]).await;
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    for key in [
        "backend.batch_completion_window",
        "backend.batch_poll_seconds",
        "backend.batch_max_enqueued_tokens",
        "backend.batch_input_per_1k",
    ] {
        assert!(stderr.contains(key), "{key} not named in {stderr}");
    }
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "mode = \"later\"",
    );
    let stderr = text(&run_job(&job, &["--quiet"]).await.stderr);
    assert!(stderr.contains("backend.mode"), "{stderr}");
}

/// Each row's id and a digest of its vector's bits, read a batch of rows at a time.
fn vector_digests(path: &Path) -> HashMap<String, u64> {
    use arrow::array::AsArray;
    use std::hash::{Hash, Hasher};
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut digests = HashMap::new();
    for batch in reader {
        let batch = batch.unwrap();
        let ids = batch.column_by_name("id").unwrap().as_string::<i32>();
        let embeddings = batch
            .column_by_name("embedding")
            .unwrap()
            .as_fixed_size_list();
        for i in 0..batch.num_rows() {
            let values = embeddings.value(i);
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            for v in values
                .as_primitive::<arrow::datatypes::Float32Type>()
                .values()
            {
                v.to_bits().hash(&mut hasher);
            }
            digests.insert(ids.value(i).to_string(), hasher.finish());
        }
    }
    digests
}

/// The job at `path` with requests of 256 inputs, as a large job would send.
fn wide_requests(path: std::path::PathBuf) -> std::path::PathBuf {
    let job = std::fs::read_to_string(&path).unwrap();
    let job = job.replace("max_inputs_per_request = 8", "max_inputs_per_request = 256");
    std::fs::write(&path, job).unwrap();
    path
}

/// Runs `embedjob run JOB --json --quiet` under `/usr/bin/time -v`: the exit
/// code, the summary, wall seconds and peak RSS in MiB.
async fn timed_run(job: &Path) -> (Option<i32>, Value, f64, f64) {
    let mut command = std::process::Command::new("/usr/bin/time");
    command
        .arg("-v")
        .arg(env!("CARGO_BIN_EXE_embedjob"))
        .args(["run", job.to_str().unwrap(), "--json", "--quiet"])
        .env("EMBEDJOB_API_KEY", KEY);
    let started = std::time::Instant::now();
    let output = crate::support::run(command).await;
    let seconds = started.elapsed().as_secs_f64();
    let stderr = text(&output.stderr);
    let rss_kib: f64 = stderr
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS in {stderr}"));
    (
        output.status.code(),
        json(&output),
        seconds,
        rss_kib / 1024.0,
    )
}

/// A job of 100,000 chunks: sync and batch give the same rows, batch at
/// half the price; prints the wall times and peak memory (`--nocapture`),
/// which are figures to read, not bounds.
#[tokio::test]
async fn a_hundred_thousand_chunks_in_batch_mode_equal_sync_at_half_price() {
    const RECORDS: usize = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("records.jsonl");
    let mut lines = String::new();
    for i in 0..RECORDS {
        lines.push_str(&format!(
            "{{\"id\":\"r{i}\",\"text\":\"record {i} on vector indexes and batch windows\"}}\n"
        ));
    }
    std::fs::write(&input, lines).unwrap();
    let source = format!(
        "kind = \"jsonl\"\npath = \"{}\"\ntext_field = \"text\"\nid_field = \"id\"",
        input.display()
    );
    let sync_sim = simulator(SimConfig::default()).await;
    let sync_dir = dir.path().join("sync");
    std::fs::create_dir_all(&sync_dir).unwrap();
    let sync_job = wide_requests(write_job(&sync_dir, &sync_sim.base_url(), &source, ""));
    let (code, sync, sync_seconds, sync_rss) = timed_run(&sync_job).await;
    assert_eq!(code, Some(0), "{sync}");

    let sim = simulator(batch_sim(2000, |_| {})).await;
    let job = wide_requests(write_job(dir.path(), &sim.base_url(), &source, BATCH));
    let (code, submitted, submit_seconds, submit_rss) = timed_run(&job).await;
    assert_eq!(code, Some(4), "{submitted}");
    // 100,000 inputs, at most 50,000 a batch.
    assert!(submitted["batch"]["pending_batches"].as_u64().unwrap() >= 2);
    let client = crate::support::client(&sim.base_url());
    for _ in 0..600 {
        let page = client.batches(None, 100).await.unwrap();
        if page.data.iter().all(|b| b.status.is_terminal()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (code, collected, collect_seconds, collect_rss) = timed_run(&job).await;
    assert_eq!(code, Some(0), "{collected}");
    assert_eq!(collected["written"].as_u64().unwrap(), RECORDS as u64);
    let key = |path: &Path, name: &str| -> String {
        embedjob::parquet_io::read_key_values(path).unwrap()[name].clone()
    };
    let (sync_out, batch_out) = (
        sync_dir.join("out/result.parquet"),
        dir.path().join("out/result.parquet"),
    );
    // Rows in another order (sync writes answers as they come), the same vector for each id.
    assert_eq!(vector_digests(&sync_out), vector_digests(&batch_out));
    let ledger = sim.ledger();
    assert_eq!(ledger.texts_billed_twice(), 0);
    let tokens: u64 = key(&batch_out, "embedjob.usage.prompt_tokens")
        .parse()
        .unwrap();
    assert_eq!(tokens, ledger.batch_tokens);
    let sync_cost: f64 = key(&sync_out, "embedjob.cost").parse().unwrap();
    let batch_cost: f64 = key(&batch_out, "embedjob.cost").parse().unwrap();
    assert!((batch_cost - sync_cost / 2.0).abs() < 1e-9);
    eprintln!(
        "100k chunks: cost sync {sync_cost:.6} vs batch {batch_cost:.6}; \
         sync run {sync_seconds:.1}s ({sync_rss:.0} MiB peak); \
         submitting run {submit_seconds:.1}s ({submit_rss:.0} MiB); \
         collecting run {collect_seconds:.1}s ({collect_rss:.0} MiB); \
         {} batches, {} batch tokens",
        ledger.batches_created, ledger.batch_tokens
    );
}

/// `--max-cost` in batch mode: what a run collects, what is enqueued and what
/// it would submit stay within the budget, at the batch price; the rest is
/// held back and the run stops as the synchronous budget stop does.
#[tokio::test]
async fn the_budget_holds_back_batches_that_would_go_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let expected = expected_chunks(&root);
    let sim = simulator(batch_sim(300, |_| {})).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), BATCH);
    // The simulator's listing has no batch price: half its 0.0001 per 1k.
    let per_token = 0.0001 / 1000.0 / 2.0;
    let bpe = tiktoken_rs::cl100k_base().unwrap();
    let distinct: std::collections::HashSet<&String> = expected.values().collect();
    let full_tokens: usize = distinct.iter().map(|t| bpe.encode_ordinary(t).len()).sum();
    let budget = full_tokens as f64 * per_token * 0.4;
    let max_cost = budget.to_string();

    let first = run_job(&job, &["--quiet", "--json", "--max-cost", &max_cost]).await;
    assert_eq!(first.status.code(), Some(4), "{}", text(&first.stderr));
    let first = json(&first);
    let stopped = first["stopped"].as_str().unwrap();
    assert!(
        stopped.starts_with("stopped at the budget of "),
        "{stopped}"
    );
    assert!(stopped.contains("waiting for "), "{stopped}");
    assert!(first["batch"]["submitted_chunks"].as_u64().unwrap() > 0);
    assert!(first["batch"]["held_back_chunks"].as_u64().unwrap() > 0);

    // Waiting collects what the first run enqueued (at most the budget, as
    // reckoned before it was sent) and then has no budget left to send more.
    let output = run_job(
        &job,
        &[
            "--quiet",
            "--json",
            "--wait",
            "--max-duration",
            "60s",
            "--max-cost",
            &max_cost,
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    let waited = json(&output);
    assert!(
        waited["stopped"].as_str().unwrap().contains("budget"),
        "{waited}"
    );
    let billed = sim.ledger().batch_tokens as f64 * per_token;
    assert!(billed <= budget, "billed {billed} within {budget}");
    // Lines of at most 8 chunks (the job's): what is left unused is less than one line.
    assert!(
        billed > budget * 0.5,
        "the budget was used: {billed} of {budget}"
    );
    assert!(!dir.path().join("out/result.parquet").exists());

    run_until_done(&job, 60, Duration::from_millis(200)).await;
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    assert_eq!(sim.ledger().texts_billed_twice(), 0);
}

/// A job whose batches an earlier run collected, finished by a synchronous
/// run (`backend.mode` is not part of what a vector is made under): the
/// output prices the collected vectors at the batch price, the rest at the
/// synchronous one. Before, the run's price went for every token.
#[tokio::test]
async fn a_synchronous_run_prices_what_batches_paid_for_at_the_batch_price() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let expected = expected_chunks(&root);
    let sim = simulator(batch_sim(300, |_| {})).await;
    let batch = format!("{BATCH}\nbatch_poll_seconds = 1");
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), &batch);
    // A budget that lets some of the lines go (as in the test before), and
    // waited on until they are collected.
    let bpe = tiktoken_rs::cl100k_base().unwrap();
    let distinct: std::collections::HashSet<&String> = expected.values().collect();
    let full_tokens: usize = distinct.iter().map(|t| bpe.encode_ordinary(t).len()).sum();
    let max_cost = (full_tokens as f64 * 0.00005 / 1000.0 * 0.4).to_string();
    let args = ["--quiet", "--json", "--max-cost", &max_cost];
    let first = run_job(&job, &args).await;
    assert_eq!(first.status.code(), Some(4), "{}", text(&first.stderr));
    let waited = run_job(
        &job,
        &[&args[..], &["--wait", "--max-duration", "60s"]].concat(),
    )
    .await;
    assert_eq!(waited.status.code(), Some(4), "{}", text(&waited.stderr));
    let collected = sim.ledger().batch_tokens;
    assert!(collected > 0, "{}", json(&waited));

    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    let ledger = sim.ledger();
    assert_eq!(ledger.batch_tokens, collected, "no batch after the switch");
    assert_eq!(ledger.texts_billed_twice(), 0);
    let synchronous = ledger.prompt_tokens - collected;
    assert!(synchronous > 0);
    // The simulator lists 0.0001 per 1k tokens and no batch price: half that.
    #[allow(clippy::cast_precision_loss)]
    let expected = (synchronous as f64 * 0.0001 + collected as f64 * 0.00005) / 1000.0;
    let (tokens, cost) = billed(&rows);
    assert_eq!(tokens, ledger.prompt_tokens);
    assert!(
        (cost - expected).abs() < 1e-15,
        "{cost}, not {expected}: {synchronous} synchronous tokens, {collected} in batches"
    );
}

/// In batch mode the budget prices the lines it would submit at the ratio
/// of billed to local tokens the job's last run recorded: the Batch API
/// bills its own count, and lines priced at the local count would be
/// submitted over a budget that covers only that.
#[tokio::test]
async fn the_budget_prices_lines_at_the_ratio_the_last_run_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let sim = simulator(SimConfig {
        billing: embedjob::simulate::Billing {
            count: embedjob::simulate::TokenCount::Bytes,
            factor: 3.0,
        },
        ..batch_sim(300, |_| {})
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), BATCH);
    run_until_done(&job, 60, Duration::from_millis(200)).await;
    let rows = read_output(&dir.path().join("out/result.parquet"));
    let ratio: f64 = rows.metadata["embedjob.billed_token_ratio"]
        .parse()
        .unwrap();
    assert!(
        ratio > 2.0,
        "the service bills more than the local count: {ratio}"
    );

    for i in 0..3 {
        std::fs::write(
            root.join(format!("added{i}.md")),
            format!("Document {i} added after the first run, about batches and their budget."),
        )
        .unwrap();
    }
    let estimate = json(&embedjob(&["estimate", job.to_str().unwrap(), "--json"]).await);
    let local = estimate["tokens"].as_f64().unwrap();
    assert!(local > 0.0, "{estimate}");
    let billed_before = sim.ledger().batch_tokens;
    // The simulator's listing has no batch price: half its 0.0001 per 1k.
    let per_token = 0.0001 / 1000.0 / 2.0;
    // Enough for the new lines by the local count, not as the service bills them.
    let max_cost = (local * per_token * 1.5).to_string();
    let output = run_job(&job, &["--quiet", "--json", "--max-cost", &max_cost]).await;
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    let summary = json(&output);
    assert!(
        summary["stopped"].as_str().unwrap().contains("budget"),
        "{summary}"
    );
    assert_eq!(
        summary["batch"]["submitted_chunks"].as_u64(),
        Some(0),
        "{summary}"
    );
    assert!(summary["batch"]["held_back_chunks"].as_u64().unwrap() > 0);
    assert_eq!(sim.ledger().batch_tokens, billed_before);
}

/// A batch job of chunks of 64 tokens at 0.1 per 1000 (0.05 in batches)
/// for a server that lists no window and truncates at 256: the window
/// probe goes first, and may send 12 texts of 80 tokens, 0.096. The job's
/// file, and the simulator.
async fn probed_job(dir: &Path) -> (std::path::PathBuf, Simulator) {
    let root = corpus(dir, 36);
    let sim = simulator(SimConfig {
        bare_listing: true,
        window: Some(embedjob::simulate::ServerWindow::parse("256:truncate").unwrap()),
        ..batch_sim(300, |_| {})
    })
    .await;
    let extra = format!("{BATCH}\ninput_per_1k = 0.1");
    (
        write_job(dir, &sim.base_url(), &files_source(&root), &extra),
        sim,
    )
}

/// [`probed_job`] run under a budget of `max_cost`: it stops (exit 4); its
/// summary, and the simulator.
async fn probed_in_batch_mode(dir: &Path, max_cost: &str) -> (Value, Simulator) {
    let (job, sim) = probed_job(dir).await;
    let output = run_job(&job, &["--quiet", "--json", "--max-cost", max_cost]).await;
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    (json(&output), sim)
}

/// In batch mode too, a window probe that could cost more than the budget
/// is not sent, and the run submits nothing: lines of chunks cut without
/// the window would be read only in part by a server that truncates.
#[tokio::test]
async fn a_probe_over_the_budget_holds_back_every_line() {
    let dir = tempfile::tempdir().unwrap();
    let (summary, sim) = probed_in_batch_mode(dir.path(), "0.03").await;
    let stopped = summary["stopped"].as_str().unwrap();
    assert!(
        stopped.starts_with("stopped at the budget of 0.03: the probe for model svc-embed-1's"),
        "{stopped}"
    );
    assert_eq!(
        summary["batch"]["submitted_chunks"].as_u64(),
        Some(0),
        "{summary}"
    );
    let ledger = sim.ledger();
    assert_eq!(ledger.embedding_requests, 0, "no probe");
    assert_eq!(ledger.batches_created, 0, "no batch");
}

/// The window probe's requests are synchronous: their worst case is priced
/// at the synchronous price, and what they were billed counts against the
/// budget before any line does. Priced at the batch price, a probe that
/// could cost 0.056 was sent under a budget of 0.03; and lines were
/// submitted up to the whole budget, the probe's bill left out; and the
/// summary's cost priced them at half what they cost.
#[tokio::test]
async fn the_window_probe_is_priced_and_counted_as_synchronous_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (summary, sim) = probed_in_batch_mode(dir.path(), "0.1").await;
    let probe = summary["learned_limits"]["window_probe"]["tokens"]
        .as_u64()
        .unwrap();
    // The ledger's prompt tokens take in the lines of a batch submitted
    // within the budget as it completes, which may be before it is read.
    let ledger = sim.ledger();
    assert_eq!(
        probe,
        ledger.prompt_tokens - ledger.batch_tokens,
        "{summary}"
    );
    let stopped = summary["stopped"].as_str().unwrap();
    #[allow(clippy::cast_precision_loss)]
    let billed = format!("{:.6} billed", probe as f64 / 1000.0 * 0.1);
    assert!(
        stopped.starts_with(&format!("stopped at the budget of 0.1: {billed}")),
        "{stopped}"
    );
    // The summary's cost prices them so too, not at the batch price.
    assert_eq!(summary["usage"]["prompt_tokens"].as_u64(), Some(probe));
    let cost = summary["cost"].as_f64().unwrap();
    #[allow(clippy::cast_precision_loss)]
    let synchronous = probe as f64 / 1000.0 * 0.1;
    assert!(
        (cost - synchronous).abs() < 1e-12,
        "{cost} for {probe} tokens"
    );
}

/// The output of a job finished over several runs prices every token as it
/// was billed: the window probe's (synchronous requests, in whichever run
/// sent them) at the synchronous price, the collected batches' at the batch
/// price. The checkpoint's parts tell which: a part a batch paid for names
/// it. Before, the first run's probe, which the checkpoint carries to the
/// run that finishes the output, was priced at the batch price there. The
/// probe found the server reads its text whole, and the checkpoint records
/// that too: the later runs do not probe again (before, each did).
#[tokio::test]
async fn a_finished_output_prices_every_runs_probe_at_the_synchronous_price() {
    let dir = tempfile::tempdir().unwrap();
    let (job, sim) = probed_job(dir.path()).await;
    let summaries = run_until_done(&job, 60, Duration::from_millis(200)).await;
    assert!(summaries.len() >= 2, "{summaries:#?}");
    let first = &summaries[0]["learned_limits"]["window_probe"]["tokens"];
    assert!(first.as_u64().is_some_and(|t| t > 0), "{summaries:#?}");
    for later in &summaries[1..] {
        assert_eq!(
            later["learned_limits"]["window_probe"],
            Value::Null,
            "{later}"
        );
    }
    let ledger = sim.ledger();
    assert!(ledger.batch_tokens > 0);
    // The ledger's prompt tokens are all it billed, batches' lines too.
    let synchronous = ledger.prompt_tokens - ledger.batch_tokens;
    let (tokens, cost) = billed(&read_output(&dir.path().join("out/result.parquet")));
    assert_eq!(tokens, ledger.prompt_tokens);
    #[allow(clippy::cast_precision_loss)]
    let expected = synchronous as f64 / 1000.0 * 0.1 + ledger.batch_tokens as f64 / 1000.0 * 0.05;
    assert!(
        (cost - expected).abs() < 1e-9,
        "{cost}, not {expected}: {synchronous} synchronous tokens, {} in batches",
        ledger.batch_tokens
    );
}

/// The request files the simulator keeps with `purpose=batch`, by name.
async fn batch_files(sim: &Simulator) -> Vec<String> {
    let config =
        embedjob::client::ClientConfig::new(sim.base_url(), embedjob::client::ApiKey::new(KEY));
    let client = embedjob::client::Client::new(config).unwrap();
    let mut names = Vec::new();
    let mut after: Option<String> = None;
    // Bounded: far more pages than the job uploads files.
    for _ in 0..100 {
        let page = client.files("batch", after.as_deref(), 2).await.unwrap();
        names.extend(page.data.into_iter().map(|f| f.filename));
        if !page.has_more {
            return names;
        }
        after = page.last_id;
    }
    panic!("the listing did not end: {names:?}");
}

/// Uploads stored whose answer is lost (and runs killed at random, some of
/// them between an upload and its record) leave no request file behind: the
/// job finds its own by name and deletes it before uploading the part again.
#[tokio::test]
async fn a_lost_upload_leaves_no_file_on_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let expected = expected_chunks(&root);
    let sim = simulator(batch_sim(300, |b| b.upload_drop = 3)).await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &format!("{BATCH}\nbatch_max_enqueued_tokens = 1500"),
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    for _ in 0..4 {
        let mut child = spawn_job(&job, &["--quiet"]);
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..120))).await;
        let _ = child.kill();
        let _ = wait(child).await;
    }
    run_until_done(&job, 60, Duration::from_millis(200)).await;
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    let ledger = sim.ledger();
    assert_eq!(ledger.batch_uploads_dropped, 3);
    assert_eq!(ledger.texts_billed_twice(), 0);
    // Collected files are deleted, and so are the lost uploads.
    let left = batch_files(&sim).await;
    assert!(left.is_empty(), "orphans on the service: {left:?}");
}

/// The collector's bound on an output line follows from the part: its
/// largest request's inputs times a vector of the job's dimensions written as
/// the widest JSON floats (48 bytes a value, 256 an item), plus 64 KiB for the
/// rest. With 8 inputs a line (the job's `max_inputs_per_request`) of 1,024
/// dimensions that is 8 × (1,024 × 48 + 256) + 65,536 = 460,800 bytes: a 1 MB
/// line is refused, naming it, rather than buffered (the bound of 2,048 inputs
/// of 3,072 floats let lines of 300 MB through).
#[tokio::test]
async fn an_output_line_longer_than_its_request_can_answer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 4);
    let sim = simulator(batch_sim(300, |b| b.line_padding = 1_000_000)).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), BATCH);
    let first = run_job(&job, &["--quiet"]).await;
    assert_eq!(first.status.code(), Some(4), "{}", text(&first.stderr));
    // Each run either waits (exit 4) or collects; 300 ms batches need few.
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let output = run_job(&job, &["--quiet"]).await;
        let (_, stderr) = no_key(&output, KEY);
        if output.status.code() == Some(4) {
            continue;
        }
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("line 1 of file "), "{stderr}");
        assert!(stderr.contains("is longer than 460800 bytes"), "{stderr}");
        assert!(!dir.path().join("out/result.parquet").exists());
        return;
    }
    panic!("the batch was never collected");
}
