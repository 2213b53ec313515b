//! Builds a job's stages, each by its kind, checking everything that can be
//! checked before work starts: the backend (key, model, context window) and
//! its chunker, the source (files, columns), the output against the model's
//! vectors, and the sink.

use super::Stages;
use crate::backend::Embedding;
use crate::exit::{Exit, Failure};
use crate::job::Job;

/// Builds all of a job's stages.
pub async fn build(job: &Job) -> Result<Stages, Failure> {
    let Embedding { backend, chunker } = crate::backend::build(job).await?;
    let source = crate::source::open_shard(&job.source, job.shard).map_err(|e| Failure {
        exit: if e.is_found_at_open() {
            Exit::Usage
        } else {
            Exit::Failed
        },
        error: e.into(),
    })?;
    let model = job.backend.shared.model.clone().unwrap_or_default();
    crate::sink::check(&job.output, backend.info().dimensions, &model)
        .map_err(crate::sink::failure)?;
    let sink = crate::sink::open(&job.output, job.shard)
        .await
        .map_err(crate::sink::failure)?;
    Ok(Stages {
        source,
        chunker,
        backend,
        sink,
    })
}
