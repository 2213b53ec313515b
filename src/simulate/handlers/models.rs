//! `GET /v1/models`, `GET /v1/models/{id}`, LiteLLM's `GET /v1/model/info`
//! and TEI's `GET /info`.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::{authorize, Shared, CREATED};
use crate::simulate::config::{ModelKind, ModelSpec};
use crate::simulate::error::ApiError;
use crate::simulate::window::OverWindow;

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
        .visible_models(caller)
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

/// LiteLLM's `GET /v1/model/info`: one entry a model the key sees, its
/// prices per token and window under `model_info`, as LiteLLM's proxy
/// serves what its configuration sets.
pub(crate) async fn model_info(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let caller = match authorize(&shared, &headers) {
        Ok(caller) => caller,
        Err(error) => return shared.fail(error),
    };
    let data: Vec<Value> = shared
        .visible_models(caller)
        .map(|model| {
            json!({
                "model_name": model.id,
                "litellm_params": { "model": format!("openai/{}", model.id) },
                "model_info": {
                    "id": model.id,
                    "input_cost_per_token": model.input_per_1k / 1000.0,
                    // LiteLLM lists the Batch API's price too: half, as OpenAI's.
                    "input_cost_per_token_batches": model.input_per_1k / 2000.0,
                    "output_cost_per_token": model.output_per_1k / 1000.0,
                    "max_input_tokens": model.context_window,
                    "max_tokens": model.context_window,
                    "mode": match model.kind {
                        ModelKind::Embedding { .. } => "embedding",
                        ModelKind::Chat => "chat",
                    },
                },
            })
        })
        .collect();
    axum::Json(json!({ "data": data })).into_response()
}

/// TEI's `GET /info`: the one model it serves (the first embedding model the
/// key sees), its window in its own tokens, and the most inputs a request
/// may hold (32 without `max_inputs_per_request`, TEI's default).
pub(crate) async fn tei_info(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let caller = match authorize(&shared, &headers) {
        Ok(caller) => caller,
        Err(error) => return shared.fail(error),
    };
    let Some(model) = shared
        .visible_models(caller)
        .find(|m| matches!(m.kind, ModelKind::Embedding { .. }))
    else {
        return shared.fail(ApiError::bad_request("no embedding model is served"));
    };
    let window = shared
        .config
        .window
        .as_ref()
        .map_or(model.context_window, |w| w.tokens);
    axum::Json(json!({
        "model_id": model.id,
        "model_sha": null,
        "model_dtype": "float32",
        "model_type": {"embedding": {"pooling": "mean"}},
        "max_concurrent_requests": shared.config.max_concurrent_requests.unwrap_or(512),
        "max_input_length": window,
        "max_batch_tokens": 16384,
        "max_batch_requests": null,
        "max_client_batch_size": shared.config.most_inputs(),
        "auto_truncate": shared.config.window.as_ref().is_some_and(|w| w.over == OverWindow::Truncate),
        "tokenization_workers": 2,
        "version": "1.5.0",
        "sha": null,
        "docker_label": null,
    }))
    .into_response()
}
