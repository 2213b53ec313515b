//! The ledger (`GET /_ledger`, `POST /_ledger/reset`) and the fallbacks
//! for unknown URLs and methods.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::Shared;
use crate::simulate::error::ApiError;
use crate::simulate::ledger::Ledger;

pub(crate) async fn get_ledger(State(shared): State<Arc<Shared>>, uri: Uri) -> Response {
    let without_texts = uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "texts=false" || pair == "texts=0")
    });
    let body = {
        let ledger = &shared.ledger_snapshot();
        if without_texts {
            let mut value = serde_json::to_value(Ledger {
                texts: HashMap::new(),
                partly_read: HashMap::new(),
                faults: ledger.faults.clone(),
                billed_sizes: ledger.billed_sizes.clone(),
                refused: ledger.refused.clone(),
                refusal_runs: HashMap::new(),
                ..*ledger
            });
            if let Ok(Value::Object(object)) = &mut value {
                object.remove("texts");
                object.remove("partly_read");
            }
            value
        } else {
            serde_json::to_value(ledger)
        }
    };
    match body {
        Ok(body) => axum::Json(body).into_response(),
        Err(_) => ApiError::internal().into_response(),
    }
}

pub(crate) async fn reset_ledger(State(shared): State<Arc<Shared>>) -> Response {
    shared.reset_ledger();
    axum::Json(Ledger::default()).into_response()
}

pub(crate) async fn unknown_url(method: Method, uri: Uri) -> Response {
    ApiError::unknown_url(method.as_str(), uri.path()).into_response()
}

pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    ApiError::method_not_allowed(method.as_str(), uri.path()).into_response()
}
