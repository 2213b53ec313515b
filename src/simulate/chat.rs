//! `POST /v1/chat/completions`: a deterministic echo, as one JSON reply or an SSE stream.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::config::ModelKind;
use super::error::ApiError;
use super::faults::{dropped_body, truncated_body, Fault};
use super::handlers::{
    authorize, body_bytes, json_response, parse_object, required_string, sleep_ms, type_name,
    wrong_type, Shared, CREATED,
};
use super::vectors::count_tokens;

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// A validated chat request.
struct ChatRequest {
    model: String,
    /// Text of each message, with its role.
    messages: Vec<(String, String)>,
    max_tokens: Option<u64>,
    stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage, before `[DONE]`.
    include_usage: bool,
}

impl ChatRequest {
    fn parse(body: &[u8]) -> Result<ChatRequest, ApiError> {
        let object = parse_object(body)?;
        let model = required_string(&object, "model")?;
        let messages = match object.get("messages") {
            None | Some(Value::Null) => return Err(ApiError::missing("messages")),
            Some(Value::Array(items)) if items.is_empty() => {
                return Err(ApiError::invalid(
                    "messages",
                    "Invalid 'messages': the conversation must contain at least one message.",
                ))
            }
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| parse_message(i, item))
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => return Err(wrong_type("messages", "an array", other)),
        };
        match object.get("temperature") {
            None | Some(Value::Null) => {}
            Some(Value::Number(number)) => {
                let temperature = number.as_f64().unwrap_or(f64::NAN);
                if !(0.0..=2.0).contains(&temperature) {
                    return Err(ApiError::invalid(
                        "temperature",
                        format!(
                            "Invalid 'temperature': expected a value between 0 and 2 inclusive, \
                             but got {number} instead."
                        ),
                    ));
                }
            }
            Some(other) => return Err(wrong_type("temperature", "a number", other)),
        }
        let max_tokens = optional_count(&object, "max_tokens")?;
        let stream = match object.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(stream)) => *stream,
            Some(other) => return Err(wrong_type("stream", "a boolean", other)),
        };
        let include_usage = stream_options(&object, stream)?;
        Ok(ChatRequest {
            model,
            messages,
            max_tokens,
            stream,
            include_usage,
        })
    }

    /// "You said: " and the last user message, cut to `max_tokens` words.
    /// Returns the reply and whether it was cut.
    fn reply(&self) -> (String, bool) {
        let said = self
            .messages
            .iter()
            .rev()
            .find(|(role, _)| role == "user")
            .or(self.messages.last())
            .map_or("", |(_, content)| content.as_str());
        let reply = format!("You said: {said}");
        match self.max_tokens {
            Some(max) if reply.split_whitespace().count() as u64 > max => {
                let words: Vec<&str> = reply
                    .split_whitespace()
                    .take(usize::try_from(max).unwrap_or(usize::MAX))
                    .collect();
                (words.join(" "), true)
            }
            _ => (reply, false),
        }
    }
}

fn parse_message(i: usize, item: &Value) -> Result<(String, String), ApiError> {
    let param = format!("messages[{i}]");
    let Value::Object(message) = item else {
        return Err(wrong_type(&param, "an object", item));
    };
    let role = match message.get("role") {
        None | Some(Value::Null) => return Err(ApiError::missing(&format!("{param}.role"))),
        Some(Value::String(role)) if ROLES.contains(&role.as_str()) => role.clone(),
        Some(Value::String(role)) => {
            return Err(ApiError::invalid(
                format!("{param}.role"),
                format!(
                    "Invalid '{param}.role': '{role}' is not one of {}.",
                    ROLES.join(", ")
                ),
            ))
        }
        Some(other) => return Err(wrong_type(&format!("{param}.role"), "a string", other)),
    };
    let content = match message.get("content") {
        None | Some(Value::Null) => return Err(ApiError::missing(&format!("{param}.content"))),
        Some(Value::String(content)) => content.clone(),
        // Content given as parts: the text parts are read, other parts (images) are skipped.
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|part| part.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        Some(other) => {
            return Err(wrong_type(
                &format!("{param}.content"),
                "a string or an array of parts",
                other,
            ))
        }
    };
    Ok((role, content))
}

/// `stream_options`, allowed only with `stream`, as OpenAI has it: whether
/// to end the stream with the usage.
fn stream_options(object: &Map<String, Value>, stream: bool) -> Result<bool, ApiError> {
    let options = match object.get("stream_options") {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Object(options)) => options,
        Some(other) => return Err(wrong_type("stream_options", "an object", other)),
    };
    if !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        ));
    }
    match options.get("include_usage") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(include)) => Ok(*include),
        Some(other) => Err(wrong_type(
            "stream_options.include_usage",
            "a boolean",
            other,
        )),
    }
}

fn optional_count(object: &Map<String, Value>, name: &str) -> Result<Option<u64>, ApiError> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => match number.as_u64() {
            Some(count) if count >= 1 => Ok(Some(count)),
            _ => Err(ApiError::invalid(
                name,
                format!("Invalid '{name}': expected an integer of at least 1, but got {number}."),
            )),
        },
        Some(other) => Err(ApiError::invalid(
            name,
            format!(
                "Invalid type for '{name}': expected an integer, but got {} instead.",
                type_name(other)
            ),
        )),
    }
}

pub(crate) async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match chat_response(&shared, &headers, body).await {
        Ok(response) => response,
        Err(error) => shared.fail(error),
    }
}

async fn chat_response(
    shared: &Shared,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = authorize(shared, headers)?;
    shared.latency().await;
    let body = body_bytes(body, shared.config.max_body_bytes)?;
    let request = ChatRequest::parse(&body)?;
    let model = shared.visible_model(caller, &request.model)?;
    if model.kind != ModelKind::Chat {
        return Err(ApiError::invalid(
            "model",
            format!(
                "The model '{}' is an embedding model and does not support chat completions.",
                request.model
            ),
        ));
    }
    let prompt_tokens: u64 = request
        .messages
        .iter()
        .map(|(_, content)| u64::from(count_tokens(content)))
        .sum();
    if prompt_tokens > u64::from(model.context_window) {
        return Err(ApiError::context_length_exceeded(
            model.context_window,
            prompt_tokens,
        ));
    }

    let fault = shared.roll(false);
    match fault {
        Some(Fault::RateLimited) => {
            return Err(ApiError::rate_limited(
                shared.config.faults.retry_after_seconds,
            ))
        }
        Some(Fault::Internal) => return Err(ApiError::internal()),
        Some(Fault::Overloaded) => return Err(ApiError::overloaded()),
        Some(Fault::Drop) if request.stream => return Ok(event_stream(dropped_body())),
        Some(Fault::Drop) => return Ok(json_response(dropped_body())),
        Some(Fault::Slow) => sleep_ms(shared.config.faults.slow_ms).await,
        Some(Fault::ErrorIn200) if !request.stream => {
            return Ok(json_response(ApiError::error_in_200_body().into()))
        }
        _ => {}
    }
    let truncate = fault == Some(Fault::Truncate);

    let (reply, cut) = request.reply();
    let finish_reason = if cut { "length" } else { "stop" };
    let id = format!(
        "chatcmpl-sim-{}",
        shared.chat_ids.fetch_add(1, Ordering::Relaxed)
    );
    let completion_tokens = u64::from(count_tokens(&reply));
    let usage = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    });
    if request.stream {
        let reply = Reply {
            id: &id,
            model: &request.model,
            text: &reply,
            finish_reason,
        };
        let usage = request.include_usage.then_some(usage);
        let events = stream_events(&reply, usage, truncate);
        let body = Body::from_stream(futures::stream::iter(
            events.into_iter().map(Ok::<Bytes, io::Error>),
        ));
        return Ok(event_stream(body));
    }
    let body = json!({
        "id": id,
        "object": "chat.completion",
        "created": CREATED,
        "model": request.model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": reply },
            "finish_reason": finish_reason,
        }],
        "usage": usage,
    })
    .to_string()
    .into_bytes();
    if truncate {
        Ok(json_response(truncated_body(body)))
    } else {
        Ok(json_response(body.into()))
    }
}

fn event_stream(body: Body) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// A reply to stream.
struct Reply<'a> {
    id: &'a str,
    model: &'a str,
    text: &'a str,
    finish_reason: &'a str,
}

/// The SSE events of a streamed reply. A truncated stream stops after about half
/// of the content, without the final chunk and without `[DONE]`. With `usage`
/// (`stream_options.include_usage`), every chunk has `"usage": null` and a
/// last chunk without choices carries the usage, as OpenAI sends it.
fn stream_events(reply: &Reply<'_>, usage: Option<Value>, truncate: bool) -> Vec<Bytes> {
    let with_usage = usage.is_some();
    let event = |mut chunk: Value| {
        if with_usage && chunk.get("usage").is_none() {
            chunk["usage"] = Value::Null;
        }
        Bytes::from(format!("data: {chunk}\n\n"))
    };
    let chunk = |delta: Value, finish: Option<&str>| {
        event(json!({
            "id": reply.id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": reply.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        }))
    };
    let finish_reason = reply.finish_reason;
    let pieces = fragments(reply.text);
    let mut events = Vec::with_capacity(pieces.len() + 4);
    events.push(chunk(json!({ "role": "assistant" }), None));
    events.push(Bytes::from_static(b": keep-alive\n\n"));
    let sent = if truncate {
        pieces.len().div_ceil(2)
    } else {
        pieces.len()
    };
    events.extend(
        pieces
            .iter()
            .take(sent)
            .map(|piece| chunk(json!({ "content": piece }), None)),
    );
    if !truncate {
        events.push(chunk(json!({}), Some(finish_reason)));
        if let Some(usage) = usage {
            events.push(event(json!({
                "id": reply.id,
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": reply.model,
                "choices": [],
                "usage": usage,
            })));
        }
        events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    }
    events
}

/// Splits `text` into fragments of a word each (with the whitespace before it),
/// long words cut every 8 characters. The fragments concatenate back to `text`.
fn fragments(text: &str) -> Vec<String> {
    const MAX_CHARS: usize = 8;
    let mut pieces = Vec::new();
    let mut current = String::new();
    let mut word_chars = 0;
    let mut previous_space = false;
    for c in text.chars() {
        let space = c.is_whitespace();
        let word_ended = space && !previous_space && !current.is_empty();
        if word_ended || (!space && word_chars == MAX_CHARS) {
            pieces.push(std::mem::take(&mut current));
            word_chars = 0;
        }
        current.push(c);
        if !space {
            word_chars += 1;
        }
        previous_space = space;
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::fragments;

    #[test]
    fn fragments_concatenate_back_to_the_text() {
        for text in [
            "",
            "You said: hello",
            "  leading and trailing  ",
            "a reallyreallylongword here",
            "héllo wörld 🎉🎉🎉🎉🎉🎉🎉🎉🎉 ok",
        ] {
            let pieces = fragments(text);
            assert_eq!(pieces.concat(), text);
            assert!(pieces.iter().all(|p| !p.is_empty()));
        }
        assert_eq!(fragments("You said: hi"), ["You", " said:", " hi"]);
        assert!(fragments("You said: hello there").len() > 3);
    }
}
