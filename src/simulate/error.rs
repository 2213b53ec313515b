//! OpenAI-style error responses: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

const INVALID_REQUEST: &str = "invalid_request_error";

/// An error response of the simulated service.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub retry_after_seconds: Option<u32>,
    /// Name under which the ledger counts this error as a fault.
    pub fault: Option<&'static str>,
    /// A body of another shape than OpenAI's, sent as it is.
    pub body: Option<Box<serde_json::Value>>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after_seconds: None,
            fault: None,
            body: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, INVALID_REQUEST, message)
    }

    /// A request field with a wrong type or value.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.into()),
            code: Some("invalid_value"),
            ..ApiError::bad_request(message)
        }
    }

    pub fn missing(param: &str) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::bad_request(format!("Missing required parameter: '{param}'."))
        }
    }

    pub fn missing_key() -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            INVALID_REQUEST,
            "You didn't provide an API key. You need to provide your API key in an \
             Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
    }

    /// Echoes the whole key, as some real services do, so that tests can check
    /// that a client redacts it from whatever it prints.
    pub fn unknown_key(key: &str) -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                INVALID_REQUEST,
                format!("Incorrect API key provided: {key}."),
            )
        }
    }

    pub fn model_not_found(id: &str) -> Self {
        ApiError {
            param: Some("model".to_string()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                INVALID_REQUEST,
                format!("The model '{id}' does not exist or you do not have access to it."),
            )
        }
    }

    pub fn unknown_url(method: &str, path: &str) -> Self {
        ApiError {
            code: Some("unknown_url"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                INVALID_REQUEST,
                format!("Unknown request URL: {method} {path}."),
            )
        }
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            INVALID_REQUEST,
            format!("Method {method} is not allowed for {path}."),
        )
    }

    /// A request-level too-large rejection, with the configured status (400, 413 or 422).
    pub fn too_large(status: u16, code: &'static str, message: String) -> Self {
        ApiError {
            param: Some("input".to_string()),
            code: Some(code),
            fault: Some("too_large"),
            ..ApiError::new(
                StatusCode::from_u16(status).unwrap_or(StatusCode::PAYLOAD_TOO_LARGE),
                INVALID_REQUEST,
                message,
            )
        }
    }

    /// FastAPI's 422 for a list longer than a pydantic model allows, as
    /// infinity answers too many inputs; it echoes the input, as FastAPI does.
    pub fn pydantic_too_long(max: usize, inputs: &[&str]) -> Self {
        let body = serde_json::json!({
            "detail": [{
                "type": "too_long",
                "loc": ["body", "input"],
                "msg": format!(
                    "List should have at most {max} items after validation, not {}",
                    inputs.len()
                ),
                "input": inputs,
                "ctx": {"field_type": "List", "max_length": max, "actual_length": inputs.len()},
            }]
        });
        ApiError::too_many_inputs(body)
    }

    /// TEI's 422 for a request of more inputs than `max_client_batch_size`.
    pub fn tei_batch_too_large(given: usize, max: usize) -> Self {
        let body = serde_json::json!({
            "error": format!("batch size {given} > maximum allowed batch size {max}"),
            "error_type": "Validation",
        });
        ApiError::too_many_inputs(body)
    }

    /// TEI's 429 for a request beyond `max_concurrent_requests` at once: no
    /// `Retry-After`, and TEI's own body.
    pub fn tei_overloaded() -> Self {
        let body = serde_json::json!({
            "error": "Model is overloaded",
            "error_type": "overloaded",
        });
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "overloaded",
            "Model is overloaded",
        )
        .answered_with("concurrency_limit", body)
    }

    /// A 422 for too many inputs, answered with a server's own `body`.
    fn too_many_inputs(body: serde_json::Value) -> Self {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            INVALID_REQUEST,
            "too many inputs",
        )
        .answered_with("too_large", body)
    }

    /// This error, counted in the ledger as `fault`, with a server's own
    /// `body` instead of OpenAI's shape.
    pub(super) fn answered_with(self, fault: &'static str, body: serde_json::Value) -> Self {
        ApiError {
            fault: Some(fault),
            body: Some(Box::new(body)),
            ..self
        }
    }

    /// The body of a 200 that carries an error, as some gateways send.
    pub fn error_in_200_body() -> Vec<u8> {
        serde_json::json!({
            "error": {
                "message": "The upstream server failed to answer; try again.",
                "type": "server_error",
                "param": null,
                "code": null,
            }
        })
        .to_string()
        .into_bytes()
    }

    pub fn context_length_exceeded(context_window: u32, tokens: u64) -> Self {
        ApiError {
            param: Some("input".to_string()),
            code: Some("context_length_exceeded"),
            fault: Some("too_large"),
            ..ApiError::bad_request(format!(
                "This model's maximum context length is {context_window} tokens, however you \
                 requested {tokens} tokens. Please reduce your input."
            ))
        }
    }

    pub fn rate_limited(retry_after_seconds: u64) -> Self {
        ApiError {
            code: Some("rate_limit_exceeded"),
            retry_after_seconds: Some(u32::try_from(retry_after_seconds).unwrap_or(u32::MAX)),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                format!(
                    "Rate limit reached for requests. Please try again in {retry_after_seconds}s."
                ),
            )
        }
    }

    pub fn internal() -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "The server had an error while processing your request. Sorry about that!",
        )
    }

    pub fn overloaded() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "The server is currently overloaded with other requests. Please try again later.",
        )
    }
}

impl ApiError {
    /// The body the error is sent with.
    pub fn body_json(&self) -> serde_json::Value {
        self.body.as_deref().cloned().unwrap_or_else(|| {
            serde_json::json!({
                "error": {
                    "message": self.message,
                    "type": self.kind,
                    "param": self.param,
                    "code": self.code,
                }
            })
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body_json();
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after_seconds {
            let headers = response.headers_mut();
            headers.insert("retry-after", HeaderValue::from(seconds));
            headers.insert(
                "retry-after-ms",
                HeaderValue::from(u64::from(seconds) * 1000),
            );
        }
        response
    }
}
