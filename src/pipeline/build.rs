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
    // A shard reads the whole input, and counts every id it reads.
    let source = crate::source::open(&job.source).map_err(|e| Failure {
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
    let (source, input_ids) = match job.shard {
        Some(shard) => {
            let (source, ids) = super::input_ids::ShardOfInput::new(source, shard);
            (
                Box::new(source) as Box<dyn crate::source::Source>,
                Some(ids),
            )
        }
        None => (source, None),
    };
    Ok(Stages {
        source,
        chunker,
        backend,
        sink,
        input_ids,
    })
}
