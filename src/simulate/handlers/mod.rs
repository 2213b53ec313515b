//! Shared state, authentication, request parsing, and the model, embeddings and
//! ledger endpoints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::config::{DimensionsParam, ModelSpec, SimConfig, TokenCount};
use super::error::ApiError;
use super::faults::{dropped_body, truncated_body, Fault, FaultDice};
use super::ledger::Ledger;
use super::quota::{Quotas, Refused};
use super::vectors::{count_tokens, embeddings_body, Damage, Item, Shape};

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
    quotas: Quotas,
}

/// An embeddings request being served; frees its place when dropped.
pub(crate) struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    pub fn new(config: SimConfig) -> Self {
        Shared {
            dice: Mutex::new(FaultDice::new(&config.faults)),
            quotas: Quotas::new(config.quota.clone()),
            config,
            ledger: Mutex::new(Ledger::default()),
            chat_ids: AtomicU64::new(1),
            embeddings_in_flight: AtomicUsize::new(0),
        }
    }

    /// Takes a place among the embeddings requests served at once, or
    /// refuses with a 429 when `max_concurrent_requests` are already in.
    pub fn enter(&self) -> Result<Slot<'_>, ApiError> {
        let now = self.embeddings_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let slot = Slot(&self.embeddings_in_flight);
        match self.config.max_concurrent_requests {
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

/// One input of an embeddings request: a text, or token ids (cl100k) and
/// the text they decode to.
pub(crate) struct Input {
    pub text: String,
    /// The number of token ids, when the input came as ids.
    pub ids: Option<u32>,
}

/// `input`: a string, an array of strings, an array of token ids (one
/// input), or an array of such arrays, as OpenAI accepts (LangChain sends ids).
fn parse_inputs(value: Option<Value>) -> Result<Vec<Input>, ApiError> {
    let empty_text = |param: String| {
        ApiError::invalid(
            param.clone(),
            format!("Invalid '{param}': the text must not be empty."),
        )
    };
    let text = |text: String| Input { text, ids: None };
    match value {
        None | Some(Value::Null) => Err(ApiError::missing("input")),
        Some(Value::String(t)) if t.is_empty() => Err(empty_text("input".to_string())),
        Some(Value::String(t)) => Ok(vec![text(t)]),
        Some(Value::Array(items)) if items.is_empty() => Err(ApiError::invalid(
            "input",
            "Invalid 'input': the list of inputs must not be empty.",
        )),
        Some(Value::Array(items)) if items[0].is_number() => {
            Ok(vec![token_input("input", &items)?])
        }
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(t) if t.is_empty() => Err(empty_text(format!("input[{i}]"))),
                Value::String(t) => Ok(text(t)),
                Value::Array(ids) if !ids.is_empty() => token_input(&format!("input[{i}]"), &ids),
                other => Err(wrong_type(
                    &format!("input[{i}]"),
                    "a string or an array of token ids",
                    &other,
                )),
            })
            .collect(),
        Some(other) => Err(wrong_type(
            "input",
            "a string, an array of strings, or an array of token ids",
            &other,
        )),
    }
}

/// Token ids of the `cl100k_base` encoding, decoded to their text.
fn token_input(param: &str, ids: &[Value]) -> Result<Input, ApiError> {
    let ids: Vec<u32> = ids
        .iter()
        .map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            ApiError::invalid(
                param,
                format!("Invalid '{param}': token ids must be integers of 0 or more."),
            )
        })?;
    let bytes = tiktoken_rs::cl100k_base_singleton()
        .decode_bytes(&ids)
        .map_err(|_| {
            ApiError::invalid(
                param,
                format!("Invalid '{param}': a token id is not in the model's vocabulary."),
            )
        })?;
    Ok(Input {
        text: String::from_utf8_lossy(&bytes).into_owned(),
        ids: Some(u32::try_from(ids.len()).unwrap_or(u32::MAX)),
    })
}

// ---- models ---------------------------------------------------------------------------------

fn model_json(model: &ModelSpec, bare: bool) -> Value {
    if bare {
        return json!({
            "id": model.id,
            "object": "model",
            "created": CREATED,
            "owned_by": "svc",
        });
    }
    json!({
        "id": model.id,
        "object": "model",
        "created": CREATED,
        "owned_by": "svc",
        "context_window": model.context_window,
        "modalities": model.modalities,
        "pricing": {
            "input_per_1k": model.input_per_1k,
            "output_per_1k": model.output_per_1k,
        },
    })
}

pub(crate) async fn list_models(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let caller = match authorize(&shared, &headers) {
        Ok(caller) => caller,
        Err(error) => return shared.fail(error),
    };
    let data: Vec<Value> = shared
        .config
        .models
        .iter()
        .filter(|model| caller.sees(&shared.config, &model.id))
        .map(|model| model_json(model, shared.config.bare_listing))
        .collect();
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

pub(crate) async fn get_model(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let found = authorize(&shared, &headers).and_then(|caller| {
        let Path(id) =
            id.map_err(|_| ApiError::bad_request("The model id in the URL is not valid."))?;
        shared
            .visible_model(caller, &id)
            .map(|model| model_json(model, shared.config.bare_listing))
    });
    match found {
        Ok(model) => axum::Json(model).into_response(),
        Err(error) => shared.fail(error),
    }
}

/// `GET /v1/models/{id}` on a server without the route: FastAPI's 404.
pub(crate) async fn no_model_route() -> Response {
    let mut response = axum::Json(json!({ "detail": "Not Found" })).into_response();
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

// ---- embeddings -----------------------------------------------------------------------------

/// An embeddings request after validation and the fault draw.
struct Prepared {
    fault: Option<Fault>,
    /// The response body; empty when the fault sends none.
    body: Vec<u8>,
    tokens: u64,
    /// Hex SHA-256 of each input, for billing; empty when the response is not billed.
    hashes: Vec<String>,
    inputs: usize,
}

pub(crate) async fn embeddings(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let mut quota = None;
    let mut response = match embeddings_response(&shared, &headers, body, &mut quota).await {
        Ok(response) => response,
        Err(error) => shared.fail(error),
    };
    // Every response carries the quota's headers, as OpenAI sends them.
    let quota = quota.or_else(|| caller_key(&headers).map(|key| shared.quotas.peek(key)));
    if let Some(quota) = quota {
        response.headers_mut().extend(quota);
    }
    response
}

fn caller_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer)
        .filter(|key| !key.is_empty())
}

async fn embeddings_response(
    shared: &Arc<Shared>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    quota: &mut Option<HeaderMap>,
) -> Result<Response, ApiError> {
    let caller = authorize(shared, headers)?;
    let _slot = shared.enter()?;
    shared.latency().await;
    let body = body_bytes(body, shared.config.max_body_bytes)?;
    // Parsing, token counting and writing vectors grow with the request: keep them
    // off the threads that serve connections.
    let task_shared = Arc::clone(shared);
    let prepared =
        tokio::task::spawn_blocking(move || prepare_embeddings(&task_shared, caller, &body))
            .await
            .map_err(|_| ApiError::internal())??;
    match shared.take_quota(headers, prepared.tokens) {
        Ok(headers) => *quota = Some(headers),
        Err(refused) => {
            *quota = Some(refused.headers);
            return Err(refused.error);
        }
    }
    let retry_after = shared.config.faults.retry_after_seconds;
    match prepared.fault {
        Some(Fault::RateLimited) => Err(ApiError::rate_limited(retry_after)),
        Some(Fault::Internal) => Err(ApiError::internal()),
        Some(Fault::Overloaded) => Err(ApiError::overloaded()),
        Some(Fault::Drop) => Ok(json_response(dropped_body())),
        Some(Fault::Truncate) => Ok(json_response(truncated_body(prepared.body))),
        Some(Fault::ErrorIn200) => Ok(json_response(ApiError::error_in_200_body().into())),
        Some(Fault::Slow | Fault::Shuffle | Fault::WrongDimensions | Fault::Nan) | None => {
            let mut compute = shared
                .config
                .latency_per_input_ms
                .saturating_mul(prepared.inputs as u64);
            if prepared.fault == Some(Fault::Slow) {
                compute = compute.saturating_add(shared.config.faults.slow_ms);
            }
            if compute == 0 {
                shared.ledger().bill(prepared.tokens, prepared.hashes);
            } else {
                // A slow answer is computed, and billed, whether or not the
                // client is still waiting for it.
                let billing = Arc::clone(shared);
                let billed = tokio::spawn(async move {
                    sleep_ms(compute).await;
                    billing.ledger().bill(prepared.tokens, prepared.hashes);
                });
                let _ = billed.await;
            }
            Ok(json_response(prepared.body.into()))
        }
    }
}

/// The request's `dimensions`, if any, as the model takes it: the length
/// to send, or the refusal.
fn requested_dimensions(
    object: &Map<String, Value>,
    model: &ModelSpec,
    dimensions: usize,
) -> Result<usize, ApiError> {
    let asked = match object.get("dimensions") {
        None | Some(Value::Null) => return Ok(dimensions),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n >= 1)
            .ok_or_else(|| {
                ApiError::invalid(
                    "dimensions",
                    format!("Invalid 'dimensions': expected an integer of at least 1, got {n}."),
                )
            })?,
        Some(other) => return Err(wrong_type("dimensions", "an integer", other)),
    };
    match model.dimensions_param {
        DimensionsParam::Ignore => Ok(dimensions),
        DimensionsParam::Refuse => Err(ApiError::invalid(
            "dimensions",
            format!(
                "Model \"{}\" does not support matryoshka representation, changing output \
                 dimensions will lead to poor results.",
                model.id
            ),
        )),
        DimensionsParam::Truncate if asked > dimensions => Err(ApiError::invalid(
            "dimensions",
            format!(
                "Invalid 'dimensions': {asked} is more than the {dimensions} of model '{}'.",
                model.id
            ),
        )),
        DimensionsParam::Truncate => Ok(asked),
    }
}

/// The tokens `usage` reports for one input, as the simulator is set to count.
fn billed_tokens(config: &SimConfig, input: &Input, cl100k: u32) -> u64 {
    let count = match config.billing.count {
        TokenCount::Cl100k => u64::from(cl100k),
        TokenCount::Bytes => (input.text.len() as u64).div_ceil(4),
    };
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let scaled = (count as f64 * config.billing.factor).ceil() as u64;
    scaled
}

fn prepare_embeddings(shared: &Shared, caller: Caller, body: &[u8]) -> Result<Prepared, ApiError> {
    let config = &shared.config;
    let mut object = parse_object(body)?;
    let model_id = required_string(&object, "model")?;
    let inputs = parse_inputs(object.remove("input"))?;
    let base64 = encoding_is_base64(&object)?;
    let model = shared.visible_model(caller, &model_id)?;
    let Some(model_dimensions) = model.dimensions() else {
        return Err(ApiError::invalid(
            "model",
            format!("The model '{model_id}' is a chat model and does not support embeddings."),
        ));
    };
    let dimensions = requested_dimensions(&object, model, model_dimensions)?;

    // Too-large checks come before the fault draw, and are never billed.
    let counts: Vec<u32> = inputs
        .iter()
        .map(|input| input.ids.unwrap_or_else(|| count_tokens(&input.text)))
        .collect();
    let tokens: u64 = counts.iter().map(|&n| u64::from(n)).sum();
    check_size(config, model.context_window, &inputs, &counts, tokens)?;
    let billed: u64 = inputs
        .iter()
        .zip(&counts)
        .map(|(input, &n)| billed_tokens(config, input, n))
        .sum();

    let count = inputs.len();
    let (fault, order, damaged) = {
        let mut dice = shared.dice();
        let fault = dice.roll(true);
        let order = if fault == Some(Fault::Shuffle) {
            dice.permutation(count)
        } else {
            (0..count).collect()
        };
        let damaged = match fault {
            Some(Fault::WrongDimensions) => Some((dice.pick(count), Damage::Short)),
            Some(Fault::Nan) => Some((dice.pick(count), Damage::Nan(dice.pick(dimensions)))),
            _ => None,
        };
        (fault, order, damaged)
    };
    shared.record(fault);
    if matches!(
        fault,
        Some(
            Fault::RateLimited
                | Fault::Internal
                | Fault::Overloaded
                | Fault::Drop
                | Fault::ErrorIn200
        )
    ) {
        return Ok(Prepared {
            fault,
            body: Vec::new(),
            tokens: billed,
            hashes: Vec::new(),
            inputs: count,
        });
    }

    let digests: Vec<[u8; 32]> = inputs
        .iter()
        .map(|input| super::vectors::text_digest(&input.text))
        .collect();
    let items: Vec<Item> = order
        .into_iter()
        .map(|index| Item {
            index,
            digest: digests[index],
            damage: match damaged {
                Some((at, damage)) if at == index => damage,
                _ => Damage::None,
            },
        })
        .collect();
    let shape = Shape {
        model: &model_id,
        model_dimensions,
        dimensions,
        base64,
    };
    let body = embeddings_body(&shape, &items, billed);
    // A response that arrives whole is billed, whatever the client makes of it.
    let hashes = if fault == Some(Fault::Truncate) {
        Vec::new()
    } else {
        digests.iter().map(hex::encode).collect()
    };
    Ok(Prepared {
        fault,
        body,
        tokens: billed,
        hashes,
        inputs: count,
    })
}

/// `encoding_format`: `"float"` (the default) or `"base64"`.
fn encoding_is_base64(object: &serde_json::Map<String, Value>) -> Result<bool, ApiError> {
    match object.get("encoding_format") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::String(format)) if format == "float" => Ok(false),
        Some(Value::String(format)) if format == "base64" => Ok(true),
        Some(other) => Err(ApiError::invalid(
            "encoding_format",
            format!("Invalid 'encoding_format': expected \"float\" or \"base64\", got {other}."),
        )),
    }
}

/// Refuses a request with too many inputs or tokens, or an input longer
/// than the model's window (or poisoned).
fn check_size(
    config: &SimConfig,
    context_window: u32,
    inputs: &[Input],
    counts: &[u32],
    tokens: u64,
) -> Result<(), ApiError> {
    if let Some(max) = config.max_inputs_per_request {
        if inputs.len() > max {
            if config.too_large_status == 422 {
                let texts: Vec<&str> = inputs.iter().map(|i| i.text.as_str()).collect();
                return Err(ApiError::pydantic_too_long(max, &texts));
            }
            return Err(ApiError::too_large(
                config.too_large_status,
                "too_many_inputs",
                format!(
                    "Too many inputs: got {}, the maximum is {max} per request.",
                    inputs.len()
                ),
            ));
        }
    }
    if let Some(max) = config.max_tokens_per_request {
        if tokens > max {
            return Err(ApiError::too_large(
                config.too_large_status,
                "request_too_large",
                format!(
                    "Request too large: {tokens} tokens, the maximum is {max} tokens per request."
                ),
            ));
        }
    }
    for (input, &count) in inputs.iter().zip(counts) {
        // A poisoned input stands for one the service refuses although the client
        // counted it as fitting; its real count is reported.
        let poisoned = config
            .poison
            .as_deref()
            .is_some_and(|poison| input.text.contains(poison));
        if count > context_window || poisoned {
            return Err(ApiError::context_length_exceeded(
                context_window,
                u64::from(count),
            ));
        }
    }
    Ok(())
}

pub(crate) fn json_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

// ---- ledger and fallbacks -------------------------------------------------------------------

pub(crate) async fn get_ledger(State(shared): State<Arc<Shared>>, uri: Uri) -> Response {
    let without_texts = uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "texts=false" || pair == "texts=0")
    });
    let body = {
        let ledger = shared.ledger();
        if without_texts {
            let mut value = serde_json::to_value(Ledger {
                texts: HashMap::new(),
                faults: ledger.faults.clone(),
                billed_sizes: ledger.billed_sizes.clone(),
                refused: ledger.refused.clone(),
                refusal_runs: HashMap::new(),
                ..*ledger
            });
            if let Ok(Value::Object(object)) = &mut value {
                object.remove("texts");
            }
            value
        } else {
            serde_json::to_value(&*ledger)
        }
    };
    match body {
        Ok(body) => axum::Json(body).into_response(),
        Err(_) => ApiError::internal().into_response(),
    }
}

pub(crate) async fn reset_ledger(State(shared): State<Arc<Shared>>) -> Response {
    *shared.ledger() = Ledger::default();
    axum::Json(Ledger::default()).into_response()
}

pub(crate) async fn unknown_url(method: Method, uri: Uri) -> Response {
    ApiError::unknown_url(method.as_str(), uri.path()).into_response()
}

pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    ApiError::method_not_allowed(method.as_str(), uri.path()).into_response()
}
