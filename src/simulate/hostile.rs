//! Whatever a client sends (bodies of any JSON shape or none, fields of the
//! wrong type, token ids out of range, huge numbers, bytes that are not
//! JSON), the simulator answers with a 4xx that says what is wrong, or a
//! 200, never a 5xx it was not told to inject, and keeps serving.

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::{SimConfig, Simulator};

/// A JSON value of any shape, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e300f64..1e300).prop_map(Value::from),
        Just(json!(4_294_967_296u64)),
        Just(json!(-1)),
        Just(json!("")),
        "[ -~é\u{1F600}]{0,24}".prop_map(Value::String),
        Just(json!("svc-embed-1")),
        Just(json!("base64")),
        Just(json!("float")),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((field(), inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A field an embeddings request has, or not.
fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("input".to_string()),
        Just("model".to_string()),
        Just("encoding_format".to_string()),
        Just("dimensions".to_string()),
        Just("user".to_string()),
        "[a-z_]{1,8}",
    ]
}

/// A request body: an object with some of the fields, any JSON, or bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec((field(), any_json()), 0..6).prop_map(|fields| {
            serde_json::to_vec(&Value::Object(fields.into_iter().collect())).unwrap_or_default()
        }),
        any_json().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        prop::collection::vec(any::<u8>(), 0..64),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn no_request_body_gets_a_5xx_or_stops_the_simulator(
        bodies in prop::collection::vec(body(), 1..12),
        paths in prop::collection::vec(
            prop_oneof![Just("/v1/embeddings"), Just("/v1/chat/completions")],
            12,
        ),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        runtime.block_on(async {
            let sim = Simulator::start(SimConfig::default())
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let client = reqwest::Client::new();
            for (body, path) in bodies.into_iter().zip(paths) {
                let response = client
                    .post(format!("{}{path}", sim.base_url()))
                    .bearer_auth("any-key-will-do")
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .map_err(|e| TestCaseError::fail(format!("no answer: {e}")))?;
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                prop_assert!(
                    status.is_success() || status.is_client_error(),
                    "{status} for {}: {text}",
                    String::from_utf8_lossy(&body)
                );
                if status.is_client_error() {
                    let error: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    prop_assert!(
                        error["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
                        "{status} without a message: {text}"
                    );
                }
            }
            // Still serving.
            let ok = client
                .post(format!("{}/v1/embeddings", sim.base_url()))
                .bearer_auth("any-key-will-do")
                .json(&json!({"model": "svc-embed-1", "input": "still there"}))
                .send()
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(ok.status().is_success(), "{}", ok.status());
            sim.shutdown().await;
            Ok(())
        })?;
    }
}
