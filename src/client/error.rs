//! Errors from the service, sorted by what the caller should do about them.

use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

use crate::secret::Scrubber;

/// The longest server message we keep; bodies past this are cut, so that a
/// proxy's HTML error page cannot flood a log line.
const MAX_MESSAGE_CHARS: usize = 500;

/// The longest delay a server may ask for; a longer `Retry-After` is taken
/// as this. It is also the most the retry policy waits on a server's word.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(120);

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
        }
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
        let mut message = format!("{what}: {}", error_chain(err));
        truncate_chars(&mut message, MAX_MESSAGE_CHARS);
        let kind = if err.is_builder() {
            ErrorKind::Permanent
        } else {
            ErrorKind::Transient
        };
        ApiError::without_status(kind, endpoint, message)
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

/// Sorts a status (and, for 400, the message) into transient, permanent or too large.
pub fn classify(status: u16, message: &str) -> ErrorKind {
    match status {
        413 => ErrorKind::TooLarge,
        400 if says_too_large(message) => ErrorKind::TooLarge,
        // 409 is what OpenAI-style services send for a lock or conflict that clears on its own.
        408 | 409 | 425 | 429 => ErrorKind::Transient,
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
        "maximum context length",
        "context_length_exceeded",
        "too many tokens",
        "tokens per request",
        "exceeds the maximum",
        "reduce your",
    ]
    .iter()
    .any(|needle| m.contains(needle))
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

pub(crate) use crate::secret::truncate_chars;

/// The delay the server asked for: `retry-after-ms`, else `Retry-After` in
/// seconds (fractions allowed) or as an HTTP date; at most [`MAX_RETRY_AFTER`].
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if let Some(delay) = capped_seconds(ms / 1000.0) {
            return Some(delay);
        }
    }
    let value = header("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return capped_seconds(seconds);
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

/// A server's delay in seconds, capped; `None` for a negative or non-number.
fn capped_seconds(seconds: f64) -> Option<Duration> {
    if !(seconds.is_finite() && seconds >= 0.0) {
        return None;
    }
    Some(Duration::from_secs_f64(
        seconds.min(MAX_RETRY_AFTER.as_secs_f64()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn retry_after_seconds_date_and_ms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            retry_after(&headers(&[("retry-after", "7")]), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", "1.5")]), now),
            Some(Duration::from_millis(1500))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &date)]), now),
            Some(Duration::from_secs(30))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &past)]), now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "9"), ("retry-after-ms", "250")]),
                now
            ),
            Some(Duration::from_millis(250)),
            "retry-after-ms is the more precise of the two"
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
        for huge in [
            ("retry-after", "99999999999"),
            ("retry-after", "1e300"),
            ("retry-after-ms", "99999999999"),
            ("retry-after-ms", "1e300"),
        ] {
            assert_eq!(
                retry_after(&headers(&[huge]), now),
                Some(MAX_RETRY_AFTER),
                "{huge:?}"
            );
        }
        let far = httpdate::fmt_http_date(now + Duration::from_secs(100_000_000));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &far)]), now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "-3")]), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn statuses_are_sorted() {
        for status in [408, 409, 429, 500, 502, 503, 504] {
            assert_eq!(classify(status, "x"), ErrorKind::Transient, "{status}");
        }
        for status in [400, 401, 403, 404, 422] {
            assert_eq!(classify(status, "bad"), ErrorKind::Permanent, "{status}");
        }
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
}
