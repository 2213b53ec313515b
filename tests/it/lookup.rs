//! What the model lookup finds before any work: a wrong `backend.api_path`
//! (no route answers under it), and LiteLLM's prices at `GET /v1/model/info`.

use std::sync::{Arc, Mutex};

use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use embedjob::simulate::SimConfig;
use serde_json::{json, Value};

use crate::support::{
    assert_complete, corpus, embedjob, expected_chunks, files_source, hostile_server, json,
    json_response, no_key, path_arg, read_output, run_job, simulator, write_job, KEY,
};

/// Runs `embedjob estimate JOB --json`.
async fn estimate(job: &std::path::Path) -> std::process::Output {
    embedjob(&["estimate", path_arg(job), "--json"]).await
}

// ---- a wrong api_path -------------------------------------------------------------------------

#[tokio::test]
async fn a_wrong_api_path_is_a_config_error_before_any_document_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    // Routes at the root, as infinity serves them; the job asks under /v1.
    let sim = simulator(SimConfig {
        url_prefix: String::new(),
        model_route: false,
        bare_listing: true,
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    for output in [run_job(&job, &["--json"]).await, estimate(&job).await] {
        let (_, stderr) = no_key(&output, KEY);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("`backend.api_path` \"/v1\""), "{stderr}");
        assert!(
            stderr.contains(&format!("POST {}/v1/embeddings", sim.base_url())),
            "the URL tried: {stderr}"
        );
        assert!(
            stderr.contains("set `backend.api_path = \"\"`"),
            "the fix: {stderr}"
        );
    }
    // Nothing was read, chunked or sent: no text reached the server (the
    // one embeddings request it saw under its own routes is the lookup's
    // request without input, under the root), and nothing was written.
    let ledger = sim.ledger();
    assert!(ledger.texts.is_empty(), "{ledger:?}");
    assert_eq!(ledger.billed_requests, 0);
    assert_eq!(
        ledger.embedding_requests, 2,
        "one lookup a command: {ledger:?}"
    );
    assert!(!dir.path().join("out").exists());

    // The base URL ends in /v1 and the api_path repeats it.
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(
        dir.path(),
        &format!("{}/v1", sim.base_url()),
        &files_source(&root),
        "api_path = \"/v1\"",
    );
    let output = run_job(&job, &["--json"]).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("POST {}/v1/v1/embeddings", sim.base_url())),
        "{stderr}"
    );
    assert!(
        stderr.contains("already ends in /v1 and `backend.api_path` repeats it"),
        "{stderr}"
    );
    assert!(sim.ledger().texts.is_empty());
    assert!(!dir.path().join("out").exists());
}

#[tokio::test]
async fn a_server_without_model_routes_under_the_right_api_path_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 6);
    // TEI: no GET /v1/models nor /v1/models/{id}, the embeddings route there.
    let sim = simulator(SimConfig {
        models_routes: false,
        ..SimConfig::default()
    })
    .await;
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "context_window = 512",
    );
    let output = run_job(&job, &["--json"]).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("the service describes no model"),
        "{stderr}"
    );
    assert_complete(
        &read_output(&dir.path().join("out/result.parquet")),
        &expected_chunks(&root),
        1024,
    );
    // The route was checked, with one request that carried no text and
    // was not billed, and the job went on.
    let ledger = sim.ledger();
    assert_eq!(
        ledger.embedding_requests,
        ledger.billed_requests + 1,
        "{ledger:?}"
    );
    assert!(ledger.texts.values().all(|&n| n == 1));
}

#[tokio::test]
async fn an_embeddings_route_missing_behind_working_model_routes_names_the_api_path() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 3);
    // The model routes answer; the embeddings route does not (a lookup
    // cannot tell): the first request's 404 says where to look.
    let server =
        hostile_server(|_, _| json_response(StatusCode::NOT_FOUND, r#"{"detail":"Not Found"}"#))
            .await;
    let job = write_job(dir.path(), &server.base_url, &files_source(&root), "");
    let output = run_job(&job, &["--json"]).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Not Found"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "no route POST {}/v1/embeddings: check `backend.api_path`",
            server.base_url
        )),
        "{stderr}"
    );
}

// ---- LiteLLM's prices at /v1/model/info --------------------------------------------------------

#[tokio::test]
async fn max_cost_counts_with_the_prices_litellm_serves_at_model_info() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 8);
    // LiteLLM's proxy: a listing and model route without prices, the
    // configured prices at /v1/model/info (svc-embed-1: 0.0001 per 1000).
    let sim = simulator(SimConfig {
        bare_listing: true,
        model_info: true,
        ..SimConfig::default()
    })
    .await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");

    let output = estimate(&job).await;
    let value = json(&output);
    assert_eq!(output.status.code(), Some(0), "{value}");
    assert_eq!(value["input_per_1k"], 0.0001, "{value}");
    assert_eq!(value["price_source"], "GET /v1/model/info", "{value}");
    let table = embedjob(&["estimate", path_arg(&job)]).await;
    let (stdout, _) = no_key(&table, KEY);
    assert!(
        stdout.contains("0.0001 (from GET /v1/model/info)"),
        "{stdout}"
    );

    let output = run_job(&job, &["--json", "--max-cost", "1.0"]).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let summary = json(&output);
    let tokens = sim.ledger().prompt_tokens;
    assert!(tokens > 0);
    let cost = summary["cost"].as_f64().unwrap();
    assert!(
        (cost - tokens as f64 / 1000.0 * 0.0001).abs() < 1e-12,
        "{summary}"
    );
    assert_complete(
        &read_output(&dir.path().join("out/result.parquet")),
        &expected_chunks(&root),
        1024,
    );

    // The job's own price comes first, and says so.
    let job = write_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        "input_per_1k = 0.5",
    );
    let value = json(&estimate(&job).await);
    assert_eq!(value["input_per_1k"], 0.5);
    assert_eq!(value["price_source"], "`backend.input_per_1k`");
}

/// A server whose model route names the model without a price, whose
/// `GET /v1/model/info` answers the body the test sets, and whose
/// embeddings are honest.
async fn model_info_server(body: Arc<Mutex<String>>) -> String {
    let handler = move |uri: Uri, request: axum::body::Bytes| {
        let body = Arc::clone(&body);
        async move {
            let path = uri.path();
            if path == "/v1/model/info" {
                let text = body.lock().unwrap().clone();
                return json_response(StatusCode::OK, text);
            }
            if path.starts_with("/v1/models/") {
                return axum::Json(json!({"id": "svc-embed-1", "object": "model"})).into_response();
            }
            let request: Value = serde_json::from_slice(&request).unwrap_or(Value::Null);
            crate::support::honest(&request)
        }
    };
    let app = axum::Router::new().fallback(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

fn litellm_entry(model_info: &str) -> String {
    format!(
        r#"{{"data": [{{"model_name": "svc-embed-1", "litellm_params": {{"model": "openai/x"}},
            "model_info": {model_info}}}]}}"#
    )
}

#[tokio::test]
async fn hostile_model_info_bodies_are_ignored_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 2);
    let body = Arc::new(Mutex::new(String::new()));
    let base = model_info_server(Arc::clone(&body)).await;
    let job = write_job(
        dir.path(),
        &base,
        &files_source(&root),
        "context_window = 512",
    );
    // Each body, and the words of the warning it must give.
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let cases: Vec<(String, &str)> = vec![
        (
            litellm_entry(r#"{"input_cost_per_token": -1e-7}"#),
            "is not a price per token",
        ),
        (
            litellm_entry(r#"{"input_cost_per_token": "1e-07"}"#),
            "\"1e-07\"",
        ),
        (
            litellm_entry(r#"{"input_cost_per_token": 1e300}"#),
            "is not a price per token",
        ),
        (
            litellm_entry(r#"{"input_cost_per_token": NaN}"#),
            "is not JSON",
        ),
        (
            litellm_entry(r#"{"input_cost_per_token": 1e400}"#),
            "is not JSON",
        ),
        (
            litellm_entry(r#"{"input_cost_per_token": [1], "max_input_tokens": -3}"#),
            "`max_input_tokens` -3",
        ),
        (deep, "is not JSON"),
        ("\u{0}\u{ff}garbage".to_string(), "is not JSON"),
    ];
    for (hostile, words) in cases {
        *body.lock().unwrap() = hostile.clone();
        let output = estimate(&job).await;
        let (stdout, stderr) = no_key(&output, KEY);
        let shown = &hostile[..hostile.len().min(120)];
        assert_eq!(output.status.code(), Some(0), "{shown}: {stderr}");
        assert!(!stderr.contains("panicked"), "{shown}: {stderr}");
        let value: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(value["input_per_1k"], Value::Null, "{shown}: {value}");
        assert_eq!(value["context_window"], 512, "{shown}: {value}");
        assert!(
            stderr.contains("warning: GET /v1/model/info") && stderr.contains(words),
            "{shown}: {stderr}"
        );
    }
    // Shapes that name no such model say nothing, and price nothing.
    for quiet in [
        r#"{"data": {"model_name": "svc-embed-1"}}"#,
        r#"[1, 2]"#,
        "{}",
    ] {
        *body.lock().unwrap() = quiet.to_string();
        let output = estimate(&job).await;
        let (stdout, stderr) = no_key(&output, KEY);
        assert_eq!(output.status.code(), Some(0), "{quiet}: {stderr}");
        assert!(!stderr.contains("model/info"), "{quiet}: {stderr}");
        let value: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(value["input_per_1k"], Value::Null);
    }
    // And a sane one prices the job.
    *body.lock().unwrap() =
        litellm_entry(r#"{"input_cost_per_token": 2e-8, "max_input_tokens": 256}"#);
    let value = json(&estimate(&job).await);
    let price = value["input_per_1k"].as_f64().unwrap();
    assert!((price - 2e-5).abs() < 1e-15, "{value}");
    assert_eq!(value["context_window"], 512, "the job's window comes first");
}
