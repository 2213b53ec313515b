//! Building a job's backend: the kind its `[backend]` names builds itself
//! (see [`EmbeddingKind`]) with the chunker that counts tokens as its
//! model does.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{BackendInfo, BackendKind, EmbeddingBackend, KINDS};
use crate::chunk::Chunker;
use crate::exit::Failure;
use crate::job::{BackendConfig, BackendParams, ChunkingConfig, Job};

/// The backend a job embeds with, and the chunker that counts tokens as it does.
pub struct Embedding {
    pub backend: Arc<dyn EmbeddingBackend>,
    pub chunker: Arc<dyn Chunker>,
}

/// A kind of backend: its own parameters (read as a [`crate::job::Kind`])
/// and how it builds itself. A new kind is a folder in `src/backend/` and a
/// line in `backend::KINDS`.
pub trait EmbeddingKind: crate::job::Kind<dyn BackendParams> {
    /// Connects to the backend or loads it, checks the model, and makes the
    /// chunker; a refusal is a configuration error (exit 2), an unreachable
    /// service a failure (exit 1).
    fn build<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Embedding, Failure>>;

    /// What [`BackendInfo::kind`] its backends report.
    fn info_kind(&self) -> BackendKind;
}

/// The backend kinds, for reading a job file.
pub fn kinds() -> Vec<&'static dyn crate::job::Kind<dyn BackendParams>> {
    // Each kind, seen as the job file's reader of its section.
    let mut all: Vec<&'static dyn crate::job::Kind<dyn BackendParams>> = Vec::new();
    for &kind in KINDS {
        all.push(kind);
    }
    all
}

/// What [`BackendInfo::kind`] the backend of `config` reports, before it is built.
pub fn info_kind(config: &BackendConfig) -> BackendKind {
    KINDS
        .iter()
        .find(|kind| kind.name() == config.kind())
        .map_or(BackendKind::Api, |kind| kind.info_kind())
}

/// Builds the backend the job's `[backend]` names.
pub async fn build(job: &Job) -> Result<Embedding, Failure> {
    let name = job.backend.kind();
    let Some(kind) = KINDS.iter().find(|kind| kind.name() == name) else {
        return Err(Failure::usage(anyhow::anyhow!(
            "`backend.kind = \"{name}\"`: no such backend in this embedjob"
        )));
    };
    kind.build(job).await
}

/// The job's chunking on this backend (sizes the job leaves out fit the
/// model's window, see [`Job::chunking_for`]), checked against the window: a
/// chunk longer than the model sees would be cut or refused.
pub fn fitted_chunking(job: &Job, info: &BackendInfo) -> Result<ChunkingConfig, Failure> {
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
