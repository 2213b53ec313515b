//! `query`: the chunks of a job's output nearest to a text.

use serde_json::json;

use super::{messages, print_json, Outcome};
use crate::cli::QueryArgs;
use crate::exit::{Exit, Failure};
use crate::job::OutputParams;
use crate::query::{self, Hit, QueryError, MAX_K};
use crate::stages::Embedding;

pub async fn query(args: &QueryArgs) -> Outcome {
    if !(1..=MAX_K).contains(&args.k) {
        return Err(Failure::usage(anyhow::anyhow!(
            "-k must be between 1 and {MAX_K}, not {}",
            args.k
        )));
    }
    if args.text.trim().is_empty() {
        return Err(Failure::usage(anyhow::anyhow!(
            "the text to search for is empty"
        )));
    }
    let job = crate::job::load(&args.job.job, &args.job.overrides).map_err(Failure::usage)?;
    // The job's own backend and model, checked as a run checks them.
    let Embedding { backend, chunker } = crate::stages::build_embedding(&job).await?;
    messages::follow(&backend.notices());
    let tokens = chunker.count_tokens(&args.text) as u64;
    let texts = [args.text.as_str()];
    let vectors = backend
        .embed(&texts, tokens)
        .await
        .map_err(|e| Failure::failed(anyhow::Error::from(e).context("cannot embed the query")))?;
    let vector = vectors.row(0).to_vec();
    let model = backend.info().model.clone();
    let hits = search(&job.output.params, vector, &model, args.k).await?;
    if args.json {
        print_json(&json!({ "results": hits }))?;
    } else {
        print!("{}", query::table(&hits));
    }
    Ok(Exit::Success)
}

async fn search(
    output: &OutputParams,
    vector: Vec<f32>,
    model: &str,
    k: usize,
) -> Result<Vec<Hit>, Failure> {
    match output {
        OutputParams::Parquet(parquet) => {
            let path = parquet.path.clone();
            let model = model.to_string();
            tokio::task::spawn_blocking(move || {
                // A split job's output is a directory of its shards' files.
                let files = if path.is_dir() {
                    crate::parquet_io::list_parquet_files(&path)?
                } else {
                    vec![path.clone()]
                };
                if files.is_empty() {
                    return Err(query::QueryError::NoOutput { path });
                }
                for file in &files {
                    let metadata = query::parquet_metadata(file, vector.len())?;
                    query::check_model(
                        &file.display().to_string(),
                        &metadata,
                        &model,
                        vector.len(),
                    )?;
                }
                query::search_parquet(&files, &vector, k)
            })
            .await
            .map_err(|e| Failure::failed(anyhow::anyhow!("the search stopped unexpectedly: {e}")))?
            .map_err(query_failure)
        }
        #[cfg(feature = "pgvector")]
        OutputParams::Pgvector(pg) => {
            let (metadata, hits) = crate::sink::pgvector::search(pg, &vector, k)
                .await
                .map_err(|e| crate::stages::sink_failure(e.into()))?;
            query::check_model(
                &format!("table {}", pg.table),
                &metadata,
                model,
                vector.len(),
            )
            .map_err(query_failure)?;
            Ok(hits)
        }
        #[cfg(not(feature = "pgvector"))]
        OutputParams::Pgvector(_) => Err(crate::stages::sink_failure(
            crate::sink::SinkError::NotBuilt("pgvector"),
        )),
    }
}

fn query_failure(e: QueryError) -> Failure {
    Failure::found(e.is_found_before_work(), e)
}
