//! Finding out what the service says about a model, from servers that say
//! more or less of it.
//!
//! `GET /v1/models/{id}` first. A server without that route (infinity,
//! llama-cpp-python: a 404 that is not an OpenAI-style `model_not_found`, a
//! 405, a 501) is asked for its listing instead; a model the listing does not
//! name, or a server with no listing at all (TEI), leaves the job to go on
//! with what it declares, with a warning. A refused key, or a model the
//! service says does not exist, is a refusal.

use super::{ApiError, Client, ErrorKind, Model};
use crate::rate::{with_retries, RetryPolicy};

/// What the service told about a model, and what it could not tell.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Discovery {
    /// The model as the service describes it, when it does.
    pub model: Option<Model>,
    /// Where the description came from: `"model route"` or `"listing"`.
    pub source: Option<&'static str>,
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
}

/// A status by which a server says it has no such route, rather than no such model.
fn route_missing(error: &ApiError) -> bool {
    match error.status {
        Some(404) => !error.is_unknown_model(),
        Some(400 | 405 | 410 | 422 | 501) => true,
        _ => false,
    }
}

fn refused(error: &ApiError) -> bool {
    matches!(error.status, Some(401 | 403))
}

/// Asks the service about `model`: its own route, then its listing.
///
/// # Errors
/// A refused key, a model the service says does not exist, or a service
/// that cannot be reached (after `retry`'s attempts).
pub async fn discover(
    client: &Client,
    model: &str,
    retry: &RetryPolicy,
) -> Result<Discovery, DiscoveryError> {
    let first = match with_retries(retry, || client.model(model)).await {
        Ok(found) => {
            return Ok(Discovery {
                model: Some(found),
                source: Some("model route"),
                warnings: Vec::new(),
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
                warnings: Vec::new(),
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
        Err(e) => Ok(Discovery {
            warnings: vec![format!(
                "the service describes no model (GET {path}/models/{{id}}: HTTP {}; \
                 GET {path}/models: HTTP {}): going on with what the job declares for {model}",
                first.status.unwrap_or_default(),
                e.status.unwrap_or_default()
            )],
            ..Discovery::default()
        }),
    }
}
