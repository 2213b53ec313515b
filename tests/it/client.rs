//! The typed client against the simulator and against scripted servers.

use std::time::Duration;

use embedjob::client::{ChatMessage, ChatRequest, EmbeddingInput, ErrorKind};
use embedjob::simulate::{self, Faults, KeySpec, SimConfig};
use embedjob::validate;
use futures::StreamExt;

use crate::support::{client, client_with_key, scripted_server, simulator, Scripted, KEY};

fn chat_request(model: &str, prompt: &str) -> ChatRequest {
    ChatRequest {
        model: model.to_string(),
        messages: vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", prompt),
        ],
        temperature: Some(0.2),
        max_tokens: None,
        stream: false,
    }
}

async fn collect(
    stream: embedjob::client::ChatStream,
) -> (String, Option<embedjob::client::ApiError>) {
    let mut text = String::new();
    let mut stream = stream;
    while let Some(item) = stream.next().await {
        match item {
            Ok(fragment) => text.push_str(&fragment),
            Err(e) => return (text, Some(e)),
        }
    }
    (text, None)
}

#[tokio::test]
async fn embeddings_one_text_and_many() {
    let sim = simulator(SimConfig::default()).await;
    let client = client(&sim.base_url());

    let one = client
        .embeddings("svc-embed-1", EmbeddingInput::One("hello"))
        .await
        .unwrap();
    let one = validate::check(one, 1, Some(1024)).unwrap();
    assert_eq!(
        one.row(0),
        simulate::embedding_vector(1024, "hello").as_slice()
    );
    assert_eq!(
        one.usage.prompt_tokens,
        u64::from(simulate::count_tokens("hello"))
    );

    let texts = vec!["alpha", "beta gamma", "delta"];
    let many = client
        .embeddings("svc-embed-1-l", EmbeddingInput::Many(texts.clone()))
        .await
        .unwrap();
    let many = validate::check(many, 3, Some(3072)).unwrap();
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(
            many.row(i),
            simulate::embedding_vector(3072, text).as_slice(),
            "row {i}"
        );
    }
}

#[tokio::test]
async fn base_url_with_slash_or_v1_reaches_the_same_service() {
    let sim = simulator(SimConfig::default()).await;
    for base in [
        sim.base_url(),
        format!("{}/", sim.base_url()),
        format!("{}/v1", sim.base_url()),
        format!("{}/v1/", sim.base_url()),
    ] {
        let models = client(&base).models().await.unwrap();
        assert!(models.iter().any(|m| m.id == "svc-embed-1"), "{base}");
    }
}

#[tokio::test]
async fn models_listing_and_one_model() {
    let sim = simulator(SimConfig::default()).await;
    let client = client(&sim.base_url());
    let models = client.models().await.unwrap();
    let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
    for id in ["svc-base", "svc-pro", "svc-embed-1", "svc-embed-1-l"] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }
    let pro = client.model("svc-pro").await.unwrap();
    assert_eq!(pro.modalities, vec!["text", "vision"]);
    assert!(pro.context_window.unwrap() > 0);
    let embed = client.model("svc-embed-1").await.unwrap();
    assert!(embed.pricing.unwrap().input_per_1k.unwrap() > 0.0);

    let err = client.model("svc-nope").await.unwrap_err();
    assert_eq!(err.status, Some(404));
    assert_eq!(err.kind, ErrorKind::Permanent);
    assert!(err.message.contains("svc-nope"), "{err}");
}

#[tokio::test]
async fn the_key_decides_which_models_are_visible() {
    let config = SimConfig {
        keys: vec![
            KeySpec {
                key: KEY.to_string(),
                models: Some(vec!["svc-embed-1".to_string()]),
            },
            KeySpec {
                key: "sk-other".to_string(),
                models: None,
            },
        ],
        ..SimConfig::default()
    };
    let sim = simulator(config).await;
    let limited = client(&sim.base_url());
    let ids: Vec<String> = limited
        .models()
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, vec!["svc-embed-1"]);
    assert_eq!(
        limited.model("svc-embed-1-l").await.unwrap_err().status,
        Some(404)
    );
    let err = limited
        .embeddings("svc-embed-1-l", EmbeddingInput::One("x"))
        .await
        .unwrap_err();
    assert_eq!(err.status, Some(404));

    let full = client_with_key(&sim.base_url(), "sk-other");
    assert!(full.models().await.unwrap().len() >= 4);

    let refused = client_with_key(&sim.base_url(), "sk-wrong-key-123");
    let err = refused.models().await.unwrap_err();
    assert_eq!(err.status, Some(401));
    assert_eq!(err.kind, ErrorKind::Permanent);
    assert!(
        !err.to_string().contains("sk-wrong-key-123"),
        "the refused key must be scrubbed from the server's message: {err}"
    );
    assert!(err.to_string().contains("[REDACTED]"), "{err}");
}

#[tokio::test]
async fn chat_plain_and_streamed_agree() {
    let sim = simulator(SimConfig::default()).await;
    let client = client(&sim.base_url());
    let request = chat_request("svc-base", "tell me about lighthouses");
    let plain = client.chat(&request).await.unwrap().text;
    assert!(plain.contains("lighthouses"), "{plain}");
    let stream = client.chat_stream(&request).await.unwrap();
    let (streamed, error) = collect(stream).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(streamed, plain);

    let mut bad = request.clone();
    bad.temperature = Some(2.5);
    let err = client.chat(&bad).await.unwrap_err();
    assert_eq!(err.status, Some(400));
    assert_eq!(err.kind, ErrorKind::Permanent);
}

/// `chat` returns what the reply was billed; a stream, asked for its usage
/// with `stream_options`, tells it once it has ended.
#[tokio::test]
async fn chat_returns_what_the_reply_was_billed() {
    let sim = simulator(SimConfig::default()).await;
    let client = client(&sim.base_url());
    let request = chat_request("svc-base", "count these tokens");
    let plain = client.chat(&request).await.unwrap();
    let usage = plain.usage.expect("the reply's usage");
    assert_eq!(
        usage.completion_tokens,
        u64::from(simulate::count_tokens(&plain.text))
    );
    assert_eq!(
        usage.total_tokens,
        usage.prompt_tokens + usage.completion_tokens
    );
    let mut stream = client.chat_stream(&request).await.unwrap();
    assert_eq!(stream.usage(), None, "not before the stream ends");
    let mut text = String::new();
    while let Some(fragment) = stream.next().await {
        text.push_str(&fragment.unwrap());
    }
    assert_eq!(text, plain.text);
    assert_eq!(stream.usage(), Some(usage));
}

/// A server that does not take `stream_options` is asked again without it.
#[tokio::test]
async fn a_stream_is_asked_for_without_usage_where_that_is_refused() {
    let (base, seen) = scripted_server(vec![
        Scripted::json(
            400,
            r#"{"error":{"message":"Unrecognized request argument supplied: stream_options"}}"#,
        ),
        Scripted::sse(&[
            "data: {\"choices\":[{\"delta\":{\"content\":\"fine\"}}]}\n\n",
            "data: [DONE]\n\n",
        ]),
    ])
    .await;
    let stream = client(&base)
        .chat_stream(&chat_request("svc-base", "hi"))
        .await
        .unwrap();
    assert_eq!(stream.usage(), None);
    let (text, error) = collect(stream).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text, "fine");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn sse_edge_cases_are_tolerated() {
    // CRLF, comments, blank lines, a role-only first chunk, a chunk without
    // content, an event split across reads (mid-UTF-8 too), no blank line
    // between two events.
    let body: [&[u8]; 11] = [
        b": welcome\r\n\r\n",
        b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\r\n\r\n",
        b"\n\n",
        b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        b"data: {\"choices\":[{\"del",
        b"ta\":{\"content\":\"lo, w\xC3",
        b"\xA9rld\"}}]}\n\n",
        b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":null}]}\n",
        b"data: {\"choices\":[{\"delta\":{\"content\":\"!\"}}]}\n\n",
        b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        b"data: [DONE]\n\n",
    ];
    let reply = Scripted {
        status: 200,
        headers: vec![("content-type", "text/event-stream".to_string())],
        pieces: body.iter().map(|p| p.to_vec()).collect(),
        abort: false,
        pause: None,
    };
    let (base, _) = scripted_server(vec![reply]).await;
    let stream = client(&base)
        .chat_stream(&chat_request("svc-base", "hi"))
        .await
        .unwrap();
    let (text, error) = collect(stream).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text, "Hello, wérld!");
}

#[tokio::test]
async fn a_stream_without_done_is_an_error_not_a_short_reply() {
    let (base, _) = scripted_server(vec![Scripted::sse(&[
        "data: {\"choices\":[{\"delta\":{\"content\":\"partial\"}}]}\n\n",
    ])])
    .await;
    let stream = client(&base)
        .chat_stream(&chat_request("svc-base", "hi"))
        .await
        .unwrap();
    let (text, error) = collect(stream).await;
    assert_eq!(text, "partial");
    let error = error.expect("a stream that ends without [DONE] must fail");
    assert!(error.message.contains("[DONE]"), "{error}");
    assert_eq!(error.kind, ErrorKind::Transient);

    let mut reset = Scripted::sse(&["data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"]);
    reset.abort = true;
    let (base, _) = scripted_server(vec![reset]).await;
    let stream = client(&base)
        .chat_stream(&chat_request("svc-base", "hi"))
        .await
        .unwrap();
    let (_, error) = collect(stream).await;
    assert_eq!(
        error.expect("a reset stream fails").kind,
        ErrorKind::Transient
    );
}

#[tokio::test]
async fn simulator_stream_faults_end_without_done() {
    let config = SimConfig {
        faults: Faults {
            rate_truncate: 1.0,
            ..Faults::default()
        },
        ..SimConfig::default()
    };
    let sim = simulator(config).await;
    let stream = client(&sim.base_url())
        .chat_stream(&chat_request("svc-base", "a long enough prompt to cut"))
        .await
        .unwrap();
    let (_, error) = collect(stream).await;
    assert!(error.is_some(), "a truncated stream must end with an error");
}

#[tokio::test]
async fn error_classes_and_messages() {
    let cases: Vec<(Scripted, ErrorKind, &str)> = vec![
        (
            Scripted::json(
                400,
                r#"{"error":{"message":"'input' is required","type":"invalid_request_error","code":null}}"#,
            ),
            ErrorKind::Permanent,
            "'input' is required",
        ),
        (
            Scripted::json(
                401,
                r#"{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}"#,
            ),
            ErrorKind::Permanent,
            "bad key",
        ),
        (
            Scripted::json(403, r#"{"error":"forbidden for this project"}"#),
            ErrorKind::Permanent,
            "forbidden for this project",
        ),
        (
            Scripted::json(
                404,
                r#"{"error":{"message":"no such model","code":"model_not_found"}}"#,
            ),
            ErrorKind::Permanent,
            "model_not_found",
        ),
        (
            Scripted::json(408, "request timeout"),
            ErrorKind::Transient,
            "request timeout",
        ),
        (
            Scripted::json(409, r#"{"error":{"message":"conflict"}}"#),
            ErrorKind::Transient,
            "conflict",
        ),
        (
            Scripted::json(413, "<html>Request Entity Too Large</html>"),
            ErrorKind::TooLarge,
            "Too Large",
        ),
        (
            Scripted::json(
                400,
                r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#,
            ),
            ErrorKind::TooLarge,
            "maximum context length",
        ),
        (
            Scripted::json(422, r#"{"detail":"unprocessable"}"#),
            ErrorKind::Permanent,
            "unprocessable",
        ),
        (
            Scripted::json(
                429,
                r#"{"error":{"message":"slow down","type":"rate_limit_exceeded"}}"#,
            ),
            ErrorKind::Transient,
            "slow down",
        ),
        (
            Scripted::json(500, "internal error"),
            ErrorKind::Transient,
            "internal error",
        ),
        (Scripted::json(502, ""), ErrorKind::Transient, "HTTP 502"),
        (
            Scripted::json(
                503,
                r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
            ),
            ErrorKind::Transient,
            "overloaded",
        ),
    ];
    for (reply, kind, needle) in cases {
        let status = reply.status;
        let (base, _) = scripted_server(vec![reply]).await;
        let err = client(&base)
            .embeddings("svc-embed-1", EmbeddingInput::One("x"))
            .await
            .unwrap_err();
        assert_eq!(err.status, Some(status));
        assert_eq!(err.kind, kind, "status {status}: {err}");
        assert!(err.to_string().contains(needle), "status {status}: {err}");
    }
}

#[tokio::test]
async fn retry_after_in_seconds_date_and_ms() {
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
    let cases = [
        (vec![("retry-after", "3".to_string())], 3.0),
        (vec![("retry-after", date)], 30.0),
        (
            vec![
                ("retry-after", "3".to_string()),
                ("retry-after-ms", "1500".to_string()),
            ],
            1.5,
        ),
    ];
    for (headers, expected) in cases {
        let mut reply = Scripted::json(429, r#"{"error":{"message":"rate limited"}}"#);
        reply.headers.extend(headers);
        let (base, _) = scripted_server(vec![reply]).await;
        let err = client(&base).models().await.unwrap_err();
        let got = err.retry_after.expect("a delay").as_secs_f64();
        assert!(
            (got - expected).abs() < 1.5,
            "expected about {expected}s, got {got}s"
        );
    }
    let sim = simulator(SimConfig {
        faults: Faults {
            rate_429: 1.0,
            retry_after_seconds: 2,
            limit: Some(1),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let err = client(&sim.base_url())
        .embeddings("svc-embed-1", EmbeddingInput::One("x"))
        .await
        .unwrap_err();
    assert_eq!(err.status, Some(429));
    assert!(err.retry_after.is_some());
}

#[tokio::test]
async fn transport_faults_are_transient() {
    for faults in [
        Faults {
            rate_drop: 1.0,
            ..Faults::default()
        },
        Faults {
            rate_truncate: 1.0,
            ..Faults::default()
        },
        Faults {
            rate_500: 1.0,
            ..Faults::default()
        },
        Faults {
            rate_503: 1.0,
            ..Faults::default()
        },
    ] {
        let sim = simulator(SimConfig {
            faults,
            ..SimConfig::default()
        })
        .await;
        let err = client(&sim.base_url())
            .embeddings("svc-embed-1", EmbeddingInput::Many(vec!["a", "b", "c"]))
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Transient, "{err}");
    }
    let sim = simulator(SimConfig {
        faults: Faults {
            rate_nan: 1.0,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let err = client(&sim.base_url())
        .embeddings("svc-embed-1", EmbeddingInput::Many(vec!["a", "b"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transient);
    assert!(err.message.contains("non-finite"), "{err}");

    // Nothing listens on this port: a closed port is a transient connect failure.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let err = client(&format!("http://127.0.0.1:{port}"))
        .models()
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transient);
    assert!(err.message.contains("connect"), "{err}");
}

#[tokio::test]
async fn a_slow_server_times_out() {
    let sim = simulator(SimConfig {
        faults: Faults {
            rate_slow: 1.0,
            slow_ms: 3_000,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let mut config =
        embedjob::client::ClientConfig::new(sim.base_url(), embedjob::client::ApiKey::new(KEY));
    config.timeout = Duration::from_millis(300);
    let client = embedjob::client::Client::new(config).unwrap();
    let err = client
        .embeddings("svc-embed-1", EmbeddingInput::One("x"))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transient);
    assert!(err.message.contains("timed out"), "{err}");
}

#[tokio::test]
async fn the_key_is_sent_as_a_bearer_token() {
    let (base, seen) =
        scripted_server(vec![Scripted::json(200, r#"{"object":"list","data":[]}"#)]).await;
    client(&base).models().await.unwrap();
    let headers = seen.lock().unwrap();
    assert_eq!(
        headers[0].get("authorization").unwrap().to_str().unwrap(),
        format!("Bearer {KEY}")
    );
}

#[tokio::test]
async fn shuffled_and_corrupt_responses_are_caught_by_the_checks() {
    let shuffled = simulator(SimConfig {
        faults: Faults {
            rate_shuffle: 1.0,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let texts: Vec<String> = (0..20).map(|i| format!("text number {i}")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let response = client(&shuffled.base_url())
        .embeddings("svc-embed-1", EmbeddingInput::Many(refs.clone()))
        .await
        .unwrap();
    let in_order = response
        .data
        .iter()
        .enumerate()
        .all(|(i, item)| item.index == i as i64);
    assert!(!in_order, "the simulator should have shuffled the items");
    let vectors = validate::check(response, refs.len(), Some(1024)).unwrap();
    for (i, text) in refs.iter().enumerate() {
        assert_eq!(
            vectors.row(i),
            simulate::embedding_vector(1024, text).as_slice()
        );
    }

    let wrong = simulator(SimConfig {
        faults: Faults {
            rate_wrong_dimensions: 1.0,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let response = client(&wrong.base_url())
        .embeddings("svc-embed-1", EmbeddingInput::Many(refs.clone()))
        .await
        .unwrap();
    let err = validate::check(response, refs.len(), Some(1024)).unwrap_err();
    assert!(err.to_string().starts_with("vector length"), "{err}");
}

// ---- servers that say less -------------------------------------------------------------------

mod discovery {
    use embedjob::client::{discover, DiscoveryError};
    use embedjob::rate::RetryPolicy;

    use crate::support::{client, scripted_server, Scripted};

    async fn ask(replies: Vec<Scripted>) -> Result<embedjob::client::Discovery, DiscoveryError> {
        let (base, _) = scripted_server(replies).await;
        discover(&client(&base), "m", &RetryPolicy::with_max_retries(0)).await
    }

    #[tokio::test]
    async fn the_listing_answers_when_the_model_route_is_missing() {
        for missing in [
            Scripted::json(404, r#"{"detail":"Not Found"}"#),
            Scripted::json(405, r#"{"detail":"Method Not Allowed"}"#),
            Scripted::json(501, "not implemented"),
            Scripted::json(
                404,
                r#"{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}"#,
            ),
        ] {
            let found = ask(vec![
                missing,
                Scripted::json(
                    200,
                    r#"{"object":"list","data":[{"id":"other"},{"id":"m","object":"model","max_model_len":512}]}"#,
                ),
            ])
            .await
            .unwrap();
            assert_eq!(found.source, Some("listing"));
            assert_eq!(found.model.unwrap().context_window, Some(512));
            assert!(found.warnings.is_empty());
        }
    }

    #[tokio::test]
    async fn window_and_price_are_read_under_the_names_servers_use() {
        let found = ask(vec![Scripted::json(
            200,
            r#"{"id":"m","model_info":{"max_input_tokens":8191,"input_cost_per_token":2e-8}}"#,
        )])
        .await
        .unwrap();
        assert_eq!(found.source, Some("model route"));
        let model = found.model.unwrap();
        assert_eq!(model.context_window, Some(8191));
        let price = model.pricing.unwrap().input_per_1k.unwrap();
        assert!((price - 2e-5).abs() < 1e-15, "{price}");
        let found = ask(vec![Scripted::json(
            200,
            r#"{"id":"m","context_length":"4096","pricing":{"prompt":"0.000001"}}"#,
        )])
        .await
        .unwrap();
        let model = found.model.unwrap();
        assert_eq!(model.context_window, Some(4096));
        assert!((model.pricing.unwrap().input_per_1k.unwrap() - 0.001).abs() < 1e-15);
    }

    #[tokio::test]
    async fn a_model_nowhere_to_be_found_leaves_a_warning() {
        let unlisted = ask(vec![
            Scripted::json(404, r#"{"detail":"Not Found"}"#),
            Scripted::json(200, r#"{"data":[{"id":"other"},{"no_id":true}]}"#),
        ])
        .await
        .unwrap();
        assert!(unlisted.model.is_none());
        assert!(
            unlisted.warnings[0].contains("is not in the service's listing"),
            "{:?}",
            unlisted.warnings
        );
        // No model route, no listing, and an embeddings route that is there
        // (it refuses the lookup's empty input).
        let nothing = ask(vec![
            Scripted::json(404, "404 page not found"),
            Scripted::json(404, "404 page not found"),
            Scripted::json(400, r#"{"error":{"message":"input must not be empty"}}"#),
        ])
        .await
        .unwrap();
        assert!(nothing.model.is_none());
        assert!(
            nothing.warnings[0].contains("describes no model"),
            "{:?}",
            nothing.warnings
        );
        // No route at all answers under the API path: it is the wrong one.
        let wrong = ask(vec![Scripted::json(404, "404 page not found")])
            .await
            .unwrap_err();
        assert!(
            matches!(wrong, DiscoveryError::WrongApiPath { status: 404, .. }),
            "{wrong}"
        );
        let message = wrong.to_string();
        assert!(message.contains("`backend.api_path` \"/v1\""), "{message}");
        assert!(
            message.contains("/v1/embeddings answers HTTP 404"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn only_a_missing_embeddings_route_makes_the_api_path_wrong() {
        let missing = || Scripted::json(404, r#"{"detail":"Not Found"}"#);
        // The embeddings route answers, about the model or with a fault:
        // it is there, and the job goes on as declared.
        for there in [
            Scripted::json(
                404,
                r#"{"object":"error","message":"The model `m` does not exist.","code":404}"#,
            ),
            Scripted::json(
                422,
                r#"{"detail":[{"msg":"List should have at least 1 item"}]}"#,
            ),
            Scripted::json(500, "internal error"),
        ] {
            let found = ask(vec![missing(), missing(), there]).await.unwrap();
            assert!(found.model.is_none());
            assert!(found.warnings[0].contains("describes no model"));
        }
        // A 405 (a path served for GET only) is no route either; the root
        // answering says which api_path to set.
        let wrong = ask(vec![
            missing(),
            missing(),
            Scripted::json(405, r#"{"detail":"Method Not Allowed"}"#),
            Scripted::json(400, r#"{"error":{"message":"input is empty"}}"#),
        ])
        .await
        .unwrap_err();
        let message = wrong.to_string();
        assert!(
            matches!(wrong, DiscoveryError::WrongApiPath { status: 405, .. }),
            "{message}"
        );
        assert!(
            message.contains("set `backend.api_path = \"\"`"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn a_refused_key_or_an_unknown_model_is_a_refusal() {
        let refused = ask(vec![Scripted::json(
            401,
            r#"{"error":{"message":"Incorrect API key","code":"invalid_api_key"}}"#,
        )])
        .await
        .unwrap_err();
        assert!(
            matches!(refused, DiscoveryError::RefusedKey(_)),
            "{refused}"
        );
        let unknown = ask(vec![Scripted::json(
            404,
            r#"{"error":{"message":"The model 'm' does not exist","type":"invalid_request_error","code":"model_not_found"}}"#,
        )])
        .await
        .unwrap_err();
        assert!(
            matches!(unknown, DiscoveryError::UnknownModel { .. }),
            "{unknown}"
        );
        let listing_refused = ask(vec![
            Scripted::json(404, r#"{"detail":"Not Found"}"#),
            Scripted::json(403, r#"{"error":"forbidden"}"#),
        ])
        .await
        .unwrap_err();
        assert!(matches!(listing_refused, DiscoveryError::RefusedKey(_)));
        let down = ask(vec![Scripted::json(503, "overloaded")])
            .await
            .unwrap_err();
        assert!(matches!(down, DiscoveryError::Unreachable(_)), "{down}");
    }
}

/// `encoding_format = "auto"` asks for base64 and, refused, asks for floats
/// for the rest of the run; the answer is kept either way.
#[tokio::test]
async fn a_refused_base64_falls_back_to_floats() {
    use embedjob::backend::api::EncodingFormat;
    use embedjob::backend::api::{ApiBackend, ApiSettings};
    use embedjob::backend::EmbeddingBackend;

    let floats =
        String::from_utf8(simulate::embeddings_response_body("m", 4, &["a", "b"])).unwrap();
    let (base, seen) = scripted_server(vec![
        Scripted::json(
            400,
            r#"{"error":{"message":"encoding_format: unsupported value 'base64'","type":"invalid_request_error"}}"#,
        ),
        Scripted::json(200, &floats),
    ])
    .await;
    let settings = ApiSettings {
        encoding: EncodingFormat::Auto,
        dimensions: Some(4),
        ..ApiSettings::new("m")
    };
    let backend = ApiBackend::new(client(&base), settings, None);
    let vectors = backend.embed(&["a", "b"], 2).await.unwrap();
    assert_eq!(
        vectors.row(1),
        simulate::embedding_vector(4, "b").as_slice()
    );
    assert_eq!(seen.lock().unwrap().len(), 2, "sent again at once");
    assert_eq!(backend.stats().retries, 0);
    let warnings = backend.warnings();
    assert!(
        warnings[0].contains("asking for floats for the rest of the run"),
        "{warnings:?}"
    );
    let sent = backend.embed(&["a", "b"], 2).await.unwrap();
    assert_eq!(sent, vectors);
    assert_eq!(seen.lock().unwrap().len(), 3, "floats from then on");

    // Asked for explicitly, a refusal of base64 stops the request.
    let (base, _) = scripted_server(vec![Scripted::json(
        400,
        r#"{"error":{"message":"encoding_format: unsupported value 'base64'"}}"#,
    )])
    .await;
    let settings = ApiSettings {
        encoding: EncodingFormat::Base64,
        ..ApiSettings::new("m")
    };
    let backend = ApiBackend::new(client(&base), settings, None);
    let error = backend.embed(&["a"], 1).await.unwrap_err();
    assert!(error.to_string().contains("encoding_format"), "{error}");
}

/// Base64 answers decode to the same floats the JSON numbers carry.
#[tokio::test]
async fn base64_answers_decode_to_the_same_vectors() {
    let texts = ["one", "two", "three"];
    let body = String::from_utf8(simulate::embeddings_response_body_base64(
        "svc-embed-1",
        1024,
        &texts,
    ))
    .unwrap();
    let (base, _) = scripted_server(vec![Scripted::json(200, &body)]).await;
    let raw = client(&base)
        .embeddings_flat("svc-embed-1", EmbeddingInput::Many(texts.to_vec()), 0)
        .await
        .unwrap();
    let vectors = validate::check(raw, 3, Some(1024)).unwrap();
    for (row, text) in vectors.rows().zip(texts) {
        assert_eq!(row, simulate::embedding_vector(1024, text).as_slice());
    }
}
