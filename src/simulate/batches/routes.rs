//! The Batch API's routes: `/v1/files` and `/v1/batches`, with OpenAI's
//! answers and refusals.

use std::sync::Arc;

use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Multipart, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::files::{content, no_such_file};
use super::lifecycle::{run, Batch};
use super::multipart::{receive, MultipartError};
use super::Batches;
use crate::simulate::error::ApiError;
use crate::simulate::faults::dropped_body;
use crate::simulate::handlers::{
    authorize, body_bytes, json_response, parse_object, required_string, wrong_type,
};

/// The limits OpenAI puts on a batch's `metadata`.
const METADATA_PAIRS: usize = 16;
const METADATA_KEY_CHARS: usize = 64;
const METADATA_VALUE_CHARS: usize = 512;

type Answer = Result<Response, ApiError>;

fn answer(answer: Answer) -> Response {
    answer.unwrap_or_else(IntoResponse::into_response)
}

fn path_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    id.map(|Path(id)| id)
        .map_err(|_| ApiError::bad_request("The id in the URL is not valid."))
}

/// `POST /v1/files`: a `multipart/form-data` upload with `purpose=batch`
/// and a `.jsonl` file, written to disk as it arrives.
pub(crate) async fn upload_file(
    State(api): State<Arc<Batches>>,
    headers: HeaderMap,
    form: Result<Multipart, MultipartRejection>,
) -> Response {
    answer(upload(&api, &headers, form).await)
}

async fn upload(
    api: &Batches,
    headers: &HeaderMap,
    form: Result<Multipart, MultipartRejection>,
) -> Answer {
    authorize(&api.shared, headers)?;
    let form = form.map_err(|_| {
        ApiError::bad_request("The request must be multipart/form-data with a boundary.")
    })?;
    let (id, path) = api.new_path().map_err(|_| ApiError::internal())?;
    let received = receive(form, &path, api.config.max_file_bytes).await;
    let kept = received
        .map_err(|error| match error {
            MultipartError::TooLarge(max) => ApiError::invalid(
                "file",
                format!("File is too large: a batch input file may hold at most {max} bytes."),
            ),
            MultipartError::Malformed(message) => {
                ApiError::bad_request(format!("The multipart body could not be read: {message}."))
            }
            MultipartError::Io(_) => ApiError::internal(),
        })
        .and_then(|upload| {
            match upload.purpose.as_deref() {
                None => return Err(ApiError::missing("purpose")),
                Some("batch") => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        "purpose",
                        format!(
                            "Invalid purpose '{other}': this service takes 'batch' files only."
                        ),
                    ))
                }
            }
            let bytes = upload.bytes.ok_or_else(|| ApiError::missing("file"))?;
            let filename = upload.filename.unwrap_or_default();
            if !filename.ends_with(".jsonl") {
                return Err(ApiError::invalid(
                    "file",
                    "Invalid file format for Batch API. Must be .jsonl",
                ));
            }
            api.keep(id, path.clone(), filename, "batch", bytes)
        });
    match kept {
        Ok(_) if api.drop_upload() => {
            api.shared.ledger().batch_uploads_dropped += 1;
            // Stored, but the client never learns its id.
            Ok(json_response(dropped_body()))
        }
        Ok(file) => Ok(axum::Json(file.json()).into_response()),
        Err(error) => {
            let _ = std::fs::remove_file(&path);
            Err(error)
        }
    }
}

/// `GET /v1/files?purpose=&limit=&after=`: newest first, as OpenAI lists
/// them by default; a job finds the request files it uploaded by their names.
pub(crate) async fn list_files(
    State(api): State<Arc<Batches>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    answer((|| {
        authorize(&api.shared, &headers)?;
        let (limit, after) = page_query(&uri, 10_000, 10_000)?;
        let purpose = query_value(&uri, "purpose");
        let mut files: Vec<_> = api
            .state()
            .files
            .values()
            .filter(|file| purpose.as_deref().is_none_or(|p| file.purpose == p))
            .cloned()
            .collect();
        // Ids grow with each file: the newest has the greatest.
        files.sort_by(|a, b| b.id.cmp(&a.id));
        let rest = match &after {
            None => &files[..],
            Some(after) => {
                let at = files
                    .iter()
                    .position(|file| &file.id == after)
                    .ok_or_else(|| no_such_file(after))?;
                &files[at + 1..]
            }
        };
        let data = rest.iter().take(limit).map(|file| file.json()).collect();
        Ok(list_page(data, rest.len() > limit))
    })())
}

/// `GET /v1/files/{id}`.
pub(crate) async fn get_file(
    State(api): State<Arc<Batches>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    answer((|| {
        authorize(&api.shared, &headers)?;
        let file = api.file(&path_id(id)?)?;
        Ok(axum::Json(file.json()).into_response())
    })())
}

/// `GET /v1/files/{id}/content`: sent as it is read from disk. An uploaded
/// batch input cannot be downloaded, as on OpenAI.
pub(crate) async fn file_content(
    State(api): State<Arc<Batches>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    answer(
        async {
            authorize(&api.shared, &headers)?;
            let file = api.file(&path_id(id)?)?;
            if file.purpose == "batch" {
                return Err(ApiError::bad_request(
                    "Not allowed to download files of purpose: batch",
                ));
            }
            let length = file.bytes;
            let body = content(file).await.map_err(|_| ApiError::internal())?;
            let mut response = Response::new(body);
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
            Ok(response)
        }
        .await,
    )
}

/// `DELETE /v1/files/{id}`.
pub(crate) async fn delete_file(
    State(api): State<Arc<Batches>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    answer((|| {
        authorize(&api.shared, &headers)?;
        let id = path_id(id)?;
        api.delete(&id)?;
        Ok(axum::Json(json!({"id": id, "object": "file", "deleted": true})).into_response())
    })())
}

/// `metadata`: absent, null, or at most 16 string pairs within OpenAI's lengths.
fn metadata(object: &Map<String, Value>) -> Result<Value, ApiError> {
    let pairs = match object.get("metadata") {
        None | Some(Value::Null) => return Ok(Value::Null),
        Some(Value::Object(pairs)) => pairs,
        Some(other) => return Err(wrong_type("metadata", "an object", other)),
    };
    if pairs.len() > METADATA_PAIRS {
        return Err(ApiError::invalid(
            "metadata",
            format!("Invalid 'metadata': at most {METADATA_PAIRS} pairs are allowed."),
        ));
    }
    for (key, value) in pairs {
        let Value::String(value) = value else {
            return Err(wrong_type(&format!("metadata.{key}"), "a string", value));
        };
        if key.chars().count() > METADATA_KEY_CHARS || value.chars().count() > METADATA_VALUE_CHARS
        {
            return Err(ApiError::invalid(
                "metadata",
                format!(
                    "Invalid 'metadata': keys hold at most {METADATA_KEY_CHARS} characters \
                     and values at most {METADATA_VALUE_CHARS}."
                ),
            ));
        }
    }
    Ok(Value::Object(pairs.clone()))
}

/// `POST /v1/batches`: the batch, `validating`; it runs in a task of its own.
pub(crate) async fn create_batch(
    State(api): State<Arc<Batches>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer((|| {
        let caller = authorize(&api.shared, &headers)?;
        let object = parse_object(&body_bytes(body, api.shared.config.max_body_bytes)?)?;
        let input_file_id = required_string(&object, "input_file_id")?;
        let endpoint = required_string(&object, "endpoint")?;
        if endpoint != "/v1/embeddings" {
            return Err(ApiError::invalid(
                "endpoint",
                format!("Invalid 'endpoint': '{endpoint}'; this service runs batches of /v1/embeddings only."),
            ));
        }
        let window = required_string(&object, "completion_window")?;
        if window != "24h" {
            return Err(ApiError::invalid(
                "completion_window",
                format!("Invalid 'completion_window': '{window}'; supported: '24h'."),
            ));
        }
        let metadata = metadata(&object)?;
        let file = api
            .file(&input_file_id)
            .map_err(|_| no_such_file(&input_file_id))?;
        if file.purpose != "batch" {
            return Err(ApiError::invalid(
                "input_file_id",
                format!(
                    "The file {input_file_id} has purpose '{}', not 'batch'.",
                    file.purpose
                ),
            ));
        }
        let (json, dropped) = {
            let mut state = api.state();
            let seq = state.batches.len() as u64;
            let batch = Batch::new(api.new_id("batch_"), seq, input_file_id, metadata);
            let json = batch.json();
            tokio::spawn(run(Arc::downgrade(&api), batch.id.clone(), file, caller));
            state.batches.push(batch);
            let dropped = state.dropped_creates < api.config.create_drop;
            if dropped {
                state.dropped_creates += 1;
            }
            (json, dropped)
        };
        let mut ledger = api.shared.ledger();
        ledger.batches_created += 1;
        if dropped {
            ledger.batch_creates_dropped += 1;
            // Created, but the client never learns its id.
            return Ok(json_response(dropped_body()));
        }
        Ok(axum::Json(json).into_response())
    })())
}

fn no_such_batch(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("No batch found with id '{id}'."),
    )
}

/// `GET /v1/batches/{id}`.
pub(crate) async fn get_batch(
    State(api): State<Arc<Batches>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    answer((|| {
        authorize(&api.shared, &headers)?;
        let id = path_id(id)?;
        let json = api
            .with_batch(&id, |batch| batch.json())
            .ok_or_else(|| no_such_batch(&id))?;
        Ok(axum::Json(json).into_response())
    })())
}

/// `POST /v1/batches/{id}/cancel`: `cancelling`, then `cancelled` with the
/// lines done so far in its output file.
pub(crate) async fn cancel_batch(
    State(api): State<Arc<Batches>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    answer((|| {
        authorize(&api.shared, &headers)?;
        let id = path_id(id)?;
        let (cancelled, json) = api
            .with_batch(&id, |batch| (batch.cancel(), batch.json()))
            .ok_or_else(|| no_such_batch(&id))?;
        if !cancelled {
            return Err(ApiError::bad_request(format!(
                "Cannot cancel a batch with status '{}'.",
                json["status"].as_str().unwrap_or_default()
            )));
        }
        Ok(axum::Json(json).into_response())
    })())
}

/// A parameter of the query, if given and not empty.
fn query_value(uri: &Uri, name: &str) -> Option<String> {
    uri.query()?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, value)| *key == name && !value.is_empty())
        .map(|(_, value)| value.to_string())
}

/// The `limit` (1 to `most`, `default` when absent) and `after` of a listing's query.
fn page_query(uri: &Uri, default: usize, most: usize) -> Result<(usize, Option<String>), ApiError> {
    let (mut limit, mut after) = (default, None);
    for pair in uri.query().unwrap_or_default().split('&') {
        match pair.split_once('=') {
            Some(("limit", value)) => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=most).contains(n))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "limit",
                            format!("Invalid 'limit': expected an integer from 1 to {most}, got '{value}'."),
                        )
                    })?;
            }
            Some(("after", value)) if !value.is_empty() => after = Some(value.to_string()),
            _ => {}
        }
    }
    Ok((limit, after))
}

/// `GET /v1/batches?limit=&after=`: newest first; `after` is the last id of the page before.
pub(crate) async fn list_batches(
    State(api): State<Arc<Batches>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    answer((|| {
        authorize(&api.shared, &headers)?;
        let (limit, after) = page_query(&uri, 20, 100)?;
        let state = api.state();
        let newest_first = state.batches.iter().rev();
        let rest: Vec<&Batch> = match &after {
            None => newest_first.collect(),
            Some(after) => {
                let mut rest = newest_first.skip_while(|batch| &batch.id != after);
                if rest.next().is_none() {
                    return Err(no_such_batch(after));
                }
                rest.collect()
            }
        };
        let data = rest.iter().take(limit).map(|batch| batch.json()).collect();
        Ok(list_page(data, rest.len() > limit))
    })())
}

/// A page of a listing, as OpenAI's list routes answer: the objects, the
/// first and last ids (to page on with `after`), and whether more follow.
fn list_page(data: Vec<Value>, has_more: bool) -> Response {
    let id = |value: Option<&Value>| value.map(|object| object["id"].clone());
    axum::Json(json!({
        "object": "list",
        "first_id": id(data.first()),
        "last_id": id(data.last()),
        "has_more": has_more,
        "data": data,
    }))
    .into_response()
}
