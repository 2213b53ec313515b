//! An in-process simulator of the model service, with fault injection.
//!
//! It serves the four endpoints of the service (`/v1/embeddings`, `/v1/models`,
//! `/v1/models/{id}`, `/v1/chat/completions`) and the Batch API (`/v1/files`,
//! `/v1/batches`) on 127.0.0.1, returns a deterministic
//! vector for each text (see [`embedding_vector`]), injects faults by seeded
//! probability (see [`Faults`]), and keeps a [`Ledger`] of what it received and
//! billed. Users run it as `embedjob simulate`; tests start it on a free port:
//!
//! ```
//! use embedjob::simulate::{embedding_vector, SimConfig, Simulator};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let sim = Simulator::start(SimConfig::default()).await?;
//! let reply: serde_json::Value = reqwest::Client::new()
//!     .post(format!("{}/v1/embeddings", sim.base_url()))
//!     .bearer_auth("any-key")
//!     .json(&serde_json::json!({ "model": "svc-embed-1", "input": ["hello"] }))
//!     .send()
//!     .await?
//!     .json()
//!     .await?;
//! let vector: Vec<f32> = serde_json::from_value(reply["data"][0]["embedding"].clone())?;
//! assert_eq!(vector, embedding_vector(1024, "hello"));
//! assert_eq!(sim.ledger().billed_requests, 1);
//! sim.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! `GET /_ledger` returns the ledger as JSON (`?texts=false` leaves out the
//! per-text counts) and `POST /_ledger/reset` zeroes it; neither needs a key.

mod batches;
mod capacity;
mod chat;
mod config;
mod error;
mod faults;
mod handlers;
#[cfg(test)]
mod hostile;
mod ledger;
mod options;
mod quota;
mod vectors;
mod window;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use capacity::{CapacityConfig, CapacityStats};
pub use config::{
    BatchConfig, Billing, DimensionsParam, Faults, KeySpec, ModelKind, ModelSpec, SimConfig,
    TokenCount, DEFAULT_MAX_BODY_BYTES, MAX_BATCH_FILE_BYTES, MAX_BATCH_INPUTS, MAX_BATCH_LINES,
};
pub use ledger::Ledger;
pub use options::SimulateOptions;
#[cfg(test)]
pub(crate) use quota::Quotas;
pub use quota::{format_reset, QuotaConfig, QuotaReset, QuotaWindow};
pub use vectors::{
    count_tokens, embedding_vector, embedding_vector_shortened, embeddings_response_body,
    embeddings_response_body_base64,
};
pub use window::{server_tokens, Counting, OverWindow, ServerWindow};

use handlers::Shared;

/// How long [`Simulator::shutdown`] waits for open requests before cutting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A running simulator. It stops on [`Simulator::shutdown`], or when dropped.
#[derive(Debug)]
pub struct Simulator {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Simulator {
    /// Binds 127.0.0.1:`config.port` (0 picks a free port) and serves in a background task.
    ///
    /// # Errors
    /// An invalid configuration (`InvalidInput`, every problem listed), or the bind error.
    pub async fn start(config: SimConfig) -> io::Result<Simulator> {
        config
            .validate()
            .map_err(|problems| io::Error::new(io::ErrorKind::InvalidInput, problems))?;
        // Load the tokenizer now rather than during the first request, so that
        // request latencies stay predictable.
        let _ = tokio::task::spawn_blocking(|| count_tokens("")).await;
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, config.port)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(config));
        let app = router(Arc::clone(&shared));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serving = axum::serve(listener, app).with_graceful_shutdown(async {
                // A dropped sender stops the server too.
                let _ = stopped.await;
            });
            if let Err(error) = serving.await {
                eprintln!("embedjob simulate: server error: {error}");
            }
        });
        Ok(Simulator {
            addr,
            shared,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The address the simulator listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, without `/v1`: every endpoint path starts
    /// with the configured prefix (`/v1` unless set otherwise).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A snapshot of the ledger.
    pub fn ledger(&self) -> Ledger {
        self.shared.ledger_snapshot()
    }

    /// Zeroes the ledger.
    pub fn reset_ledger(&self) {
        self.shared.reset_ledger();
    }

    /// Stops accepting connections, lets open requests finish (for a few seconds at
    /// most), and returns once the server is down.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn router(shared: Arc<Shared>) -> Router {
    let prefix = shared.config.url_prefix.clone();
    let model_route = if shared.config.model_route {
        get(handlers::get_model)
    } else {
        get(handlers::no_model_route)
    };
    let mut router = Router::new()
        .route(&format!("{prefix}/embeddings"), post(handlers::embeddings))
        .route(
            &format!("{prefix}/chat/completions"),
            post(chat::chat_completions),
        );
    if shared.config.models_routes {
        router = router
            .route(&format!("{prefix}/models"), get(handlers::list_models))
            .route(&format!("{prefix}/models/{{id}}"), model_route);
    }
    if shared.config.model_info {
        router = router.route(&format!("{prefix}/model/info"), get(handlers::model_info));
    }
    if shared.config.tei_info {
        router = router.route("/info", get(handlers::tei_info));
    }
    router
        .merge(batch_routes(&shared))
        .route("/_ledger", get(handlers::get_ledger))
        .route("/_ledger/reset", post(handlers::reset_ledger))
        .fallback(handlers::unknown_url)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(shared.config.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            handlers::count_requests,
        ))
        .with_state(shared)
}

/// The Batch API's routes, with their own state: the files and batches.
fn batch_routes<S: Clone + Send + Sync + 'static>(shared: &Arc<Shared>) -> Router<S> {
    let prefix = shared.config.url_prefix.clone();
    Router::new()
        .route(
            &format!("{prefix}/files"),
            // The upload streams to disk: its body may be as large as a file may be.
            post(batches::upload_file)
                .layer(DefaultBodyLimit::max(batches::upload_body_limit(
                    shared.config.batches.max_file_bytes,
                )))
                .get(batches::list_files),
        )
        .route(
            &format!("{prefix}/files/{{id}}"),
            get(batches::get_file).delete(batches::delete_file),
        )
        .route(
            &format!("{prefix}/files/{{id}}/content"),
            get(batches::file_content),
        )
        .route(
            &format!("{prefix}/batches"),
            post(batches::create_batch).get(batches::list_batches),
        )
        .route(&format!("{prefix}/batches/{{id}}"), get(batches::get_batch))
        .route(
            &format!("{prefix}/batches/{{id}}/cancel"),
            post(batches::cancel_batch),
        )
        .with_state(Arc::new(batches::Batches::new(Arc::clone(shared))))
}

/// Runs `embedjob simulate`: starts the simulator, prints its base URL as one line
/// on stdout (so that scripts using `--port 0` learn the port) and a description on
/// stderr, then serves until Ctrl-C or SIGTERM.
///
/// # Errors
/// A port that cannot be bound, or signals that cannot be listened for.
pub async fn serve(config: SimConfig) -> anyhow::Result<()> {
    let description = describe(&config);
    let port = config.port;
    let sim = Simulator::start(config)
        .await
        .map_err(|error| anyhow::anyhow!("cannot start the simulator on port {port}: {error}"))?;
    println!("{}", sim.base_url());
    eprintln!("embedjob simulate: serving on {}", sim.base_url());
    eprintln!("{description}");
    eprintln!("  ledger: GET {}/_ledger; stop with Ctrl-C", sim.base_url());
    let stopped = stop_signal().await;
    sim.shutdown().await;
    stopped.map_err(|error| anyhow::anyhow!("cannot listen for signals: {error}"))
}

async fn stop_signal() -> io::Result<()> {
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result,
            _ = terminate.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

fn describe_quota(quota: &QuotaConfig) -> String {
    let mut parts = Vec::new();
    if let Some(n) = quota.requests_per_minute {
        parts.push(format!("{n} requests"));
    }
    if let Some(n) = quota.tokens_per_minute {
        parts.push(format!("{n} tokens"));
    }
    let mut text = if parts.is_empty() {
        String::new()
    } else {
        format!(
            "{} per {} ms{}, per key",
            parts.join(" and "),
            quota.window.as_millis(),
            match (quota.kind, quota.reset) {
                (QuotaWindow::Bucket, _) => "",
                (QuotaWindow::Sliding, QuotaReset::Oldest) => " (sliding window)",
                (QuotaWindow::Sliding, QuotaReset::Whole) => {
                    " (sliding window, reset when whole again)"
                }
            }
        )
    };
    if !quota.headers {
        text.push_str(", without x-ratelimit headers");
    }
    if let Some(n) = quota.insufficient_after {
        if !text.is_empty() {
            text.push_str("; ");
        }
        text.push_str(&format!("insufficient_quota after {n} requests"));
    }
    text
}

/// The routes, when they are not an OpenAI-style service's.
fn describe_routes(config: &SimConfig) -> Option<String> {
    if config.url_prefix != "/v1"
        || !config.model_route
        || !config.models_routes
        || config.model_info
        || config.tei_info
        || config.bare_listing
        || config.floats_only
    {
        return Some(format!(
            "  routes under {:?}{}{}{}{}{}",
            config.url_prefix,
            if !config.models_routes {
                ", no GET /models nor /models/{id}"
            } else if config.model_route {
                ""
            } else {
                ", no GET /models/{id}"
            },
            if config.model_info {
                ", LiteLLM's GET /model/info"
            } else {
                ""
            },
            if config.tei_info {
                ", TEI's GET /info"
            } else {
                ""
            },
            if config.bare_listing {
                ", a listing without window or price"
            } else {
                ""
            },
            if config.floats_only {
                ", vectors as floats whatever encoding_format asks"
            } else {
                ""
            }
        ));
    }
    None
}

/// The capacity model, when it is on.
fn describe_capacity(c: &CapacityConfig) -> Option<String> {
    let workers = c.workers?;
    let mut line = format!(
        "  capacity: {workers} workers, {:?} a request + {:?} per 1000 tokens, \
         {} waiting at most; computed and billed even when the client gave up",
        c.base, c.per_1k_tokens, c.queue
    );
    if let Some(after) = c.change_after {
        line.push_str(&format!("; {} workers after {after} requests", c.then));
    }
    Some(line)
}

/// The Batch API's clock and faults, when they are not the defaults.
fn describe_batches(b: &BatchConfig) -> Option<String> {
    if *b == BatchConfig::default() {
        return None;
    }
    let mut parts = vec![format!("a batch takes {:?}", b.duration)];
    if let Some(n) = b.enqueued_tokens {
        parts.push(format!("{n} enqueued tokens a model"));
    }
    let firsts = [
        (b.fail_validation, "fail validation"),
        (b.stuck, "stay in_progress until cancelled"),
        (b.create_drop, "are created without an answer"),
        (b.upload_drop, "uploads are stored without an answer"),
    ];
    for (n, what) in firsts.into_iter().filter(|(n, _)| *n > 0) {
        parts.push(format!("the first {n} {what}"));
    }
    if b.line_failures > 0.0 {
        parts.push(format!("lines fail at {}", b.line_failures));
    }
    if let Some(after) = b.expire_after {
        parts.push(format!("expire after {after:?}"));
    }
    if b.in_order {
        parts.push("output in order".to_string());
    }
    Some(format!("  batches: {}", parts.join(", ")))
}

/// A few lines on what the simulator serves; never the keys themselves.
fn describe(config: &SimConfig) -> String {
    let models: Vec<String> = config
        .models
        .iter()
        .map(|model| match model.kind {
            ModelKind::Embedding { dimensions } => format!("{} ({dimensions} dims)", model.id),
            ModelKind::Chat => format!("{} (chat)", model.id),
        })
        .collect();
    let keys = if config.keys.is_empty() {
        "any non-empty key".to_string()
    } else {
        format!("{} configured", config.keys.len())
    };
    let faults: Vec<String> = config
        .faults
        .rates()
        .iter()
        .filter(|(_, rate)| *rate > 0.0)
        .map(|(name, rate)| format!("{name} at {rate}"))
        .collect();
    let faults = if faults.is_empty() {
        "none".to_string()
    } else {
        let limit = config
            .faults
            .limit
            .map_or(String::new(), |limit| format!(", at most {limit}"));
        format!("{} (seed {}{limit})", faults.join(", "), config.faults.seed)
    };
    let mut lines = vec![
        format!("  models: {}", models.join(", ")),
        format!("  keys: {keys}"),
        format!("  faults: {faults}"),
    ];
    lines.extend(describe_routes(config));
    if config.billing != Billing::default() {
        lines.push(format!(
            "  usage counts {:?} tokens times {}",
            config.billing.count, config.billing.factor
        ));
    }
    if config.quota.is_set() {
        lines.push(format!("  quota: {}", describe_quota(&config.quota)));
    }
    if config.latency_ms > 0 {
        lines.push(format!("  latency: {} ms per request", config.latency_ms));
    }
    if config.latency_per_input_ms > 0 {
        lines.push(format!(
            "  computing: {} ms per input, billed even when the client gave up",
            config.latency_per_input_ms
        ));
    }
    lines.extend(describe_capacity(&config.capacity));
    lines.extend(describe_batches(&config.batches));
    let mut limits = Vec::new();
    if let Some(max) = config.most_inputs() {
        limits.push(format!("{max} inputs"));
    }
    if let Some(max) = config.max_tokens_per_request {
        limits.push(format!("{max} tokens"));
    }
    if !limits.is_empty() {
        lines.push(format!(
            "  limits: {} per request (status {})",
            limits.join(", "),
            if config.tei_info {
                422
            } else {
                config.too_large_status
            }
        ));
    }
    lines.join("\n")
}
