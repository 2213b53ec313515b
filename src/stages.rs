//! Builds a job's stages from its configuration, checking everything that
//! can be checked before work starts: the backend (key, model, context
//! window) and its chunker, the source (files, columns) and the sink.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::api::{ApiBackend, ApiSettings};
#[cfg(feature = "local")]
use crate::backend::local::{LocalBackend, LocalSettings};
use crate::backend::EmbeddingBackend;
use crate::chunk::{Chunker, TokenChunker};
use crate::client::{ApiKey, Client, ClientConfig, ErrorKind};
use crate::exit::{Exit, Failure};
use crate::job::{BackendParams, Job};
use crate::pipeline::Stages;
use crate::retry::{with_retries, RetryPolicy};

/// The backend a job embeds with, and the chunker that counts tokens as it does.
pub struct Embedding {
    pub backend: Arc<dyn EmbeddingBackend>,
    pub chunker: Arc<dyn Chunker>,
}

/// Builds all of a job's stages.
pub async fn build(job: &Job) -> Result<Stages, Failure> {
    let Embedding { backend, chunker } = build_embedding(job).await?;
    let source = crate::source::open(&job.source).map_err(|e| Failure {
        exit: if e.is_found_at_open() {
            Exit::Usage
        } else {
            Exit::Failed
        },
        error: e.into(),
    })?;
    Ok(Stages {
        source,
        chunker,
        backend,
        sink: crate::sink::open(&job.output),
    })
}

/// Connects to the backend and checks the model; a refusal here is a
/// configuration error (exit 2), an unreachable service a failure (exit 1).
pub async fn build_embedding(job: &Job) -> Result<Embedding, Failure> {
    match &job.backend.params {
        BackendParams::Api(_) => build_api(job).await,
        BackendParams::Local(_) => build_local(job).await,
    }
}

/// Loads the local model off the async runtime. A missing or too old ONNX
/// Runtime or a missing model file is a set-up problem: exit 2, with how to fix it.
#[cfg(feature = "local")]
async fn build_local(job: &Job) -> Result<Embedding, Failure> {
    let settings = LocalSettings::from_config(&job.backend);
    let backend = tokio::task::spawn_blocking(move || LocalBackend::load(settings))
        .await
        .map_err(|e| {
            Failure::failed(anyhow::anyhow!(
                "loading the local model stopped unexpectedly: {e}"
            ))
        })?
        .map_err(Failure::usage)?;
    check_context_window(job, &backend.info().model, backend.info().context_window)?;
    let chunker = TokenChunker::with_tokenizer(&job.chunking, backend.tokenizer())
        .map_err(Failure::failed)?;
    Ok(Embedding {
        backend: Arc::new(backend),
        chunker: Arc::new(chunker),
    })
}

#[cfg(not(feature = "local"))]
async fn build_local(_job: &Job) -> Result<Embedding, Failure> {
    Err(Failure::usage(anyhow::anyhow!(
        "`backend.kind = \"local\"`: this embedjob was built without the local backend \
         (cargo feature `local`)"
    )))
}

/// A chunk longer than the model's window would be cut or refused.
fn check_context_window(job: &Job, model: &str, window: Option<u64>) -> Result<(), Failure> {
    match window {
        Some(window) if job.chunking.max_tokens as u64 > window => Err(Failure::usage(anyhow::anyhow!(
            "`chunking.max_tokens` ({}) is larger than model {model}'s context window ({window} tokens)",
            job.chunking.max_tokens
        ))),
        _ => Ok(()),
    }
}

async fn build_api(job: &Job) -> Result<Embedding, Failure> {
    let b = &job.backend.shared;
    let api = job.backend.api().cloned().unwrap_or_default();
    let model = b.model.clone().unwrap_or_default();
    let key = std::env::var(&api.api_key_env).unwrap_or_default();
    let mut config = ClientConfig::new(api.base_url.clone().unwrap_or_default(), ApiKey::new(key));
    config.timeout =
        crate::job::seconds_in_range(Some(b.timeout_seconds)).unwrap_or(Duration::from_secs(60));
    let client = Client::new(config).map_err(Failure::usage)?;
    let retry = RetryPolicy::with_max_retries(api.max_retries);
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
    check_context_window(job, &model, listing.context_window)?;
    let settings = ApiSettings {
        model,
        dimensions: b.dimensions,
        concurrency: b.concurrency,
        requests_per_minute: api.requests_per_minute,
        tokens_per_minute: api.tokens_per_minute,
        max_tokens_per_request: b.max_tokens_per_request as u64,
        retry,
        renames_models: api.server_renames_models,
    };
    let backend = ApiBackend::new(client, settings, Some(&listing));
    let chunker = TokenChunker::cl100k(&job.chunking).map_err(Failure::failed)?;
    Ok(Embedding {
        backend: Arc::new(backend),
        chunker: Arc::new(chunker),
    })
}
