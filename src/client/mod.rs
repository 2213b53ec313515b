//! A typed async client for the model service: embeddings, model listing,
//! chat (plain or streamed) and the Batch API (`batches`).
//!
//! Every failure comes back as an [`ApiError`] sorted into transient,
//! permanent or too-large, carrying the status, the server's message and the
//! delay the server asked for. The API key is sent as a bearer token and is
//! scrubbed from every message that comes back.

mod batches;
mod body;
mod discovery;
mod error;
mod flat;
mod model_info;
mod server_info;
mod sse;
mod trust;
mod wire;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use reqwest::{header, Method};
use serde::de::DeserializeOwned;

use crate::rate::RateLimitHeaders;
use crate::secret::Scrubber;
use crate::types::Usage;

pub use batches::{
    embeddings_from_body, BatchError, BatchLine, BatchLineResponse, BatchObject, BatchPage,
    BatchStatus, FileObject, FilePage, NewBatch, RequestCounts,
};
pub use body::embeddings_limit;
pub use discovery::{discover, Discovery, DiscoveryError};
pub use error::{
    classify, server_message, size_limit, window_refusal, ApiError, ErrorKind, SizeLimit,
    WindowRefusal,
};
pub use flat::with_non_finite_quoted;
pub use sse::{SseDecoder, SseError};
pub use wire::{
    ChatMessage, ChatRequest, EmbeddingInput, EmbeddingItem, EmbeddingRequest, EmbeddingResponse,
    Model, Pricing,
};

/// An API key. Its `Debug` and `Display` never show it.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself, for the `Authorization` header and for redaction only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([REDACTED])")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The service's address; endpoint paths (`/v1/...`) are appended to it.
    pub base_url: String,
    /// The path the API's routes sit under, between the base URL and
    /// `/embeddings`: `None` for `/v1` (a trailing `/v1` on the base URL is
    /// then taken as this prefix), `Some("")` for routes at the root, as
    /// infinity serves them by default, `Some("/openai/v1")` for others.
    pub api_path: Option<String>,
    pub api_key: ApiKey,
    /// Whole-request limit for plain calls; for a stream, the limit for its
    /// answer to begin and between its events (reads that complete no
    /// event do not count).
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// The most a chat stream may take from the request to `[DONE]`, however
    /// steadily it arrives.
    pub stream_timeout: Duration,
}

impl ClientConfig {
    pub fn new(base_url: impl Into<String>, api_key: ApiKey) -> Self {
        ClientConfig {
            base_url: base_url.into(),
            api_path: None,
            api_key,
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            stream_timeout: Duration::from_secs(600),
        }
    }
}

/// A problem with the client's own configuration, found before any request.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `url` is shown without its user info or query (`secret::shown_url`).
    #[error("base URL {url:?} is not valid: {reason}")]
    BaseUrl { url: String, reason: String },
    #[error(
        "base URL {url:?} holds credentials (not shown) in {places}: remove them; \
         the API key belongs in the API key variable"
    )]
    BaseUrlCredentials { url: String, places: String },
    #[error("API path {path:?} is not valid: {reason}")]
    ApiPath { path: String, reason: String },
    #[error("the API key is empty")]
    EmptyKey,
    #[error("the API key contains characters that cannot be sent in an HTTP header")]
    KeyNotHeaderSafe,
    #[error("could not build the HTTP client: {0}")]
    Http(String),
    #[error(
        "{var} {path:?} cannot be used: {reason}; it names a PEM file of the certificate \
         authorities an https base URL is checked against",
        var = trust::CA_FILE_VAR
    )]
    CaFile { path: String, reason: String },
}

/// Told the status and headers of each response a client receives.
pub type Observer = std::sync::Arc<dyn Fn(u16, &header::HeaderMap) + Send + Sync>;

#[derive(Clone)]
pub struct Client {
    observer: Option<Observer>,
    http: reqwest::Client,
    base: String,
    /// `/v1`, `` or another prefix of every route.
    prefix: String,
    key: ApiKey,
    scrubber: Arc<Scrubber>,
    timeout: Duration,
    stream_timeout: Duration,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// A chat reply: its text, and what it was billed when the service said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatReply {
    pub text: String,
    pub usage: Option<Usage>,
}

/// What a chat stream yields: fragments of the reply, in order. Once it has
/// ended, [`ChatStream::usage`] tells what the reply was billed.
pub struct ChatStream {
    fragments: std::pin::Pin<Box<dyn Stream<Item = Result<String, ApiError>> + Send>>,
    usage: Arc<Mutex<Option<Usage>>>,
}

impl ChatStream {
    /// The usage the stream's last chunk reported (it is asked for with
    /// `stream_options.include_usage`); `None` before it came, or from a
    /// service that sends none.
    pub fn usage(&self) -> Option<Usage> {
        *self.usage.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Stream for ChatStream {
    type Item = Result<String, ApiError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        self.fragments.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for ChatStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatStream")
            .field("usage", &self.usage())
            .finish_non_exhaustive()
    }
}

impl Client {
    pub fn new(config: ClientConfig) -> Result<Self, ConfigError> {
        let (base, prefix) = match &config.api_path {
            None => (normalize_base_url(&config.base_url)?, "/v1".to_string()),
            Some(path) => (
                base_url_as_given(&config.base_url)?,
                normalize_api_path(path)?,
            ),
        };
        let key = config.api_key;
        if key.expose().trim().is_empty() {
            return Err(ConfigError::EmptyKey);
        }
        if header::HeaderValue::from_str(&format!("Bearer {}", key.expose())).is_err() {
            return Err(ConfigError::KeyNotHeaderSafe);
        }
        let scrubber = Arc::new(Scrubber::new(key.expose()).ok_or(ConfigError::EmptyKey)?);
        crate::secret::register(key.expose());
        let scheme = base.split_once("://").map_or("", |(scheme, _)| scheme);
        trust::check_ca_file(scheme, std::env::var_os(trust::CA_FILE_VAR))?;
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.timeout)
            .user_agent(concat!("embedjob/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ConfigError::Http(e.to_string()))?;
        Ok(Client {
            observer: None,
            http,
            base,
            prefix,
            key,
            scrubber,
            timeout: config.timeout,
            stream_timeout: config.stream_timeout,
        })
    }

    /// This client, telling `observer` the status and headers of every
    /// response (a rate limit's headers, read by whoever sent the request).
    #[must_use]
    pub fn observed(&self, observer: Observer) -> Client {
        Client {
            observer: Some(observer),
            ..self.clone()
        }
    }

    /// Runs `request` on this client, and returns its result with the quota
    /// headers of the last response it received: what [`crate::rate`] paces by.
    pub async fn with_quota_headers<T, Fut>(
        &self,
        request: impl FnOnce(Client) -> Fut,
    ) -> (T, Option<RateLimitHeaders>)
    where
        Fut: Future<Output = T>,
    {
        let seen = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&seen);
        let client = self.observed(Arc::new(move |_, headers| {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = RateLimitHeaders::parse(headers);
        }));
        let result = request(client).await;
        let headers = seen.lock().unwrap_or_else(PoisonError::into_inner).take();
        (result, headers)
    }

    /// The normalised base URL (no trailing slash; without `/v1` unless an
    /// API path was given).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The path every route sits under: `/v1` unless configured otherwise.
    pub fn api_path(&self) -> &str {
        &self.prefix
    }

    fn route(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }

    /// `POST /v1/embeddings`. The response is returned as sent; check it with
    /// `validate` before trusting it.
    pub async fn embeddings(
        &self,
        model: &str,
        input: EmbeddingInput<'_>,
    ) -> Result<EmbeddingResponse, ApiError> {
        let limit = embeddings_limit(input.len(), None);
        let body = EmbeddingRequest::new(model, input);
        let path = self.route("/embeddings");
        let endpoint = format!("POST {path}");
        self.call_with(Method::POST, &path, Some(&body), limit, |bytes| {
            serde_json::from_slice(bytes).map_err(|e| unparseable(&endpoint, &e, bytes))
        })
        .await
        .map_err(|e| discovery::with_route_hint(self, e))
    }

    /// `POST /v1/embeddings`, decoded straight into one buffer of values
    /// (see [`RawVectors`](crate::types::RawVectors)), with room for `capacity` values reserved
    /// (the inputs times the dimensions, when known). Check it with
    /// `validate::check` before trusting it.
    ///
    /// A body longer than such an answer can be (see [`embeddings_limit`])
    /// is a transient fault, and is not kept.
    pub async fn embeddings_flat(
        &self,
        model: &str,
        input: EmbeddingInput<'_>,
        capacity: usize,
    ) -> Result<crate::types::RawVectors, ApiError> {
        self.embed_request(&EmbeddingRequest::new(model, input), capacity)
            .await
    }

    /// `POST /v1/embeddings` with the request as given (its encoding and
    /// dimensions), decoded as [`Client::embeddings_flat`] decodes.
    pub async fn embed_request(
        &self,
        request: &EmbeddingRequest<'_>,
        capacity: usize,
    ) -> Result<crate::types::RawVectors, ApiError> {
        let inputs = request.input.len();
        let dimensions = capacity.checked_div(inputs).filter(|&d| d > 0);
        let limit = embeddings_limit(inputs, dimensions);
        let path = self.route("/embeddings");
        self.call_with(Method::POST, &path, Some(request), limit, |bytes| {
            decode_embeddings(bytes, capacity)
        })
        .await
        .map_err(|e| discovery::with_route_hint(self, e))
    }

    /// `GET /v1/models`: the models the key can see.
    pub async fn models(&self) -> Result<Vec<Model>, ApiError> {
        let list: wire::ModelList = self
            .call(Method::GET, &self.route("/models"), None::<&()>)
            .await?;
        Ok(list.models())
    }

    /// `GET /v1/models/{id}`.
    pub async fn model(&self, id: &str) -> Result<Model, ApiError> {
        let path = self.route(&format!("/models/{}", encode_path_segment(id)));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `POST /v1/chat/completions` without streaming: the reply's text and usage.
    pub async fn chat(&self, request: &ChatRequest) -> Result<ChatReply, ApiError> {
        let mut request = request.clone();
        request.stream = false;
        let path = self.route("/chat/completions");
        let endpoint = format!("POST {path}");
        let endpoint = endpoint.as_str();
        let reply: wire::ChatResponse = self.call(Method::POST, &path, Some(&request)).await?;
        let usage = reply.usage;
        let choice = reply
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::transient(endpoint, "the reply has no choices"))?;
        Ok(ChatReply {
            text: choice.message.and_then(|m| m.content).unwrap_or_default(),
            usage,
        })
    }

    /// `POST /v1/chat/completions` with `stream: true`: the reply's fragments
    /// as they arrive, and its usage at the end (asked for with
    /// `stream_options`, unless the service refuses that). A stream that
    /// ends before `data: [DONE]` ends with an error, never silently short.
    pub async fn chat_stream(&self, request: &ChatRequest) -> Result<ChatStream, ApiError> {
        let mut request = request.clone();
        request.stream = true;
        let path = self.route("/chat/completions");
        let endpoint = "POST /v1/chat/completions";
        let with_usage = wire::StreamedChat::with_usage(&request);
        // The whole stream's limit runs from the request on.
        let deadline = tokio::time::Instant::now() + self.stream_timeout;
        let response = match self.open_stream(&path, &with_usage).await {
            Err(e) if refuses_stream_options(&e) => self.open_stream(&path, &request).await?,
            other => other?,
        };
        let scrubber = Arc::clone(&self.scrubber);
        let bytes = response.bytes_stream();
        let usage = Arc::new(Mutex::new(None));
        let state = StreamState {
            bytes: Box::pin(bytes),
            decoder: SseDecoder::new(),
            queue: std::collections::VecDeque::new(),
            ended: false,
            done: false,
            deadline,
            stream_timeout: self.stream_timeout,
            idle_deadline: tokio::time::Instant::now() + self.timeout,
            idle_timeout: self.timeout,
            usage: Arc::clone(&usage),
        };
        let stream = futures::stream::unfold(state, move |mut state| {
            let scrubber = Arc::clone(&scrubber);
            async move {
                let item = next_fragment(&mut state, endpoint).await;
                item.map(|result| (result.map_err(|e| e.redact(&scrubber)), state))
            }
        });
        Ok(ChatStream {
            fragments: Box::pin(stream),
            usage,
        })
    }

    /// Sends a streamed request: its status and headers (and an error's
    /// body) must arrive within the request timeout, however slowly they
    /// trickle in; the stream itself is bounded by [`next_fragment`].
    async fn open_stream(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<reqwest::Response, ApiError> {
        let sending = self.send(Method::POST, path, Some(body), false);
        match tokio::time::timeout(self.timeout, sending).await {
            Ok(result) => result,
            Err(_) => {
                let mut error = ApiError::transient(
                    &format!("POST {path}"),
                    format!("timed out: no answer within {}", seconds(self.timeout)),
                );
                error.timed_out = true;
                Err(error)
            }
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<T, ApiError> {
        let endpoint = format!("{method} {path}");
        self.call_with(method, path, body, body::OTHER_BODY_BYTES, |bytes| {
            serde_json::from_slice(bytes).map_err(|e| unparseable(&endpoint, &e, bytes))
        })
        .await
    }

    /// Sends a request and decodes a successful response's body, of at most
    /// `limit` bytes, with `decode`.
    async fn call_with<T>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
        limit: usize,
        decode: impl FnOnce(&[u8]) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let endpoint = format!("{method} {path}");
        let response = self.send(method, path, body, true).await?;
        self.decode_body(&endpoint, response, limit, decode).await
    }

    /// Reads a successful response's body, of at most `limit` bytes, and
    /// decodes it with `decode`.
    async fn decode_body<T>(
        &self,
        endpoint: &str,
        response: reqwest::Response,
        limit: usize,
        decode: impl FnOnce(&[u8]) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let status = response.status().as_u16();
        let bytes = body::read(response, limit).await.map_err(|e| {
            let error = match e {
                body::BodyError::Transport(e) => ApiError::from_transport(endpoint, &e),
                body::BodyError::TooLarge { limit } => {
                    let mut error = ApiError::transient(
                        endpoint,
                        format!(
                            "the response body is longer than {limit} bytes, more than the \
                             answer to this request can take; it was dropped"
                        ),
                    );
                    error.status = Some(status);
                    error
                }
            };
            error.redact(&self.scrubber)
        })?;
        decode(&bytes).map_err(|e| {
            // Some gateways answer 200 with an error object instead of a status.
            ApiError::from_error_body(endpoint, &bytes)
                .unwrap_or(e)
                .redact(&self.scrubber)
        })
    }

    /// Sends a request and returns the response if its status is a success.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
        whole_request_timeout: bool,
    ) -> Result<reqwest::Response, ApiError> {
        let endpoint = format!("{method} {path}");
        let mut request = self.request(method, path);
        if whole_request_timeout {
            request = request.timeout(self.timeout);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        self.dispatch(&endpoint, request).await
    }

    /// A request to `path` with the key.
    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(self.key.expose())
    }

    /// Sends a built request and returns the response if its status is a success.
    async fn dispatch(
        &self,
        endpoint: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ApiError> {
        let response = request
            .send()
            .await
            .map_err(|e| ApiError::from_transport(endpoint, &e).redact(&self.scrubber))?;
        let status = response.status();
        if let Some(observe) = &self.observer {
            observe(status.as_u16(), response.headers());
        }
        if status.is_success() {
            return Ok(response);
        }
        let headers = response.headers().clone();
        // The error body is read only so far as a message needs; a cut-off
        // error body still yields the status.
        let body = body::prefix(response, body::ERROR_BODY_BYTES).await;
        Err(
            ApiError::from_response(endpoint, status.as_u16(), &headers, &body)
                .redact(&self.scrubber),
        )
    }
}

/// Decodes the body of a successful `POST /v1/embeddings` as the client
/// does: into a [`RawVectors`](crate::types::RawVectors) with room for `capacity` values, a body
/// that is not the expected JSON being a transient fault that says why.
///
/// # Errors
/// A body that `serde_json::from_slice::<EmbeddingResponse>` would reject.
pub fn decode_embeddings(
    body: &[u8],
    capacity: usize,
) -> Result<crate::types::RawVectors, ApiError> {
    flat::decode(body, capacity).map_err(|e| unparseable("POST /v1/embeddings", &e, body))
}

/// A service that does not take `stream_options` (an older server) refuses
/// the request it is in; the stream is then asked for without it.
fn refuses_stream_options(error: &ApiError) -> bool {
    matches!(error.status, Some(400 | 422))
        && error
            .message
            .to_ascii_lowercase()
            .contains("stream_options")
}

fn unparseable(endpoint: &str, err: &serde_json::Error, body: &[u8]) -> ApiError {
    // Python-based services write NaN and Infinity as bare tokens, which JSON
    // does not allow; name that check rather than a column number.
    let text = String::from_utf8_lossy(&body[..body.len().min(1 << 20)]);
    let message = if ["NaN", "Infinity"].iter().any(|t| text.contains(t)) {
        format!("invalid response: a non-finite value (NaN or Infinity) in the body ({err})")
    } else if err.is_eof() {
        format!("the response body was cut off ({err})")
    } else {
        format!("the response body is not the expected JSON ({err})")
    };
    ApiError::transient(endpoint, message)
}

struct StreamState {
    bytes: std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    decoder: SseDecoder,
    queue: std::collections::VecDeque<String>,
    /// The body has ended; only queued events remain.
    ended: bool,
    done: bool,
    /// When the whole stream must have ended.
    deadline: tokio::time::Instant,
    stream_timeout: Duration,
    /// When the next event must have arrived: bytes that trickle in without
    /// completing an event do not put it off.
    idle_deadline: tokio::time::Instant,
    idle_timeout: Duration,
    /// Where the usage of the last chunk goes.
    usage: Arc<Mutex<Option<Usage>>>,
}

/// The next reply fragment, `None` after `[DONE]`.
async fn next_fragment(
    state: &mut StreamState,
    endpoint: &str,
) -> Option<Result<String, ApiError>> {
    loop {
        if state.done {
            return None;
        }
        while let Some(data) = state.queue.pop_front() {
            match fragment_of(&data, endpoint, &state.usage) {
                Ok(Some(Fragment::Text(text))) => return Some(Ok(text)),
                Ok(Some(Fragment::Done)) => {
                    state.done = true;
                    return None;
                }
                Ok(None) => {}
                Err(e) => {
                    state.done = true;
                    return Some(Err(e));
                }
            }
        }
        if state.ended {
            state.done = true;
            return Some(Err(ApiError::transient(
                endpoint,
                "the stream ended before data: [DONE]; the reply is incomplete",
            )));
        }
        let until = state.deadline.min(state.idle_deadline);
        let Ok(next) = tokio::time::timeout_at(until, state.bytes.next()).await else {
            state.done = true;
            let message = if until == state.deadline {
                format!(
                    "timed out: the stream did not end within {}; the reply is incomplete",
                    seconds(state.stream_timeout)
                )
            } else {
                format!(
                    "timed out: the stream sent no event for {}; the reply is incomplete",
                    seconds(state.idle_timeout)
                )
            };
            return Some(Err(ApiError::transient(endpoint, message)));
        };
        let decoded = match next {
            Some(Ok(bytes)) => state.decoder.push(&bytes),
            Some(Err(e)) => {
                state.done = true;
                return Some(Err(ApiError::from_transport(endpoint, &e)));
            }
            None => {
                state.ended = true;
                state.decoder.finish()
            }
        };
        match decoded {
            Ok(events) => {
                if !events.is_empty() {
                    state.idle_deadline = tokio::time::Instant::now() + state.idle_timeout;
                }
                state.queue.extend(events);
            }
            Err(e) => {
                state.done = true;
                return Some(Err(ApiError::transient(
                    endpoint,
                    format!("bad event stream: {e}"),
                )));
            }
        }
    }
}

/// `3s`, `0.5s`: a limit as people set it.
fn seconds(limit: Duration) -> String {
    let secs = limit.as_secs_f64();
    if (secs - secs.round()).abs() < 0.05 {
        format!("{secs:.0}s")
    } else {
        format!("{secs:.1}s")
    }
}

enum Fragment {
    Text(String),
    Done,
}

fn fragment_of(
    data: &str,
    endpoint: &str,
    usage: &Mutex<Option<Usage>>,
) -> Result<Option<Fragment>, ApiError> {
    if data.trim() == "[DONE]" {
        return Ok(Some(Fragment::Done));
    }
    let chunk: wire::ChatChunk = serde_json::from_str(data).map_err(|e| {
        ApiError::transient(
            endpoint,
            format!("a stream event is not the expected JSON ({e})"),
        )
    })?;
    if let Some(error) = chunk.error {
        let wrapped = serde_json::json!({ "error": error });
        let message = server_message(wrapped.to_string().as_bytes());
        return Err(ApiError::transient(
            endpoint,
            format!("the stream reported an error: {message}"),
        ));
    }
    if let Some(reported) = chunk.usage {
        *usage.lock().unwrap_or_else(PoisonError::into_inner) = Some(reported);
    }
    let text: String = chunk
        .choices
        .into_iter()
        .filter_map(|c| c.delta.and_then(|d| d.content))
        .collect();
    Ok((!text.is_empty()).then_some(Fragment::Text(text)))
}

/// Accepts a base URL with or without a trailing slash, and with or without a
/// trailing `/v1` (as OpenAI-style clients write it).
fn normalize_base_url(url: &str) -> Result<String, ConfigError> {
    // A key given as the user name, the password or a query parameter is
    // registered as a secret before anything could print it, and refused.
    let credentials = crate::secret::UrlCredentials::of(url);
    if credentials.any(true) {
        credentials.register(true);
        return Err(ConfigError::BaseUrlCredentials {
            url: crate::secret::shown_url(url),
            places: credentials.places(),
        });
    }
    let fail = |reason: &str| ConfigError::BaseUrl {
        url: crate::secret::shown_url(url),
        reason: reason.to_string(),
    };
    let parsed = reqwest::Url::parse(url.trim()).map_err(|e| fail(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(fail("the scheme must be http or https"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(fail("it must not have a query or fragment"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(fail(
            "credentials do not belong in the URL; use the API key variable",
        ));
    }
    let mut base = parsed.as_str().trim_end_matches('/').to_string();
    if let Some(stripped) = base.strip_suffix("/v1") {
        base = stripped.to_string();
    }
    Ok(base)
}

/// A base URL used as given, for a client told its API path explicitly.
fn base_url_as_given(url: &str) -> Result<String, ConfigError> {
    let normalized = normalize_base_url(url)?;
    // normalize_base_url checked it; only the trailing `/v1` is kept here.
    let trimmed = url.trim().trim_end_matches('/');
    Ok(
        if trimmed.ends_with("/v1") && !normalized.ends_with("/v1") {
            format!("{normalized}/v1")
        } else {
            normalized
        },
    )
}

/// `""`, or a path of `/`-separated segments: `/v1`, `/openai/v1`.
fn normalize_api_path(path: &str) -> Result<String, ConfigError> {
    let fail = |reason: &str| ConfigError::ApiPath {
        path: path.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = path.trim().trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    if !trimmed.starts_with('/') {
        return Err(fail("it must start with / (or be empty)"));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "/-._~".contains(c);
    if !trimmed.chars().all(allowed) || trimmed.contains("//") {
        return Err(fail(
            "only letters, digits, - . _ ~ and single / are allowed",
        ));
    }
    Ok(trimmed.to_string())
}

fn encode_path_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_normalised() {
        for url in [
            "http://127.0.0.1:9000",
            "http://127.0.0.1:9000/",
            "http://127.0.0.1:9000/v1",
            "http://127.0.0.1:9000/v1/",
        ] {
            assert_eq!(
                normalize_base_url(url).unwrap(),
                "http://127.0.0.1:9000",
                "{url}"
            );
        }
        assert_eq!(
            normalize_base_url("https://proxy.example/openai/").unwrap(),
            "https://proxy.example/openai"
        );
        assert!(normalize_base_url("ftp://x").is_err());
        assert!(normalize_base_url("not a url").is_err());
        assert!(normalize_base_url("http://user:pw@host").is_err());
    }

    #[test]
    fn key_is_never_formatted() {
        let key = ApiKey::new("sk-very-secret");
        assert!(!format!("{key:?} {key}").contains("sk-very-secret"));
        let config = ClientConfig::new("http://127.0.0.1:1", key);
        assert!(!format!("{config:?}").contains("sk-very-secret"));
        let client = Client::new(config).unwrap();
        assert!(!format!("{client:?}").contains("sk-very-secret"));
    }

    #[test]
    fn an_api_path_replaces_the_v1_prefix() {
        let key = || ApiKey::new("sk-api-path-test");
        let with = |base: &str, path: Option<&str>| {
            let mut config = ClientConfig::new(base, key());
            config.api_path = path.map(str::to_string);
            Client::new(config).map(|c| format!("{}{}", c.base_url(), c.route("/embeddings")))
        };
        assert_eq!(
            with("http://h:1/v1", None).unwrap(),
            "http://h:1/v1/embeddings"
        );
        assert_eq!(
            with("http://h:1/", Some("")).unwrap(),
            "http://h:1/embeddings"
        );
        assert_eq!(
            with("http://h:1/v1", Some("")).unwrap(),
            "http://h:1/v1/embeddings",
            "a base URL is taken as given when the path is set"
        );
        assert_eq!(
            with("http://h:1", Some("/openai/v1/")).unwrap(),
            "http://h:1/openai/v1/embeddings"
        );
        assert!(with("http://h:1", Some("v1")).is_err());
        assert!(with("http://h:1", Some("/v1?x=1")).is_err());
    }

    #[test]
    fn path_segments_are_escaped() {
        assert_eq!(encode_path_segment("svc-embed-1"), "svc-embed-1");
        assert_eq!(encode_path_segment("a/b c"), "a%2Fb%20c");
    }
}
