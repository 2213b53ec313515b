//! Errors from the service, sorted by what the caller should do about them.

use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

use crate::rate::{retry_after, Fault, Retryable};
use crate::secret::Scrubber;

/// The longest server message we keep; bodies past this are cut, so that a
/// proxy's HTML error page cannot flood a log line.
const MAX_MESSAGE_CHARS: usize = 500;

/// What a caller should do with a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Worth retrying after a delay: 408, 409, 429, 5xx, timeouts, resets,
    /// truncated or unparseable bodies, invalid responses.
    Transient,
    /// Retrying cannot help: 400, 401, 403, 404, 422 and the like.
    Permanent,
    /// The request was too large (413, or a 400 that says so); split it.
    TooLarge,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Transient => "transient",
            ErrorKind::Permanent => "permanent",
            ErrorKind::TooLarge => "too large",
        })
    }
}

/// A failed call to the service: what happened, where, and what to do next.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ApiError {
    pub kind: ErrorKind,
    /// The endpoint, e.g. `POST /v1/embeddings`.
    pub endpoint: String,
    /// The HTTP status, when a response arrived.
    pub status: Option<u16>,
    /// The server's message (or a description of the transport failure),
    /// cut to a sane length and scrubbed of the API key.
    pub message: String,
    /// The delay the server asked for (`retry-after-ms` or `Retry-After`).
    pub retry_after: Option<Duration>,
    /// No answer came within the client's timeout. The server may still
    /// compute, and bill, the request.
    pub timed_out: bool,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.endpoint)?;
        match self.status {
            Some(status) => write!(f, " failed with HTTP {status}")?,
            None => write!(f, " failed")?,
        }
        write!(f, " ({}): {}", self.kind, self.message)?;
        if let Some(delay) = self.retry_after {
            write!(f, " (retry after {:.3}s)", delay.as_secs_f64())?;
        }
        Ok(())
    }
}

impl ApiError {
    pub fn transient(endpoint: &str, message: impl Into<String>) -> Self {
        Self::without_status(ErrorKind::Transient, endpoint, message)
    }

    fn without_status(kind: ErrorKind, endpoint: &str, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            endpoint: endpoint.to_string(),
            status: None,
            message: message.into(),
            retry_after: None,
            timed_out: false,
        }
    }

    /// Builds the error for a non-success HTTP response. The message is
    /// kept whole, so that [`ApiError::redact`] sees any key in it before it is cut.
    pub fn from_response(endpoint: &str, status: u16, headers: &HeaderMap, body: &[u8]) -> Self {
        let message = message_of(body);
        let kind = classify(status, &message);
        ApiError {
            kind,
            endpoint: endpoint.to_string(),
            status: Some(status),
            message: if message.is_empty() {
                format!("HTTP {status} with an empty body")
            } else {
                message
            },
            retry_after: retry_after(headers, SystemTime::now()),
            timed_out: false,
        }
    }

    /// The error an OpenAI-style `{"error": ...}` object in a successful
    /// (200) body stands for, if the body is one: some gateways report
    /// failures, rate limits among them, that way. Sorted by the status the
    /// object names, if any, else by its words; the server's message is kept.
    pub fn from_error_body(endpoint: &str, body: &[u8]) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_slice(body).ok()?;
        let object = value.as_object()?;
        if object.contains_key("data") || object.get("error").is_none_or(serde_json::Value::is_null)
        {
            return None;
        }
        let error = &object["error"];
        let status = ["code", "status", "status_code"].iter().find_map(|key| {
            error
                .get(key)
                .and_then(|v| {
                    v.as_u64()
                        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                })
                .filter(|code| (400..600).contains(code))
        });
        let message = server_message(body);
        let lower = message.to_ascii_lowercase();
        let kind = match status {
            Some(code) => classify(u16::try_from(code).unwrap_or(500), &message),
            None if says_too_large(&message) => ErrorKind::TooLarge,
            None if ["api key", "unauthorized", "authentication", "permission"]
                .iter()
                .any(|w| lower.contains(w)) =>
            {
                ErrorKind::Permanent
            }
            None => ErrorKind::Transient,
        };
        Some(ApiError {
            kind,
            endpoint: endpoint.to_string(),
            status: Some(200),
            message: format!("an error in a successful response: {message}"),
            retry_after: None,
            timed_out: false,
        })
    }

    /// Whether the service said the model does not exist (OpenAI's
    /// `model_not_found`, or a message saying so), as opposed to a route the
    /// server does not have.
    pub fn is_unknown_model(&self) -> bool {
        let m = self.message.to_ascii_lowercase();
        m.contains("model_not_found")
            || (m.contains("model")
                && [
                    "does not exist",
                    "not found",
                    "unknown model",
                    "no such model",
                ]
                .iter()
                .any(|w| m.contains(w))
                && !m.contains("unknown request url")
                && !m.contains("file not found"))
    }

    /// What a too-large answer was about, read from the server's message.
    pub fn size_limit(&self) -> SizeLimit {
        size_limit(&self.message)
    }

    /// Builds the error for a transport failure (connect, timeout, reset, cut-off body).
    pub fn from_transport(endpoint: &str, err: &reqwest::Error) -> Self {
        let what = if err.is_timeout() {
            "timed out"
        } else if err.is_connect() {
            "could not connect"
        } else if err.is_body() || err.is_decode() {
            "the response body was cut off"
        } else {
            "the connection failed"
        };
        let chain = error_chain(err);
        // No retry makes a certificate trusted.
        let untrusted = super::trust::refused_certificate(&chain);
        let mut message = if untrusted {
            format!(
                "the server's TLS certificate was refused ({}): {chain}",
                super::trust::UNTRUSTED_HINT
            )
        } else {
            format!("{what}: {chain}")
        };
        truncate_chars(&mut message, MAX_MESSAGE_CHARS);
        let kind = if err.is_builder() || untrusted {
            ErrorKind::Permanent
        } else {
            ErrorKind::Transient
        };
        ApiError {
            timed_out: err.is_timeout(),
            ..ApiError::without_status(kind, endpoint, message)
        }
    }

    /// Removes the key, in any form a server could echo it (see
    /// [`Scrubber`]), from the message, then cuts it to a sane length. Some
    /// services echo the key they refused; it must never reach a log.
    #[must_use]
    pub fn redact(mut self, scrubber: &Scrubber) -> Self {
        if let std::borrow::Cow::Owned(clean) = scrubber.scrub(&self.message) {
            self.message = clean;
        }
        truncate_chars(&mut self.message, MAX_MESSAGE_CHARS);
        self
    }

    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Transient
    }
}

/// Joins an error's sources: reqwest's top-level text alone ("error sending
/// request") hides the cause.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

/// Sorts a status (and, for 400 and 422, the message) into transient,
/// permanent or too large.
pub fn classify(status: u16, message: &str) -> ErrorKind {
    match status {
        413 => ErrorKind::TooLarge,
        400 | 422 if says_too_large(message) => ErrorKind::TooLarge,
        // llama.cpp's server refuses an input longer than its physical batch
        // with a 500 that no retry clears.
        500 if over_physical_batch(message) => ErrorKind::TooLarge,
        // 409 is what OpenAI-style services send for a lock or conflict that clears on its own.
        408 | 409 | 425 | 429 => ErrorKind::Transient,
        // Not Implemented: the server lacks the route, and always will.
        501 => ErrorKind::Permanent,
        500..=599 => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

fn says_too_large(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "too large",
        "too long",
        "too many",
        "too_long",
        "maximum context length",
        "context_length_exceeded",
        "too many tokens",
        "tokens per request",
        "exceeds the maximum",
        "reduce your",
        "maximum allowed batch size",
        "must have less than",
        "items after validation",
        "available context size",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

/// Whether a message is llama.cpp's server refusing an input longer than
/// its physical batch: "input (600 tokens) is too large to process.
/// increase the physical batch size (current batch size: 512)", or without
/// the numbers as older builds word it.
fn over_physical_batch(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("too large to process") && m.contains("physical batch size")
}

/// What a request was too large in, as far as the server's message tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeLimit {
    /// One input is longer than the model takes: only that input is at fault.
    Input,
    /// The request has more inputs than the server takes (the most, when said).
    Inputs(Option<usize>),
    /// The request has more tokens than the server takes (the most, when said).
    Tokens(Option<u64>),
    /// The request as a whole, in a way the message does not say (a bare 413).
    Request,
}

/// Reads a too-large message as OpenAI, TEI, vLLM, llama.cpp and FastAPI
/// (pydantic) servers word it.
pub fn size_limit(message: &str) -> SizeLimit {
    let m = message.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| m.contains(w));
    if over_physical_batch(&m) {
        return SizeLimit::Input;
    }
    if has(&[
        "available context size",
        "context length",
        "context_length",
        "input is too long",
        "inputs` must have less than",
        "string should have at most",
        "string_too_long",
        "in the input",
        "input length",
    ]) {
        return SizeLimit::Input;
    }
    let most = number_after(
        &m,
        &[
            "maximum allowed batch size",
            "at most",
            "the maximum is",
            "maximum of",
            "max_length",
            "maximum",
            "limit of",
            "limit is",
            "max",
        ],
    );
    if has(&[
        "items",
        "inputs",
        "batch size",
        "batch_size",
        "list should have",
        "too many input",
    ]) {
        return SizeLimit::Inputs(most.and_then(|n| usize::try_from(n).ok()));
    }
    if m.contains("token") {
        return SizeLimit::Tokens(most);
    }
    SizeLimit::Request
}

/// A model's window as a refusal states it, in the server's own tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRefusal {
    /// The most tokens one input may have.
    pub limit: u64,
    /// The refused input's tokens, when said.
    pub given: Option<u64>,
}

/// Reads the window from a refusal worded as OpenAI ("maximum context
/// length is 8192 tokens, however you requested 9000 tokens"), vLLM
/// ("… is 512 tokens. However, you requested 600 tokens in the input …"),
/// TEI ("`inputs` must have less than 512 tokens. Given: 600") or
/// llama.cpp's server ("input (600 tokens) is too large to process.
/// increase the physical batch size (current batch size: 512)"; "request
/// (600 tokens) exceeds the available context size (512 tokens), try
/// increasing it") word it. A number too large for a `u64`, or none, is no
/// window.
pub fn window_refusal(message: &str) -> Option<WindowRefusal> {
    let m = message.to_ascii_lowercase();
    let limit = number_right_after(
        &m,
        &[
            "maximum context length is",
            "must have less than",
            "current batch size:",
            "available context size (",
        ],
    )?;
    let given = number_right_after(&m, &["you requested", "given:", "input (", "request ("]);
    Some(WindowRefusal { limit, given })
}

/// The number that follows the first of `markers` found, past white space
/// only; none when another word or a sign comes first, or it is 0.
fn number_right_after(text: &str, markers: &[&str]) -> Option<u64> {
    let rest = markers
        .iter()
        .find_map(|marker| text.find(marker).map(|at| &text[at + marker.len()..]))?
        .trim_start();
    let digits = &rest[..rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len())];
    digits.parse().ok().filter(|&n| n > 0)
}

/// The first number within a few words after the first of `markers` found.
fn number_after(text: &str, markers: &[&str]) -> Option<u64> {
    markers.iter().find_map(|marker| {
        let at = text.find(marker)? + marker.len();
        let rest = &text[at..];
        let start = rest.find(|c: char| c.is_ascii_digit())?;
        if start > 24 {
            return None;
        }
        let digits: String = rest[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok().filter(|&n| n > 0)
    })
}

/// Extracts the message from an OpenAI-style `{"error": {...}}` body, a few
/// other common JSON shapes, or plain text.
pub fn server_message(body: &[u8]) -> String {
    let mut message = message_of(body);
    truncate_chars(&mut message, MAX_MESSAGE_CHARS);
    message
}

/// [`server_message`] without the cut.
fn message_of(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let trimmed = text.trim();
    match serde_json::from_str::<serde_json::Value>(trimmed) {
        Ok(value) => json_message(&value).unwrap_or_else(|| trimmed.to_string()),
        Err(_) => trimmed.to_string(),
    }
}

fn json_message(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    let error = value.get("error");
    let object = match error {
        Some(Value::String(text)) => return Some(text.clone()),
        Some(obj @ Value::Object(_)) => obj,
        _ => value,
    };
    if let Some(Value::Array(details)) = object.get("detail") {
        if let Some(message) = pydantic_message(details) {
            return Some(message);
        }
    }
    let message = object
        .get("message")
        .or_else(|| object.get("detail"))
        .and_then(|m| match m {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        })?;
    let code = object
        .get("code")
        .and_then(Value::as_str)
        .or_else(|| object.get("type").and_then(Value::as_str));
    Some(match code {
        Some(code) if !message.contains(code) => format!("{message} [{code}]"),
        _ => message,
    })
}

/// FastAPI's validation errors (`detail: [{loc, msg, ctx}, ...]`), without
/// the `input` they echo, which can be the whole request.
fn pydantic_message(details: &[serde_json::Value]) -> Option<String> {
    let parts: Vec<String> = details
        .iter()
        .filter_map(|detail| {
            let msg = detail.get("msg")?.as_str()?;
            let loc: Vec<String> = detail
                .get("loc")
                .and_then(serde_json::Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .map(|l| l.as_str().map_or_else(|| l.to_string(), str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let kind = detail.get("type").and_then(serde_json::Value::as_str);
            let most = detail
                .get("ctx")
                .and_then(|c| c.get("max_length"))
                .and_then(serde_json::Value::as_u64);
            let mut text = if loc.is_empty() {
                msg.to_string()
            } else {
                format!("{}: {msg}", loc.join("."))
            };
            if let Some(kind) = kind {
                text.push_str(&format!(" [{kind}]"));
            }
            if let Some(most) = most {
                text.push_str(&format!(" (max_length {most})"));
            }
            Some(text)
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

pub(crate) use crate::secret::truncate_chars;

impl Retryable for ApiError {
    fn should_retry(&self) -> bool {
        self.is_transient()
    }

    fn requested_delay(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl Fault for ApiError {
    fn is_refusal(&self) -> bool {
        self.status == Some(429)
    }

    fn message(&self) -> &str {
        &self.message
    }

    fn timed_out(&self) -> bool {
        self.timed_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_sorted() {
        for status in [408, 409, 429, 500, 502, 503, 504] {
            assert_eq!(classify(status, "x"), ErrorKind::Transient, "{status}");
        }
        for status in [400, 401, 403, 404, 422] {
            assert_eq!(classify(status, "bad"), ErrorKind::Permanent, "{status}");
        }
        assert_eq!(
            classify(
                422,
                "body.input: List should have at most 32 items after validation, not 33"
            ),
            ErrorKind::TooLarge
        );
        assert_eq!(classify(413, ""), ErrorKind::TooLarge);
        assert_eq!(
            classify(400, "This model's maximum context length is 8192 tokens"),
            ErrorKind::TooLarge
        );
        assert_eq!(
            classify(400, "Too many inputs: got 300, the maximum is 256"),
            ErrorKind::TooLarge
        );
    }

    #[test]
    fn messages_from_common_bodies() {
        assert_eq!(
            server_message(br#"{"error":{"message":"nope","type":"invalid_request_error","code":"model_not_found"}}"#),
            "nope [model_not_found]"
        );
        assert_eq!(
            server_message(br#"{"error":"plain string"}"#),
            "plain string"
        );
        assert_eq!(server_message(br#"{"message":"top level"}"#), "top level");
        assert_eq!(
            server_message(br#"{"detail":"fastapi style"}"#),
            "fastapi style"
        );
        assert_eq!(server_message(b"  upstream gone \n"), "upstream gone");
        let long = "x".repeat(10_000);
        assert_eq!(
            server_message(long.as_bytes()).chars().count(),
            MAX_MESSAGE_CHARS + 1
        );
    }

    #[test]
    fn too_large_messages_say_what_was_too_large() {
        let cases = [
            (
                "This model's maximum context length is 8192 tokens, however you requested 9000 tokens",
                SizeLimit::Input,
            ),
            (
                "Input validation error: `inputs` must have less than 512 tokens. Given: 600",
                SizeLimit::Input,
            ),
            (
                "Too many inputs: got 33, the maximum is 32 per request.",
                SizeLimit::Inputs(Some(32)),
            ),
            (
                "batch size 64 > maximum allowed batch size 32",
                SizeLimit::Inputs(Some(32)),
            ),
            (
                "Requested 400000 tokens, max 300000 tokens per request",
                SizeLimit::Tokens(Some(300_000)),
            ),
            ("Request body too large", SizeLimit::Request),
        ];
        for (message, expected) in cases {
            assert_eq!(size_limit(message), expected, "{message}");
        }
        let body = br#"{"detail":[{"type":"too_long","loc":["body","input"],"msg":"List should have at most 32 items after validation, not 33","input":["a","b"],"ctx":{"field_type":"List","max_length":32,"actual_length":33}}]}"#;
        let error = ApiError::from_response("POST /embeddings", 422, &HeaderMap::new(), body);
        assert_eq!(error.kind, ErrorKind::TooLarge);
        assert!(
            !error.message.contains(r#""a""#),
            "the echoed input is left out: {error}"
        );
        assert_eq!(error.size_limit(), SizeLimit::Inputs(Some(32)));
    }

    #[test]
    fn an_error_in_a_successful_body_is_a_fault_with_its_message() {
        let error = ApiError::from_error_body(
            "POST /v1/embeddings",
            br#"{"error":{"message":"upstream overloaded","type":"server_error","code":503}}"#,
        )
        .unwrap();
        assert_eq!(error.kind, ErrorKind::Transient);
        assert!(error.message.contains("upstream overloaded"), "{error}");
        let limited = ApiError::from_error_body(
            "POST /v1/embeddings",
            br#"{"error":{"message":"Rate limit reached","code":"429"}}"#,
        )
        .unwrap();
        assert_eq!(limited.kind, ErrorKind::Transient);
        assert!(ApiError::from_error_body("x", br#"{"data":[],"error":null}"#).is_none());
        assert!(ApiError::from_error_body("x", b"not json").is_none());
    }

    #[test]
    fn an_unknown_model_is_told_from_a_missing_route() {
        let unknown = ApiError::from_response(
            "GET /v1/models/x",
            404,
            &HeaderMap::new(),
            br#"{"error":{"message":"The model 'x' does not exist","code":"model_not_found"}}"#,
        );
        assert!(unknown.is_unknown_model());
        for body in [
            &br#"{"detail":"Not Found"}"#[..],
            br#"{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}"#,
            br#"{"error":{"message":"Unknown request URL: GET /v1/models/x.","code":"unknown_url"}}"#,
            b"404 page not found",
        ] {
            let missing = ApiError::from_response("GET /v1/models/x", 404, &HeaderMap::new(), body);
            assert!(!missing.is_unknown_model(), "{missing}");
        }
    }

    #[test]
    fn redaction_removes_the_key() {
        let body = br#"{"error":{"message":"Incorrect API key provided: sk-secret-123.","code":"invalid_api_key"}}"#;
        let scrubber = Scrubber::new("sk-secret-123").unwrap();
        let err = ApiError::from_response("GET /v1/models", 401, &HeaderMap::new(), body)
            .redact(&scrubber);
        assert!(!err.to_string().contains("sk-secret-123"));
        assert!(err.to_string().contains("[REDACTED]"));
    }

    #[test]
    fn a_key_cut_by_the_length_limit_is_scrubbed_before_the_cut() {
        let key = "sk-secret-0123456789abcdef";
        let body = format!("{}{key}", "x".repeat(MAX_MESSAGE_CHARS - 4));
        let err = ApiError::from_response(
            "POST /v1/embeddings",
            500,
            &HeaderMap::new(),
            body.as_bytes(),
        )
        .redact(&Scrubber::new(key).unwrap());
        assert!(!err.message.contains("sk-s"), "{}", err.message);
        assert_eq!(err.message.chars().count(), MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn a_window_is_read_from_each_servers_refusal() {
        let openai = br#"{"error":{"message":"This model's maximum context length is 8192 tokens, however you requested 9000 tokens (9000 in your prompt; 0 for the completion). Please reduce your prompt; or completion length.","type":"invalid_request_error","param":null,"code":"context_length_exceeded"}}"#;
        let tei = br#"{"error":"Input validation error: `inputs` must have less than 512 tokens. Given: 600","error_type":"Validation"}"#;
        let vllm = br#"{"object":"error","message":"This model's maximum context length is 512 tokens. However, you requested 600 tokens in the input for embedding generation. Please reduce the length of the input.","type":"BadRequestError","param":null,"code":400}"#;
        let llama_batch = br#"{"error":{"code":500,"message":"input (600 tokens) is too large to process. increase the physical batch size (current batch size: 512)","type":"server_error"}}"#;
        let llama_context = br#"{"error":{"code":400,"message":"request (600 tokens) exceeds the available context size (512 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":600,"n_ctx":512}}"#;
        // LiteLLM's proxy passes the server's words on inside its own.
        let behind_litellm = br#"{"error":{"message":"litellm.InternalServerError: OpenAIException - input (600 tokens) is too large to process. increase the physical batch size (current batch size: 512)","type":null,"param":null,"code":"500"}}"#;
        for (status, body, limit, given) in [
            (400, &openai[..], 8192, 9000),
            (422, &tei[..], 512, 600),
            (413, &tei[..], 512, 600),
            (400, &vllm[..], 512, 600),
            (500, &llama_batch[..], 512, 600),
            (200, &llama_batch[..], 512, 600),
            (400, &llama_context[..], 512, 600),
            (500, &behind_litellm[..], 512, 600),
        ] {
            let error = if status == 200 {
                ApiError::from_error_body("POST /v1/embeddings", body).unwrap()
            } else {
                ApiError::from_response("POST /v1/embeddings", status, &HeaderMap::new(), body)
            };
            assert_eq!(error.kind, ErrorKind::TooLarge, "{}", error.message);
            assert_eq!(error.size_limit(), SizeLimit::Input, "{}", error.message);
            assert_eq!(
                window_refusal(&error.message),
                Some(WindowRefusal {
                    limit,
                    given: Some(given)
                }),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn only_llama_cpps_physical_batch_makes_a_500_too_large() {
        let older = br#"{"error":{"code":500,"message":"input is too large to process. increase the physical batch size","type":"server_error"}}"#;
        let error = ApiError::from_response("POST /v1/embeddings", 500, &HeaderMap::new(), older);
        assert_eq!(error.kind, ErrorKind::TooLarge, "{}", error.message);
        assert_eq!(error.size_limit(), SizeLimit::Input);
        assert_eq!(window_refusal(&error.message), None);
        for other in [
            &br#"{"error":{"code":500,"message":"the request is too large to process right now","type":"server_error"}}"#[..],
            br#"{"error":{"code":500,"message":"failed to decode the batch","type":"server_error"}}"#,
            b"Internal Server Error",
        ] {
            let error = ApiError::from_response("POST /v1/embeddings", 500, &HeaderMap::new(), other);
            assert_eq!(error.kind, ErrorKind::Transient, "{}", error.message);
        }
    }

    #[test]
    fn a_refusal_without_a_usable_number_is_no_window() {
        for message in [
            "This model's maximum context length is 99999999999999999999999 tokens, however you requested 9 tokens",
            "This model's maximum context length is exceeded",
            "This model's maximum context length is 0 tokens",
            "`inputs` must have less than",
            "Input validation error: `inputs` must have less than about 512 tokens",
            "maximum context length is -5 tokens",
            "",
        ] {
            assert_eq!(window_refusal(message), None, "{message}");
        }
        let huge_given =
            window_refusal("must have less than 512 tokens. Given: 184467440737095516160000");
        assert_eq!(
            huge_given,
            Some(WindowRefusal {
                limit: 512,
                given: None
            })
        );
        let long = format!("maximum context length is {} tokens", "9".repeat(100_000));
        assert_eq!(window_refusal(&long), None);
    }
}
