//! The commands that talk to the service without a job file: `models`,
//! `embed` and `chat`. They take the key from `EMBEDJOB_API_KEY` and the
//! address from `EMBEDJOB_BASE_URL`.

use std::io::{BufRead, Write};

use anyhow::Context;
use futures::StreamExt;
use serde_json::json;

use super::{client_from_env, messages, print_json, Outcome, COMMAND_RETRIES};
use crate::backend::api::{ApiBackend, ApiSettings};
use crate::backend::EmbeddingBackend;
use crate::cli::{ChatArgs, EmbedArgs, ModelsArgs};
use crate::client::{ChatMessage, ChatRequest, Model};
use crate::exit::{Exit, Failure};
use crate::rate::{with_retries, RateControl, RateSettings, RetryPolicy};

pub async fn models(args: &ModelsArgs) -> Outcome {
    let client = client_from_env()?;
    let policy = RetryPolicy::with_max_retries(COMMAND_RETRIES);
    let models = match &args.id {
        // A server without GET /v1/models/{id} is asked for its listing.
        Some(id) => {
            let found = crate::client::discover(&client, id, &policy)
                .await
                .map_err(Failure::failed)?;
            match found.model {
                Some(model) => vec![model],
                None => {
                    return Err(Failure::failed(anyhow::anyhow!(
                        "model {id}: {}",
                        found.warnings.join("; ")
                    )))
                }
            }
        }
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
        print!("{}", crate::secret::scrub(&models_table(&models)));
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

/// Texts embedded per request (and per call of the local model) when
/// `embed` reads many from stdin.
const EMBED_GROUP: usize = 128;

pub async fn embed(args: &EmbedArgs) -> Outcome {
    let texts = embed_texts(&args.texts)?;
    let (backend, model) = embed_backend(args).await?;
    messages::follow(&backend.notices());
    let mut out = std::io::stdout().lock();
    let mut all: Vec<Vec<f32>> = Vec::new();
    let mut usage = crate::types::Usage::default();
    let mut dimensions = 0;
    for (group_index, group) in texts.chunks(EMBED_GROUP).enumerate() {
        let refs: Vec<&str> = group.iter().map(String::as_str).collect();
        let vectors = backend.embed(&refs, 0).await.map_err(Failure::failed)?;
        usage += vectors.usage;
        dimensions = vectors.dimensions;
        let first = group_index * EMBED_GROUP;
        if args.json {
            all.extend(vectors.rows().map(<[f32]>::to_vec));
            continue;
        }
        for (i, (row, text)) in vectors.rows().zip(&refs).enumerate() {
            let head: Vec<String> = row.iter().take(4).map(|v| format!("{v:.6}")).collect();
            writeln!(
                out,
                "{}\t{}\t[{}, …]\t{}",
                first + i,
                vectors.dimensions,
                head.join(", "),
                preview(text, 60)
            )
            .context("writing to stdout")
            .map_err(Failure::failed)?;
        }
    }
    if args.json {
        print_json(&json!({
            "model": model,
            "backend": backend.info().kind.to_string(),
            "dimensions": dimensions,
            "embeddings": all,
            "usage": usage,
        }))?;
    } else if backend.info().kind == crate::backend::BackendKind::Local {
        messages::say(&format!(
            "{} of {dimensions} dimensions from the local model {model}, which bills nothing",
            crate::display::counted(texts.len() as u64, "vector")
        ));
    } else {
        messages::say(&format!(
            "{} of {dimensions} dimensions, {} prompt tokens billed",
            crate::display::counted(texts.len() as u64, "vector"),
            usage.prompt_tokens
        ));
    }
    Ok(Exit::Success)
}

/// The texts given, or with `-` alone, stdin's lines (blank ones skipped).
fn embed_texts(given: &[String]) -> Result<Vec<String>, Failure> {
    if !given.iter().any(|t| t == "-") {
        return Ok(given.to_vec());
    }
    if given.len() > 1 {
        return Err(Failure::usage(anyhow::anyhow!(
            "`-` reads every text from stdin, one per line: give it alone"
        )));
    }
    let mut texts = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading stdin").map_err(Failure::usage)?;
        if !line.trim().is_empty() {
            texts.push(line);
        }
    }
    if texts.is_empty() {
        return Err(Failure::usage(anyhow::anyhow!(
            "stdin holds no text to embed (`-` reads one text per line)"
        )));
    }
    Ok(texts)
}

/// The service's backend (the job engine's: the same retries and checks),
/// or the local model; and the model's name.
async fn embed_backend(
    args: &EmbedArgs,
) -> Result<(std::sync::Arc<dyn EmbeddingBackend>, String), Failure> {
    if args.local {
        let backend = crate::backend::local::local_backend(args.model.clone()).await?;
        let model = backend.info().model.clone();
        return Ok((backend, model));
    }
    let model = args.model.clone().unwrap_or_default();
    let client = client_from_env()?;
    let backend = ApiBackend::new(
        client,
        ApiSettings {
            retry: RetryPolicy::with_max_retries(COMMAND_RETRIES),
            ..ApiSettings::new(model.clone())
        },
        None,
    );
    Ok((std::sync::Arc::new(backend), model))
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
    // Paced by the service's quota and retried as the embeddings are.
    let rate = RateControl::new(&RateSettings::new(RetryPolicy::with_max_retries(
        COMMAND_RETRIES,
    )));
    let request = &request;
    let mut out = std::io::stdout().lock();
    let write_err =
        |e: std::io::Error| Failure::failed(anyhow::Error::from(e).context("writing to stdout"));
    if args.no_stream {
        let reply = rate
            .call(0, || {
                client.with_quota_headers(|client| async move { client.chat(request).await })
            })
            .await
            .map_err(Failure::failed)?;
        writeln!(out, "{}", crate::secret::scrub(&reply.text)).map_err(write_err)?;
        return Ok(Exit::Success);
    }
    // Only opening the stream is retried: once text is on the screen, a retry would repeat it.
    let mut stream = rate
        .call(0, || {
            client.with_quota_headers(|client| async move { client.chat_stream(request).await })
        })
        .await
        .map_err(Failure::failed)?;
    let mut held = String::new();
    while let Some(fragment) = stream.next().await {
        match fragment {
            Ok(text) => {
                held.push_str(&text);
                let shown = release(&mut held, false);
                out.write_all(shown.as_bytes()).map_err(write_err)?;
                out.flush().map_err(write_err)?;
            }
            Err(e) => {
                // End the partial line so the error starts on a line of its own.
                let _ = writeln!(out, "{}", release(&mut held, true));
                return Err(Failure::failed(e));
            }
        }
    }
    writeln!(out, "{}", release(&mut held, true)).map_err(write_err)?;
    Ok(Exit::Success)
}

/// The streamed reply's text that can be shown: scrubbed of the key, less
/// the last few characters, which may be the start of a key a later
/// fragment completes (all of it at the `end`).
fn release(held: &mut String, end: bool) -> String {
    /// More than a piece of the key that is too short to be scrubbed.
    const KEPT_BACK: usize = 2 * crate::secret::MIN_FRAGMENT;
    let clean = crate::secret::scrub(held).into_owned();
    let cut = if end {
        clean.len()
    } else {
        clean
            .char_indices()
            .rev()
            .nth(KEPT_BACK - 1)
            .map_or(0, |(at, _)| at)
    };
    *held = clean[cut..].to_string();
    clean[..cut].to_string()
}
