//! Hostile servers on 127.0.0.1: bodies that never end, delays of
//! centuries, the key echoed in every encoding, vectors of zeros, answers
//! from another model, billing counts past 2^63, streams that drip forever.
//! Each test runs the binary against one and checks the exit code, the
//! message, that nothing wrong was written, and, for the memory bombs, the
//! child's peak memory.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::support::{
    bin, files_source, honest, hostile_server, inputs, json_response, read_output, run_command,
    run_measured, text, three_documents, write_job, Measured, HOSTILE_KEY,
};

/// A body that starts with `head` and then repeats `piece` forever.
fn endless(status: StatusCode, head: &'static str, piece: &'static str) -> Response {
    let piece = Bytes::from(piece.repeat(4096));
    let head = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(Bytes::from(head)) });
    let rest = futures::stream::repeat_with(move || Ok::<Bytes, std::io::Error>(piece.clone()));
    json_response(
        status,
        Body::from_stream(futures::StreamExt::chain(head, rest)),
    )
}

/// A job of three documents against `base_url`, retrying twice.
pub(crate) fn three_document_job(dir: &Path, base_url: &str) -> PathBuf {
    let root = three_documents(dir);
    write_job(dir, base_url, &files_source(&root), "")
}

const RETRY_TWICE: [&str; 2] = ["--set", "backend.max_retries=2"];

/// Every way a server could echo the key: raw, percent-encoded (all bytes,
/// either case; reserved bytes only; form style), JSON-escaped (`\u` either
/// case, `\/`), base64 (standard and URL-safe, of the key and of
/// `Bearer <key>`) and hex (either case). Written out here, apart from the
/// program's own list.
pub(crate) fn key_forms(key: &str) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let bearer = format!("Bearer {key}");
    let reserved = |c: char| match c {
        '/' => "%2F".to_string(),
        '+' => "%2B".to_string(),
        '=' => "%3D".to_string(),
        c => c.to_string(),
    };
    vec![
        key.to_string(),
        key.bytes().map(|b| format!("%{b:02X}")).collect(),
        key.bytes().map(|b| format!("%{b:02x}")).collect(),
        key.chars().map(reserved).collect(),
        key.chars()
            .map(|c| match reserved(c) {
                escaped if escaped.len() == 3 => escaped.to_lowercase(),
                plain => plain,
            })
            .collect(),
        key.chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect(),
        key.chars()
            .map(|c| format!("\\u{:04X}", c as u32))
            .collect(),
        // As a debug print of the JSON-escaped text shows it.
        key.chars()
            .map(|c| format!("\\\\u{:04x}", c as u32))
            .collect(),
        key.replace('/', "\\/"),
        b64.encode(key),
        b64.encode(&bearer),
        url.encode(key),
        url.encode(&bearer),
        hex::encode(key),
        hex::encode(key).to_uppercase(),
    ]
}

/// Asserts that no piece of 8 or more characters of any form of the key is
/// in `text`.
pub(crate) fn assert_no_key_in(text: &str, key: &str, place: &str) {
    for form in key_forms(key) {
        for window in form.as_bytes().windows(8) {
            let window = std::str::from_utf8(window).unwrap();
            // The base64 of "Bearer " alone is no part of the key.
            if base64::engine::general_purpose::STANDARD
                .encode("Bearer ")
                .contains(window)
            {
                continue;
            }
            assert!(
                !text.contains(window),
                "{place}: {window:?} (of the key as {form:?}) in:\n{text}"
            );
        }
    }
}

/// Asserts the key is in no form on stdout, stderr, or in any file under `dir`.
pub(crate) fn assert_no_key_anywhere(output: &Output, dir: &Path, key: &str) {
    assert_no_key_in(&text(&output.stdout), key, "stdout");
    assert_no_key_in(&text(&output.stderr), key, "stderr");
    for file in files_under(dir) {
        if let Ok(bytes) = std::fs::read(&file) {
            assert_no_key_in(
                &String::from_utf8_lossy(&bytes),
                key,
                &file.display().to_string(),
            );
        }
    }
}

pub(crate) fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

fn summary(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("out/result.parquet.summary.json"))
        .expect("the run wrote its summary");
    serde_json::from_str(&text).unwrap()
}

/// A failed run: exit 1, one error line naming `needle`, no output file, a
/// summary saying so.
fn assert_failed_cleanly(output: &Output, dir: &Path, needle: &str) {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    assert!(stderr.len() < 2000, "a sane length: {} bytes", stderr.len());
    assert!(!dir.join("out/result.parquet").exists(), "nothing written");
    let summary = summary(dir);
    assert_eq!(summary["exit_code"], 1, "{summary}");
    assert!(
        summary["error"].as_str().unwrap().contains(needle),
        "{summary}"
    );
}

fn assert_bounded(measured: &Measured, what: &str) {
    assert!(
        measured.peak_rss_mb < 300.0,
        "{what}: peak RSS {:.0} MB",
        measured.peak_rss_mb
    );
}

#[tokio::test]
async fn memory_bomb_a_200_body_that_never_ends_is_cut_off() {
    let server = hostile_server(|_, _| {
        endless(
            StatusCode::OK,
            r#"{"data":[{"index":0,"embedding":["#,
            "0.125,",
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let job = three_document_job(dir.path(), &server.base_url);
    let measured = run_measured(run_command(&job, &RETRY_TWICE)).await;
    assert_failed_cleanly(&measured.output, dir.path(), "response body is longer than");
    assert_eq!(
        server.requests.load(Ordering::SeqCst),
        3,
        "tried three times"
    );
    assert_bounded(&measured, "an endless 200 body");
}

#[tokio::test]
async fn memory_bomb_an_error_body_that_never_ends_is_read_only_so_far() {
    let server = hostile_server(|_, _| {
        endless(
            StatusCode::INTERNAL_SERVER_ERROR,
            "upstream failed: ",
            "more detail ",
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let job = three_document_job(dir.path(), &server.base_url);
    let measured = run_measured(run_command(&job, &RETRY_TWICE)).await;
    assert_failed_cleanly(&measured.output, dir.path(), "HTTP 500");
    assert_bounded(&measured, "an endless 500 body");
}

#[tokio::test]
async fn memory_bomb_endless_valid_items_are_cut_off() {
    static ITEM: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let vector = vec!["0.03125"; 1024].join(",");
        format!(r#"{{"object":"embedding","index":0,"embedding":[{vector}]}},"#)
    });
    let server = hostile_server(|_, _| {
        let item = Bytes::from(ITEM.as_str());
        let head = futures::stream::once(async {
            Ok::<Bytes, std::io::Error>(Bytes::from_static(br#"{"object":"list","data":["#))
        });
        let rest = futures::stream::repeat_with(move || Ok::<Bytes, std::io::Error>(item.clone()));
        json_response(
            StatusCode::OK,
            Body::from_stream(futures::StreamExt::chain(head, rest)),
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let job = three_document_job(dir.path(), &server.base_url);
    let measured = run_measured(run_command(&job, &RETRY_TWICE)).await;
    assert_failed_cleanly(&measured.output, dir.path(), "response body is longer than");
    assert_bounded(&measured, "endless valid items");
}

#[tokio::test]
async fn memory_bomb_a_600_mb_body_is_refused_with_or_without_its_length() {
    const SIZE: usize = 600 << 20;
    for declared in [true, false] {
        let server = hostile_server(move |_, _| {
            let piece = Bytes::from(vec![b' '; 1 << 20]);
            let pieces = futures::stream::iter(
                (0..SIZE >> 20).map(move |_| Ok::<Bytes, std::io::Error>(piece.clone())),
            );
            let mut response = json_response(StatusCode::OK, Body::from_stream(pieces));
            if declared {
                response
                    .headers_mut()
                    .insert("content-length", SIZE.to_string().parse().unwrap());
            }
            response
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let job = three_document_job(dir.path(), &server.base_url);
        let measured = run_measured(run_command(&job, &RETRY_TWICE)).await;
        assert_failed_cleanly(&measured.output, dir.path(), "response body is longer than");
        assert_bounded(&measured, &format!("600 MB, length declared: {declared}"));
    }
}

#[tokio::test]
async fn a_body_that_drips_forever_meets_the_requests_deadline() {
    let server = hostile_server(|_, _| {
        let drip = futures::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Some((Ok::<Bytes, std::io::Error>(Bytes::from_static(b" ")), ()))
        });
        json_response(StatusCode::OK, Body::from_stream(drip))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let job = three_document_job(dir.path(), &server.base_url);
    let started = std::time::Instant::now();
    let output = run_measured(run_command(
        &job,
        &[
            "--set",
            "backend.max_retries=1",
            "--set",
            "backend.timeout_seconds=1",
            // One input a request, one at a time: a request that times out
            // cannot be split, so it is sent once more and then given up.
            "--set",
            "backend.max_inputs_per_request=1",
            "--set",
            "backend.concurrency=1",
        ],
    ))
    .await
    .output;
    assert_failed_cleanly(&output, dir.path(), "timed out");
    assert_eq!(server.requests.load(Ordering::SeqCst), 2);
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn a_server_delay_of_centuries_is_capped_not_a_panic() {
    // The last two panicked converting the delay to a Duration.
    for (header, delay) in [
        ("retry-after", "99999999999"),
        ("retry-after", "99999999999999999999"),
        ("retry-after-ms", "1e30"),
    ] {
        let server = hostile_server(move |n, request| {
            if n == 0 {
                let mut response = json_response(
                    StatusCode::TOO_MANY_REQUESTS,
                    r#"{"error":{"message":"slow down","type":"rate_limit"}}"#,
                );
                response
                    .headers_mut()
                    .insert(header, delay.parse().unwrap());
                return response;
            }
            honest(request)
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let job = three_document_job(dir.path(), &server.base_url);
        let started = std::time::Instant::now();
        let output = run_measured(run_command(
            &job,
            &[
                "--json",
                "--max-duration",
                "2s",
                "--set",
                "backend.timeout_seconds=1",
            ],
        ))
        .await
        .output;
        let stderr = text(&output.stderr);
        assert!(!stderr.contains("panicked"), "{header}: {delay}: {stderr}");
        assert_eq!(output.status.code(), Some(4), "{header}: {delay}: {stderr}");
        let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert!(
            summary["stopped"].as_str().unwrap().contains("time limit"),
            "{summary}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{header}: {delay}"
        );
        assert!(!dir.path().join("out/result.parquet").exists());
    }
}

/// A server that answers every request, the model listing too, with `body`.
async fn refusing_server(status: StatusCode, body: String) -> String {
    let app = axum::Router::new().fallback(move || {
        let body = body.clone();
        async move { json_response(status, body) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// Bodies echoing the key in every form: as an error message, cut by the
/// length limit, and in a 200 body that then fails to parse.
fn echo_bodies(key: &str) -> Vec<String> {
    let forms = key_forms(key).join(" | ");
    vec![
        json!({"error": {"message": format!("Incorrect API key provided: {forms}"), "code": "invalid_api_key"}}).to_string(),
        format!("{}{key}", "x".repeat(495)),
        format!("plain text echo: {forms}"),
    ]
}

#[tokio::test]
async fn the_key_is_in_no_form_in_errors_summaries_or_files() {
    let key = HOSTILE_KEY;
    // Refused at the model listing: a usage error printed on stderr.
    for body in echo_bodies(key) {
        let refusing = refusing_server(StatusCode::UNAUTHORIZED, body).await;
        let dir = tempfile::tempdir().unwrap();
        let job = three_document_job(dir.path(), &refusing);
        let output = run_measured(run_command(&job, &["--json"])).await.output;
        assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
        assert_no_key_anywhere(&output, dir.path(), key);
    }
    // Failing every embeddings request, and a 200 that echoes it then fails to parse.
    let mut bodies: Vec<(StatusCode, String)> = echo_bodies(key)
        .into_iter()
        .map(|b| (StatusCode::INTERNAL_SERVER_ERROR, b))
        .collect();
    bodies.push((
        StatusCode::OK,
        json!({"data": key_forms(key).join(" ")}).to_string(),
    ));
    bodies.push((
        StatusCode::OK,
        format!("{{\"data\": [{{\"index\": \"{key}\""),
    ));
    for (status, body) in bodies {
        let server = hostile_server(move |_, _| json_response(status, body.clone())).await;
        let dir = tempfile::tempdir().unwrap();
        let job = three_document_job(dir.path(), &server.base_url);
        let mut extra = vec!["--json"];
        extra.extend(RETRY_TWICE);
        let output = run_measured(run_command(&job, &extra)).await.output;
        assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
        let summary: Value =
            serde_json::from_slice(&output.stdout).expect("--json prints the summary");
        assert_eq!(summary["exit_code"], 1);
        assert_no_key_anywhere(&output, dir.path(), key);
    }
}

#[tokio::test]
async fn the_key_is_in_no_form_in_the_failures_file() {
    let key = HOSTILE_KEY;
    let message = format!("input too large for key {}", key_forms(key).join(" "));
    let server = hostile_server(move |_, _| {
        json_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({"error": {"message": message.clone()}}).to_string(),
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let job = three_document_job(dir.path(), &server.base_url);
    let output = run_measured(run_command(&job, &["--json"])).await.output;
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    let failures =
        std::fs::read_to_string(dir.path().join("out/result.parquet.failures.jsonl")).unwrap();
    assert_eq!(failures.lines().count(), 3, "{failures}");
    assert!(failures.contains("[REDACTED]"), "{failures}");
    assert_no_key_anywhere(&output, dir.path(), key);
}

/// A warning raised below the commands (the backend's, about the name the
/// service answers under) reaches stderr through the one printer, scrubbed.
#[tokio::test]
async fn regression_a_warning_from_a_lower_layer_reaches_stderr_without_the_key() {
    let server = hostile_server(|_, request| {
        let texts = inputs(request);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        json_response(
            StatusCode::OK,
            embedjob::simulate::embeddings_response_body(HOSTILE_KEY, 1024, &refs),
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let job = three_document_job(dir.path(), &server.base_url);
    let output = run_measured(run_command(
        &job,
        &["--set", "backend.server_renames_models=true"],
    ))
    .await
    .output;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("warning: the service answers requests for model \"svc-embed-1\" as model \"[REDACTED]\""),
        "{stderr}"
    );
    assert_no_key_anywhere(&output, dir.path(), HOSTILE_KEY);
}

#[tokio::test]
async fn a_response_from_another_model_is_refused_unless_the_job_allows_it() {
    let server = hostile_server(|_, request| {
        let texts = inputs(request);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        json_response(
            StatusCode::OK,
            embedjob::simulate::embeddings_response_body("svc-embed-1-l", 1024, &refs),
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let job = three_document_job(dir.path(), &server.base_url);
    let output = run_measured(run_command(&job, &[])).await.output;
    assert_failed_cleanly(
        &output,
        dir.path(),
        "\"svc-embed-1-l\", not \"svc-embed-1\"",
    );
    assert!(text(&output.stderr).contains("server_renames_models"));
    assert_eq!(
        server.requests.load(Ordering::SeqCst),
        1,
        "not retried: it cannot help"
    );

    let output = run_measured(run_command(
        &job,
        &[
            "--set",
            "backend.server_renames_models=true",
            "--set",
            "backend.max_inputs_per_request=1",
        ],
    ))
    .await
    .output;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr
            .matches("warning: the service answers requests for model")
            .count(),
        1,
        "one warning for three answers: {stderr}"
    );
    assert_eq!(
        read_output(&dir.path().join("out/result.parquet"))
            .ids
            .len(),
        3
    );
}

#[tokio::test]
async fn vectors_of_zeros_are_refused() {
    let server = hostile_server(|_, request| {
        let items: Vec<Value> = (0..inputs(request).len())
            .map(|i| json!({"object": "embedding", "index": i, "embedding": vec![0.0; 1024]}))
            .collect();
        json_response(
            StatusCode::OK,
            json!({"object": "list", "data": items, "model": "svc-embed-1",
                   "usage": {"prompt_tokens": 6, "total_tokens": 6}})
            .to_string(),
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let job = three_document_job(dir.path(), &server.base_url);
    let output = run_measured(run_command(&job, &RETRY_TWICE)).await.output;
    assert_failed_cleanly(
        &output,
        dir.path(),
        "non-zero vectors: index 0 is all zeros",
    );
    assert!(
        !dir.path().join("out/result.parquet.checkpoint").exists(),
        "no vector of zeros is kept"
    );
}

#[tokio::test]
async fn billing_of_2_to_the_63_tokens_saturates_instead_of_wrapping() {
    let server = hostile_server(|_, request| {
        let texts = inputs(request);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let body = embedjob::simulate::embeddings_response_body("svc-embed-1", 1024, &refs);
        let mut value: Value = serde_json::from_slice(&body).unwrap();
        value["usage"] = json!({"prompt_tokens": 1u64 << 63, "total_tokens": 1u64 << 63});
        json_response(StatusCode::OK, value.to_string())
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let job = three_document_job(dir.path(), &server.base_url);
    let output = run_measured(run_command(
        &job,
        &["--json", "--set", "backend.max_inputs_per_request=1"],
    ))
    .await
    .output;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["requests"], 3);
    assert_eq!(summary["usage"]["prompt_tokens"], u64::MAX, "{summary}");
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_eq!(
        rows.metadata["embedjob.usage.prompt_tokens"],
        u64::MAX.to_string()
    );
}

#[tokio::test]
async fn a_20_mb_error_string_is_cut_to_a_sane_length() {
    for size in [20 << 20, 100 << 10] {
        let server = hostile_server(move |_, _| {
            let message = "e".repeat(size);
            json_response(StatusCode::OK, json!({"data": message}).to_string())
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let job = three_document_job(dir.path(), &server.base_url);
        let output = run_measured(run_command(&job, &RETRY_TWICE)).await.output;
        let needle = if size > 1 << 20 {
            "response body is longer than"
        } else {
            "not the expected JSON"
        };
        assert_failed_cleanly(&output, dir.path(), needle);
        assert!(!text(&output.stderr).contains(&"e".repeat(600)));
    }
}

#[tokio::test]
async fn a_chat_stream_that_drips_forever_is_given_up() {
    let server = hostile_server(|_, _| {
        let event =
            Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n");
        let drip = futures::stream::unfold(event, |event| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Some((Ok::<Bytes, std::io::Error>(event.clone()), event))
        });
        let mut response = Response::new(Body::from_stream(drip));
        response
            .headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        response
    })
    .await;
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", HOSTILE_KEY)
        .env("EMBEDJOB_BASE_URL", &server.base_url)
        .env("EMBEDJOB_TIMEOUT_SECONDS", "0.3")
        .args(["chat", "--model", "svc-base", "hello"]);
    let started = std::time::Instant::now();
    let output = run_measured(command).await.output;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the stream did not end within 3s"),
        "{stderr}"
    );
    assert!(
        text(&output.stdout).starts_with("xxx"),
        "the reply so far is shown"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}
