//! Builds a job's stages from its configuration, checking everything that
//! can be checked before work starts.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::api::{ApiBackend, ApiSettings};
use crate::backend::EmbeddingBackend;
use crate::chunk::{Chunker, TokenChunker};
use crate::client::{ApiKey, Client, ClientConfig, ErrorKind};
use crate::exit::Failure;
use crate::job::{BackendKind, Job};
use crate::retry::{with_retries, RetryPolicy};

/// The backend and chunker a job runs with.
pub struct Stages {
    pub backend: Arc<dyn EmbeddingBackend>,
    pub chunker: Arc<dyn Chunker>,
}

/// Connects to the backend and checks the model; a refusal here is a
/// configuration error (exit 2), an unreachable service a failure (exit 1).
pub async fn build(job: &Job) -> Result<Stages, Failure> {
    match job.backend.kind {
        BackendKind::Api => build_api(job).await,
        BackendKind::Local => Err(Failure::usage(anyhow::anyhow!(
            "`backend.kind = \"local\"` is not available in this build; use \"api\""
        ))),
    }
}

async fn build_api(job: &Job) -> Result<Stages, Failure> {
    let b = &job.backend;
    let model = b.model.clone().unwrap_or_default();
    let key = std::env::var(&b.api_key_env).unwrap_or_default();
    let mut config = ClientConfig::new(b.base_url.clone().unwrap_or_default(), ApiKey::new(key));
    config.timeout = Duration::from_secs_f64(b.timeout_seconds);
    let client = Client::new(config).map_err(Failure::usage)?;
    let retry = RetryPolicy::with_max_retries(b.max_retries);
    let listing = with_retries(&retry, || client.model(&model))
        .await
        .map_err(|e| {
            let context = match (e.kind, e.status) {
                (ErrorKind::Transient, _) => {
                    return Failure::failed(
                        anyhow::Error::from(e).context("cannot reach the service"),
                    )
                }
                (_, Some(401 | 403)) => "the service refused the API key".to_string(),
                (_, Some(404)) => format!("unknown model {model:?} (`backend.model`)"),
                _ => format!("cannot use model {model:?}"),
            };
            Failure::usage(anyhow::Error::from(e).context(context))
        })?;
    if let Some(window) = listing.context_window {
        if job.chunking.max_tokens as u64 > window {
            return Err(Failure::usage(anyhow::anyhow!(
                "`chunking.max_tokens` ({}) is larger than model {model}'s context window ({window} tokens)",
                job.chunking.max_tokens
            )));
        }
    }
    let settings = ApiSettings {
        model,
        dimensions: b.dimensions,
        concurrency: b.concurrency,
        requests_per_minute: b.requests_per_minute,
        tokens_per_minute: b.tokens_per_minute,
        max_tokens_per_request: b.max_tokens_per_request as u64,
        retry,
    };
    let backend = ApiBackend::new(client, settings, Some(&listing));
    let chunker = TokenChunker::cl100k(&job.chunking).map_err(Failure::failed)?;
    Ok(Stages {
        backend: Arc::new(backend),
        chunker: Arc::new(chunker),
    })
}
