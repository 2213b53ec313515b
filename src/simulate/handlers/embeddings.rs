//! `POST /v1/embeddings`: the inputs parsed, the size and quota checked,
//! the fault drawn, the vectors sent and billed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Map, Value};

use super::{
    authorize, body_bytes, caller_key, json_response, parse_object, required_string, sleep_ms,
    wrong_type, Caller, Shared,
};
use crate::simulate::config::{DimensionsParam, ModelSpec, SimConfig, TokenCount};
use crate::simulate::error::ApiError;
use crate::simulate::faults::{dropped_body, truncated_body, Fault};
use crate::simulate::vectors::{count_tokens, embeddings_body, Damage, Item, Shape};

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

/// Whether the client still waits for its answer: cleared when the handler
/// is dropped before the answer (the client hung up).
struct Listening {
    client: Arc<AtomicBool>,
    answered: bool,
}

impl Default for Listening {
    fn default() -> Self {
        Listening {
            client: Arc::new(AtomicBool::new(true)),
            answered: false,
        }
    }
}

impl Listening {
    /// The answer is computed with the client still there.
    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        if !self.answered {
            self.client.store(false, Ordering::SeqCst);
        }
    }
}

/// An embeddings request after validation and the fault draw.
struct Prepared {
    fault: Option<Fault>,
    /// The response body; empty when the fault sends none.
    body: Vec<u8>,
    tokens: u64,
    /// Hex SHA-256 of each input, for billing; empty when the response is not billed.
    hashes: Vec<String>,
    /// Of `hashes`, those of inputs the model read only the start of.
    partly_read: Vec<String>,
    inputs: usize,
    /// The inputs times the longest input's tokens: what a padding server computes.
    padded: u64,
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
    if shared.config.faults.zero_retry_after && response.status() == 429 {
        let headers = response.headers_mut();
        headers.insert("retry-after", HeaderValue::from(0));
        headers.insert("retry-after-ms", HeaderValue::from(0));
    }
    response
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
        Some(Fault::LyingRateLimited) => {
            *quota = Some(shared.quotas.whole());
            Err(ApiError {
                retry_after_seconds: None,
                ..ApiError::rate_limited(0)
            })
        }
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
            let queued = match &shared.capacity {
                Some(capacity) => Some(capacity.enqueue().ok_or_else(ApiError::overloaded)?),
                None => None,
            };
            if compute == 0 && queued.is_none() {
                let mut ledger = shared.ledger();
                ledger.padded_tokens += prepared.padded;
                ledger.bill(prepared.tokens, prepared.hashes, prepared.partly_read);
            } else {
                // A slow answer is computed, and billed, whether or not the
                // client is still waiting for it.
                let listening = Listening::default();
                let client = Arc::clone(&listening.client);
                let billing = Arc::clone(shared);
                let billed = tokio::spawn(async move {
                    let extra = std::time::Duration::from_millis(compute);
                    match (&billing.capacity, queued) {
                        (Some(capacity), Some(queued)) => {
                            let work = capacity.work(prepared.tokens, prepared.padded);
                            capacity.compute(queued, work, extra).await;
                        }
                        _ => sleep_ms(compute).await,
                    }
                    let mut ledger = billing.ledger();
                    if !client.load(Ordering::SeqCst) {
                        ledger.computed_after_hangup += 1;
                        ledger.texts_after_hangup += prepared.hashes.len() as u64;
                    }
                    ledger.padded_tokens += prepared.padded;
                    ledger.bill(prepared.tokens, prepared.hashes, prepared.partly_read);
                });
                let _ = billed.await;
                listening.answered();
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

/// An embeddings request that passed validation and the size checks: what
/// the synchronous route and a line of a batch both answer from.
pub(crate) struct Checked {
    model_id: String,
    inputs: Vec<Input>,
    base64: bool,
    model_dimensions: usize,
    dimensions: usize,
    /// The tokens `usage` reports and the bill counts.
    pub billed: u64,
    /// The inputs times the longest input's tokens: what a padding server computes.
    pub padded: u64,
}

/// The answer to a checked request, with what it bills.
pub(crate) struct Answer {
    pub body: Vec<u8>,
    /// Hex SHA-256 of each input the model read whole.
    pub hashes: Vec<String>,
    /// Of the inputs, those the model read only the start of.
    pub partly_read: Vec<String>,
}

/// Parses an embeddings request body and refuses it as the service would:
/// unknown model, bad parameters, too many inputs or tokens, over the window.
pub(crate) fn check_request(
    shared: &Shared,
    caller: Caller,
    body: &[u8],
) -> Result<Checked, ApiError> {
    let config = &shared.config;
    let mut object = parse_object(body)?;
    let model_id = required_string(&object, "model")?;
    let inputs = parse_inputs(object.remove("input"))?;
    // llama-cpp-python's server reads the field and answers floats anyway.
    let base64 = encoding_is_base64(&object)? && !config.floats_only;
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
    // A server keeps one window: with `--window`, that one, in its own tokens.
    let context_window = if config.window.is_some() {
        u32::MAX
    } else {
        model.context_window
    };
    check_size(config, context_window, &inputs, &counts, tokens)?;
    let longest = counts.iter().copied().max().unwrap_or(0);
    let padded = inputs.len() as u64 * u64::from(longest);
    if let Some(window) = &config.window {
        window.check(inputs.iter().map(|input| input.text.as_str()))?;
    }
    let billed: u64 = inputs
        .iter()
        .zip(&counts)
        .map(|(input, &n)| billed_tokens(config, input, n))
        .sum();
    Ok(Checked {
        model_id,
        inputs,
        base64,
        model_dimensions,
        dimensions,
        billed,
        padded,
    })
}

/// The response body of a checked request, its items written in `order`,
/// one of them damaged when `damaged` says so.
pub(crate) fn answer(
    config: &SimConfig,
    checked: &Checked,
    order: Vec<usize>,
    damaged: Option<(usize, Damage)>,
) -> Answer {
    let read = crate::simulate::window::read(
        config.window.as_ref(),
        checked.inputs.iter().map(|input| input.text.as_str()),
    );
    let digests = &read.digests;
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
        model: &checked.model_id,
        model_dimensions: checked.model_dimensions,
        dimensions: checked.dimensions,
        base64: checked.base64,
    };
    Answer {
        body: embeddings_body(&shape, &items, checked.billed),
        hashes: read.whole,
        partly_read: read.partly_read,
    }
}

/// The fault-free answer to one request body, as the synchronous route
/// gives it: a batch line's answer.
pub(crate) fn answer_fault_free(
    shared: &Shared,
    caller: Caller,
    body: &[u8],
) -> Result<(Answer, u64), ApiError> {
    let checked = check_request(shared, caller, body)?;
    let order = (0..checked.inputs.len()).collect();
    Ok((
        answer(&shared.config, &checked, order, None),
        checked.billed,
    ))
}

fn prepare_embeddings(shared: &Shared, caller: Caller, body: &[u8]) -> Result<Prepared, ApiError> {
    let checked = check_request(shared, caller, body)?;
    let billed = checked.billed;
    let dimensions = checked.dimensions;
    let count = checked.inputs.len();
    let padded = checked.padded;
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
                | Fault::LyingRateLimited
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
            partly_read: Vec::new(),
            inputs: count,
            padded,
        });
    }
    let answer = answer(&shared.config, &checked, order, damaged);
    // A response that arrives whole is billed, whatever the client makes of it.
    let (hashes, partly_read) = if fault == Some(Fault::Truncate) {
        (Vec::new(), Vec::new())
    } else {
        (answer.hashes, answer.partly_read)
    };
    Ok(Prepared {
        fault,
        body: answer.body,
        tokens: billed,
        hashes,
        partly_read,
        inputs: count,
        padded,
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
    if let Some(max) = config.most_inputs() {
        if inputs.len() > max {
            if config.tei_info {
                return Err(ApiError::tei_batch_too_large(inputs.len(), max));
            }
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
