//! `query`: the chunks of a job's output nearest to a text.

use serde_json::json;

use super::{messages, print_json, Outcome};
use crate::backend::Embedding;
use crate::cli::QueryArgs;
use crate::exit::{Exit, Failure};
use crate::query::{self, MAX_K};

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
    let job = crate::kinds::load(&args.job.job, &args.job.overrides).map_err(Failure::usage)?;
    // The job's own backend and model, checked as a run checks them.
    let Embedding { backend, chunker } = crate::backend::build(&job).await?;
    messages::follow(&backend.notices());
    let tokens = chunker.count_tokens(&args.text) as u64;
    let texts = [args.text.as_str()];
    let vectors = backend
        .embed(&texts, tokens)
        .await
        .map_err(|e| Failure::failed(anyhow::Error::from(e).context("cannot embed the query")))?;
    let vector = vectors.row(0).to_vec();
    let model = backend.info().model.clone();
    let found = crate::sink::search(&job.output, vector, &model, args.k).await?;
    messages::warn_all(&found.warnings);
    if found.passed_over > 0 {
        messages::warn(&format!(
            "passed over {} stored row(s) whose vector cannot be compared \
             (a NaN or an infinity in it, all zeros, or no vector): \
             they are never results; `run --fresh` embeds them again",
            found.passed_over
        ));
    }
    if args.json {
        print_json(&json!({ "results": found.hits, "passed_over": found.passed_over }))?;
    } else {
        print!("{}", crate::secret::scrub(&query::table(&found.hits)));
    }
    Ok(Exit::Success)
}
