//! Builds a job's stages from its configuration, checking everything that
//! can be checked before work starts: the backend (key, model, context
//! window) and its chunker, the source (files, columns) and the sink.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::api::{ApiBackend, ApiSettings};
#[cfg(feature = "local")]
use crate::backend::local::{LocalBackend, LocalSettings};
use crate::backend::{BackendInfo, EmbeddingBackend};
use crate::chunk::{Chunker, TokenChunker};
use crate::client::{discover, ApiKey, Client, ClientConfig, DiscoveryError};
use crate::exit::{Exit, Failure};
#[cfg(feature = "local")]
use crate::job::BackendConfig;
use crate::job::{BackendParams, ChunkingConfig, Job};
use crate::pipeline::Stages;
use crate::rate::RetryPolicy;

/// The backend a job embeds with, and the chunker that counts tokens as it does.
pub struct Embedding {
    pub backend: Arc<dyn EmbeddingBackend>,
    pub chunker: Arc<dyn Chunker>,
}

/// Builds all of a job's stages.
pub async fn build(job: &Job) -> Result<Stages, Failure> {
    let Embedding { backend, chunker } = build_embedding(job).await?;
    let source = crate::source::open_shard(&job.source, job.shard).map_err(|e| Failure {
        exit: if e.is_found_at_open() {
            Exit::Usage
        } else {
            Exit::Failed
        },
        error: e.into(),
    })?;
    check_index(job, backend.info().dimensions)?;
    let sink = crate::sink::open(&job.output, job.shard)
        .await
        .map_err(sink_failure)?;
    Ok(Stages {
        source,
        chunker,
        backend,
        sink,
    })
}

/// A sink that cannot be opened: a problem of configuration (exit 2), or a
/// database that cannot be reached (exit 1).
pub fn sink_failure(e: crate::sink::SinkError) -> Failure {
    Failure::found(e.is_found_before_work(), e)
}

/// pgvector's HNSW index holds vectors of at most 2000 dimensions; when the
/// model's are known to be longer, the job is refused before any work.
fn check_index(job: &Job, dimensions: Option<usize>) -> Result<(), Failure> {
    let crate::job::OutputParams::Pgvector(pg) = &job.output.params else {
        return Ok(());
    };
    match dimensions {
        Some(d)
            if pg.index == crate::job::VectorIndex::Hnsw && d > crate::job::HNSW_MAX_DIMENSIONS =>
        {
            Err(Failure::usage(anyhow::anyhow!(
                "`output.index = \"hnsw\"`: pgvector indexes vectors of at most {} dimensions, \
                 model {} makes {d}; set `output.index = \"none\"` (exact search)",
                crate::job::HNSW_MAX_DIMENSIONS,
                backend_model(job)
            )))
        }
        _ => Ok(()),
    }
}

fn backend_model(job: &Job) -> String {
    job.backend.shared.model.clone().unwrap_or_default()
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
    let backend = load_local(&job.backend).await?;
    let chunking = fitted_chunking(job, backend.info())?;
    let chunker =
        TokenChunker::with_tokenizer(&chunking, backend.tokenizer()).map_err(Failure::usage)?;
    Ok(Embedding {
        backend: Arc::new(backend),
        chunker: Arc::new(chunker),
    })
}

#[cfg(feature = "local")]
async fn load_local(config: &BackendConfig) -> Result<LocalBackend, Failure> {
    let settings = LocalSettings::from_config(config);
    tokio::task::spawn_blocking(move || LocalBackend::load(settings))
        .await
        .map_err(|e| {
            Failure::failed(anyhow::anyhow!(
                "loading the local model stopped unexpectedly: {e}"
            ))
        })?
        .map_err(Failure::usage)
}

/// The local model with its defaults (`model`: another model's folder in
/// the cache), for the commands without a job file.
#[cfg(feature = "local")]
pub async fn local_backend(model: Option<String>) -> Result<Arc<dyn EmbeddingBackend>, Failure> {
    let mut config = BackendConfig {
        params: BackendParams::Local(crate::job::LocalParams::default()),
        ..BackendConfig::default()
    };
    config.shared.model = model;
    Ok(Arc::new(load_local(&config).await?))
}

#[cfg(not(feature = "local"))]
pub async fn local_backend(_model: Option<String>) -> Result<Arc<dyn EmbeddingBackend>, Failure> {
    Err(not_built())
}

#[cfg(not(feature = "local"))]
async fn build_local(_job: &Job) -> Result<Embedding, Failure> {
    Err(not_built())
}

#[cfg(not(feature = "local"))]
fn not_built() -> Failure {
    Failure::usage(anyhow::anyhow!(
        "`backend.kind = \"local\"`: this embedjob was built without the local backend \
         (cargo feature `local`)"
    ))
}

/// The job's chunking on this backend (sizes the job leaves out fit the
/// model's window, see [`Job::chunking_for`]), checked against the window: a
/// chunk longer than the model sees would be cut or refused.
fn fitted_chunking(job: &Job, info: &BackendInfo) -> Result<ChunkingConfig, Failure> {
    let chunking = job.chunking_for(info.chunk_window());
    let model = &info.model;
    if let (Some(window), Some(text)) = (info.context_window, info.chunk_window()) {
        if chunking.max_tokens as u64 > text {
            let room = if text == window {
                String::new()
            } else {
                format!(", {text} of them for the text")
            };
            return Err(Failure::usage(anyhow::anyhow!(
                "`chunking.max_tokens` ({}) is larger than model {model}'s context window \
                 ({window} tokens{room}); leave it out to fit the model",
                chunking.max_tokens
            )));
        }
    }
    if chunking.overlap_tokens >= chunking.max_tokens {
        return Err(Failure::usage(anyhow::anyhow!(
            "`chunking.overlap_tokens` ({}) must be less than the {}-token chunks that fit model {model}; \
             set `chunking.max_tokens` or a smaller overlap",
            chunking.overlap_tokens,
            chunking.max_tokens
        )));
    }
    Ok(chunking)
}

async fn build_api(job: &Job) -> Result<Embedding, Failure> {
    let b = &job.backend.shared;
    let api = job.backend.api().cloned().unwrap_or_default();
    let model = b.model.clone().unwrap_or_default();
    let key = std::env::var(&api.api_key_env).unwrap_or_default();
    let mut config = ClientConfig::new(api.base_url.clone().unwrap_or_default(), ApiKey::new(key));
    config.timeout =
        crate::job::seconds_in_range(Some(b.timeout_seconds)).unwrap_or(Duration::from_secs(60));
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
    if window.is_none() {
        warnings.push(format!(
            "the context window of model {model} is unknown (the service does not list it and \
             `backend.context_window` is not set): a server may silently truncate chunks longer \
             than the model takes, so keep `chunking.max_tokens` within it"
        ));
    }
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
        output_per_1k: api.output_per_1k,
        warnings,
        renames_models: api.server_renames_models,
        stall_timeout: Duration::from_secs(api.stall_timeout_seconds),
        sharing: job.shard.map_or(1, |shard| shard.count),
        ..ApiSettings::new(model)
    };
    let backend = ApiBackend::new(client, settings, listed);
    let chunking = fitted_chunking(job, backend.info())?;
    let chunker = TokenChunker::for_config(&chunking).map_err(|e| {
        let tokenizer = chunking.tokenizer.as_deref();
        if tokenizer.is_some_and(|t| !crate::chunk::named_encoding(t)) {
            Failure::usage(e)
        } else {
            Failure::failed(e)
        }
    })?;
    Ok(Embedding {
        backend: Arc::new(backend),
        chunker: Arc::new(chunker),
    })
}
