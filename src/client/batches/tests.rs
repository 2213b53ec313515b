//! Reading the Batch API's objects: every status, absent and odd fields,
//! lines with an answer or an error, and hostile bodies.

use base64::Engine as _;
use proptest::prelude::*;
use serde_json::json;

use super::*;

fn batch(value: Value) -> BatchObject {
    serde_json::from_value(value).unwrap()
}

#[test]
fn every_status_is_read_and_written_back() {
    let known = [
        ("validating", BatchStatus::Validating, false),
        ("failed", BatchStatus::Failed, true),
        ("in_progress", BatchStatus::InProgress, false),
        ("finalizing", BatchStatus::Finalizing, false),
        ("completed", BatchStatus::Completed, true),
        ("expired", BatchStatus::Expired, true),
        ("cancelling", BatchStatus::Cancelling, false),
        ("cancelled", BatchStatus::Cancelled, true),
    ];
    for (text, status, terminal) in known {
        let read = batch(json!({"id": "b", "status": text})).status;
        assert_eq!(read, status, "{text}");
        assert_eq!(read.as_str(), text);
        assert_eq!(read.is_terminal(), terminal, "{text}");
    }
    let odd = batch(json!({"id": "b", "status": "paused"})).status;
    assert_eq!(odd, BatchStatus::Other("paused".into()));
    assert!(!odd.is_terminal());
    assert_eq!(
        batch(json!({"id": "b", "status": 3})).status,
        BatchStatus::Other("3".into())
    );
    assert!(!batch(json!({"id": "b"})).status.is_terminal());
}

#[test]
fn an_openai_batch_is_read_whole() {
    let read = batch(json!({
        "id": "batch_abc123",
        "object": "batch",
        "endpoint": "/v1/embeddings",
        "errors": {"object": "list", "data": [
            {"code": "invalid_json", "message": "Line 3 is not JSON.", "param": null, "line": 3},
            {"code": "token_limit_exceeded", "message": "Enqueued token limit reached.", "line": null}
        ]},
        "input_file_id": "file-abc123",
        "completion_window": "24h",
        "status": "failed",
        "output_file_id": null,
        "error_file_id": "file-err",
        "created_at": 1_711_471_533,
        "in_progress_at": null,
        "expires_at": 1_711_557_933,
        "request_counts": {"total": 100, "completed": 95, "failed": 5},
        "metadata": {"embedjob_job": "docs", "embedjob_part": "3", "n": 7, "gone": null},
        "a_field_from_the_future": {"x": [1, 2]}
    }));
    assert_eq!(read.id, "batch_abc123");
    assert_eq!(read.endpoint, "/v1/embeddings");
    assert_eq!(read.input_file_id, "file-abc123");
    assert_eq!(read.output_file_id, None);
    assert_eq!(read.error_file_id.as_deref(), Some("file-err"));
    assert_eq!(read.completion_window, "24h");
    assert_eq!(read.created_at, 1_711_471_533);
    assert_eq!(read.expires_at, Some(1_711_557_933));
    assert_eq!(
        read.request_counts,
        RequestCounts {
            total: 100,
            completed: 95,
            failed: 5
        }
    );
    assert_eq!(
        read.errors,
        vec![
            BatchError {
                code: Some("invalid_json".into()),
                message: "Line 3 is not JSON.".into(),
                line: Some(3),
                param: None,
            },
            BatchError {
                code: Some("token_limit_exceeded".into()),
                message: "Enqueued token limit reached.".into(),
                line: None,
                param: None,
            },
        ]
    );
    let metadata: Vec<(&str, &str)> = read
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        metadata,
        [("embedjob_job", "docs"), ("embedjob_part", "3"), ("n", "7")]
    );
}

#[test]
fn absent_and_null_fields_are_empty() {
    let bare = batch(json!({"id": "b"}));
    let nulls = batch(json!({
        "id": "b", "status": null, "endpoint": null, "input_file_id": null,
        "output_file_id": "", "error_file_id": null, "completion_window": null,
        "created_at": null, "expires_at": null, "request_counts": null,
        "errors": null, "metadata": null
    }));
    for read in [bare, nulls] {
        assert_eq!(read.request_counts, RequestCounts::default());
        assert!(read.errors.is_empty());
        assert!(read.metadata.is_empty());
        assert_eq!(read.output_file_id, None);
        assert_eq!(read.expires_at, None);
        assert_eq!(read.created_at, 0);
    }
    let partial = batch(json!({"id": "b", "request_counts": {"total": "12", "completed": 4.0}}));
    assert_eq!(
        partial.request_counts,
        RequestCounts {
            total: 12,
            completed: 4,
            failed: 0
        }
    );
    let bare_list = batch(json!({"id": "b", "errors": ["boom", {"message": "m", "code": 400}]}));
    assert_eq!(bare_list.errors[0].message, "boom");
    assert_eq!(bare_list.errors[1].code.as_deref(), Some("400"));
    assert!(serde_json::from_value::<BatchObject>(json!({"status": "completed"})).is_err());
}

#[test]
fn a_page_always_says_where_the_next_begins() {
    let page: BatchPage = serde_json::from_value::<RawPage>(json!({
        "object": "list",
        "data": [{"id": "b2"}, {"id": "b1"}],
        "first_id": "b2",
        "has_more": true
    }))
    .unwrap()
    .into();
    assert_eq!(page.last_id.as_deref(), Some("b1"));
    assert!(page.has_more);
    let empty: BatchPage = serde_json::from_value::<RawPage>(json!({"data": [], "has_more": true}))
        .unwrap()
        .into();
    assert!(!empty.has_more, "an empty page cannot promise more");
    assert_eq!(empty.last_id, None);
}

#[test]
fn a_line_has_a_response_or_an_error() {
    let answered = lines::parse_line(
        br#"{"id":"batch_req_1","custom_id":"p0-1","response":{"status_code":200,"request_id":"req_1","body":{"object":"list","data":[{"index":0,"embedding":[0.5,1]}],"usage":{"prompt_tokens":2,"total_tokens":2}}},"error":null}"#,
    )
    .unwrap();
    assert_eq!(answered.custom_id, "p0-1");
    assert_eq!(answered.error, None);
    let response = answered.response.as_ref().unwrap();
    assert_eq!(response.status_code, 200);
    assert_eq!(response.request_id.as_deref(), Some("req_1"));
    assert!(answered.api_error().is_none());
    let vectors = embeddings_from_body(&response.body).unwrap();
    assert_eq!(vectors.vector(0), [0.5, 1.0]);
    assert_eq!(vectors.usage.unwrap().prompt_tokens, 2);

    let expired = lines::parse_line(
        br#"{"id":"batch_req_2","custom_id":"p0-2","response":null,"error":{"code":"batch_expired","message":"This request could not be executed before the completion window expired."}}"#,
    )
    .unwrap();
    assert_eq!(expired.response, None);
    assert_eq!(
        expired.error.as_ref().unwrap().code.as_deref(),
        Some("batch_expired")
    );
    let error = expired.api_error().unwrap();
    assert_eq!(error.kind, ErrorKind::Transient, "{error}");
    assert!(error.to_string().contains("batch_expired"), "{error}");

    let refused = lines::parse_line(
        br#"{"custom_id":"p0-3","response":{"status_code":400,"body":{"error":{"message":"Input is empty.","type":"invalid_request_error"}}}}"#,
    )
    .unwrap();
    let error = refused.api_error().unwrap();
    assert_eq!(error.kind, ErrorKind::Permanent);
    assert_eq!(error.status, Some(400));
    assert!(error.message.contains("Input is empty."), "{error}");
    let failing =
        lines::parse_line(br#"{"custom_id":"p0-4","response":{"status_code":500,"body":{}}}"#)
            .unwrap();
    assert_eq!(failing.api_error().unwrap().kind, ErrorKind::Transient);
    let neither = lines::parse_line(br#"{"custom_id":"p0-5"}"#).unwrap();
    assert!(neither.api_error().is_some());
    let cancelled = lines::parse_line(
        br#"{"custom_id":"p0-6","response":null,"error":{"code":"batch_cancelled","message":"cancelled"}}"#,
    )
    .unwrap();
    assert_eq!(cancelled.api_error().unwrap().kind, ErrorKind::Transient);
    let no_status =
        lines::parse_line(br#"{"custom_id":"p0-7","response":{"body":{"data":[]}}}"#).unwrap();
    let error = no_status.api_error().unwrap();
    assert_eq!((error.kind, error.status), (ErrorKind::Transient, None));
    assert!(
        lines::parse_line(br#"{"response":null}"#).is_err(),
        "no custom_id"
    );
}

#[test]
fn a_line_body_decodes_as_the_synchronous_answer_does() {
    let values = [0.25f32, -1.5, 3.0e-7];
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    for body in [
        json!({"data": [{"index": 0, "embedding": values}], "model": "m"}),
        json!({"data": [{"index": 0, "embedding": encoded}], "model": "m"}),
    ] {
        let from_line = embeddings_from_body(&body).unwrap();
        let from_bytes = super::super::decode_embeddings(body.to_string().as_bytes(), 0).unwrap();
        assert_eq!(from_line, from_bytes);
        assert_eq!(from_line.vector(0), values);
    }
    // Quoted non-finite values, and a bare NaN in the line, are kept for the check to name.
    let line = lines::parse_line(
        br#"{"custom_id":"a","response":{"status_code":200,"body":{"data":[{"index":0,"embedding":[NaN,"Infinity"]}]}}}"#,
    )
    .unwrap();
    let vectors = embeddings_from_body(&line.response.unwrap().body).unwrap();
    assert!(vectors.vector(0)[0].is_nan() && vectors.vector(0)[1].is_infinite());

    let refused = embeddings_from_body(&json!({"error": {"message": "overloaded", "code": 503}}))
        .unwrap_err();
    assert!(refused.message.contains("overloaded"), "{refused}");
    let wrong = embeddings_from_body(&json!({"data": [{"index": 0}]})).unwrap_err();
    assert_eq!(wrong.kind, ErrorKind::Transient);
    assert!(wrong.message.contains("embedding"), "{wrong}");
}

#[test]
fn a_missing_route_is_told_from_an_unknown_batch() {
    let missing = |status: u16, body: &[u8]| {
        with_route_hint(ApiError::from_response(
            "GET /v1/batches/b",
            status,
            &HeaderMap::new(),
            body,
        ))
    };
    for (status, body) in [
        (404, &b""[..]),
        (404, br#"{"detail":"Not Found"}"#),
        (404, br#"{"error":{"message":"Unknown request URL: GET /v1/batches/b.","code":"unknown_url"}}"#),
        (405, b""),
        (501, b"not implemented"),
    ] {
        let error = missing(status, body);
        assert!(error.message.contains("has no route GET /v1/batches/b"), "{error}");
        assert_eq!(error.kind, ErrorKind::Permanent);
    }
    let unknown = missing(
        404,
        br#"{"error":{"message":"No batch found with id 'b'.","type":"invalid_request_error"}}"#,
    );
    assert!(!unknown.message.contains("no route"), "{unknown}");
}

#[test]
fn a_new_batch_is_sent_as_openai_takes_it() {
    let metadata = BTreeMap::from([("embedjob_part".to_string(), "0".to_string())]);
    let sent = serde_json::to_value(NewBatch {
        input_file_id: "file-1",
        endpoint: "/v1/embeddings",
        completion_window: "24h",
        metadata: &metadata,
    })
    .unwrap();
    assert_eq!(
        sent,
        json!({"input_file_id": "file-1", "endpoint": "/v1/embeddings",
               "completion_window": "24h", "metadata": {"embedjob_part": "0"}})
    );
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        "[a-z_0-9]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("id".to_string()),
                    Just("custom_id".to_string()),
                    Just("status".to_string()),
                    Just("errors".to_string()),
                    Just("data".to_string()),
                    Just("metadata".to_string()),
                    Just("request_counts".to_string()),
                    Just("response".to_string()),
                    Just("error".to_string()),
                    Just("body".to_string()),
                    Just("embedding".to_string()),
                    "[a-z]{1,4}",
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn hostile_objects_fail_or_read_without_panic(value in any_json()) {
        let _ = serde_json::from_value::<BatchObject>(value.clone());
        let _ = serde_json::from_value::<RawPage>(value.clone());
        let _ = serde_json::from_value::<FileObject>(value.clone());
        if let Ok(line) = lines::parse_line(value.to_string().as_bytes()) {
            let _ = line.api_error();
            if let Some(response) = &line.response {
                let _ = embeddings_from_body(&response.body);
            }
        }
        let _ = embeddings_from_body(&value);
    }

    #[test]
    fn hostile_bytes_fail_or_read_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = serde_json::from_slice::<BatchObject>(&bytes);
        let _ = serde_json::from_slice::<RawPage>(&bytes);
        let _ = lines::parse_line(&bytes);
    }
}
