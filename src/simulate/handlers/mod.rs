//! Shared state, authentication and request parsing, with the endpoints in
//! a file per route: models, embeddings, the ledger and the fallbacks.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value};

use super::capacity::Capacity;
use super::config::{ModelSpec, SimConfig};
use super::error::ApiError;
use super::faults::{Fault, FaultDice};
use super::ledger::Ledger;
use super::quota::{Quotas, Refused};

mod embeddings;
mod ledger;
mod models;

pub(crate) use embeddings::{answer_fault_free, embeddings};
pub(crate) use ledger::{get_ledger, method_not_allowed, reset_ledger, unknown_url};
pub(crate) use models::{get_model, list_models, model_info, no_model_route, tei_info};

/// The fixed `created` timestamp of every model and completion.
pub(crate) const CREATED: u64 = 1_700_000_000;

/// State shared by all requests.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: SimConfig,
    ledger: Mutex<Ledger>,
    dice: Mutex<FaultDice>,
    pub chat_ids: AtomicU64,
    embeddings_in_flight: AtomicUsize,
    /// An embeddings answer has left since the ledger was last reset.
    pub answered: AtomicBool,
    quotas: Quotas,
    /// The workers and queue of the capacity model, when it is on.
    pub capacity: Option<Arc<Capacity>>,
}

/// An embeddings request being served; frees its place when dropped, as its answer leaves.
pub(crate) struct Slot<'a>(&'a Shared);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.embeddings_in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.answered.store(true, Ordering::SeqCst);
    }
}

impl Shared {
    pub fn new(config: SimConfig) -> Self {
        Shared {
            dice: Mutex::new(FaultDice::new(&config.faults)),
            quotas: Quotas::new(config.quota.clone()),
            capacity: Capacity::new(config.capacity.clone()),
            config,
            ledger: Mutex::new(Ledger::default()),
            chat_ids: AtomicU64::new(1),
            embeddings_in_flight: AtomicUsize::new(0),
            answered: AtomicBool::new(false),
        }
    }

    /// Takes a place among the embeddings requests served at once, or
    /// refuses with a 429 when `max_concurrent_requests` are already in
    /// (TEI's, with `tei_info`).
    pub fn enter(&self) -> Result<Slot<'_>, ApiError> {
        let now = self.embeddings_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let slot = Slot(self);
        if !self.answered.load(Ordering::SeqCst) {
            let mut ledger = self.ledger();
            let most = &mut ledger.in_flight_before_first_answer;
            *most = (*most).max(now as u64);
        }
        match self.config.max_concurrent_requests {
            Some(max) if now > max && self.config.tei_info => Err(ApiError::tei_overloaded()),
            Some(max) if now > max => Err(ApiError {
                fault: Some("concurrency_limit"),
                ..ApiError::rate_limited(self.config.faults.retry_after_seconds)
            }),
            _ => Ok(slot),
        }
    }

    /// Takes a request of `tokens` billed tokens from the caller's quota:
    /// the quota's headers, or the 429 that refuses it and its headers.
    fn take_quota(&self, headers: &HeaderMap, tokens: u64) -> Result<HeaderMap, Box<Refused>> {
        if !self.config.quota.is_set() {
            return Ok(HeaderMap::new());
        }
        let key = caller_key(headers).unwrap_or_default();
        let answer = self.quotas.admit(key, tokens);
        let refused = answer.as_ref().err().map(|r| r.refusal.name());
        self.ledger().record_quota(key, refused);
        answer
    }

    /// The ledger with the capacity model's counts.
    pub fn ledger_snapshot(&self) -> Ledger {
        let mut ledger = self.ledger().clone();
        ledger.capacity = self.capacity.as_ref().map(|c| c.snapshot());
        ledger
    }

    pub fn reset_ledger(&self) {
        *self.ledger() = Ledger::default();
        self.answered.store(false, Ordering::SeqCst);
        if let Some(capacity) = &self.capacity {
            capacity.reset();
        }
    }

    pub fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // The counters stay meaningful even if a request panicked while holding the lock.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn dice(&self) -> MutexGuard<'_, FaultDice> {
        self.dice.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Draws the fault of one request and records it.
    pub fn roll(&self, embeddings: bool) -> Option<Fault> {
        let fault = self.dice().roll(embeddings);
        self.record(fault);
        fault
    }

    pub fn record(&self, fault: Option<Fault>) {
        if let Some(fault) = fault {
            self.ledger().record_fault(fault.name());
        }
    }

    /// Turns an error into its response, counting it when it is a fault.
    pub fn fail(&self, error: ApiError) -> Response {
        if let Some(name) = error.fault {
            self.ledger().record_fault(name);
        }
        error.into_response()
    }

    pub async fn latency(&self) {
        sleep_ms(self.config.latency_ms).await;
    }

    /// The models the caller may see, in the configuration's order.
    pub fn visible_models(&self, caller: Caller) -> impl Iterator<Item = &ModelSpec> {
        self.config
            .models
            .iter()
            .filter(move |model| caller.sees(&self.config, &model.id))
    }

    /// The model `id`, if it exists and the caller may see it.
    pub fn visible_model(&self, caller: Caller, id: &str) -> Result<&ModelSpec, ApiError> {
        self.config
            .model(id)
            .filter(|model| caller.sees(&self.config, &model.id))
            .ok_or_else(|| ApiError::model_not_found(id))
    }
}

pub(crate) async fn sleep_ms(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// Who is calling: the index of their key, or `None` when any key is accepted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caller {
    key: Option<usize>,
}

impl Caller {
    fn sees(self, config: &SimConfig, model: &str) -> bool {
        self.key
            .and_then(|index| config.keys.get(index))
            .is_none_or(|key| key.sees(model))
    }
}

pub(crate) fn authorize(shared: &Shared, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let key = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer)
        .filter(|key| !key.is_empty())
        .ok_or_else(ApiError::missing_key)?;
    if shared.config.keys.is_empty() {
        return Ok(Caller { key: None });
    }
    let index = shared
        .config
        .keys
        .iter()
        .position(|known| known.key == key)
        .ok_or_else(|| ApiError::unknown_key(key))?;
    Ok(Caller { key: Some(index) })
}

fn bearer(value: &str) -> Option<&str> {
    let (scheme, key) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// Counts every request to `/v1/*` before it is handled, whatever its outcome.
pub(crate) async fn count_requests(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let prefix = shared.config.url_prefix.as_str();
    if let Some(route) = path
        .strip_prefix(prefix)
        .filter(|route| route.is_empty() || route.starts_with('/'))
        .filter(|_| !path.starts_with("/_ledger"))
    {
        let mut ledger = shared.ledger();
        ledger.requests += 1;
        if request.method() == Method::POST {
            match route {
                "/embeddings" => ledger.embedding_requests += 1,
                "/chat/completions" => ledger.chat_requests += 1,
                _ => {}
            }
        }
    }
    next.run(request).await
}

// ---- request parsing ------------------------------------------------------------------------

/// The request body as bytes, or the error the service gives for it.
pub(crate) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    max_body_bytes: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: Some("request_too_large"),
                fault: Some("too_large"),
                ..ApiError::bad_request(format!(
                    "Request body too large: the maximum is {max_body_bytes} bytes."
                ))
            }
        } else {
            ApiError::bad_request(format!(
                "Could not read the request body: {}",
                rejection.body_text()
            ))
        }
    })
}

pub(crate) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(ApiError::bad_request(format!(
            "The request body must be a JSON object, but got {} instead.",
            type_name(&other)
        ))),
        Err(error) => Err(ApiError::bad_request(format!(
            "We could not parse the JSON body of your request ({error}). \
             The service expects a JSON object."
        ))),
    }
}

pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a decimal",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A required string field.
pub(crate) fn required_string(object: &Map<String, Value>, name: &str) -> Result<String, ApiError> {
    match object.get(name) {
        None | Some(Value::Null) => Err(ApiError::missing(name)),
        Some(Value::String(value)) => Ok(value.clone()),
        Some(other) => Err(wrong_type(name, "a string", other)),
    }
}

pub(crate) fn wrong_type(param: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid(
        param,
        format!(
            "Invalid type for '{param}': expected {expected}, but got {} instead.",
            type_name(got)
        ),
    )
}

fn caller_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer)
        .filter(|key| !key.is_empty())
}

pub(crate) fn json_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
