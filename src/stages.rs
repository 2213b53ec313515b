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
use crate::client::{discover, ApiKey, Client, ClientConfig, DiscoveryError};
use crate::exit::{Exit, Failure};
use crate::job::{BackendParams, Job};
use crate::pipeline::Stages;
use crate::retry::RetryPolicy;

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
    config.timeout = Duration::from_secs_f64(b.timeout_seconds);
    config.api_path.clone_from(&api.api_path);
    let client = Client::new(config).map_err(Failure::usage)?;
    let retry = RetryPolicy::with_max_retries(api.max_retries);
    let discovery = discover(&client, &model, &retry)
        .await
        .map_err(|e| match e {
            DiscoveryError::Unreachable(_) => Failure::failed(e),
            _ => Failure::usage(e),
        })?;
    let mut warnings = discovery.warnings;
    let listed = discovery.model.as_ref();
    let window = api
        .context_window
        .or_else(|| listed.and_then(|m| m.context_window));
    check_context_window(job, &model, window)?;
    if window.is_none() {
        warnings.push(format!(
            "the context window of model {model} is unknown (the service does not list it and \
             `backend.context_window` is not set): a server may silently truncate chunks longer \
             than the model takes, so keep `chunking.max_tokens` within it"
        ));
    }
    let chunker = TokenChunker::for_config(&job.chunking).map_err(|e| {
        let tokenizer = job.chunking.tokenizer.as_deref();
        if tokenizer.is_some_and(|t| !crate::chunk::named_encoding(t)) {
            Failure::usage(e)
        } else {
            Failure::failed(e)
        }
    })?;
    let settings = ApiSettings {
        dimensions: b.dimensions,
        concurrency: b.concurrency,
        requests_per_minute: api.requests_per_minute,
        tokens_per_minute: api.tokens_per_minute,
        max_tokens_per_request: b.max_tokens_per_request as u64,
        retry,
        encoding: api.encoding_format,
        context_window: api.context_window,
        input_per_1k: api.input_per_1k,
        warnings,
        ..ApiSettings::new(model)
    };
    let backend = ApiBackend::new(client, settings, listed);
    Ok(Embedding {
        backend: Arc::new(backend),
        chunker: Arc::new(chunker),
    })
}
