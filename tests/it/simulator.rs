//! The service simulator: endpoints, keys, errors, limits, faults and the ledger.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use clap::Parser;
use embedjob::simulate::{
    count_tokens, embedding_vector, Faults, KeySpec, Ledger, ModelSpec, SimConfig, SimulateOptions,
    Simulator,
};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const KEY: &str = "sk-test-0123456789";

async fn start(config: SimConfig) -> Simulator {
    Simulator::start(config).await.expect("simulator starts")
}

fn with_faults(faults: Faults) -> SimConfig {
    SimConfig {
        faults,
        ..SimConfig::default()
    }
}

fn client() -> reqwest::Client {
    // No pooled connections: a fault may leave a connection broken.
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client builds")
}

/// What a client saw of one response, however it ended.
#[derive(Debug)]
struct Outcome {
    /// `None` when no response head arrived.
    status: Option<StatusCode>,
    headers: HeaderMap,
    body: Vec<u8>,
    /// The body arrived whole.
    complete: bool,
}

impl Outcome {
    fn json(&self) -> Value {
        assert!(self.complete, "the body was cut off: {self:?}");
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "body is not JSON ({error}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts an error response with this status, type and code; returns its message.
    fn error(&self, status: u16, kind: &str, code: Value) -> String {
        assert_eq!(
            self.status,
            Some(StatusCode::from_u16(status).unwrap()),
            "{self:?}"
        );
        let body = self.json();
        let error = &body["error"];
        assert_eq!(error["type"], kind, "{body}");
        assert_eq!(error["code"], code, "{body}");
        error["message"]
            .as_str()
            .expect("the message is a string")
            .to_string()
    }
}

async fn outcome(sent: reqwest::Result<reqwest::Response>) -> Outcome {
    let mut response = match sent {
        Ok(response) => response,
        Err(_) => {
            return Outcome {
                status: None,
                headers: HeaderMap::new(),
                body: Vec::new(),
                complete: false,
            }
        }
    };
    let status = Some(response.status());
    let headers = response.headers().clone();
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => {
                return Outcome {
                    status,
                    headers,
                    body,
                    complete: true,
                }
            }
            Err(_) => {
                return Outcome {
                    status,
                    headers,
                    body,
                    complete: false,
                }
            }
        }
    }
}

async fn post(sim: &Simulator, path: &str, key: Option<&str>, body: &Value) -> Outcome {
    post_raw(sim, path, key, body.to_string()).await
}

async fn post_raw(sim: &Simulator, path: &str, key: Option<&str>, body: String) -> Outcome {
    let mut request = client()
        .post(format!("{}{path}", sim.base_url()))
        .header("content-type", "application/json")
        .body(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    outcome(request.send().await).await
}

async fn get(sim: &Simulator, path: &str, key: Option<&str>) -> Outcome {
    let mut request = client().get(format!("{}{path}", sim.base_url()));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    outcome(request.send().await).await
}

async fn embed(sim: &Simulator, model: &str, inputs: &[&str]) -> Outcome {
    post(
        sim,
        "/v1/embeddings",
        Some(KEY),
        &json!({ "model": model, "input": inputs }),
    )
    .await
}

fn texts(count: usize) -> Vec<String> {
    (0..count)
        .map(|i| format!("text number {i} about embeddings"))
        .collect()
}

fn refs(texts: &[String]) -> Vec<&str> {
    texts.iter().map(String::as_str).collect()
}

fn vector(item: &Value) -> Vec<f32> {
    serde_json::from_value(item["embedding"].clone()).expect("embedding is a list of numbers")
}

/// Checks a normal embeddings response for `inputs`, in index order unless `any_order`.
fn assert_embeddings(body: &Value, model: &str, dimensions: usize, inputs: &[&str]) {
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], model);
    let data = body["data"].as_array().expect("data is a list");
    assert_eq!(data.len(), inputs.len());
    for (position, item) in data.iter().enumerate() {
        assert_eq!(item["object"], "embedding");
        assert_eq!(item["index"], position);
        assert_eq!(vector(item), embedding_vector(dimensions, inputs[position]));
    }
    let tokens: u64 = inputs.iter().map(|t| u64::from(count_tokens(t))).sum();
    assert_eq!(body["usage"]["prompt_tokens"], tokens);
    assert_eq!(body["usage"]["total_tokens"], tokens);
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

// ---- vectors ----------------------------------------------------------------------------------

#[test]
fn embedding_vector_is_deterministic_normalised_and_quantised() {
    let a = embedding_vector(1024, "hello");
    assert_eq!(a, embedding_vector(1024, "hello"));
    assert_ne!(a, embedding_vector(1024, "hello!"));
    assert_eq!(a.len(), 1024);
    assert_eq!(embedding_vector(3072, "hello").len(), 3072);
    assert_eq!(embedding_vector(7, "").len(), 7);
    let norm: f64 = a
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    assert!((norm - 1.0).abs() < 1e-3, "norm {norm}");
    for v in &a {
        let scaled = f64::from(*v) * 65536.0;
        assert_eq!(scaled, scaled.round(), "{v} is not a multiple of 2^-16");
        assert!((-1.0..=1.0).contains(v));
    }
    assert!(a.iter().any(|&v| v > 0.0) && a.iter().any(|&v| v < 0.0));
}

#[test]
fn every_quantised_value_survives_json_through_an_f64() {
    for k in -65536..=65536_i32 {
        #[allow(clippy::cast_precision_loss)]
        let value = k as f32 / 65536.0;
        let text = serde_json::to_string(&value).unwrap();
        let through_f64: f64 = text.parse().unwrap();
        #[allow(clippy::cast_possible_truncation)]
        let back = through_f64 as f32;
        assert_eq!(back.to_bits(), value.to_bits(), "{value} written as {text}");
    }
}

#[test]
fn count_tokens_uses_cl100k_base() {
    assert_eq!(count_tokens(""), 0);
    assert_eq!(count_tokens("hello world"), 2);
    // Special-token text is counted as ordinary text.
    assert!(count_tokens("<|endoftext|>") > 1);
}

// ---- embeddings -------------------------------------------------------------------------------

#[tokio::test]
async fn embeddings_return_the_vector_of_each_input_in_order() {
    let sim = start(SimConfig::default()).await;
    let inputs = [
        "first text",
        "second, longer text with more tokens",
        "héllo 🎉",
    ];
    let reply = embed(&sim, "svc-embed-1", &inputs).await;
    assert_eq!(reply.status, Some(StatusCode::OK));
    assert_eq!(reply.headers["content-type"], "application/json");
    assert_embeddings(&reply.json(), "svc-embed-1", 1024, &inputs);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_single_string_input_and_the_large_model() {
    let sim = start(SimConfig::default()).await;
    let reply = post(
        &sim,
        "/v1/embeddings",
        Some(KEY),
        &json!({ "model": "svc-embed-1-l", "input": "just one" }),
    )
    .await;
    assert_embeddings(&reply.json(), "svc-embed-1-l", 3072, &["just one"]);
}

#[tokio::test]
async fn served_values_parse_back_to_the_identical_f32() {
    let sim = start(SimConfig::default()).await;
    let inputs = texts(8);
    let body = embed(&sim, "svc-embed-1-l", &refs(&inputs)).await.json();
    for item in body["data"].as_array().unwrap() {
        let index = usize::try_from(item["index"].as_u64().unwrap()).unwrap();
        let expected = embedding_vector(3072, &inputs[index]);
        let served: Vec<f32> = vector(item);
        let served_bits: Vec<u32> = served.iter().map(|v| v.to_bits()).collect();
        let expected_bits: Vec<u32> = expected.iter().map(|v| v.to_bits()).collect();
        assert_eq!(served_bits, expected_bits);
    }
}

#[tokio::test]
async fn a_model_added_by_config_serves_its_own_length() {
    let sim = start(SimConfig {
        models: vec![ModelSpec::embedding("tiny-embed", 8)],
        ..SimConfig::default()
    })
    .await;
    let reply = embed(&sim, "tiny-embed", &["a", "b"]).await;
    assert_embeddings(&reply.json(), "tiny-embed", 8, &["a", "b"]);
    let gone = embed(&sim, "svc-embed-1", &["a"]).await;
    gone.error(404, "invalid_request_error", json!("model_not_found"));
}

// ---- models and keys --------------------------------------------------------------------------

#[tokio::test]
async fn models_lists_every_model_to_any_key_when_no_keys_are_configured() {
    let sim = start(SimConfig::default()).await;
    let body = get(&sim, "/v1/models", Some("whatever")).await.json();
    assert_eq!(body["object"], "list");
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["svc-embed-1", "svc-embed-1-l", "svc-base", "svc-pro"]);
    let pro = &body["data"][3];
    assert_eq!(pro["object"], "model");
    assert_eq!(pro["owned_by"], "svc");
    assert!(pro["created"].is_u64());
    assert_eq!(pro["context_window"], 128_000);
    assert_eq!(pro["modalities"], json!(["text", "vision"]));
    assert_eq!(pro["pricing"]["input_per_1k"], 0.003);
    assert_eq!(pro["pricing"]["output_per_1k"], 0.015);
    let embed = &body["data"][0];
    assert_eq!(embed["context_window"], 8192);
    assert_eq!(embed["pricing"]["input_per_1k"], 0.0001);
}

#[tokio::test]
async fn one_model_by_id() {
    let sim = start(SimConfig::default()).await;
    let model = get(&sim, "/v1/models/svc-embed-1-l", Some(KEY))
        .await
        .json();
    assert_eq!(model["id"], "svc-embed-1-l");
    assert_eq!(model["pricing"]["input_per_1k"], 0.00013);
    assert_eq!(model["modalities"], json!(["text"]));

    let missing = get(&sim, "/v1/models/svc-nope", Some(KEY)).await;
    let message = missing.error(404, "invalid_request_error", json!("model_not_found"));
    assert_eq!(
        message,
        "The model 'svc-nope' does not exist or you do not have access to it."
    );
}

fn limited_keys() -> SimConfig {
    SimConfig {
        keys: vec![
            KeySpec {
                key: "sk-embed-only".to_string(),
                models: Some(vec!["svc-embed-1".to_string()]),
            },
            KeySpec {
                key: "sk-everything".to_string(),
                models: None,
            },
        ],
        ..SimConfig::default()
    }
}

#[tokio::test]
async fn a_key_limited_to_one_model_sees_only_that_model() {
    let sim = start(limited_keys()).await;
    let listed = get(&sim, "/v1/models", Some("sk-embed-only")).await.json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["svc-embed-1"]);

    let hidden = get(&sim, "/v1/models/svc-embed-1-l", Some("sk-embed-only")).await;
    hidden.error(404, "invalid_request_error", json!("model_not_found"));
    let refused = post(
        &sim,
        "/v1/embeddings",
        Some("sk-embed-only"),
        &json!({ "model": "svc-embed-1-l", "input": ["x"] }),
    )
    .await;
    refused.error(404, "invalid_request_error", json!("model_not_found"));
    let allowed = post(
        &sim,
        "/v1/embeddings",
        Some("sk-embed-only"),
        &json!({ "model": "svc-embed-1", "input": ["x"] }),
    )
    .await;
    assert_eq!(allowed.status, Some(StatusCode::OK));

    let all = get(&sim, "/v1/models", Some("sk-everything")).await.json();
    assert_eq!(all["data"].as_array().unwrap().len(), 4);
}

#[tokio::test]
async fn a_missing_key_is_401() {
    let sim = start(SimConfig::default()).await;
    for outcome in [
        get(&sim, "/v1/models", None).await,
        get(&sim, "/v1/models/svc-base", None).await,
        post(&sim, "/v1/embeddings", None, &json!({})).await,
        post(&sim, "/v1/chat/completions", None, &json!({})).await,
        post(&sim, "/v1/embeddings", Some(""), &json!({})).await,
    ] {
        let message = outcome.error(401, "invalid_request_error", Value::Null);
        assert!(
            message.starts_with("You didn't provide an API key."),
            "{message}"
        );
    }
}

#[tokio::test]
async fn an_unknown_key_is_401_and_its_message_echoes_the_whole_key() {
    let sim = start(limited_keys()).await;
    let secret = "sk-not-a-real-key-ABCDEF123456";
    let outcome = post(
        &sim,
        "/v1/embeddings",
        Some(secret),
        &json!({ "model": "svc-embed-1", "input": ["x"] }),
    )
    .await;
    let message = outcome.error(401, "invalid_request_error", json!("invalid_api_key"));
    assert_eq!(message, format!("Incorrect API key provided: {secret}."));
    let listing = get(&sim, "/v1/models", Some(secret)).await;
    listing.error(401, "invalid_request_error", json!("invalid_api_key"));
}

#[tokio::test]
async fn an_unknown_url_is_a_404_in_the_service_shape() {
    let sim = start(SimConfig::default()).await;
    let outcome = get(&sim, "/v1/nothing-here", Some(KEY)).await;
    outcome.error(404, "invalid_request_error", json!("unknown_url"));
    let wrong_method = get(&sim, "/v1/embeddings", Some(KEY)).await;
    wrong_method.error(405, "invalid_request_error", Value::Null);
}

// ---- bad requests -----------------------------------------------------------------------------

#[tokio::test]
async fn malformed_embeddings_requests_are_400_with_a_precise_message() {
    let sim = start(SimConfig::default()).await;
    let cases: Vec<(String, &str)> = vec![
        (
            "{\"model\": \"svc-embed-1\", \"input\": [".to_string(),
            "parse the JSON body",
        ),
        ("[1, 2]".to_string(), "must be a JSON object"),
        (json!({ "input": ["x"] }).to_string(), "'model'"),
        (json!({ "model": "svc-embed-1" }).to_string(), "'input'"),
        (json!({ "model": 7, "input": ["x"] }).to_string(), "'model'"),
        (
            json!({ "model": "svc-embed-1", "input": 7 }).to_string(),
            "'input'",
        ),
        (
            json!({ "model": "svc-embed-1", "input": [] }).to_string(),
            "must not be empty",
        ),
        (
            json!({ "model": "svc-embed-1", "input": ["a", 3] }).to_string(),
            "'input[1]'",
        ),
        (
            json!({ "model": "svc-embed-1", "input": ["a", ""] }).to_string(),
            "'input[1]'",
        ),
        (
            json!({ "model": "svc-base", "input": ["a"] }).to_string(),
            "chat model",
        ),
    ];
    for (body, expected) in cases {
        let outcome = post_raw(&sim, "/v1/embeddings", Some(KEY), body.clone()).await;
        assert_eq!(outcome.status, Some(StatusCode::BAD_REQUEST), "{body}");
        let error = outcome.json()["error"].clone();
        assert_eq!(error["type"], "invalid_request_error", "{body}");
        assert!(
            error["code"].is_null() || error["code"] == "invalid_value",
            "{body}: {error}"
        );
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    assert_eq!(sim.ledger().billed_requests, 0);
}

#[tokio::test]
async fn malformed_chat_requests_are_400_with_a_precise_message() {
    let sim = start(SimConfig::default()).await;
    let hello = json!([{ "role": "user", "content": "hello" }]);
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({ "model": "svc-base", "messages": hello, "temperature": 2.5 }),
            "'temperature'",
        ),
        (
            json!({ "model": "svc-base", "messages": hello, "temperature": -0.1 }),
            "'temperature'",
        ),
        (
            json!({ "model": "svc-base", "messages": hello, "temperature": "warm" }),
            "'temperature'",
        ),
        (json!({ "model": "svc-base" }), "'messages'"),
        (json!({ "model": "svc-base", "messages": [] }), "'messages'"),
        (
            json!({ "model": "svc-base", "messages": [{ "role": "user" }] }),
            "'messages[0].content'",
        ),
        (
            json!({ "model": "svc-base", "messages": [{ "role": "boss", "content": "x" }] }),
            "'messages[0].role'",
        ),
        (
            json!({ "model": "svc-base", "messages": hello, "max_tokens": 0 }),
            "'max_tokens'",
        ),
        (
            json!({ "model": "svc-base", "messages": hello, "stream": "yes" }),
            "'stream'",
        ),
        (
            json!({ "model": "svc-embed-1", "messages": hello }),
            "embedding model",
        ),
    ];
    for (body, expected) in cases {
        let outcome = post(&sim, "/v1/chat/completions", Some(KEY), &body).await;
        assert_eq!(outcome.status, Some(StatusCode::BAD_REQUEST), "{body}");
        let message = outcome.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(message.contains(expected), "{body}: {message}");
    }
    let edge = post(
        &sim,
        "/v1/chat/completions",
        Some(KEY),
        &json!({ "model": "svc-base", "messages": hello, "temperature": 2.0 }),
    )
    .await;
    assert_eq!(
        edge.status,
        Some(StatusCode::OK),
        "temperature 2.0 is allowed"
    );
}

#[tokio::test]
async fn a_body_over_the_byte_limit_is_413_in_the_service_shape() {
    let sim = start(SimConfig {
        max_body_bytes: 1000,
        ..SimConfig::default()
    })
    .await;
    let outcome = embed(&sim, "svc-embed-1", &[&"x".repeat(2000)]).await;
    outcome.error(413, "invalid_request_error", json!("request_too_large"));
    assert_eq!(sim.ledger().faults.get("too_large"), Some(&1));
}

// ---- too large --------------------------------------------------------------------------------

#[tokio::test]
async fn too_many_inputs_gets_the_configured_status() {
    for status in [413, 400] {
        let sim = start(SimConfig {
            max_inputs_per_request: Some(3),
            too_large_status: status,
            ..SimConfig::default()
        })
        .await;
        let inputs = texts(4);
        let outcome = embed(&sim, "svc-embed-1", &refs(&inputs)).await;
        let message = outcome.error(status, "invalid_request_error", json!("too_many_inputs"));
        assert_eq!(
            message,
            "Too many inputs: got 4, the maximum is 3 per request."
        );
        let fits = embed(&sim, "svc-embed-1", &refs(&inputs[..3])).await;
        assert_eq!(fits.status, Some(StatusCode::OK));
        let ledger = sim.ledger();
        assert_eq!(ledger.faults.get("too_large"), Some(&1));
        assert_eq!(ledger.billed_requests, 1);
    }
}

#[tokio::test]
async fn too_many_tokens_gets_the_configured_status() {
    let inputs = ["one two three four five", "six seven eight nine ten"];
    let tokens: u64 = inputs.iter().map(|t| u64::from(count_tokens(t))).sum();
    for status in [413, 400] {
        let sim = start(SimConfig {
            max_tokens_per_request: Some(tokens - 1),
            too_large_status: status,
            ..SimConfig::default()
        })
        .await;
        let outcome = embed(&sim, "svc-embed-1", &inputs).await;
        let message = outcome.error(status, "invalid_request_error", json!("request_too_large"));
        assert_eq!(
            message,
            format!(
                "Request too large: {tokens} tokens, the maximum is {} tokens per request.",
                tokens - 1
            )
        );
        let fits = embed(&sim, "svc-embed-1", &inputs[..1]).await;
        assert_eq!(fits.status, Some(StatusCode::OK));
        assert_eq!(sim.ledger().billed_requests, 1);
    }
}

#[tokio::test]
async fn an_input_over_the_context_window_is_400_whatever_the_configured_status() {
    let sim = start(SimConfig {
        models: vec![ModelSpec {
            context_window: 5,
            ..ModelSpec::embedding("small-window", 4)
        }],
        too_large_status: 413,
        ..SimConfig::default()
    })
    .await;
    let long = "one two three four five six seven";
    let outcome = embed(&sim, "small-window", &["short", long]).await;
    let message = outcome.error(
        400,
        "invalid_request_error",
        json!("context_length_exceeded"),
    );
    assert_eq!(
        message,
        format!(
            "This model's maximum context length is 5 tokens, however you requested {} tokens. \
             Please reduce your input.",
            count_tokens(long)
        )
    );
    let ledger = sim.ledger();
    assert_eq!(ledger.billed_requests, 0);
    assert_eq!(ledger.prompt_tokens, 0);
    assert_eq!(ledger.faults.get("too_large"), Some(&1));
}

#[tokio::test]
async fn a_poisoned_input_is_refused_as_over_the_context_window() {
    let sim = start(SimConfig {
        poison: Some("POISON".to_string()),
        ..SimConfig::default()
    })
    .await;
    let outcome = embed(&sim, "svc-embed-1", &["fine", "a POISON pill"]).await;
    let message = outcome.error(
        400,
        "invalid_request_error",
        json!("context_length_exceeded"),
    );
    assert!(
        message.contains("maximum context length is 8192 tokens"),
        "{message}"
    );
    let fine = embed(&sim, "svc-embed-1", &["fine"]).await;
    assert_eq!(fine.status, Some(StatusCode::OK));
}

#[tokio::test]
async fn too_large_is_checked_before_faults_are_drawn() {
    let sim = start(SimConfig {
        max_inputs_per_request: Some(1),
        faults: Faults {
            rate_500: 1.0,
            limit: Some(1),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let outcome = embed(&sim, "svc-embed-1", &["a", "b"]).await;
    outcome.error(413, "invalid_request_error", json!("too_many_inputs"));
    // The one fault allowed is still unspent.
    let next = embed(&sim, "svc-embed-1", &["a"]).await;
    next.error(500, "server_error", Value::Null);
    let ledger = sim.ledger();
    assert_eq!(ledger.faults.get("too_large"), Some(&1));
    assert_eq!(ledger.faults.get("500"), Some(&1));
}

// ---- faults -----------------------------------------------------------------------------------

/// Sends three identical requests to a simulator injecting `faults` with limit 2,
/// checks the third is normal and billed, and returns the first two outcomes.
async fn two_faults_then_normal(faults: Faults, inputs: &[&str]) -> (Vec<Outcome>, Ledger) {
    let sim = start(with_faults(Faults {
        limit: Some(2),
        ..faults
    }))
    .await;
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        outcomes.push(embed(&sim, "svc-embed-1", inputs).await);
    }
    let normal = outcomes.pop().unwrap();
    assert_eq!(normal.status, Some(StatusCode::OK));
    assert_embeddings(&normal.json(), "svc-embed-1", 1024, inputs);
    let ledger = sim.ledger();
    assert_eq!(ledger.embedding_requests, 3);
    sim.shutdown().await;
    (outcomes, ledger)
}

#[tokio::test]
async fn fault_429_carries_retry_after_in_seconds_and_milliseconds() {
    let (outcomes, ledger) = two_faults_then_normal(
        Faults {
            rate_429: 1.0,
            retry_after_seconds: 3,
            ..Faults::default()
        },
        &["a"],
    )
    .await;
    for outcome in &outcomes {
        outcome.error(429, "rate_limit_exceeded", json!("rate_limit_exceeded"));
        assert_eq!(outcome.headers["retry-after"], "3");
        assert_eq!(outcome.headers["retry-after-ms"], "3000");
    }
    assert_eq!(ledger.faults.get("429"), Some(&2));
    assert_eq!(ledger.billed_requests, 1);
}

#[tokio::test]
async fn faults_500_and_503_are_server_errors() {
    for (rate_500, rate_503, status, name) in [(1.0, 0.0, 500, "500"), (0.0, 1.0, 503, "503")] {
        let (outcomes, ledger) = two_faults_then_normal(
            Faults {
                rate_500,
                rate_503,
                ..Faults::default()
            },
            &["a"],
        )
        .await;
        for outcome in &outcomes {
            outcome.error(status, "server_error", Value::Null);
        }
        assert_eq!(ledger.faults.get(name), Some(&2));
        assert_eq!(ledger.billed_requests, 1);
    }
}

#[tokio::test]
async fn fault_drop_cuts_the_connection_before_any_body_byte() {
    let (outcomes, ledger) = two_faults_then_normal(
        Faults {
            rate_drop: 1.0,
            ..Faults::default()
        },
        &["a", "b"],
    )
    .await;
    for outcome in &outcomes {
        assert!(!outcome.complete, "{outcome:?}");
        assert!(outcome.body.is_empty(), "{outcome:?}");
    }
    assert_eq!(ledger.faults.get("drop"), Some(&2));
    assert_eq!(ledger.billed_requests, 1);
    assert_eq!(ledger.texts.len(), 2);
}

#[tokio::test]
async fn fault_truncate_sends_part_of_the_body_then_cuts_it() {
    let (outcomes, ledger) = two_faults_then_normal(
        Faults {
            rate_truncate: 1.0,
            ..Faults::default()
        },
        &["a", "b"],
    )
    .await;
    for outcome in &outcomes {
        assert_eq!(outcome.status, Some(StatusCode::OK));
        assert!(!outcome.complete, "the body must end in an error");
        assert!(
            outcome.body.starts_with(b"{\"object\":\"list\""),
            "{}",
            outcome.text()
        );
        assert!(serde_json::from_slice::<Value>(&outcome.body).is_err());
    }
    assert_eq!(ledger.faults.get("truncate"), Some(&2));
    assert_eq!(ledger.billed_requests, 1);
}

#[tokio::test]
async fn fault_slow_delays_a_normal_billed_response() {
    let sim = start(with_faults(Faults {
        rate_slow: 1.0,
        slow_ms: 150,
        limit: Some(1),
        ..Faults::default()
    }))
    .await;
    let began = Instant::now();
    let slow = embed(&sim, "svc-embed-1", &["a"]).await;
    assert!(began.elapsed() >= Duration::from_millis(150));
    assert_embeddings(&slow.json(), "svc-embed-1", 1024, &["a"]);
    let normal = embed(&sim, "svc-embed-1", &["a"]).await;
    assert_embeddings(&normal.json(), "svc-embed-1", 1024, &["a"]);
    let ledger = sim.ledger();
    assert_eq!(ledger.faults.get("slow"), Some(&1));
    assert_eq!(ledger.billed_requests, 2);
    assert_eq!(ledger.texts.get(&sha256_hex("a")), Some(&2));
}

#[tokio::test]
async fn fault_shuffle_keeps_correct_indices_and_is_billed() {
    let inputs = texts(6);
    let inputs = refs(&inputs);
    let (outcomes, ledger) = two_faults_then_normal(
        Faults {
            rate_shuffle: 1.0,
            seed: 7,
            ..Faults::default()
        },
        &inputs,
    )
    .await;
    for outcome in &outcomes {
        let body = outcome.json();
        let data = body["data"].as_array().unwrap();
        let indices: Vec<usize> = data
            .iter()
            .map(|item| usize::try_from(item["index"].as_u64().unwrap()).unwrap())
            .collect();
        assert_ne!(indices, (0..6).collect::<Vec<_>>(), "the order is shuffled");
        assert_eq!(indices.iter().copied().collect::<BTreeSet<_>>().len(), 6);
        for (item, index) in data.iter().zip(indices) {
            assert_eq!(vector(item), embedding_vector(1024, inputs[index]));
        }
    }
    assert_eq!(ledger.faults.get("shuffle"), Some(&2));
    assert_eq!(ledger.billed_requests, 3);
}

#[tokio::test]
async fn fault_wrong_dimensions_makes_one_vector_short_and_is_billed() {
    let (outcomes, ledger) = two_faults_then_normal(
        Faults {
            rate_wrong_dimensions: 1.0,
            ..Faults::default()
        },
        &["a", "b", "c"],
    )
    .await;
    for outcome in &outcomes {
        let body = outcome.json();
        let mut lengths: Vec<usize> = body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["embedding"].as_array().unwrap().len())
            .collect();
        lengths.sort_unstable();
        assert_eq!(lengths, [1023, 1024, 1024]);
    }
    assert_eq!(ledger.faults.get("wrong_dimensions"), Some(&2));
    assert_eq!(ledger.billed_requests, 3, "an answer computed is billed");
    assert_eq!(ledger.texts.get(&sha256_hex("a")), Some(&3));
}

#[tokio::test]
async fn fault_nan_writes_a_bare_nan_that_is_not_json() {
    let (outcomes, ledger) = two_faults_then_normal(
        Faults {
            rate_nan: 1.0,
            ..Faults::default()
        },
        &["a", "b"],
    )
    .await;
    for outcome in &outcomes {
        assert_eq!(outcome.status, Some(StatusCode::OK));
        assert!(outcome.complete);
        let text = outcome.text();
        assert_eq!(text.matches("NaN").count(), 1, "{text}");
        assert!(serde_json::from_slice::<Value>(&outcome.body).is_err());
    }
    assert_eq!(ledger.faults.get("nan"), Some(&2));
    assert_eq!(ledger.billed_requests, 3, "an answer computed is billed");
}

#[tokio::test]
async fn the_same_seed_injects_the_same_faults() {
    async fn statuses(seed: u64) -> Vec<Option<StatusCode>> {
        let sim = start(with_faults(Faults {
            seed,
            rate_500: 0.5,
            ..Faults::default()
        }))
        .await;
        let mut statuses = Vec::new();
        for _ in 0..16 {
            statuses.push(embed(&sim, "svc-embed-1", &["a"]).await.status);
        }
        statuses
    }
    let first = statuses(42).await;
    assert_eq!(first, statuses(42).await);
    assert!(first.contains(&Some(StatusCode::OK)));
    assert!(first.contains(&Some(StatusCode::INTERNAL_SERVER_ERROR)));
}

#[tokio::test]
async fn latency_delays_every_request() {
    let sim = start(SimConfig {
        latency_ms: 120,
        ..SimConfig::default()
    })
    .await;
    let began = Instant::now();
    let outcome = embed(&sim, "svc-embed-1", &["a"]).await;
    assert_eq!(outcome.status, Some(StatusCode::OK));
    assert!(began.elapsed() >= Duration::from_millis(120));
    assert!(sim.ledger().faults.is_empty(), "latency is not a fault");
}

#[tokio::test]
async fn fault_rates_adding_up_to_more_than_one_are_refused() {
    let error = Simulator::start(with_faults(Faults {
        rate_429: 0.6,
        rate_drop: 0.6,
        ..Faults::default()
    }))
    .await
    .expect_err("rates over 1 are a config error");
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    assert!(error.to_string().contains("add up to"), "{error}");
}

// ---- chat -------------------------------------------------------------------------------------

fn chat_body(content: &str, extra: &Value) -> Value {
    let mut body = json!({
        "model": "svc-base",
        "messages": [
            { "role": "system", "content": "be brief" },
            { "role": "user", "content": content },
        ],
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

#[tokio::test]
async fn chat_replies_with_the_last_user_message() {
    let sim = start(SimConfig::default()).await;
    let outcome = post(
        &sim,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("hello there", &json!({ "temperature": 0.2 })),
    )
    .await;
    let body = outcome.json();
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-sim-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "svc-base");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "You said: hello there");
    assert_eq!(choice["finish_reason"], "stop");
    let prompt = u64::from(count_tokens("be brief") + count_tokens("hello there"));
    let completion = u64::from(count_tokens("You said: hello there"));
    assert_eq!(body["usage"]["prompt_tokens"], prompt);
    assert_eq!(body["usage"]["completion_tokens"], completion);
    assert_eq!(body["usage"]["total_tokens"], prompt + completion);
    assert_eq!(sim.ledger().chat_requests, 1);
}

#[tokio::test]
async fn chat_cuts_the_reply_to_max_tokens_words() {
    let sim = start(SimConfig::default()).await;
    let body = post(
        &sim,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("one two three four", &json!({ "max_tokens": 3 })),
    )
    .await
    .json();
    assert_eq!(body["choices"][0]["message"]["content"], "You said: one");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

/// The `data:` payloads of an SSE body, and whether it has a keep-alive comment.
fn sse_data(text: &str) -> (Vec<String>, bool) {
    let mut data = Vec::new();
    let mut keep_alive = false;
    for event in text.split("\n\n").filter(|e| !e.is_empty()) {
        for line in event.lines() {
            if let Some(payload) = line.strip_prefix("data: ") {
                data.push(payload.to_string());
            } else if line.starts_with(':') {
                keep_alive = true;
            } else {
                panic!("unexpected SSE line {line:?}");
            }
        }
    }
    (data, keep_alive)
}

#[tokio::test]
async fn chat_streams_role_then_content_then_stop_then_done() {
    let sim = start(SimConfig::default()).await;
    let said = "stream me a reasonably long reply, wördly and 🎉";
    let outcome = post(
        &sim,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body(said, &json!({ "stream": true })),
    )
    .await;
    assert_eq!(outcome.status, Some(StatusCode::OK));
    assert!(outcome.complete);
    assert!(outcome.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = outcome.text();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let (data, keep_alive) = sse_data(&text);
    assert!(keep_alive, "the stream carries a keep-alive comment");
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({ "role": "assistant" })
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    let content: Vec<&str> = chunks[1..chunks.len() - 1]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert!(content.len() > 3, "several fragments: {content:?}");
    assert_eq!(content.concat(), format!("You said: {said}"));
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "svc-base");
    }
}

#[tokio::test]
async fn a_truncated_chat_stream_never_sends_done() {
    let sim = start(with_faults(Faults {
        rate_truncate: 1.0,
        limit: Some(1),
        ..Faults::default()
    }))
    .await;
    let body = chat_body(
        "a reply long enough to cut in half",
        &json!({ "stream": true }),
    );
    let cut = post(&sim, "/v1/chat/completions", Some(KEY), &body).await;
    assert_eq!(cut.status, Some(StatusCode::OK));
    let text = cut.text();
    assert!(!text.contains("[DONE]"), "{text}");
    assert!(!text.contains("finish_reason\":\"stop"), "{text}");
    let (data, _) = sse_data(&text);
    assert!(data.len() >= 2, "some events arrive: {text}");

    let whole = post(&sim, "/v1/chat/completions", Some(KEY), &body).await;
    assert!(whole.text().ends_with("data: [DONE]\n\n"));
    assert_eq!(sim.ledger().faults.get("truncate"), Some(&1));
}

#[tokio::test]
async fn chat_gets_server_faults_but_not_embeddings_only_ones() {
    let sim = start(with_faults(Faults {
        rate_429: 0.5,
        rate_shuffle: 0.5,
        seed: 3,
        ..Faults::default()
    }))
    .await;
    let body = chat_body("hi", &json!({}));
    let mut seen_429 = false;
    for _ in 0..12 {
        let outcome = post(&sim, "/v1/chat/completions", Some(KEY), &body).await;
        match outcome.status {
            Some(StatusCode::OK) => {
                assert_eq!(
                    outcome.json()["choices"][0]["message"]["content"],
                    "You said: hi"
                );
            }
            Some(StatusCode::TOO_MANY_REQUESTS) => {
                seen_429 = true;
                assert_eq!(outcome.headers["retry-after"], "1");
            }
            other => panic!("unexpected status {other:?}"),
        }
    }
    assert!(seen_429);
    assert!(!sim.ledger().faults.contains_key("shuffle"));
}

// ---- ledger -----------------------------------------------------------------------------------

#[tokio::test]
async fn the_ledger_counts_requests_and_bills_every_answer_computed() {
    let sim = start(SimConfig {
        faults: Faults {
            rate_nan: 1.0,
            limit: Some(1),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    // Billed although a value is NaN, as a service bills what it computed.
    embed(&sim, "svc-embed-1", &["alpha", "beta"]).await;
    // Not billed: no key, bad request.
    post(&sim, "/v1/embeddings", None, &json!({})).await;
    post(
        &sim,
        "/v1/embeddings",
        Some(KEY),
        &json!({ "model": "svc-embed-1" }),
    )
    .await;
    embed(&sim, "svc-embed-1", &["alpha", "beta"]).await;
    embed(&sim, "svc-embed-1", &["alpha"]).await;
    get(&sim, "/v1/models", Some(KEY)).await;
    get(&sim, "/v1/unknown", Some(KEY)).await;
    post(
        &sim,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("hi", &json!({})),
    )
    .await;

    let ledger = sim.ledger();
    assert_eq!(ledger.requests, 8);
    assert_eq!(ledger.embedding_requests, 5);
    assert_eq!(ledger.billed_requests, 3);
    assert_eq!(ledger.chat_requests, 1);
    let tokens = u64::from(3 * count_tokens("alpha") + 2 * count_tokens("beta"));
    assert_eq!(ledger.prompt_tokens, tokens);
    assert_eq!(ledger.total_tokens, tokens);
    assert_eq!(ledger.faults.get("nan"), Some(&1));
    assert_eq!(ledger.texts.len(), 2);
    assert_eq!(ledger.texts.get(&sha256_hex("alpha")), Some(&3));
    assert_eq!(ledger.texts.get(&sha256_hex("beta")), Some(&2));
    assert_eq!(
        ledger.billed_sizes,
        [(1, 1), (2, 2)].into_iter().collect(),
        "billed requests by their number of inputs"
    );

    // The ledger endpoints need no key and are not counted.
    let served: Ledger = serde_json::from_value(get(&sim, "/_ledger", None).await.json()).unwrap();
    assert_eq!(served, ledger);
    let counts = get(&sim, "/_ledger?texts=false", None).await.json();
    assert!(counts.get("texts").is_none(), "{counts}");
    assert_eq!(counts["billed_requests"], 3);
    assert_eq!(counts["faults"]["nan"], 1);
    let without_texts: Ledger = serde_json::from_value(counts).unwrap();
    assert_eq!(
        without_texts,
        Ledger {
            texts: Default::default(),
            ..ledger.clone()
        }
    );

    let reset = post(&sim, "/_ledger/reset", None, &json!({})).await;
    assert_eq!(reset.status, Some(StatusCode::OK));
    assert_eq!(sim.ledger(), Ledger::default());
    embed(&sim, "svc-embed-1", &["gamma"]).await;
    assert_eq!(sim.ledger().billed_requests, 1);
    sim.reset_ledger();
    assert_eq!(sim.ledger(), Ledger::default());
}

// ---- options ----------------------------------------------------------------------------------

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    options: SimulateOptions,
}

fn options(args: &[&str]) -> SimulateOptions {
    let argv = std::iter::once("simulate").chain(args.iter().copied());
    Cli::try_parse_from(argv).expect("flags parse").options
}

#[test]
fn options_build_the_configuration() {
    let config = options(&[
        "--port",
        "0",
        "--key",
        "sk-a=svc-embed-1,svc-base",
        "--key",
        "sk-b",
        "--model",
        "my-embed=16",
        "--max-inputs-per-request",
        "64",
        "--too-large-status",
        "400",
        "--rate-429",
        "0.25",
        "--rate-nan",
        "0.25",
        "--fault-limit",
        "3",
        "--seed",
        "9",
    ])
    .to_config()
    .expect("valid options");
    assert_eq!(config.keys.len(), 2);
    assert_eq!(
        config.keys[0].models,
        Some(vec!["svc-embed-1".to_string(), "svc-base".to_string()])
    );
    assert_eq!(config.keys[1].models, None);
    assert!(config
        .models
        .contains(&ModelSpec::embedding("my-embed", 16)));
    assert_eq!(config.models.len(), 5);
    assert_eq!(config.max_inputs_per_request, Some(64));
    assert_eq!(config.too_large_status, 400);
    assert!((config.faults.rate_429 - 0.25).abs() < f64::EPSILON);
    assert_eq!(config.faults.limit, Some(3));
    assert_eq!(config.faults.seed, 9);
    assert_eq!(config.faults.retry_after_seconds, 1);
}

#[test]
fn invalid_options_are_all_reported_by_flag_name() {
    let problems = options(&[
        "--rate-wrong-dimensions",
        "1.5",
        "--too-large-status",
        "418",
        "--model",
        "no-length",
        "--key",
        "sk-x=svc-unknown",
    ])
    .to_config()
    .expect_err("invalid options");
    for expected in [
        "--rate-wrong-dimensions",
        "--too-large-status",
        "--model no-length",
        "svc-unknown",
    ] {
        assert!(problems.contains(expected), "{expected} in {problems}");
    }
    assert!(
        !problems.contains("sk-x"),
        "keys are never echoed: {problems}"
    );
    let sum = options(&["--rate-500", "0.7", "--rate-503", "0.7"])
        .to_config()
        .expect_err("rates over 1");
    assert!(sum.contains("add up to"), "{sum}");
}

#[test]
fn a_simulator_can_be_shared_between_tasks() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Simulator>();
}

#[tokio::test]
async fn the_simulator_listens_on_localhost_only() {
    let sim = start(SimConfig::default()).await;
    assert!(sim.addr().ip().is_loopback());
    assert_eq!(
        sim.base_url(),
        format!("http://127.0.0.1:{}", sim.addr().port())
    );
    let url = sim.base_url();
    sim.shutdown().await;
    let after = client()
        .get(format!("{url}/v1/models"))
        .bearer_auth(KEY)
        .send()
        .await;
    assert!(after.is_err(), "nothing listens after shutdown");
}

// ---- what real servers accept, and how they differ ---------------------------------------------

fn decode_base64(item: &Value) -> Vec<f32> {
    use base64::Engine as _;
    let text = item["embedding"].as_str().expect("a base64 string");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("valid base64");
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[tokio::test]
async fn base64_embeddings_are_the_vectors_as_little_endian_floats() {
    let sim = start(SimConfig::default()).await;
    let inputs = ["one", "two"];
    let body = post(
        &sim,
        "/v1/embeddings",
        Some(KEY),
        &json!({ "model": "svc-embed-1", "input": inputs, "encoding_format": "base64" }),
    )
    .await
    .json();
    for (item, text) in body["data"].as_array().unwrap().iter().zip(inputs) {
        assert_eq!(decode_base64(item), embedding_vector(1024, text));
    }
    let float = post(
        &sim,
        "/v1/embeddings",
        Some(KEY),
        &json!({ "model": "svc-embed-1", "input": "one", "encoding_format": "float" }),
    )
    .await
    .json();
    assert_eq!(vector(&float["data"][0]), embedding_vector(1024, "one"));
    let message = post(
        &sim,
        "/v1/embeddings",
        Some(KEY),
        &json!({ "model": "svc-embed-1", "input": "one", "encoding_format": "int8" }),
    )
    .await
    .error(400, "invalid_request_error", json!("invalid_value"));
    assert!(message.contains("base64"), "{message}");
}

#[tokio::test]
async fn token_id_inputs_are_embedded_as_the_text_they_encode() {
    let sim = start(SimConfig::default()).await;
    let bpe = tiktoken_rs::cl100k_base_singleton();
    let (a, b) = ("token ids, as LangChain sends them", "and a second input");
    let (ids_a, ids_b) = (bpe.encode_ordinary(a), bpe.encode_ordinary(b));
    let one = post(
        &sim,
        "/v1/embeddings",
        Some(KEY),
        &json!({ "model": "svc-embed-1", "input": ids_a }),
    )
    .await
    .json();
    assert_eq!(one["data"].as_array().unwrap().len(), 1);
    assert_eq!(vector(&one["data"][0]), embedding_vector(1024, a));
    assert_eq!(one["usage"]["prompt_tokens"], ids_a.len());
    let many = post(
        &sim,
        "/v1/embeddings",
        Some(KEY),
        &json!({ "model": "svc-embed-1", "input": [ids_a, ids_b] }),
    )
    .await
    .json();
    assert_eq!(vector(&many["data"][1]), embedding_vector(1024, b));
    assert_eq!(many["usage"]["prompt_tokens"], ids_a.len() + ids_b.len());
    for bad in [
        json!([[1, -2]]),
        json!([[4_000_000_000u64]]),
        json!([[1], "x", 7]),
    ] {
        post(
            &sim,
            "/v1/embeddings",
            Some(KEY),
            &json!({ "model": "svc-embed-1", "input": bad }),
        )
        .await
        .error(400, "invalid_request_error", json!("invalid_value"));
    }
    assert_eq!(sim.ledger().texts.get(&sha256_hex(a)), Some(&2));
}

#[tokio::test]
async fn dimensions_shorten_refuse_or_are_ignored_as_the_model_does() {
    let mut config = SimConfig::default();
    let parsed = options(&[
        "--model",
        "plain=64",
        "--model",
        "wide=48:ignores-dimensions",
    ])
    .to_config()
    .unwrap();
    config.models = parsed.models;
    let sim = start(config).await;
    let ask = |model: &'static str, dimensions: u64| {
        let sim = &sim;
        async move {
            post(
                sim,
                "/v1/embeddings",
                Some(KEY),
                &json!({ "model": model, "input": ["a text"], "dimensions": dimensions }),
            )
            .await
        }
    };
    let short = ask("svc-embed-1", 256).await.json();
    let vector = vector(&short["data"][0]);
    assert_eq!(
        vector,
        embedjob::simulate::embedding_vector_shortened(1024, 256, "a text")
    );
    let norm: f64 = vector
        .iter()
        .map(|v| f64::from(*v).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!((norm - 1.0).abs() < 1e-3, "renormalised: {norm}");
    assert_eq!(
        &vector[..4],
        &{
            let full = embedding_vector(1024, "a text");
            let n: f64 = full[..256]
                .iter()
                .map(|v| f64::from(*v).powi(2))
                .sum::<f64>()
                .sqrt();
            full[..4]
                .iter()
                .map(|v| ((f64::from(*v) / n * 65536.0).round() / 65536.0) as f32)
                .collect::<Vec<_>>()
        }[..]
    );
    ask("svc-embed-1", 2048)
        .await
        .error(400, "invalid_request_error", json!("invalid_value"));
    let refused =
        ask("plain", 32)
            .await
            .error(400, "invalid_request_error", json!("invalid_value"));
    assert!(refused.contains("does not support matryoshka"), "{refused}");
    let ignored = ask("wide", 16).await.json();
    assert_eq!(
        ignored["data"][0]["embedding"].as_array().unwrap().len(),
        48
    );
}

#[tokio::test]
async fn a_stream_can_end_with_its_usage() {
    let sim = start(SimConfig::default()).await;
    let reply = post(
        &sim,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body(
            "count me",
            &json!({ "stream": true, "stream_options": { "include_usage": true } }),
        ),
    )
    .await;
    let text = reply.text();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let (last, rest) = events.split_last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert!(last["usage"]["total_tokens"].as_u64().unwrap() > 0);
    assert!(rest.iter().all(|e| e["usage"].is_null()));
    let message = post(
        &sim,
        "/v1/chat/completions",
        Some(KEY),
        &chat_body("x", &json!({ "stream_options": { "include_usage": true } })),
    )
    .await
    .error(400, "invalid_request_error", json!("invalid_value"));
    assert!(message.contains("only allowed when 'stream'"), "{message}");
}

#[tokio::test]
async fn the_simulator_can_serve_as_infinity_does() {
    let sim = start(SimConfig {
        url_prefix: String::new(),
        model_route: false,
        bare_listing: true,
        max_inputs_per_request: Some(2),
        too_large_status: 422,
        ..SimConfig::default()
    })
    .await;
    let body = post(
        &sim,
        "/embeddings",
        Some(KEY),
        &json!({ "model": "svc-embed-1", "input": ["a", "b"] }),
    )
    .await
    .json();
    assert_eq!(vector(&body["data"][1]), embedding_vector(1024, "b"));
    let missing = embed(&sim, "svc-embed-1", &["a"]).await;
    assert_eq!(missing.status, Some(StatusCode::NOT_FOUND), "no /v1 prefix");
    let route = get(&sim, "/models/svc-embed-1", Some(KEY)).await;
    assert_eq!(route.status, Some(StatusCode::NOT_FOUND));
    assert_eq!(route.json(), json!({ "detail": "Not Found" }));
    let listing = get(&sim, "/models", Some(KEY)).await.json();
    let first = listing["data"][0].as_object().unwrap();
    let keys: BTreeSet<&str> = first.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from(["created", "id", "object", "owned_by"])
    );
    let refused = post(
        &sim,
        "/embeddings",
        Some(KEY),
        &json!({ "model": "svc-embed-1", "input": ["a", "b", "c"] }),
    )
    .await;
    assert_eq!(refused.status, Some(StatusCode::UNPROCESSABLE_ENTITY));
    let detail = &refused.json()["detail"][0];
    assert_eq!(detail["type"], "too_long");
    assert_eq!(detail["ctx"]["max_length"], 2);
    assert_eq!(detail["loc"], json!(["body", "input"]));
    let ledger = sim.ledger();
    assert_eq!(ledger.billed_requests, 1);
    assert_eq!(
        ledger.embedding_requests, 2,
        "a request outside the prefix is not one"
    );
}

#[tokio::test]
async fn an_error_in_a_200_body_is_not_billed() {
    let sim = start(with_faults(Faults {
        rate_error_200: 1.0,
        ..Faults::default()
    }))
    .await;
    let reply = embed(&sim, "svc-embed-1", &["a"]).await;
    assert_eq!(reply.status, Some(StatusCode::OK));
    assert!(reply.json()["error"]["message"].is_string());
    let ledger = sim.ledger();
    assert_eq!(ledger.billed_requests, 0);
    assert_eq!(ledger.faults.get("error_200"), Some(&1));
}

#[tokio::test]
async fn tokens_can_be_billed_by_another_count() {
    let sim = start(SimConfig {
        billing: embedjob::simulate::Billing {
            count: embedjob::simulate::TokenCount::Bytes,
            factor: 1.5,
        },
        ..SimConfig::default()
    })
    .await;
    let inputs = ["twelve bytes", "a"];
    let body = embed(&sim, "svc-embed-1", &inputs).await.json();
    // ceil(12 / 4) * 1.5 = 4.5 → 5; ceil(1 / 4) * 1.5 = 1.5 → 2.
    assert_eq!(body["usage"]["prompt_tokens"], 7);
    assert_eq!(sim.ledger().prompt_tokens, 7);
}

#[tokio::test]
async fn a_slow_answer_is_billed_when_computed_though_the_client_gave_up() {
    let sim = start(SimConfig {
        latency_per_input_ms: 150,
        ..SimConfig::default()
    })
    .await;
    let started = Instant::now();
    let sent = client()
        .post(format!("{}/v1/embeddings", sim.base_url()))
        .bearer_auth(KEY)
        .timeout(Duration::from_millis(200))
        .json(&json!({ "model": "svc-embed-1", "input": ["a", "b", "c", "d"] }))
        .send()
        .await;
    assert!(sent.is_err(), "the client gave up");
    assert_eq!(sim.ledger().billed_requests, 0, "not computed yet");
    while sim.ledger().billed_requests == 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "never billed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(sim.ledger().billed_sizes.get(&4), Some(&1));
}

#[test]
fn options_configure_servers_as_people_run_them() {
    let config = options(&[
        "--url-prefix",
        "",
        "--no-model-route",
        "--bare-listing",
        "--bill-by",
        "bytes",
        "--bill-factor",
        "1.5",
        "--latency-per-input-ms",
        "20",
        "--too-large-status",
        "422",
        "--rate-error-200",
        "0.1",
        "--model",
        "m=8:matryoshka",
    ])
    .to_config()
    .expect("valid options");
    assert_eq!(config.url_prefix, "");
    assert!(!config.model_route && config.bare_listing);
    assert_eq!(config.billing.count, embedjob::simulate::TokenCount::Bytes);
    assert!((config.billing.factor - 1.5).abs() < f64::EPSILON);
    assert_eq!(config.latency_per_input_ms, 20);
    assert_eq!(config.too_large_status, 422);
    assert!((config.faults.rate_error_200 - 0.1).abs() < f64::EPSILON);
    let m = config.models.iter().find(|m| m.id == "m").unwrap();
    assert_eq!(
        m.dimensions_param,
        embedjob::simulate::DimensionsParam::Truncate
    );
    let problems = options(&[
        "--bill-by",
        "words",
        "--url-prefix",
        "v1/",
        "--model",
        "m=8:other",
        "--bill-factor",
        "0",
    ])
    .to_config()
    .expect_err("invalid options");
    for expected in [
        "--bill-by words",
        "--url-prefix",
        "--model m=8:other",
        "--bill-factor",
    ] {
        assert!(problems.contains(expected), "{expected} in {problems}");
    }
}
