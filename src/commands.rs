//! The commands: `run` and `estimate` take a job file; `models`, `embed`,
//! `chat`, `simulate` and `inspect` do not.
//!
//! `models`, `embed` and `chat` take the key from `EMBEDJOB_API_KEY` and the
//! address from `EMBEDJOB_BASE_URL`. Results go to stdout; nothing else does.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::watch;

use crate::backend::api::{ApiBackend, ApiSettings};
use crate::backend::EmbeddingBackend;
use crate::checkpoint::{Checkpoint, Fingerprint};
use crate::cli::{ChatArgs, EmbedArgs, ModelsArgs};
use crate::client::{ApiKey, ChatMessage, ChatRequest, Client, ClientConfig, Model};
use crate::exit::{Exit, Failure};
use crate::pipeline::{RunOptions, StopRequest};
use crate::retry::{with_retries, RetryPolicy};
use crate::simulate::{self, SimulateOptions};

pub const API_KEY_ENV: &str = "EMBEDJOB_API_KEY";
pub const BASE_URL_ENV: &str = "EMBEDJOB_BASE_URL";
pub const TIMEOUT_ENV: &str = "EMBEDJOB_TIMEOUT_SECONDS";

/// The commands retry transient faults a few times, honouring Retry-After.
const COMMAND_RETRIES: usize = 3;

type Outcome = Result<Exit, Failure>;

/// Builds a client from the environment; every problem is a usage error.
pub fn client_from_env() -> Result<Client, Failure> {
    let mut problems = Vec::new();
    let key = match std::env::var(API_KEY_ENV) {
        Ok(key) if !key.trim().is_empty() => Some(key),
        Ok(_) => {
            problems.push(format!(
                "{API_KEY_ENV} is empty: set it to the service's API key"
            ));
            None
        }
        Err(_) => {
            problems.push(format!(
                "{API_KEY_ENV} is not set: set it to the service's API key"
            ));
            None
        }
    };
    let base = match std::env::var(BASE_URL_ENV) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            problems.push(format!(
                "{BASE_URL_ENV} is not set: set it to the service's address, e.g. http://127.0.0.1:9000"
            ));
            None
        }
    };
    let timeout = match std::env::var(TIMEOUT_ENV) {
        Err(_) => Duration::from_secs(60),
        Ok(text) => match text.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s),
            _ => {
                problems.push(format!(
                    "{TIMEOUT_ENV} must be a positive number of seconds, not {text:?}"
                ));
                Duration::from_secs(60)
            }
        },
    };
    match (key, base) {
        (Some(key), Some(base)) if problems.is_empty() => {
            let mut config = ClientConfig::new(base, ApiKey::new(key));
            config.timeout = timeout;
            Client::new(config).map_err(Failure::usage)
        }
        _ => Err(Failure::usage(anyhow::anyhow!(problems.join("; ")))),
    }
}

fn print_json(value: &serde_json::Value) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)
        .map_err(anyhow::Error::from)
        .and_then(|()| writeln!(out).map_err(anyhow::Error::from))
        .map_err(Failure::failed)
}

pub async fn models(args: &ModelsArgs) -> Outcome {
    let client = client_from_env()?;
    let policy = RetryPolicy::with_max_retries(COMMAND_RETRIES);
    let models = match &args.id {
        Some(id) => vec![with_retries(&policy, || client.model(id))
            .await
            .map_err(Failure::failed)?],
        None => with_retries(&policy, || client.models())
            .await
            .map_err(Failure::failed)?,
    };
    if args.json {
        let value = match &args.id {
            Some(_) => serde_json::to_value(&models[0]),
            None => serde_json::to_value(&models).map(|m| json!({ "models": m })),
        }
        .map_err(Failure::failed)?;
        print_json(&value)?;
    } else {
        print!("{}", models_table(&models));
    }
    Ok(Exit::Success)
}

/// The human listing of models: one row each, aligned.
pub fn models_table(models: &[Model]) -> String {
    let mut rows = vec![[
        "ID".to_string(),
        "CONTEXT".to_string(),
        "MODALITIES".to_string(),
        "INPUT/1K".to_string(),
        "OUTPUT/1K".to_string(),
    ]];
    let price = |p: Option<f64>| p.map_or_else(|| "-".to_string(), |v| format!("{v}"));
    for model in models {
        rows.push([
            model.id.clone(),
            model
                .context_window
                .map_or_else(|| "-".to_string(), |c| c.to_string()),
            if model.modalities.is_empty() {
                "-".to_string()
            } else {
                model.modalities.join(",")
            },
            price(model.pricing.and_then(|p| p.input_per_1k)),
            price(model.pricing.and_then(|p| p.output_per_1k)),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

pub async fn embed(args: &EmbedArgs) -> Outcome {
    let client = client_from_env()?;
    // The job engine's backend: the same retries and the same checks of every response.
    let backend = ApiBackend::new(
        client,
        ApiSettings {
            model: args.model.clone(),
            dimensions: None,
            concurrency: 1,
            requests_per_minute: 0,
            tokens_per_minute: 0,
            max_tokens_per_request: 0,
            retry: RetryPolicy::with_max_retries(COMMAND_RETRIES),
        },
        None,
    );
    let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
    let vectors = backend.embed(&texts, 0).await.map_err(Failure::failed)?;
    if args.json {
        let embeddings: Vec<&[f32]> = vectors.rows().collect();
        print_json(&json!({
            "model": args.model,
            "dimensions": vectors.dimensions,
            "embeddings": embeddings,
            "usage": vectors.usage,
        }))?;
    } else {
        let mut out = std::io::stdout().lock();
        for (i, (row, text)) in vectors.rows().zip(&texts).enumerate() {
            let head: Vec<String> = row.iter().take(4).map(|v| format!("{v:.6}")).collect();
            writeln!(
                out,
                "{i}\t{}\t[{}, …]\t{}",
                vectors.dimensions,
                head.join(", "),
                preview(text, 60)
            )
            .context("writing to stdout")
            .map_err(Failure::failed)?;
        }
        eprintln!(
            "{} vectors of {} dimensions, {} prompt tokens",
            vectors.len(),
            vectors.dimensions,
            vectors.usage.prompt_tokens
        );
    }
    Ok(Exit::Success)
}

fn preview(text: &str, max_chars: usize) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match one_line.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &one_line[..cut]),
        None => one_line,
    }
}

pub async fn chat(args: &ChatArgs) -> Outcome {
    if let Some(t) = args.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(Failure::usage(anyhow::anyhow!(
                "--temperature must be between 0.0 and 2.0, not {t}"
            )));
        }
    }
    if args.max_tokens == Some(0) {
        return Err(Failure::usage(anyhow::anyhow!(
            "--max-tokens must be at least 1"
        )));
    }
    let client = client_from_env()?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system));
    }
    messages.push(ChatMessage::new("user", &args.prompt));
    let request = ChatRequest {
        model: args.model.clone(),
        messages,
        temperature: args.temperature,
        max_tokens: args.max_tokens,
        stream: !args.no_stream,
    };
    let policy = RetryPolicy::with_max_retries(COMMAND_RETRIES);
    let mut out = std::io::stdout().lock();
    let write_err =
        |e: std::io::Error| Failure::failed(anyhow::Error::from(e).context("writing to stdout"));
    if args.no_stream {
        let reply = with_retries(&policy, || client.chat(&request))
            .await
            .map_err(Failure::failed)?;
        writeln!(out, "{reply}").map_err(write_err)?;
        return Ok(Exit::Success);
    }
    // Only opening the stream is retried: once text is on the screen, a retry would repeat it.
    let mut stream = with_retries(&policy, || client.chat_stream(&request))
        .await
        .map_err(Failure::failed)?;
    while let Some(fragment) = stream.next().await {
        match fragment {
            Ok(text) => {
                out.write_all(text.as_bytes()).map_err(write_err)?;
                out.flush().map_err(write_err)?;
            }
            Err(e) => {
                // End the partial line so the error starts on a line of its own.
                let _ = writeln!(out);
                return Err(Failure::failed(e));
            }
        }
    }
    writeln!(out).map_err(write_err)?;
    Ok(Exit::Success)
}

pub async fn simulate(options: SimulateOptions) -> Outcome {
    let config = options.to_config().map_err(|problems| {
        Failure::usage(anyhow::anyhow!("invalid simulator options:\n{problems}"))
    })?;
    simulate::serve(config).await.map_err(Failure::failed)?;
    Ok(Exit::Success)
}

pub async fn run(args: &crate::cli::RunArgs) -> Outcome {
    let mut overrides = args.job.overrides.clone();
    if let Some(cost) = args.max_cost {
        overrides.push(format!("budget.max_cost={cost:?}"));
    }
    let job = crate::job::load(&args.job.job, &overrides).map_err(Failure::usage)?;
    let stages = crate::run::build(&job).await?;
    if job.budget.max_cost.is_some() && stages.backend.info().input_per_1k.is_none() {
        return Err(Failure::usage(anyhow::anyhow!(
            "`budget.max_cost` is set, but model {} has no price to count it with",
            stages.backend.info().model
        )));
    }
    let options = RunOptions {
        progress: !args.quiet,
        fresh: args.fresh,
        max_duration: args.max_duration,
        stop: Some(stop_on_signals()),
    };
    let summary = crate::pipeline::run(&job, stages.backend, stages.chunker, options)
        .await
        .map_err(|e| Failure {
            exit: e.exit(),
            error: e.into(),
        })?;
    if args.json {
        print_json(&serde_json::to_value(&summary).map_err(Failure::failed)?)?;
    } else {
        print!("{}", summary_text(&summary));
    }
    Ok(if summary.stopped.is_some() {
        Exit::Stopped
    } else if summary.quarantined > 0 {
        Exit::Quarantined
    } else {
        Exit::Success
    })
}

/// The first SIGINT or SIGTERM asks the run to stop after the requests in
/// flight; a second one, at once.
fn stop_on_signals() -> watch::Receiver<StopRequest> {
    let (tx, rx) = watch::channel(StopRequest::Running);
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        let mut received = 0;
        loop {
            let name = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            received += 1;
            let request = if received == 1 {
                eprintln!(
                    "embedjob: {name}: stopping after the requests in flight (again to stop at once)"
                );
                StopRequest::Graceful(format!("stopped by {name}"))
            } else {
                StopRequest::Now(format!("stopped by {name}"))
            };
            if tx.send(request).is_err() {
                return;
            }
        }
    });
    rx
}

/// The human form of a run's summary.
pub fn summary_text(s: &crate::pipeline::Summary) -> String {
    let mut out = format!(
        "{job}: {written} chunks from {documents} documents written to {output}\n",
        job = s.job,
        written = s.written,
        documents = s.documents,
        output = s.output.display()
    );
    out.push_str(&format!(
        "  model {} ({} backend), {} dimensions\n",
        s.model,
        s.backend,
        s.dimensions
            .map_or_else(|| "?".to_string(), |d| d.to_string())
    ));
    out.push_str(&format!(
        "  tokens: {} billed, {} estimated locally; {} requests, {} retries ({} throttled, {} invalid responses)\n",
        s.usage.prompt_tokens, s.estimated_tokens, s.requests, s.retries, s.throttled, s.invalid_responses
    ));
    if let Some(cost) = s.cost {
        out.push_str(&format!("  cost: {cost:.6}\n"));
    }
    out.push_str(&format!(
        "  chunks: {} embedded, {} reused from the last output, {} resumed, {} repeats; \
         {} added, {} changed, {} unchanged, {} removed; {} tokens saved\n",
        s.embedded,
        s.reused,
        s.resumed,
        s.deduplicated,
        s.added,
        s.changed,
        s.unchanged,
        s.removed,
        s.tokens_saved
    ));
    if let Some(reason) = &s.stopped {
        out.push_str(&format!(
            "  {reason}: what was done is kept; run the job again to carry on\n"
        ));
    }
    if s.skipped_null + s.skipped_empty > 0 {
        out.push_str(&format!(
            "  skipped: {} null, {} empty texts\n",
            s.skipped_null, s.skipped_empty
        ));
    }
    if s.quarantined > 0 {
        out.push_str(&format!(
            "  quarantined: {} chunks (see {}.failures.jsonl)\n",
            s.quarantined,
            s.output.display()
        ));
    }
    out.push_str(&format!(
        "  {:.1}s, {:.0} chunks/s\n",
        s.elapsed_seconds, s.chunks_per_second
    ));
    out
}

pub async fn estimate(args: &crate::cli::EstimateArgs) -> Outcome {
    let job = crate::job::load(&args.job.job, &args.job.overrides).map_err(Failure::usage)?;
    // The run's own set-up: the same key checks, model listing and chunker.
    let stages = crate::run::build(&job).await?;
    let info = stages.backend.info().clone();
    let chunker = stages.chunker;
    let fresh = args.fresh;
    let estimate = tokio::task::spawn_blocking(move || {
        // What a run would reuse, found as the run finds it, without its lock or clean-up.
        let store = if fresh {
            None
        } else {
            let fingerprint = Fingerprint::new(&job, &info);
            let checkpoint = Checkpoint::read(&job.name, &job.output.path, &fingerprint)
                .map_err(checkpoint_failure)?;
            let (store, _) = crate::checkpoint::load_store(&job.output.path, &checkpoint, false)
                .map_err(checkpoint_failure)?;
            Some(store)
        };
        let result = match &store {
            Some(store) if !store.is_empty() => {
                let filter =
                    |chunk: &crate::chunk::Chunk| store.locate(&chunk.content_hash).is_none();
                crate::estimate::estimate(&job, chunker.as_ref(), &info, &filter)
            }
            _ => {
                crate::estimate::estimate(&job, chunker.as_ref(), &info, &crate::estimate::SendAll)
            }
        };
        result.map_err(|e| Failure {
            exit: e.exit(),
            error: e.into(),
        })
    })
    .await
    .map_err(|e| Failure::failed(anyhow::anyhow!("the estimate stopped unexpectedly: {e}")))??;
    if args.json {
        print_json(&serde_json::to_value(&estimate).map_err(Failure::failed)?)?;
    } else {
        print!("{}", crate::estimate::table(&estimate));
    }
    Ok(Exit::Success)
}

fn checkpoint_failure(e: crate::checkpoint::CheckpointError) -> Failure {
    Failure {
        exit: if e.is_found_before_work() {
            Exit::Usage
        } else {
            Exit::Failed
        },
        error: e.into(),
    }
}

/// Prints the report whatever it finds; a failed check makes the exit 1.
pub async fn inspect(args: &crate::cli::InspectArgs) -> Outcome {
    let path = args.path.clone();
    let report = tokio::task::spawn_blocking(move || crate::inspect::inspect(&path))
        .await
        .map_err(|e| Failure::failed(anyhow::anyhow!("the inspection stopped unexpectedly: {e}")))?
        .map_err(|e| Failure {
            exit: e.exit(),
            error: e.into(),
        })?;
    if args.json {
        print_json(&serde_json::to_value(&report).map_err(Failure::failed)?)?;
    } else {
        print!("{}", crate::inspect::text(&report));
    }
    if report.ok {
        return Ok(Exit::Success);
    }
    let n = report.totals.problem_count;
    let first = crate::inspect::first_problem(&report).unwrap_or_default();
    Err(Failure::failed(anyhow::anyhow!(
        "{n} failed check{} in {}; the first: {first}",
        if n == 1 { "" } else { "s" },
        args.path.display()
    )))
}
