//! Finding out what the service says about a model, from servers that say
//! more or less of it.
//!
//! `GET /v1/models/{id}` first. A server without that route (infinity,
//! llama-cpp-python: a 404 that is not an OpenAI-style `model_not_found`, a
//! 405, a 501) is asked for its listing instead; a model the listing does not
//! name, or a server with no listing at all (TEI), leaves the job to go on
//! with what it declares, with a warning. A refused key, or a model the
//! service says does not exist, is a refusal.
//!
//! When neither model route exists, the embeddings route is asked with no
//! input (nothing to compute or bill): a server with no route there either
//! is being asked under the wrong `backend.api_path`, which is said before
//! any work, and TEI's `GET /info` is asked what it serves: the model's
//! window and the most inputs a request may hold (`server_info.rs`). A model
//! still without a price is looked up in LiteLLM's `GET /v1/model/info`
//! (`model_info.rs`).

use reqwest::Method;

use super::{
    model_info, server_info, ApiError, Client, EmbeddingInput, EmbeddingRequest, ErrorKind, Model,
    Pricing,
};
use crate::rate::{with_retries, RetryPolicy};

/// What the service told about a model, and what it could not tell.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Discovery {
    /// The model as the service describes it, when it does.
    pub model: Option<Model>,
    /// Where the description came from: `"model route"`, `"listing"`,
    /// `"server info"` (TEI's `GET /info`) or `"model info"` (LiteLLM's
    /// `GET /v1/model/info` alone).
    pub source: Option<&'static str>,
    /// The most inputs a request may hold, when the service says it (TEI's
    /// `max_client_batch_size`).
    pub max_inputs: Option<usize>,
    /// The most requests the server takes at once, when it says it (TEI's
    /// `max_concurrent_requests`).
    pub max_in_flight: Option<usize>,
    /// The request the model's input price was read from, e.g.
    /// `GET /v1/model/info`, when the service gave one.
    pub price_source: Option<String>,
    /// What the service did not tell, for stderr and the run's summary.
    pub warnings: Vec<String>,
}

/// Why the model cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The service refused the key (401, 403).
    #[error("the service refused the API key: {0}")]
    RefusedKey(#[source] ApiError),
    /// The service says there is no such model.
    #[error("unknown model {model:?} (`backend.model`): {error}")]
    UnknownModel {
        model: String,
        #[source]
        error: ApiError,
    },
    /// The service could not be reached, or kept failing.
    #[error("cannot reach the service: {0}")]
    Unreachable(#[source] ApiError),
    /// The connection failed for good, before any answer: the server's
    /// certificate was refused (see `trust`).
    #[error("cannot use the service: {0}")]
    Refused(#[source] ApiError),
    /// No route under the API path answers: neither the model routes nor
    /// the embeddings route. `url` is shown without credentials.
    #[error(
        "`backend.api_path` {api_path:?} is wrong for this service: POST {url} answers HTTP \
         {status} (no such route), and so do GET {api_path}/models/{{id}} and GET \
         {api_path}/models; {fix}"
    )]
    WrongApiPath {
        api_path: String,
        url: String,
        status: u16,
        fix: String,
    },
}

/// A status by which a server says it has no such route, rather than no such model.
fn route_missing(error: &ApiError) -> bool {
    match error.status {
        Some(404) => !error.is_unknown_model(),
        Some(400 | 405 | 410 | 422 | 501) => true,
        _ => false,
    }
}

/// An answer to a POST that only a missing route gives: a 404 that is not
/// about the model, or a 405 (a path served for GET only).
fn no_such_route(error: &ApiError) -> bool {
    match error.status {
        Some(404) => !error.is_unknown_model(),
        Some(405) => true,
        _ => false,
    }
}

fn refused(error: &ApiError) -> bool {
    matches!(error.status, Some(401 | 403))
}

/// Asks the service about `model`: its own route, then its listing, then
/// LiteLLM's model info for a price neither gave.
///
/// # Errors
/// A refused key, a model the service says does not exist, a service that
/// cannot be reached (after `retry`'s attempts), or one without any route
/// under the API path.
pub async fn discover(
    client: &Client,
    model: &str,
    retry: &RetryPolicy,
) -> Result<Discovery, DiscoveryError> {
    let mut found = look_up(client, model, retry).await?;
    let path = client.api_path();
    let priced = found
        .model
        .as_ref()
        .and_then(|m| m.pricing)
        .and_then(|p| p.input_per_1k)
        .is_some();
    if priced {
        found.price_source = Some(match found.source {
            Some("listing") => format!("GET {path}/models"),
            _ => format!("GET {path}/models/{{id}}"),
        });
    } else {
        let info = model_info::fetch(client, model).await;
        with_model_info(&mut found, model, info, model_info::endpoint(client));
    }
    Ok(found)
}

/// Adds to `found` the price, and the window, it lacks from the model info.
fn with_model_info(found: &mut Discovery, model: &str, info: model_info::Info, source: String) {
    found.warnings.extend(info.warnings);
    if info.input_per_1k.is_none() && info.context_window.is_none() {
        return;
    }
    if found.model.is_none() {
        found.source = Some("model info");
    }
    let entry = found.model.get_or_insert_with(|| Model {
        id: model.to_string(),
        context_window: None,
        modalities: Vec::new(),
        pricing: None,
    });
    entry.context_window = entry.context_window.or(info.context_window);
    if info.input_per_1k.is_some() {
        entry.pricing = Some(Pricing {
            input_per_1k: info.input_per_1k,
            output_per_1k: info.output_per_1k,
            batch_input_per_1k: info.batch_input_per_1k,
        });
        found.price_source = Some(source);
    }
}

/// The model's route, then the listing, as the module's documentation says.
async fn look_up(
    client: &Client,
    model: &str,
    retry: &RetryPolicy,
) -> Result<Discovery, DiscoveryError> {
    let first = match with_retries(retry, || client.model(model)).await {
        Ok(found) => {
            return Ok(Discovery {
                model: Some(found),
                source: Some("model route"),
                ..Discovery::default()
            })
        }
        Err(e) => e,
    };
    if refused(&first) {
        return Err(DiscoveryError::RefusedKey(first));
    }
    if first.kind == ErrorKind::Transient {
        return Err(DiscoveryError::Unreachable(first));
    }
    if first.status.is_none() {
        return Err(DiscoveryError::Refused(first));
    }
    if !route_missing(&first) {
        return Err(DiscoveryError::UnknownModel {
            model: model.to_string(),
            error: first,
        });
    }
    let path = client.api_path();
    match with_retries(retry, || client.models()).await {
        Ok(models) => match models.into_iter().find(|m| m.id == model) {
            Some(found) => Ok(Discovery {
                model: Some(found),
                source: Some("listing"),
                ..Discovery::default()
            }),
            None => Ok(Discovery {
                warnings: vec![format!(
                    "model {model} is not in the service's listing (GET {path}/models), \
                     and the service has no GET {path}/models/{{id}} (HTTP {}): going on \
                     with what the job declares",
                    first.status.unwrap_or_default()
                )],
                ..Discovery::default()
            }),
        },
        Err(e) if refused(&e) => Err(DiscoveryError::RefusedKey(e)),
        Err(e) if e.kind == ErrorKind::Transient => Err(DiscoveryError::Unreachable(e)),
        Err(e) => {
            if route_missing(&e) {
                check_embeddings_route(client, model).await?;
            }
            let info = server_info::fetch(client, model).await;
            if !info.is_empty() {
                return Ok(Discovery {
                    model: Some(Model {
                        id: model.to_string(),
                        context_window: info.context_window,
                        modalities: Vec::new(),
                        pricing: None,
                    }),
                    source: Some("server info"),
                    max_inputs: info.max_inputs,
                    max_in_flight: info.max_in_flight,
                    warnings: info.warnings,
                    ..Discovery::default()
                });
            }
            let mut warnings = info.warnings;
            warnings.push(format!(
                "the service describes no model (GET {path}/models/{{id}}: HTTP {}; \
                 GET {path}/models: HTTP {}): going on with what the job declares for {model}",
                first.status.unwrap_or_default(),
                e.status.unwrap_or_default()
            ));
            Ok(Discovery {
                warnings,
                ..Discovery::default()
            })
        }
    }
}

/// What a server answered to an embeddings request without input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Any answer but "no such route": the route is there.
    Served,
    /// No such route, with this status.
    Missing(u16),
    /// No answer (a transport fault): nothing is known.
    Unknown,
}

/// `POST {prefix}/embeddings` with an empty `input`: every server checked
/// (OpenAI, vLLM, TEI, infinity, llama.cpp, Ollama, LiteLLM) routes the path
/// before it reads the body, so a missing route answers 404 (or 405), and a
/// route that is there refuses the empty input (400, 422) without computing
/// or billing anything.
async fn embeddings_route(client: &Client, prefix: &str, model: &str) -> Route {
    let request = EmbeddingRequest::new(model, EmbeddingInput::Many(Vec::new()));
    let path = format!("{prefix}/embeddings");
    match client.send(Method::POST, &path, Some(&request), true).await {
        Ok(_) => Route::Served,
        Err(e) if no_such_route(&e) => Route::Missing(e.status.unwrap_or_default()),
        Err(e) if e.status.is_none() => Route::Unknown,
        Err(_) => Route::Served,
    }
}

/// The URL of the embeddings route under `prefix`, as it may be shown.
fn embeddings_url(client: &Client, prefix: &str) -> String {
    crate::secret::shown_url(&format!("{}{prefix}/embeddings", client.base))
}

/// With both model routes missing: the embeddings route must be there, or
/// the API path is wrong, and the error says which path the service does
/// answer under, when `/v1` or the root does.
async fn check_embeddings_route(client: &Client, model: &str) -> Result<(), DiscoveryError> {
    let prefix = client.api_path();
    let Route::Missing(status) = embeddings_route(client, prefix, model).await else {
        return Ok(());
    };
    let mut answering = None;
    for candidate in ["", "/v1"].into_iter().filter(|c| *c != prefix) {
        if embeddings_route(client, candidate, model).await == Route::Served {
            answering = Some(candidate);
            break;
        }
    }
    let fix = match answering {
        Some("") if !prefix.is_empty() && client.base.ends_with(prefix) => format!(
            "the base URL already ends in {prefix} and `backend.api_path` repeats it: \
             remove `backend.api_path`, or the {prefix} at the end of `backend.base_url` \
             (POST {} answers)",
            embeddings_url(client, "")
        ),
        Some(candidate) => format!(
            "the service answers at POST {}: set `backend.api_path = {candidate:?}`",
            embeddings_url(client, candidate)
        ),
        None => format!(
            "nor does POST {}: check `backend.base_url` and `backend.api_path` against \
             the server's documentation",
            ["", "/v1"]
                .into_iter()
                .filter(|c| *c != prefix)
                .map(|c| embeddings_url(client, c))
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    };
    Err(DiscoveryError::WrongApiPath {
        api_path: prefix.to_string(),
        url: embeddings_url(client, prefix),
        status,
        fix,
    })
}

/// An embeddings request's error, with a word on `backend.api_path` when
/// the server says it has no such route (a lookup that could not tell).
pub(super) fn with_route_hint(client: &Client, mut error: ApiError) -> ApiError {
    if no_such_route(&error) {
        error.message = format!(
            "{} (the server has no route POST {}: check `backend.api_path` (or \
             EMBEDJOB_API_PATH) and the base URL)",
            error.message,
            embeddings_url(client, client.api_path())
        );
    }
    error
}
