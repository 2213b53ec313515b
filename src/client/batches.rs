//! The service's Batch API, as OpenAI defines it: upload a file of requests,
//! create a batch of it, follow its status, stream its output file's lines.
//!
//! Every call goes with the client's key and timeout, and fails as an
//! [`ApiError`] naming the endpoint, the key scrubbed. Objects are read
//! leniently: unknown fields are ignored, an unknown status is
//! [`BatchStatus::Other`], absent counts, errors and metadata are empty, and
//! a count or id written as the wrong JSON type is read as what it says where
//! it can be. The client retries nothing: a `create_batch` whose answer was
//! lost may have created the batch, so its caller looks in the listing
//! instead of creating again.

mod lines;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::Stream;
use reqwest::header::HeaderMap;
use reqwest::Method;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::{body, encode_path_segment, flat, unparseable, ApiError, Client, ErrorKind};
use crate::types::RawVectors;

/// What is read of a file at a time while it is uploaded.
const UPLOAD_CHUNK_BYTES: usize = 64 * 1024;

/// A file the service keeps: `POST /v1/files` answers with one.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileObject {
    pub id: String,
    #[serde(default, deserialize_with = "count")]
    pub bytes: u64,
    #[serde(default, deserialize_with = "text")]
    pub filename: String,
    #[serde(default, deserialize_with = "text")]
    pub purpose: String,
    /// Unix seconds; 0 when the service sends none.
    #[serde(default, deserialize_with = "count")]
    pub created_at: u64,
}

/// Where a batch is in its life. A status this client does not know is kept
/// as [`BatchStatus::Other`] rather than failing the batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchStatus {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
    Other(String),
}

impl BatchStatus {
    /// Whether the batch will change no more: failed, completed, expired or cancelled.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            BatchStatus::Failed
                | BatchStatus::Completed
                | BatchStatus::Expired
                | BatchStatus::Cancelled
        )
    }

    /// The status as the service writes it.
    pub fn parse(text: &str) -> BatchStatus {
        match text {
            "validating" => BatchStatus::Validating,
            "failed" => BatchStatus::Failed,
            "in_progress" => BatchStatus::InProgress,
            "finalizing" => BatchStatus::Finalizing,
            "completed" => BatchStatus::Completed,
            "expired" => BatchStatus::Expired,
            "cancelling" => BatchStatus::Cancelling,
            "cancelled" => BatchStatus::Cancelled,
            other => BatchStatus::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            BatchStatus::Validating => "validating",
            BatchStatus::Failed => "failed",
            BatchStatus::InProgress => "in_progress",
            BatchStatus::Finalizing => "finalizing",
            BatchStatus::Completed => "completed",
            BatchStatus::Expired => "expired",
            BatchStatus::Cancelling => "cancelling",
            BatchStatus::Cancelled => "cancelled",
            BatchStatus::Other(other) => other,
        }
    }
}

impl fmt::Display for BatchStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many of a batch's requests there are, and how many are done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct RequestCounts {
    #[serde(default, deserialize_with = "count")]
    pub total: u64,
    #[serde(default, deserialize_with = "count")]
    pub completed: u64,
    #[serde(default, deserialize_with = "count")]
    pub failed: u64,
}

/// An error the service reports: one of a failed batch's `errors.data[]`,
/// or a failed line's `error`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct BatchError {
    #[serde(default, deserialize_with = "optional_text")]
    pub code: Option<String>,
    #[serde(default, deserialize_with = "text")]
    pub message: String,
    /// The input file's line at fault, when the service says.
    #[serde(default, deserialize_with = "optional_count")]
    pub line: Option<u64>,
    #[serde(default, deserialize_with = "optional_text")]
    pub param: Option<String>,
}

impl BatchError {
    /// An error as a service wrote it: an object, or a bare message.
    fn of(value: Value) -> Option<BatchError> {
        match value {
            Value::Null => None,
            Value::String(message) => Some(BatchError {
                message,
                ..BatchError::default()
            }),
            object @ Value::Object(_) => serde_json::from_value(object).ok(),
            other => Some(BatchError {
                message: other.to_string(),
                ..BatchError::default()
            }),
        }
    }
}

/// A batch as the service describes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BatchObject {
    pub id: String,
    #[serde(default = "unknown_status", deserialize_with = "status")]
    pub status: BatchStatus,
    #[serde(default, deserialize_with = "text")]
    pub endpoint: String,
    #[serde(default, deserialize_with = "text")]
    pub input_file_id: String,
    #[serde(default, deserialize_with = "optional_text")]
    pub output_file_id: Option<String>,
    #[serde(default, deserialize_with = "optional_text")]
    pub error_file_id: Option<String>,
    #[serde(default, deserialize_with = "text")]
    pub completion_window: String,
    #[serde(default, deserialize_with = "count")]
    pub created_at: u64,
    #[serde(default, deserialize_with = "optional_count")]
    pub expires_at: Option<u64>,
    /// Zeros when the service sends none.
    #[serde(default, deserialize_with = "request_counts")]
    pub request_counts: RequestCounts,
    /// `errors.data[]`; empty when absent.
    #[serde(default, deserialize_with = "errors")]
    pub errors: Vec<BatchError>,
    /// Empty when absent or `null`.
    #[serde(default, deserialize_with = "metadata")]
    pub metadata: BTreeMap<String, String>,
}

/// What `POST /v1/batches` is sent.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct NewBatch<'a> {
    pub input_file_id: &'a str,
    /// `"/v1/embeddings"`.
    pub endpoint: &'a str,
    /// `"24h"`.
    pub completion_window: &'a str,
    pub metadata: &'a BTreeMap<String, String>,
}

/// One page of `GET /v1/batches`, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPage {
    pub data: Vec<BatchObject>,
    /// Whether another page follows; never true for an empty page, so that
    /// a caller that pages on cannot loop forever.
    pub has_more: bool,
    /// The `after` of the next page: the service's `last_id`, or the last
    /// batch's id when it sends none.
    pub last_id: Option<String>,
}

/// One page of `GET /v1/files`, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePage {
    pub data: Vec<FileObject>,
    /// As [`BatchPage::has_more`]: never true for an empty page.
    pub has_more: bool,
    /// The `after` of the next page.
    pub last_id: Option<String>,
}

/// The listing of batches as the service sends it.
type RawPage = RawList<BatchObject>;

#[derive(Deserialize)]
struct RawList<T> {
    #[serde(default = "Vec::new")]
    data: Vec<T>,
    #[serde(default, deserialize_with = "flag")]
    has_more: bool,
    #[serde(default, deserialize_with = "optional_text")]
    last_id: Option<String>,
}

impl From<RawList<FileObject>> for FilePage {
    fn from(page: RawList<FileObject>) -> Self {
        let last_id = page
            .last_id
            .or_else(|| page.data.last().map(|f| f.id.clone()));
        FilePage {
            has_more: page.has_more && !page.data.is_empty(),
            last_id,
            data: page.data,
        }
    }
}

impl From<RawPage> for BatchPage {
    fn from(page: RawPage) -> Self {
        let last_id = page
            .last_id
            .or_else(|| page.data.last().map(|b| b.id.clone()));
        BatchPage {
            has_more: page.has_more && !page.data.is_empty(),
            last_id,
            data: page.data,
        }
    }
}

/// One line of an output or error file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BatchLine {
    pub custom_id: String,
    #[serde(default)]
    pub response: Option<BatchLineResponse>,
    #[serde(default, deserialize_with = "line_error")]
    pub error: Option<BatchError>,
}

/// The answer a line got, as the synchronous route would have given it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BatchLineResponse {
    /// 0 when the service sends no usable status.
    #[serde(default, deserialize_with = "status_code")]
    pub status_code: u16,
    #[serde(default, deserialize_with = "optional_text")]
    pub request_id: Option<String>,
    #[serde(default)]
    pub body: Value,
}

/// The endpoint a line's answer is named by in errors.
const LINE_ENDPOINT: &str = "POST /v1/embeddings (a batch line)";

impl BatchLine {
    /// Why this line has no answer to use, as the synchronous route would
    /// have failed: a response whose status is not a success, sorted as that
    /// status is (a 400 refuses the input for good, a 500 is transient); or
    /// its `error` without a status (`batch_expired`, `batch_cancelled`:
    /// the request never ran), transient. `None` for a successful answer.
    pub fn api_error(&self) -> Option<ApiError> {
        if let Some(error) = &self.error {
            return Some(ApiError::transient(LINE_ENDPOINT, error_text(error)));
        }
        let Some(response) = &self.response else {
            return Some(ApiError::transient(
                LINE_ENDPOINT,
                format!(
                    "line {:?} has neither a response nor an error",
                    self.custom_id
                ),
            ));
        };
        match response.status_code {
            200..=299 => None,
            0 => Some(ApiError::transient(
                LINE_ENDPOINT,
                format!("line {:?} has a response without a status", self.custom_id),
            )),
            status => {
                let body = serde_json::to_vec(&response.body).unwrap_or_default();
                Some(ApiError::from_response(
                    LINE_ENDPOINT,
                    status,
                    &HeaderMap::new(),
                    &body,
                ))
            }
        }
    }
}

fn error_text(error: &BatchError) -> String {
    match &error.code {
        Some(code) if !error.message.contains(code.as_str()) => {
            format!("{} [{code}]", error.message)
        }
        _ => error.message.clone(),
    }
}

/// Decodes the body of a batch line's response, an embeddings response with
/// vectors as numbers or base64, as the synchronous answers are decoded.
///
/// # Errors
/// A body the synchronous path would reject (transient, as there), or the
/// service's error object when the body is one.
pub fn embeddings_from_body(body: &Value) -> Result<RawVectors, ApiError> {
    flat::decode_value(body).map_err(|e| {
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        ApiError::from_error_body(LINE_ENDPOINT, &bytes).unwrap_or_else(|| {
            ApiError::transient(
                LINE_ENDPOINT,
                format!("the line's body is not an embeddings response ({e})"),
            )
        })
    })
}

impl Client {
    /// `POST /v1/files` with `purpose=batch`: the file at `path`, streamed
    /// from disk, named `filename`. The whole upload may take the client's
    /// stream timeout (or its request timeout, if longer): a file is up to
    /// 200 MB, more than a plain request's limit allows for.
    pub async fn upload_batch_file(
        &self,
        path: &Path,
        filename: &str,
    ) -> Result<FileObject, ApiError> {
        let route = self.route("/files");
        let endpoint = format!("POST {route}");
        let unreadable = |e: std::io::Error| {
            let mut error =
                ApiError::transient(&endpoint, format!("cannot read {}: {e}", path.display()));
            error.kind = ErrorKind::Permanent;
            error.redact(&self.scrubber)
        };
        let file = tokio::fs::File::open(path).await.map_err(unreadable)?;
        let length = file.metadata().await.map_err(unreadable)?.len();
        let stream = reqwest::Body::wrap_stream(file_chunks(file));
        let part = reqwest::multipart::Part::stream_with_length(stream, length)
            .file_name(filename.to_string())
            .mime_str("application/jsonl")
            .map_err(|e| ApiError::from_transport(&endpoint, &e))?;
        let form = reqwest::multipart::Form::new()
            .text("purpose", "batch")
            .part("file", part);
        let request = self
            .request(Method::POST, &route)
            .timeout(self.stream_timeout.max(self.timeout))
            .multipart(form);
        let response = match self.dispatch(&endpoint, request).await {
            Ok(response) => response,
            Err(error) => return Err(self.upload_error(with_route_hint(error)).await),
        };
        self.decode_body(&endpoint, response, body::ERROR_BODY_BYTES, |bytes| {
            json(&endpoint, bytes)
        })
        .await
    }

    /// `POST /v1/batches`. Never retry this blindly: an answer lost on the
    /// way may have created the batch.
    pub async fn create_batch(&self, batch: &NewBatch<'_>) -> Result<BatchObject, ApiError> {
        self.batch_call(Method::POST, &self.route("/batches"), Some(batch))
            .await
    }

    /// `GET /v1/batches/{id}`.
    pub async fn batch(&self, id: &str) -> Result<BatchObject, ApiError> {
        let path = self.route(&format!("/batches/{}", encode_path_segment(id)));
        self.batch_call(Method::GET, &path, None::<&()>).await
    }

    /// One page of `GET /v1/batches`, newest first: at most `limit` batches
    /// (taken into 1..=100), after the batch `after` (the previous page's
    /// [`BatchPage::last_id`]).
    pub async fn batches(&self, after: Option<&str>, limit: u32) -> Result<BatchPage, ApiError> {
        let mut path = self.route(&format!("/batches?limit={}", limit.clamp(1, 100)));
        if let Some(after) = after {
            path.push_str(&format!("&after={}", encode_path_segment(after)));
        }
        let page: RawPage = self.batch_call(Method::GET, &path, None::<&()>).await?;
        Ok(page.into())
    }

    /// One page of `GET /v1/files`, newest first: at most `limit` files of
    /// `purpose` (taken into 1..=10,000, as OpenAI allows), after the file
    /// `after` (the previous page's [`FilePage::last_id`]).
    pub async fn files(
        &self,
        purpose: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<FilePage, ApiError> {
        let mut path = self.route(&format!(
            "/files?purpose={}&limit={}",
            encode_path_segment(purpose),
            limit.clamp(1, 10_000)
        ));
        if let Some(after) = after {
            path.push_str(&format!("&after={}", encode_path_segment(after)));
        }
        let page: RawList<FileObject> = self.batch_call(Method::GET, &path, None::<&()>).await?;
        Ok(page.into())
    }

    /// `POST /v1/batches/{id}/cancel`: the batch, `cancelling` or already ended.
    pub async fn cancel_batch(&self, id: &str) -> Result<BatchObject, ApiError> {
        let path = self.route(&format!("/batches/{}/cancel", encode_path_segment(id)));
        self.batch_call(Method::POST, &path, None::<&()>).await
    }

    /// `GET /v1/files/{id}/content` as a stream of lines, read as it
    /// arrives. Memory is bounded by `max_line_bytes` (plus one read of the
    /// body): a longer line ends the stream with an error naming the file
    /// and the line's number, and so does a body that ends mid-line (cut
    /// off) or fails. A line that is not a batch line is an error naming it,
    /// and the stream goes on. Blank lines are skipped. The answer must
    /// begin within the client's timeout, and each read of the body too.
    pub async fn file_lines(
        &self,
        id: &str,
        max_line_bytes: usize,
    ) -> Result<impl Stream<Item = Result<BatchLine, ApiError>> + Send + 'static, ApiError> {
        let path = self.route(&format!("/files/{}/content", encode_path_segment(id)));
        let endpoint = format!("GET {path}");
        let request = self.request(Method::GET, &path);
        let response =
            match tokio::time::timeout(self.timeout, self.dispatch(&endpoint, request)).await {
                Ok(result) => result.map_err(with_route_hint)?,
                Err(_) => {
                    let mut error = ApiError::transient(
                        &endpoint,
                        format!(
                            "timed out: no answer within {}",
                            super::seconds(self.timeout)
                        ),
                    );
                    error.timed_out = true;
                    return Err(error);
                }
            };
        Ok(lines::stream(
            response,
            id.to_string(),
            endpoint,
            max_line_bytes,
            Arc::clone(&self.scrubber),
        ))
    }

    /// `DELETE /v1/files/{id}`. A service that answers `"deleted": false`
    /// has not deleted it, and that is an error.
    pub async fn delete_file(&self, id: &str) -> Result<(), ApiError> {
        let path = self.route(&format!("/files/{}", encode_path_segment(id)));
        let endpoint = format!("DELETE {path}");
        let response = self
            .send(Method::DELETE, &path, None::<&()>, true)
            .await
            .map_err(with_route_hint)?;
        self.decode_body(&endpoint, response, body::ERROR_BODY_BYTES, |bytes| {
            let deleted = serde_json::from_slice::<Value>(bytes)
                .ok()
                .and_then(|v| v.get("deleted").and_then(Value::as_bool));
            if deleted == Some(false) {
                let mut error =
                    ApiError::transient(&endpoint, format!("the service did not delete file {id}"));
                error.kind = ErrorKind::Permanent;
                return Err(error);
            }
            Ok(())
        })
        .await
    }

    /// A call whose answer is a JSON object: a batch or a page of them.
    async fn batch_call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ApiError> {
        let endpoint = format!("{method} {path}");
        self.call_with(method, path, body, body::OTHER_BODY_BYTES, |bytes| {
            json(&endpoint, bytes)
        })
        .await
        .map_err(with_route_hint)
    }
}

impl Client {
    /// An upload's error, saying whether the server has the Batch API when
    /// the connection failed under it: a server without the route answers
    /// before it reads the body and closes, so the write fails before the
    /// answer is read. The listing, sent without a body, tells.
    async fn upload_error(&self, error: ApiError) -> ApiError {
        if error.status.is_some() || error.timed_out || error.message.starts_with("could not") {
            return error;
        }
        let probe = self.route("/batches?limit=1");
        match self.call::<Value>(Method::GET, &probe, None::<&()>).await {
            Err(answer) if route_missing(&answer) => {
                let mut error = error;
                error.kind = ErrorKind::Permanent;
                error.message = format!(
                    "{} (the server has no route GET {probe} either: it does not offer the \
                     Batch API there; check `backend.base_url` and `backend.api_path`)",
                    error.message
                );
                error
            }
            _ => error,
        }
    }
}

fn json<T: serde::de::DeserializeOwned>(endpoint: &str, bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| unparseable(endpoint, &e, bytes))
}

/// A file read a chunk at a time, for an upload that never holds it whole.
fn file_chunks(file: tokio::fs::File) -> impl Stream<Item = std::io::Result<Bytes>> + Send {
    use tokio::io::AsyncReadExt as _;
    futures::stream::try_unfold(file, |mut file| async move {
        let mut chunk = BytesMut::with_capacity(UPLOAD_CHUNK_BYTES);
        let read = file.read_buf(&mut chunk).await?;
        Ok((read > 0).then(|| (chunk.freeze(), file)))
    })
}

/// Whether the server said it has no such route: a 404 with no message of
/// the service's own, a 405 or a 501.
fn route_missing(error: &ApiError) -> bool {
    let message = error.message.to_ascii_lowercase();
    match error.status {
        Some(405 | 501) => true,
        Some(404) => {
            message.contains("with an empty body")
                || message.contains("unknown request url")
                || message.contains("unknown_url")
                || message.contains("page not found")
                || message.trim() == "not found"
        }
        _ => false,
    }
}

/// A batch call's error, saying so when the server has no such route.
fn with_route_hint(mut error: ApiError) -> ApiError {
    if route_missing(&error) {
        error.kind = ErrorKind::Permanent;
        error.message = format!(
            "{} (the server has no route {}: it does not offer the Batch API there; check \
             `backend.base_url` and `backend.api_path`)",
            error.message, error.endpoint
        );
    }
    error
}

// Lenient readers: a field of the wrong JSON type reads as what it says
// where it can, else as absent, so that an odd object costs a field, never
// the batch.

fn text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Ok(optional_text(deserializer)?.unwrap_or_default())
}

fn optional_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(deserializer)? {
        Value::String(s) if s.is_empty() => None,
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    })
}

fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0 && *f < 1.8e19)
                // A whole count written as a float: its integer part.
                .map(|f| f.trunc() as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn count<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    Ok(optional_count(deserializer)?.unwrap_or_default())
}

fn optional_count<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    Ok(number(&Value::deserialize(deserializer)?))
}

fn status_code<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u16, D::Error> {
    Ok(optional_count(deserializer)?
        .and_then(|n| u16::try_from(n).ok())
        .unwrap_or_default())
}

fn flag<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(match Value::deserialize(deserializer)? {
        Value::Bool(b) => b,
        Value::String(s) => s == "true",
        _ => false,
    })
}

fn unknown_status() -> BatchStatus {
    BatchStatus::Other(String::new())
}

fn status<'de, D: Deserializer<'de>>(deserializer: D) -> Result<BatchStatus, D::Error> {
    Ok(match Value::deserialize(deserializer)? {
        Value::String(s) => BatchStatus::parse(&s),
        Value::Null => unknown_status(),
        other => BatchStatus::Other(other.to_string()),
    })
}

fn request_counts<'de, D: Deserializer<'de>>(deserializer: D) -> Result<RequestCounts, D::Error> {
    let value = Value::deserialize(deserializer)?;
    Ok(serde_json::from_value(value).unwrap_or_default())
}

/// `errors` as OpenAI writes it, `{"object": "list", "data": [...]}`, or a bare list.
fn errors<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<BatchError>, D::Error> {
    let list = match Value::deserialize(deserializer)? {
        Value::Array(list) => list,
        Value::Object(mut object) => match object.remove("data") {
            Some(Value::Array(list)) => list,
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    Ok(list.into_iter().filter_map(BatchError::of).collect())
}

fn line_error<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<BatchError>, D::Error> {
    Ok(BatchError::of(Value::deserialize(deserializer)?))
}

/// String values as they are; others as their JSON, `null` left out.
fn metadata<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    let Value::Object(object) = Value::deserialize(deserializer)? else {
        return Ok(BTreeMap::new());
    };
    Ok(object
        .into_iter()
        .filter_map(|(key, value)| match value {
            Value::Null => None,
            Value::String(s) => Some((key, s)),
            other => Some((key, other.to_string())),
        })
        .collect())
}

#[cfg(test)]
mod tests;
