//! Shared fixtures: a simulator per test, and a scripted raw server for
//! shapes the simulator does not produce.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use embedjob::client::{ApiKey, Client, ClientConfig};
use embedjob::simulate::{SimConfig, Simulator};

pub const KEY: &str = "sk-test-SECRET-4242-do-not-print";

pub async fn simulator(config: SimConfig) -> Simulator {
    Simulator::start(config)
        .await
        .expect("simulator starts on 127.0.0.1")
}

pub fn client(base_url: &str) -> Client {
    client_with_key(base_url, KEY)
}

pub fn client_with_key(base_url: &str, key: &str) -> Client {
    let mut config = ClientConfig::new(base_url, ApiKey::new(key));
    config.timeout = Duration::from_secs(5);
    config.connect_timeout = Duration::from_secs(2);
    Client::new(config).expect("client builds")
}

/// One scripted reply: status, headers, and body pieces sent with a pause
/// between them (so they arrive in separate reads).
#[derive(Clone, Default)]
pub struct Scripted {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub pieces: Vec<Vec<u8>>,
    /// End the body with an error after the pieces (a reset mid-body).
    pub abort: bool,
}

impl Scripted {
    pub fn json(status: u16, body: &str) -> Self {
        Scripted {
            status,
            headers: vec![("content-type", "application/json".to_string())],
            pieces: vec![body.as_bytes().to_vec()],
            abort: false,
        }
    }

    pub fn sse(pieces: &[&str]) -> Self {
        Scripted {
            status: 200,
            headers: vec![("content-type", "text/event-stream".to_string())],
            pieces: pieces.iter().map(|p| p.as_bytes().to_vec()).collect(),
            abort: false,
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
    let pieces = reply.pieces;
    let stream = futures::stream::unfold(
        (pieces.into_iter(), false),
        move |(mut it, ended)| async move {
            if ended {
                return None;
            }
            match it.next() {
                Some(piece) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
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
