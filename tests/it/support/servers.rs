//! Servers that are not the simulator: a scripted raw server for shapes the
//! simulator does not produce, and hostile servers whose answers a test writes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::bin;

/// One scripted reply: status, headers, and body pieces sent with a pause
/// between them (so they arrive in separate reads).
#[derive(Clone, Default)]
pub struct Scripted {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub pieces: Vec<Vec<u8>>,
    /// End the body with an error after the pieces (a reset mid-body).
    pub abort: bool,
    /// The pause before each piece; `None`, a few milliseconds.
    pub pause: Option<Duration>,
}

impl Scripted {
    pub fn json(status: u16, body: &str) -> Self {
        Scripted {
            status,
            headers: vec![("content-type", "application/json".to_string())],
            pieces: vec![body.as_bytes().to_vec()],
            abort: false,
            pause: None,
        }
    }

    pub fn sse(pieces: &[&str]) -> Self {
        Scripted {
            status: 200,
            headers: vec![("content-type", "text/event-stream".to_string())],
            pieces: pieces.iter().map(|p| p.as_bytes().to_vec()).collect(),
            abort: false,
            pause: None,
        }
    }
}

/// A server on 127.0.0.1 answering every request with the next scripted
/// reply (the last one repeats). Returns its base URL and the headers of
/// each request it saw.
pub async fn scripted_server(replies: Vec<Scripted>) -> (String, Arc<Mutex<Vec<HeaderMap>>>) {
    let replies = Arc::new(Mutex::new(
        replies
            .into_iter()
            .collect::<std::collections::VecDeque<_>>(),
    ));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in_handler = Arc::clone(&seen);
    let handler = move |headers: HeaderMap| {
        let replies = Arc::clone(&replies);
        let seen = Arc::clone(&seen_in_handler);
        async move {
            seen.lock().unwrap().push(headers);
            let reply = {
                let mut queue = replies.lock().unwrap();
                if queue.len() > 1 {
                    queue.pop_front().unwrap()
                } else {
                    queue.front().cloned().unwrap()
                }
            };
            respond(reply)
        }
    };
    let app = axum::Router::new().fallback(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

fn respond(reply: Scripted) -> Response {
    let abort = reply.abort;
    let pause = reply.pause.unwrap_or(Duration::from_millis(5));
    let pieces = reply.pieces;
    let stream = futures::stream::unfold(
        (pieces.into_iter(), false),
        move |(mut it, ended)| async move {
            if ended {
                return None;
            }
            match it.next() {
                Some(piece) => {
                    tokio::time::sleep(pause).await;
                    Some((Ok::<Bytes, std::io::Error>(Bytes::from(piece)), (it, false)))
                }
                None if abort => Some((Err(std::io::Error::other("reset")), (it, true))),
                None => None,
            }
        },
    );
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = StatusCode::from_u16(reply.status).unwrap();
    for (name, value) in reply.headers {
        response.headers_mut().insert(
            HeaderName::from_static(name),
            HeaderValue::from_str(&value).unwrap(),
        );
    }
    response
}

/// The key the hostile tests send: it has the characters that encodings
/// change (`/`, `+`, `=`).
pub const HOSTILE_KEY: &str = "sk-live/Hostile+Key=0042-do-not-print";

/// What a hostile server answers a request with: given the request's number
/// (from 0) and its JSON body.
type Answer = dyn Fn(usize, &Value) -> Response + Send + Sync;

/// A server whose model listing is honest and whose answers to
/// `POST /v1/embeddings` and `POST /v1/chat/completions` are `answer`'s.
pub struct Hostile {
    pub base_url: String,
    pub requests: Arc<AtomicUsize>,
}

pub async fn hostile_server(
    answer: impl Fn(usize, &Value) -> Response + Send + Sync + 'static,
) -> Hostile {
    let answer: Arc<Answer> = Arc::new(answer);
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    let handler = move |method: Method, uri: Uri, body: Bytes| {
        let answer = Arc::clone(&answer);
        let counted = Arc::clone(&counted);
        async move {
            let path = uri.path().to_string();
            if method == Method::GET {
                let id = path.rsplit('/').next().unwrap_or_default().to_string();
                return axum::Json(json!({
                    "id": id, "object": "model", "context_window": 8192,
                    "pricing": {"input_per_1k": 0.0001}
                }))
                .into_response();
            }
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            answer(counted.fetch_add(1, Ordering::SeqCst), &request)
        }
    };
    let app = axum::Router::new().fallback(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Hostile {
        base_url: format!("http://{addr}"),
        requests,
    }
}

/// The texts of an embeddings request.
pub fn inputs(request: &Value) -> Vec<String> {
    request["input"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The answer an honest server gives: the simulator's vectors.
pub fn honest(request: &Value) -> Response {
    let texts = inputs(request);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let model = request["model"].as_str().unwrap_or("svc-embed-1");
    json_response(
        StatusCode::OK,
        embedjob::simulate::embeddings_response_body(model, 1024, &refs),
    )
}

pub fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut response = Response::new(body.into());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// `embedjob run JOB --quiet EXTRA…` with the hostile key.
pub fn run_command(job: &Path, extra: &[&str]) -> Command {
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", HOSTILE_KEY)
        .arg("run")
        .arg(job)
        .arg("--quiet")
        .args(extra);
    command
}

/// A run's output and the most memory the process ever held.
pub struct Measured {
    pub output: Output,
    pub peak_rss_mb: f64,
}

/// Runs `command`, watching its peak resident memory (`VmHWM`) until it ends.
pub async fn run_measured(mut command: Command) -> Measured {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = command.spawn().expect("the binary starts");
    let status = PathBuf::from(format!("/proc/{}/status", child.id()));
    let waiting = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap());
    let mut peak_kb = 0u64;
    while !waiting.is_finished() {
        if let Ok(text) = std::fs::read_to_string(&status) {
            let hwm = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
            peak_kb = peak_kb.max(hwm.unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Measured {
        output: waiting.await.unwrap(),
        peak_rss_mb: peak_kb as f64 / 1024.0,
    }
}
