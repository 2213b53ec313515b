//! Whole jobs through the binary against the simulator: faults, splitting,
//! quarantine, bad input, config errors, and the output's contents.

use std::path::Path;

use arrow::datatypes::DataType;
use embedjob::simulate::{Faults, KeySpec, SimConfig, Simulator};
use serde_json::Value;

use crate::support::{
    assert_complete, bin, corpus, expected_chunks, files_source, mixed_corpus, no_key, path_arg,
    read_output, run, run_job, simulator, text, write_cost_job_over, write_job, KEY,
};

fn ledger_total(sim: &Simulator) -> (u64, u64) {
    let ledger = sim.ledger();
    (ledger.prompt_tokens, ledger.billed_requests)
}

#[tokio::test]
async fn a_job_survives_a_fault_mix_and_matches_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 40);
    let sim = simulator(SimConfig {
        faults: Faults {
            seed: 11,
            rate_429: 0.05,
            retry_after_seconds: 1,
            rate_500: 0.06,
            rate_503: 0.04,
            rate_drop: 0.06,
            rate_truncate: 0.06,
            rate_shuffle: 0.15,
            rate_wrong_dimensions: 0.06,
            rate_nan: 0.06,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(
        &job,
        &["--json", "--set", "backend.max_inputs_per_request=4"],
    )
    .await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).expect("one JSON object");

    let expected = expected_chunks(&root);
    assert!(
        expected.len() > 100,
        "a corpus of some size: {}",
        expected.len()
    );
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);
    assert!(
        matches!(rows.embedding_type, DataType::FixedSizeList(ref f, 1024) if f.data_type() == &DataType::Float32)
    );

    let ledger = sim.ledger();
    assert!(
        ledger.faults.len() >= 6,
        "the mix injected most kinds of fault: {:?} in {} requests",
        ledger.faults,
        ledger.embedding_requests
    );
    let (tokens, requests) = ledger_total(&sim);
    assert_eq!(summary["usage"]["prompt_tokens"].as_u64(), Some(tokens));
    assert_eq!(summary["requests"].as_u64(), Some(requests));
    assert_eq!(
        rows.metadata["embedjob.usage.prompt_tokens"],
        tokens.to_string()
    );
    assert_eq!(rows.metadata["embedjob.requests"], requests.to_string());
    assert_eq!(rows.metadata["embedjob.dimensions"], "1024");
    assert_eq!(rows.metadata["embedjob.model"], "svc-embed-1");
    let cost: f64 = rows.metadata["embedjob.cost"].parse().unwrap();
    assert!((cost - tokens as f64 / 1000.0 * 0.0001).abs() < 1e-12);
    assert!(summary["retries"].as_u64().unwrap() > 0);
    assert!(
        summary["invalid_responses"].as_u64().unwrap() > 0,
        "{summary}"
    );
    // Invalid answers were billed too; less what paid for vectors discarded,
    // local token counts equal what the service billed (both cl100k).
    let discarded = summary["discarded_tokens"].as_u64().unwrap();
    assert!(discarded > 0, "{summary}");
    assert_eq!(
        rows.metadata["embedjob.usage.discarded_tokens"],
        discarded.to_string()
    );
    assert_eq!(
        rows.token_counts.iter().map(|&t| u64::from(t)).sum::<u64>(),
        tokens - discarded
    );
    assert_eq!(rows.metadata["embedjob.billed_token_ratio"], "1");
    // Every chunk was billed; only identical texts may be billed together.
    for text in expected.values() {
        let hash = hex::encode(embedjob::types::content_hash(text));
        assert!(ledger.texts.get(&hash).copied().unwrap_or(0) >= 1);
    }
    let summary_file: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out/result.parquet.summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary_file, summary);
    assert!(!dir
        .path()
        .join("out/result.parquet.failures.jsonl")
        .exists());
}

#[tokio::test]
async fn too_large_requests_are_split_and_a_lone_refused_chunk_is_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    std::fs::write(
        root.join("poisoned.md"),
        "This chunk carries POISON-PILL and is refused.",
    )
    .unwrap();
    let sim = simulator(SimConfig {
        max_inputs_per_request: Some(3),
        too_large_status: 413,
        poison: Some("POISON-PILL".to_string()),
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--json"]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["quarantined"], 1);

    let mut expected = expected_chunks(&root);
    let poisoned: Vec<String> = expected
        .iter()
        .filter(|(_, text)| text.contains("POISON-PILL"))
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(poisoned, vec!["poisoned.md#0".to_string()]);
    expected.remove("poisoned.md#0");
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);

    let failures =
        std::fs::read_to_string(dir.path().join("out/result.parquet.failures.jsonl")).unwrap();
    let lines: Vec<Value> = failures
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["id"], "poisoned.md#0");
    assert!(
        lines[0]["reason"]
            .as_str()
            .unwrap()
            .contains("maximum context length"),
        "{}",
        lines[0]
    );
    assert!(sim.ledger().faults["too_large"] > 0);
}

#[tokio::test]
async fn permanent_refusals_stop_before_work_with_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 3);
    let sim = simulator(SimConfig {
        keys: vec![KeySpec {
            key: KEY.to_string(),
            models: Some(vec!["svc-embed-1-l".to_string()]),
        }],
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");

    // The key cannot see svc-embed-1: an unknown model.
    let output = run_job(&job, &[]).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown model") && stderr.contains("svc-embed-1"),
        "{stderr}"
    );

    // A refused key.
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", "sk-refused-SECRET")
        .arg("run")
        .arg(&job);
    let output = run(command).await;
    let (_, stderr) = no_key(&output, "sk-refused-SECRET");
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("refused the API key"), "{stderr}");

    // Too many tokens for the model's window.
    let output = run_job(
        &job,
        &[
            "--set",
            "backend.model=svc-embed-1-l",
            "--set",
            "chunking.max_tokens=9000",
            "--set",
            "backend.max_tokens_per_request=90000",
        ],
    )
    .await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("context window"), "{stderr}");

    assert!(!dir.path().join("out").join("result.parquet").exists());
    assert_eq!(sim.ledger().embedding_requests, 0, "nothing was sent");
}

#[tokio::test]
async fn config_problems_are_reported_together() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        r#"
[source]
kind = "jsonl"
glob = "x"
[chunking]
max_tokens = 100
overlap_tokens = 100
[backend]
kind = "api"
model = "svc-embed-1"
dimensions = 3072
[output]
path = "out.parquet"
"#,
    )
    .unwrap();
    let mut command = bin();
    command
        .arg("run")
        .arg(&job)
        .args(["--set", "backend.concurrency=0"]);
    let output = run(command).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for needle in [
        "source.glob",
        "source.path",
        "source.text_field",
        "overlap_tokens",
        "backend.base_url",
        "backend.dimensions",
        "backend.concurrency",
        "EMBEDJOB_API_KEY",
        "job.toml",
    ] {
        assert!(stderr.contains(needle), "{needle} missing from:\n{stderr}");
    }
}

#[tokio::test]
async fn the_output_reads_in_pyarrow_and_duckdb() {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-python (scripts/test does)",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 5);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--set", "backend.model=svc-embed-1-l", "--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        output.stderr.is_empty(),
        "--quiet: {}",
        text(&output.stderr)
    );
    let check = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/check_output.py");
    let mut command = std::process::Command::new(python);
    command
        .arg(check)
        .arg(dir.path().join("out/result.parquet"))
        .arg("3072");
    let output = run(command).await;
    assert!(
        output.status.success(),
        "{}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    assert!(
        text(&output.stdout).contains("pyarrow ok") && text(&output.stdout).contains("duckdb ok")
    );
}

/// A run that starts faster than the service allows settles under the limit:
/// 429s shrink the window of requests in flight instead of being hammered.
#[tokio::test]
async fn a_run_that_starts_too_fast_converges_under_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let sim = simulator(SimConfig {
        max_concurrent_requests: Some(2),
        latency_ms: 40,
        faults: Faults {
            retry_after_seconds: 1,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(
        &job,
        &[
            "--json",
            "--set",
            "backend.concurrency=16",
            "--set",
            "backend.max_inputs_per_request=2",
        ],
    )
    .await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    let ledger = sim.ledger();
    let refused = ledger.faults.get("concurrency_limit").copied().unwrap_or(0);
    let served = ledger.billed_requests;
    assert!(served >= 40, "enough requests to converge: {served}");
    // Sending 16 at a time against a limit of 2 would refuse 7 of every 8
    // attempts; an adaptive window pays for its first waves, then settles.
    assert!(
        refused < served,
        "{refused} refusals for {served} requests served: the window did not adapt"
    );
    assert_eq!(summary["throttled"].as_u64(), Some(refused));
    assert_eq!(
        summary["written"].as_u64(),
        Some(expected_chunks(&root).len() as u64)
    );
}

#[tokio::test]
async fn progress_lines_go_to_stderr_unless_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    let sim = simulator(SimConfig {
        latency_ms: 100,
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let settings = [
        "--json",
        "--set",
        "pipeline.progress_seconds=0.2",
        "--set",
        "backend.concurrency=1",
        "--set",
        "backend.max_inputs_per_request=1",
    ];
    let output = run_job(&job, &settings).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.lines().filter(|l| l.contains("chunks done")).count() >= 2,
        "{stderr}"
    );
    let summary: Value =
        serde_json::from_slice(&output.stdout).expect("progress never reaches stdout");
    assert_eq!(summary["exit_code"], 0);

    let mut quiet = settings.to_vec();
    quiet.push("--quiet");
    let output = run_job(&job, &quiet).await;
    assert_eq!(output.status.code(), Some(0));
    assert!(
        output.stderr.is_empty(),
        "--quiet: {}",
        text(&output.stderr)
    );
}

#[tokio::test]
async fn requests_per_minute_paces_the_requests() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let started = std::time::Instant::now();
    // 240 a minute is 4 a second with a burst of 4: twelve requests need at least two seconds.
    let output = run_job(
        &job,
        &[
            "--set",
            "backend.requests_per_minute=240",
            "--set",
            "backend.max_inputs_per_request=1",
        ],
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let requests = sim.ledger().billed_requests;
    assert!(requests >= 12, "{requests} requests");
    let least = std::time::Duration::from_secs_f64((requests - 4) as f64 / 4.0);
    assert!(
        elapsed >= least,
        "{requests} requests in {elapsed:?}, the limit allows no faster than {least:?}"
    );
}

/// When the output cannot be written, the run stops at once instead of
/// paying for vectors that have nowhere to go.
#[tokio::test]
async fn a_failing_writer_stops_the_run_before_the_rest_is_paid_for() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 40);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    std::fs::write(
        dir.path().join("blocker"),
        "a file where a directory should be",
    )
    .unwrap();
    let blocked = dir.path().join("blocker/out.parquet");
    let output = run_job(
        &job,
        &[
            "--set",
            &format!("output.path=\"{}\"", blocked.display()),
            "--set",
            "backend.max_inputs_per_request=1",
            "--set",
            "backend.concurrency=1",
        ],
    )
    .await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("blocker"), "{stderr}");
    let chunks = expected_chunks(&root).len() as u64;
    let sent = sim.ledger().billed_requests;
    assert!(
        sent * 4 < chunks,
        "{sent} requests of {chunks} were sent after the writer failed"
    );
}

/// The local backend through the binary: no key, no server, 384-dimensional
/// vectors, and chunks counted with the model's own tokenizer.
#[tokio::test]
async fn a_local_job_runs_without_key_or_server() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 4);
    let job = dir.path().join("local.toml");
    std::fs::write(
        &job,
        format!(
            "[source]\nkind = \"files\"\npaths = [\"{}\"]\n[chunking]\nmax_tokens = 128\noverlap_tokens = 16\n\
             [backend]\nkind = \"local\"\n[output]\npath = \"{}\"\n",
            root.display(),
            dir.path().join("out/local.parquet").display()
        ),
    )
    .unwrap();
    let mut command = bin();
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("run")
        .arg(&job)
        .arg("--json");
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["backend"], "local");
    assert_eq!(summary["dimensions"], 384);
    assert_eq!(summary["cost"], 0.0);
    let rows = read_output(&dir.path().join("out/local.parquet"));
    assert_eq!(rows.ids.len() as u64, summary["chunks"].as_u64().unwrap());
    assert!(matches!(
        rows.embedding_type,
        DataType::FixedSizeList(_, 384)
    ));
    for vector in &rows.vectors {
        let norm: f32 = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!(
            (norm - 1.0).abs() < 1e-3,
            "normalised vectors, got norm {norm}"
        );
    }
    assert!(rows.token_counts.iter().all(|&t| t <= 128));
    assert_eq!(rows.metadata["embedjob.backend"], "local");
}

#[tokio::test]
async fn a_local_job_without_the_runtime_is_a_clear_setup_error() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 1);
    let job = dir.path().join("local.toml");
    std::fs::write(
        &job,
        format!(
            "[source]\nkind = \"files\"\npaths = [\"{}\"]\n[backend]\nkind = \"local\"\n[output]\npath = \"{}\"\n",
            root.display(),
            dir.path().join("out/local.parquet").display()
        ),
    )
    .unwrap();
    let missing = dir.path().join("nowhere/libonnxruntime.so");
    let mut command = bin();
    command
        .env("ORT_DYLIB_PATH", &missing)
        .arg("run")
        .arg(&job)
        .args(["--set", "chunking.max_tokens=200"]);
    let output = run(command).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("ONNX Runtime") && stderr.contains("scripts/setup-local"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.path().join("out").exists());

    // Chunks larger than the model sees whole are refused, naming the window.
    let mut command = bin();
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("run")
        .arg(&job)
        .args(["--set", "chunking.max_tokens=256"]);
    let output = run(command).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("context window (256 tokens, 254 of them for the text)"),
        "{stderr}"
    );
    assert!(!dir.path().join("out").exists());
}

/// Regression: a local job without `[chunking]` failed, its default
/// 512-token chunks being larger than the model's 256-token window. Chunks
/// now fit the window: at most 254 tokens of text (the model adds `[CLS]`
/// and `[SEP]`), with an overlap in proportion.
#[tokio::test]
async fn regression_a_local_job_with_default_chunking_fits_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("docs");
    std::fs::create_dir_all(&root).unwrap();
    // One long document: its chunks are as long as the window allows.
    let long: String = (0..400)
        .map(|i| format!("Sentence {i} is about chunk sizes and model windows. "))
        .collect();
    std::fs::write(root.join("long.txt"), &long).unwrap();
    let job = dir.path().join("local.toml");
    std::fs::write(
        &job,
        "[source]\nkind = \"files\"\npaths = [\"docs\"]\n[backend]\nkind = \"local\"\n\
         [output]\npath = \"out/local.parquet\"\n",
    )
    .unwrap();
    let mut command = bin();
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("run")
        .arg(&job)
        .arg("--json");
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let rows = read_output(&dir.path().join("out/local.parquet"));
    let longest = rows.token_counts.iter().copied().max().unwrap();
    assert!(
        (200..=254).contains(&longest),
        "chunks fill the window without passing it: {:?}",
        rows.token_counts
    );
    let fingerprint: Value = serde_json::from_str(&rows.metadata["embedjob.fingerprint"]).unwrap();
    assert_eq!(fingerprint["chunking.max_tokens"], "254");
    assert_eq!(fingerprint["chunking.overlap_tokens"], "25");

    // The estimate sizes chunks the same way, and says so.
    let mut command = bin();
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("estimate")
        .arg(&job);
    let output = run(command).await;
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        stdout.contains("up to 254 tokens, 25 overlapping"),
        "{stdout}"
    );
    assert!(stdout.contains("the local model bills nothing"), "{stdout}");
}

#[tokio::test]
async fn a_terminal_gets_a_progress_bar_and_stdout_stays_json() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig {
        latency_ms: 60,
        ..SimConfig::default()
    })
    .await;
    // No repeated texts: every chunk read is sent, so the bar can fill.
    let job = write_cost_job_over(
        dir.path(),
        mixed_corpus(dir.path(), false),
        &sim.base_url(),
        "",
    );
    // One request at a time and a channel of one batch: reading ends only
    // near the end of the run, so the bar is first shown without a total.
    let args = [
        "run",
        path_arg(&job),
        "--json",
        "--set",
        "pipeline.channel_capacity=1",
        "--set",
        "backend.concurrency=1",
        "--set",
        "backend.max_inputs_per_request=2",
    ];
    let (screen, stdout) = under_a_terminal(dir.path(), &args).await;
    let summary: Value = serde_json::from_str(&stdout).expect("stdout is one JSON object");
    let chunks = summary["chunks"].as_u64().unwrap();
    let requests = summary["requests"].as_u64().unwrap();
    // A bar redrawn in place, with its elements.
    assert!(
        screen.contains('\r') || screen.contains("\x1b["),
        "{screen:?}"
    );
    assert!(screen.contains("tokens/s"), "{screen}");
    assert!(screen.contains("retries"), "{screen}");
    assert!(screen.contains("ETA"), "{screen}");
    assert!(
        screen.contains("chunks done ("),
        "before the total is known: {screen}"
    );
    assert!(
        screen.contains(&format!("{chunks}/{chunks} chunks")),
        "the bar ends full: {screen}"
    );
    assert!(screen.contains(&format!("{requests} req")), "{screen}");
    assert!(
        !screen.contains("chunks done, "),
        "no progress lines on a terminal: {screen}"
    );
    assert!(screen.contains('█'), "the bar is drawn: {screen}");

    let mut quiet = args.to_vec();
    quiet.push("--quiet");
    let (screen, stdout) = under_a_terminal(dir.path(), &quiet).await;
    serde_json::from_str::<Value>(&stdout).expect("stdout is one JSON object");
    assert!(
        !screen.contains("chunks") && !screen.contains("ETA"),
        "--quiet shows nothing: {screen}"
    );
}

/// Runs `args` with stderr on a pseudo-terminal (util-linux `script`) and
/// stdout in a file; returns (what the terminal showed, stdout).
async fn under_a_terminal(dir: &Path, args: &[&str]) -> (String, String) {
    let exe = env!("CARGO_BIN_EXE_embedjob");
    let stdout_file = dir.join("stdout.json");
    let screen_file = dir.join("screen.txt");
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let inner = format!("'{exe}' {} > '{}'", quoted.join(" "), stdout_file.display());
    let mut command = std::process::Command::new("script");
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .env("COLUMNS", "100")
        .env("TERM", "xterm")
        .args(["-qfec", &inner])
        .arg(&screen_file)
        .stdin(std::process::Stdio::null());
    let output = run(command).await;
    assert!(
        output.status.success(),
        "`script` (util-linux) runs the command under a pseudo-terminal: {output:?}"
    );
    let screen = std::fs::read_to_string(&screen_file).unwrap();
    let stdout = std::fs::read_to_string(&stdout_file).unwrap();
    assert!(!screen.contains(KEY) && !stdout.contains(KEY));
    (screen, stdout)
}

/// Regression: relative paths were taken from the directory the command ran
/// in, so a job that worked by hand failed under cron (which runs from the
/// home directory). They are taken from the job file's directory, `--set`
/// values included.
#[tokio::test]
async fn regression_a_job_runs_the_same_from_another_directory() {
    let sim = simulator(SimConfig::default()).await;
    let project = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let root = corpus(project.path(), 6);
    let expected = expected_chunks(&root);
    std::fs::create_dir_all(project.path().join("jobs")).unwrap();
    let job = project.path().join("jobs/docs.toml");
    std::fs::write(
        &job,
        format!(
            "name = \"docs\"\n[source]\nkind = \"files\"\npaths = [\"../docs/**/*.md\"]\n\
             [chunking]\nmax_tokens = 64\noverlap_tokens = 8\n[backend]\nkind = \"api\"\n\
             base_url = \"{}\"\nmodel = \"svc-embed-1\"\n[output]\npath = \"../out/docs.parquet\"\n",
            sim.base_url()
        ),
    )
    .unwrap();
    let mut command = bin();
    command
        .current_dir(elsewhere.path())
        .env("EMBEDJOB_API_KEY", KEY)
        .arg("run")
        .arg(&job)
        .arg("--quiet");
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let rows = read_output(&project.path().join("out/docs.parquet"));
    assert_complete(&rows, &expected, 1024);
    assert!(
        std::fs::read_dir(elsewhere.path())
            .unwrap()
            .next()
            .is_none(),
        "nothing is written where the command runs"
    );

    // A `--set` path is taken from the job file's directory too, and the
    // job file may be named relative to where the command runs.
    let mut command = bin();
    command
        .current_dir(project.path())
        .env("EMBEDJOB_API_KEY", KEY)
        .args(["run", "jobs/docs.toml", "--json"])
        .args(["--set", "output.path=../out/again.parquet"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["output"], "out/again.parquet");
    assert_complete(
        &read_output(&project.path().join("out/again.parquet")),
        &expected,
        1024,
    );
}

/// Regression: on a terminal the summary began on the line of the last
/// progress bar. It starts a line of its own, right after the bar.
#[tokio::test]
async fn regression_the_summary_starts_on_its_own_line_after_the_bar() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig {
        latency_ms: 30,
        ..SimConfig::default()
    })
    .await;
    let job = write_cost_job_over(
        dir.path(),
        mixed_corpus(dir.path(), false),
        &sim.base_url(),
        "",
    );
    let exe = env!("CARGO_BIN_EXE_embedjob");
    let screen_file = dir.path().join("screen.txt");
    let inner = format!("'{exe}' run '{}'", job.display());
    let mut command = std::process::Command::new("script");
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .env("COLUMNS", "100")
        .env("TERM", "xterm")
        .args(["-qfec", &inner])
        .arg(&screen_file)
        .stdin(std::process::Stdio::null());
    let output = run(command).await;
    assert!(output.status.success(), "{output:?}");
    let screen = std::fs::read_to_string(&screen_file).unwrap();
    let at = screen
        .find("cost: ")
        .unwrap_or_else(|| panic!("no summary: {screen:?}"));
    let before = &screen[..at];
    assert!(before.contains('█'), "the bar came first: {screen:?}");
    assert!(
        before.ends_with('\n'),
        "the summary starts a line: {:?}",
        &before[before.len().saturating_sub(80)..]
    );
    assert!(
        !before.ends_with("\n\r\n") && !before.ends_with("\n\n"),
        "without a blank line: {:?}",
        &before[before.len().saturating_sub(80)..]
    );
}

/// Regression: a run stopped by its time limit said "0 chunks … written to
/// out/x.parquet" although nothing was written there. It says what the
/// checkpoint holds and the command that carries on.
#[tokio::test]
async fn regression_a_stopped_run_says_what_was_committed_and_how_to_carry_on() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let expected = expected_chunks(&root);
    let sim = simulator(SimConfig {
        latency_ms: 150,
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let args = [
        "--set",
        "backend.concurrency=1",
        "--set",
        "backend.max_inputs_per_request=2",
        "--max-duration",
        "1s",
    ];
    let output = run_job(&job, &args).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    let committed = 2 * sim.ledger().billed_requests;
    assert!(committed > 0);
    assert!(!stdout.contains("written to"), "{stdout}");
    let output_path = dir.path().join("out/result.parquet");
    assert!(
        stdout.contains(&format!(
            "test: the time limit of 1s was reached before the end; {} is as it was",
            output_path.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "committed: {committed} vectors in {}.checkpoint ({committed} from this run)",
            output_path.display()
        )),
        "{stdout}"
    );
    let carry_on = format!(
        "to carry on: embedjob run {} --set backend.concurrency=1 --set backend.max_inputs_per_request=2 \
         --max-duration 1s",
        job.display()
    );
    assert!(stdout.contains(&carry_on), "{stdout}");

    // The command it gives carries on, sending only what was not committed.
    let before = sim.ledger().billed_requests;
    let output = run_job(&job, &args[..4]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_complete(&read_output(&output_path), &expected, 1024);
    let ledger = sim.ledger();
    assert!(
        ledger.texts.values().all(|&n| n == 1),
        "nothing billed twice"
    );
    assert!(ledger.billed_requests > before);
}
