//! Working with the OpenAI-style servers people run, as the simulator
//! imitates them (no model route, bare listings, no `/v1`, 422s, other token
//! counts, errors in 200 bodies, slow answers), with its ledger as the judge
//! of what was sent and billed; and the official `openai` Python client
//! against `embedjob simulate`.

use std::collections::HashMap;
use std::path::Path;

use embedjob::simulate::{self, Billing, Faults, ModelSpec, SimConfig, TokenCount};
use serde_json::Value;

use crate::support::{
    assert_complete, corpus, expected_chunks, files_source, no_key, read_output, run, run_job,
    simulator, text, write_job, KEY,
};

/// A simulator configured as infinity serves by default: routes at the
/// root, no `GET /models/{id}`, a listing without window or price, and a
/// FastAPI 422 over `max_inputs` inputs.
fn like_infinity(max_inputs: usize) -> SimConfig {
    SimConfig {
        url_prefix: String::new(),
        model_route: false,
        bare_listing: true,
        max_inputs_per_request: Some(max_inputs),
        too_large_status: 422,
        ..SimConfig::default()
    }
}

fn summary_of(output: &std::process::Output) -> Value {
    let (stdout, stderr) = no_key(output, KEY);
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}\n{stderr}"))
}

#[tokio::test]
async fn a_server_without_the_model_route_and_with_a_bare_listing_runs_as_declared() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let sim = simulator(like_infinity(32)).await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "api_path = \"\"\ncontext_window = 512\ninput_per_1k = 0.02",
    );
    let output = run_job(&job, &["--json"]).await;
    let summary = summary_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected_chunks(&root), 1024);

    let ledger = sim.ledger();
    let tokens = summary["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(tokens, ledger.prompt_tokens);
    // The price the job declares prices the run.
    let cost = summary["cost"].as_f64().unwrap();
    assert!(
        (cost - tokens as f64 / 1000.0 * 0.02).abs() < 1e-12,
        "{summary}"
    );
    assert_eq!(
        summary["warnings"],
        Value::Array(vec![]),
        "the listing names the model and the job gives the window: {summary}"
    );

    // Without `backend.context_window`, the run goes on and says what it cannot know.
    let output = run_job(
        &job,
        &["--json", "--fresh", "--set", "backend.context_window=0"],
    )
    .await;
    assert_eq!(output.status.code(), Some(2), "a window of 0 is refused");
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "api_path = \"\"",
    );
    let output = run_job(&job, &["--json", "--fresh"]).await;
    let summary = summary_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("warning: the context window of model svc-embed-1 is unknown"),
        "{stderr}"
    );
    assert!(summary["warnings"][0]
        .as_str()
        .unwrap()
        .contains("may silently truncate"));
    assert_eq!(summary["cost"], Value::Null, "no price listed or declared");
}

/// llama-cpp-python's server takes `encoding_format: "base64"` and answers
/// JSON numbers all the same: a job that asks for base64, by default or by
/// name, reads them.
#[tokio::test]
async fn a_server_that_answers_floats_to_a_request_for_base64_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let sim = simulator(SimConfig {
        model_route: false,
        bare_listing: true,
        floats_only: true,
        ..SimConfig::default()
    })
    .await;
    // The simulator answers floats to a request for base64.
    let answer: Value = reqwest::Client::new()
        .post(format!("{}/v1/embeddings", sim.base_url()))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"model": "svc-embed-1", "input": ["a"], "encoding_format": "base64"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["data"][0]["embedding"].as_array().map(Vec::len),
        Some(1024),
        "{answer}"
    );
    for encoding in ["auto", "base64"] {
        let job = write_job(
            dir.path(),
            &sim.base_url(),
            &files_source(&root),
            &format!("context_window = 512\nencoding_format = \"{encoding}\""),
        );
        let output = run_job(&job, &["--json", "--fresh"]).await;
        let summary = summary_of(&output);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        let rows = read_output(&dir.path().join("out/result.parquet"));
        assert_complete(&rows, &expected_chunks(&root), 1024);
        assert_eq!(summary["invalid_responses"], 0, "{summary}");
        assert_eq!(summary["retries"], 0, "{summary}");
    }
}

#[tokio::test]
async fn a_model_neither_routed_nor_listed_is_used_as_declared_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    // A key that sees another model only: the listing does not name svc-embed-1.
    let sim = simulator(SimConfig {
        model_route: false,
        keys: vec![embedjob::simulate::KeySpec {
            key: KEY.to_string(),
            models: Some(vec!["svc-embed-1-l".into()]),
        }],
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--json"]).await;
    let stderr = text(&output.stderr);
    // The service then refuses the model in the first request: a failed run, not a config error.
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is not in the service's listing"),
        "{stderr}"
    );
    assert!(stderr.contains("does not exist"), "{stderr}");

    // With a route, a model the service says does not exist is a refusal before any work.
    let sim = simulator(SimConfig {
        keys: vec![embedjob::simulate::KeySpec {
            key: KEY.to_string(),
            models: Some(vec!["svc-embed-1-l".into()]),
        }],
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--json"]).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown model \"svc-embed-1\""), "{stderr}");
    assert_eq!(sim.ledger().embedding_requests, 0);
}

#[tokio::test]
async fn a_wrong_length_first_response_stops_the_run_with_one_round_billed() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 40);
    let mut config = SimConfig::default();
    // A model that ignores `dimensions` and sends its own 1536 values.
    config.models.push(simulate::ModelSpec {
        dimensions_param: simulate::DimensionsParam::Ignore,
        ..ModelSpec::embedding("wide", 1536)
    });
    let sim = simulator(config).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(
        &job,
        &[
            "--json",
            "--set",
            "backend.model=wide",
            "--set",
            "backend.dimensions=512",
        ],
    )
    .await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("every vector has 1536 values, expected 512"),
        "{stderr}"
    );
    // `--json` prints the failed run's summary: the error and what it was billed.
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["exit_code"], 1, "{summary}");
    assert!(
        summary["error"]
            .as_str()
            .is_some_and(|e| e.contains("1536 values")),
        "{summary}"
    );
    assert!(stderr.contains("`dimensions: 512` was sent"), "{stderr}");
    let ledger = sim.ledger();
    // concurrency = 4 in the job: at most the requests of the first round.
    assert!(
        (1..=4).contains(&ledger.billed_requests),
        "{} requests billed",
        ledger.billed_requests
    );
    assert!(
        ledger.embedding_requests <= 4,
        "{}",
        ledger.embedding_requests
    );
    assert!(!dir.path().join("out/result.parquet").exists());
    assert!(
        !dir.path().join("out/result.parquet.checkpoint").exists(),
        "nothing kept, so the job can be run again with the right length"
    );
}

/// Runs a corpus under one-vector faults and checks the bill against the ledger.
async fn bill_under_vector_faults(encoding: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 30);
    let sim = simulator(SimConfig {
        faults: Faults {
            seed: 5,
            rate_wrong_dimensions: 0.25,
            rate_nan: 0.25,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &format!("encoding_format = \"{encoding}\""),
    );
    let output = run_job(
        &job,
        &["--json", "--set", "backend.max_inputs_per_request=4"],
    )
    .await;
    let summary = summary_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let expected = expected_chunks(&root);
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected, 1024);

    let ledger = sim.ledger();
    let wrong = ledger.faults.get("wrong_dimensions").copied().unwrap_or(0);
    let nan = ledger.faults.get("nan").copied().unwrap_or(0);
    assert!(wrong >= 2 && nan >= 2, "{:?}", ledger.faults);
    let faults = wrong + nan;
    // The bill is the ledger's, every answer counted.
    assert_eq!(
        summary["usage"]["prompt_tokens"].as_u64(),
        Some(ledger.prompt_tokens),
        "{summary}"
    );
    assert_eq!(summary["requests"].as_u64(), Some(ledger.billed_requests));
    assert_eq!(
        rows.metadata["embedjob.usage.prompt_tokens"],
        ledger.prompt_tokens.to_string()
    );
    // Each fault spoilt one vector, and only that input was billed again.
    let by_hash: HashMap<String, &String> = expected
        .values()
        .map(|t| (hex::encode(embedjob::types::content_hash(t)), t))
        .collect();
    let mut again = 0;
    let mut again_tokens = 0;
    for (hash, &count) in &ledger.texts {
        let text = by_hash[hash];
        assert!(count >= 1);
        again += count - 1;
        again_tokens += (count - 1) * u64::from(simulate::count_tokens(text));
    }
    assert_eq!(again, faults, "one input sent again per spoilt vector");
    assert_eq!(summary["discarded_tokens"].as_u64(), Some(again_tokens));
    assert_eq!(
        summary["invalid_responses"].as_u64(),
        Some(faults),
        "{summary}"
    );
}

#[tokio::test]
async fn under_wrong_length_and_nan_faults_the_bill_is_the_ledgers_with_base64() {
    bill_under_vector_faults("auto").await;
}

#[tokio::test]
async fn under_wrong_length_and_nan_faults_the_bill_is_the_ledgers_with_floats() {
    bill_under_vector_faults("float").await;
}

/// Runs `job` (its output beside it, in `out/`) with requests of at most
/// `max_inputs` inputs, to a complete output of `root`'s chunks: its summary,
/// the simulator's ledger, and the most inputs a billed request held.
async fn run_complete(
    job: &Path,
    root: &Path,
    max_inputs: usize,
    sim: &simulate::Simulator,
) -> (Value, simulate::Ledger, u64) {
    let most = format!("backend.max_inputs_per_request={max_inputs}");
    let output = run_job(job, &["--json", "--set", &most]).await;
    let summary = summary_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let out = job.parent().unwrap().join("out/result.parquet");
    assert_complete(&read_output(&out), &expected_chunks(root), 1024);
    let ledger = sim.ledger();
    let largest = ledger.billed_sizes.keys().max().copied().unwrap();
    (summary, ledger, largest)
}

#[tokio::test]
async fn a_422_over_8_inputs_completes_with_requests_of_at_most_8() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 40);
    let sim = simulator(like_infinity(8)).await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "api_path = \"\"\ncontext_window = 512",
    );
    let (summary, ledger, largest) = run_complete(&job, &root, 32, &sim).await;
    assert!(largest <= 8, "{:?}", ledger.billed_sizes);
    assert_eq!(largest, 8, "requests as large as the service takes");
    assert_eq!(summary["learned_limits"]["max_inputs_per_request"], 8);
    // Only the requests in flight when the limit was learned were refused.
    let refused = ledger.faults["too_large"];
    assert!((1..=4).contains(&refused), "{:?}", ledger.faults);
    assert_eq!(summary["quarantined"], 0);
    let warnings = summary["warnings"].to_string();
    assert!(
        warnings.contains("requests of at most 8 inputs"),
        "{warnings}"
    );
}

/// TEI's `GET /info` says, before any request, the most inputs a request
/// may hold: requests are cut to its 32 inputs from the first, and none is
/// refused (before, the first request, of all the chunks, was).
#[tokio::test]
async fn teis_info_sizes_the_requests_before_the_first_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 40);
    let sim = simulator(SimConfig {
        models_routes: false,
        tei_info: true,
        window: Some(simulate::ServerWindow::parse("256:tei").unwrap()),
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let (summary, ledger, largest) = run_complete(&job, &root, 128, &sim).await;
    assert_eq!(largest, 32, "{:?}", ledger.billed_sizes);
    assert_eq!(ledger.faults.get("too_large"), None, "{:?}", ledger.faults);
    assert_eq!(
        summary["learned_limits"]["max_inputs_per_request"],
        Value::Null
    );
    let warnings = summary["warnings"].to_string();
    assert!(
        warnings.contains("at most 32 inputs a request (GET /info, `max_client_batch_size`)")
            && !warnings.contains("describes no model"),
        "{warnings}"
    );
    // A job that asks for no more says nothing of it.
    let (summary, _, largest) = run_complete(&job, &root, 32, &sim).await;
    assert_eq!(largest, 32);
    assert!(
        !summary["warnings"].to_string().contains("GET /info"),
        "{summary}"
    );
}

/// TEI's `/info` also says how many requests it takes at once
/// (`max_concurrent_requests`), answering a 429 to more: no more are sent,
/// whether the job fixes its concurrency above it (with a warning) or
/// leaves it `auto` (whose ceiling is lowered quietly).
#[tokio::test]
async fn teis_info_caps_the_requests_in_flight() {
    let config = |tei_info: bool| SimConfig {
        models_routes: !tei_info,
        tei_info,
        latency_ms: 50,
        max_concurrent_requests: Some(2),
        ..SimConfig::default()
    };
    let sim = simulator(config(true)).await;
    for (concurrency, warned) in [("8", true), ("auto", false)] {
        let (summary, ledger) = run_fresh(&sim, concurrency).await;
        let faults = &ledger.faults;
        assert_eq!(
            faults.get("concurrency_limit"),
            None,
            "{concurrency}: {faults:?}"
        );
        assert!(
            ledger.embedding_requests >= 10,
            "{}",
            ledger.embedding_requests
        );
        assert_eq!(summary["throttled"], 0, "{summary}");
        let warnings = summary["warnings"].to_string();
        assert_eq!(
            warnings.contains(
                "at most 2 requests at once (GET /info, `max_concurrent_requests`): \
                 at most 2 are sent at once, not `backend.concurrency` = 8"
            ),
            warned,
            "{concurrency}: {warnings}"
        );
        assert!(
            warned || !warnings.contains("max_concurrent_requests"),
            "{warnings}"
        );
    }
    // A server that does not say so refuses what goes beyond.
    let silent = simulator(config(false)).await;
    let (_, ledger) = run_fresh(&silent, "8").await;
    let refused = ledger.faults.get("concurrency_limit").copied();
    assert!(refused.is_some_and(|n| n > 0), "{refused:?}");
}

/// A job of 40 documents in requests of 4 inputs, at `concurrency`, run
/// to its end against `sim` in a directory of its own; its summary, and
/// the simulator's ledger of it.
async fn run_fresh(sim: &simulate::Simulator, concurrency: &str) -> (Value, simulate::Ledger) {
    sim.reset_ledger();
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 40);
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "context_window = 512\nprobe_window = false",
    );
    let concurrency = format!("backend.concurrency={concurrency}");
    let output = run_job(
        &job,
        &[
            "--json",
            "--set",
            "backend.max_inputs_per_request=4",
            "--set",
            &concurrency,
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    (summary_of(&output), sim.ledger())
}

#[tokio::test]
async fn a_request_that_times_out_but_is_billed_is_not_sent_again_whole() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("docs");
    std::fs::create_dir_all(&root).unwrap();
    for i in 0..8 {
        std::fs::write(
            root.join(format!("d{i}.txt")),
            format!("short text number {i}"),
        )
        .unwrap();
    }
    // 8 inputs take 1.6 s, past the 1 s the job waits; 4 take 0.8 s.
    let sim = simulator(SimConfig {
        latency_per_input_ms: 200,
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(
        &job,
        &[
            "--json",
            "--set",
            "backend.timeout_seconds=1",
            "--set",
            "backend.concurrency=2",
        ],
    )
    .await;
    let summary = summary_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(summary["written"], 8);
    let ledger = sim.ledger();
    assert_eq!(ledger.embedding_requests, 3, "{:?}", ledger.billed_sizes);
    assert_eq!(
        ledger.billed_sizes,
        [(4, 2), (8, 1)].into_iter().collect(),
        "the request of 8 was billed after the client gave up, and sent again as two of 4"
    );
    assert_eq!(summary["timeouts"], 1);
    assert_eq!(summary["learned_limits"]["max_inputs_per_request"], 4);
    assert_eq!(summary["learned_limits"]["concurrency"], 1);
    // What the run saw billed is the two halves; the whole was billed unseen.
    let halves: u64 = ledger.prompt_tokens / 2;
    assert_eq!(summary["usage"]["prompt_tokens"].as_u64(), Some(halves));
}

#[tokio::test]
async fn dimensions_are_sent_when_they_differ_from_the_models_length() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    let mut config = SimConfig::default();
    // Serves 768 values and, as vLLM, refuses `dimensions` for it.
    config.models.push(ModelSpec::embedding("plain", 768));
    let sim = simulator(config).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--json", "--set", "backend.dimensions=256"]).await;
    let summary = summary_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_eq!(rows.metadata["embedjob.dimensions"], "256");
    for (vector, text) in rows.vectors.iter().zip(&rows.texts) {
        assert_eq!(
            vector,
            &simulate::embedding_vector_shortened(1024, 256, text)
        );
    }
    assert_eq!(summary["retries"], 0, "{summary}");

    // A model that does not take `dimensions`: dropped, and its own length checked.
    let output = run_job(
        &job,
        &[
            "--json",
            "--fresh",
            "--set",
            "backend.model=plain",
            "--set",
            "backend.dimensions=768",
        ],
    )
    .await;
    let summary = summary_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        summary["warnings"]
            .to_string()
            .contains("the service refused `dimensions`"),
        "{summary}"
    );
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_eq!(rows.vectors[0].len(), 768);
}

#[tokio::test]
async fn an_error_in_a_200_body_is_a_fault_with_the_servers_message() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    let sim = simulator(SimConfig {
        faults: Faults {
            rate_error_200: 1.0,
            limit: Some(2),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--json"]).await;
    let summary = summary_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(summary["retries"].as_u64().unwrap() >= 2);
    assert_eq!(
        summary["usage"]["prompt_tokens"].as_u64(),
        Some(sim.ledger().prompt_tokens)
    );

    let sim = simulator(SimConfig {
        faults: Faults {
            rate_error_200: 1.0,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--fresh", "--set", "backend.max_retries=1"]).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("The upstream server failed to answer"),
        "the server's own message: {stderr}"
    );
}

#[tokio::test]
async fn a_service_that_counts_tokens_otherwise_is_billed_as_it_counts() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 10);
    let sim = simulator(SimConfig {
        billing: Billing {
            count: TokenCount::Bytes,
            factor: 1.0,
        },
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--json"]).await;
    let summary = summary_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let ledger = sim.ledger();
    let billed = summary["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(billed, ledger.prompt_tokens);
    let local = summary["estimated_tokens"].as_u64().unwrap();
    assert_ne!(billed, local, "bytes / 4 is not cl100k");
    let ratio = summary["billed_token_ratio"].as_f64().unwrap();
    assert!((ratio - billed as f64 / local as f64).abs() < 1e-12);
}

/// The official `openai` package, default arguments, against `embedjob simulate`.
#[tokio::test]
async fn the_openai_python_client_works_against_the_simulator() {
    let python = std::env::var_os("EMBEDJOB_REFERENCE_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/venv/bin/python"),
        std::path::PathBuf::from,
    );
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-python (scripts/test does)",
        python.display()
    );
    let sim = simulator(SimConfig::default()).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/openai_client.py");
    let mut command = std::process::Command::new(python);
    command
        .arg(script)
        .env("OPENAI_BASE_URL", format!("{}/v1", sim.base_url()))
        .env("OPENAI_API_KEY", KEY)
        .env(
            "TOKEN_IDS",
            serde_json::to_string(
                &tiktoken_rs::cl100k_base_singleton().encode_ordinary("hello from python"),
            )
            .unwrap(),
        )
        .env_remove("OPENAI_ORG_ID")
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY")
        .env_remove("ALL_PROXY");
    let output = run(command).await;
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();

    let one = &report["one"];
    assert_eq!(
        one["vector"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect::<Vec<_>>(),
        simulate::embedding_vector(1024, "hello from python")
    );
    assert_eq!(
        one["prompt_tokens"].as_u64(),
        Some(u64::from(simulate::count_tokens("hello from python")))
    );
    let many = report["many"].as_array().unwrap();
    for (item, text) in many.iter().zip(["first", "second", "third"]) {
        let vector: Vec<f32> = item
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(vector, simulate::embedding_vector(1024, text), "{text}");
    }
    let ids: Vec<&str> = report["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"svc-embed-1") && ids.contains(&"svc-pro"),
        "{ids:?}"
    );
    assert_eq!(report["retrieved"], "svc-embed-1-l");
    assert_eq!(report["chat"], "You said: ping");
    assert_eq!(report["streamed"], "You said: stream me");
    assert!(report["stream_usage"]["total_tokens"].as_u64().unwrap() > 0);
    assert_eq!(report["token_ids"], report["one"]["vector"]);
    // Every call the client made was answered without a retry.
    let ledger = sim.ledger();
    assert_eq!(ledger.embedding_requests, 3);
    assert_eq!(ledger.chat_requests, 3);
}

/// `chunking.tokenizer` as a Hugging Face `tokenizer.json`: chunks are
/// counted as the model counts, and the tokenizer is part of the fingerprint.
#[tokio::test]
async fn chunks_are_counted_by_the_tokenizer_the_job_names() {
    let model_dir = std::env::var("EMBEDJOB_MODEL_DIR").map_or_else(
        |_| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/models/all-MiniLM-L6-v2"),
        std::path::PathBuf::from,
    );
    let tokenizer_path = model_dir.join("tokenizer.json");
    assert!(
        tokenizer_path.exists(),
        "{} is missing: run scripts/setup-local",
        tokenizer_path.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 8);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let set = format!("chunking.tokenizer={}", tokenizer_path.display());
    let output = run_job(&job, &["--json", "--set", &set]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let rows = read_output(&dir.path().join("out/result.parquet"));
    let mut tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path).unwrap();
    tokenizer.with_padding(None);
    tokenizer.with_truncation(None).unwrap();
    for (text, &count) in rows.texts.iter().zip(&rows.token_counts) {
        let counted = tokenizer.encode_fast(text.as_str(), false).unwrap().len();
        assert_eq!(count as usize, counted, "{text}");
        assert!(count <= 64);
    }
    assert!(rows.metadata["embedjob.fingerprint"].contains("tokenizer.json (sha256 "));

    // cl100k counts otherwise: the vectors are not reused under it.
    let output = run_job(&job, &["--json"]).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("chunking.tokenizer"), "{stderr}");

    let output = run_job(
        &job,
        &[
            "--json",
            "--fresh",
            "--set",
            "chunking.tokenizer=missing/tokenizer.json",
        ],
    )
    .await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("missing/tokenizer.json"), "{stderr}");
}
