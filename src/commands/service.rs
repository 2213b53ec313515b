//! The commands that talk to the service without a job file: `models`,
//! `embed` and `chat`. They take the key from `EMBEDJOB_API_KEY` and the
//! address from `EMBEDJOB_BASE_URL`.

use std::io::Write;

use anyhow::Context;
use futures::StreamExt;
use serde_json::json;

use super::{client_from_env, messages, print_json, Outcome, COMMAND_RETRIES};
use crate::backend::api::{ApiBackend, ApiSettings};
use crate::backend::Embedding;
use crate::chunk::{Chunker, TokenChunker};
use crate::cli::{ChatArgs, EmbedArgs, ModelsArgs};
use crate::client::{ChatMessage, ChatRequest, Model};
use crate::exit::{Exit, Failure};
use crate::job::ChunkingConfig;
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
/// `embed` reads many from stdin...
const EMBED_GROUP: usize = 128;
/// ...and the most text a group holds before it is sent, so that memory
/// holds a group, not the input.
const EMBED_GROUP_BYTES: usize = 16 * 1024 * 1024;

pub async fn embed(args: &EmbedArgs) -> Outcome {
    let mut texts = Texts::new(&args.texts)?;
    // Read before the backend is built: empty stdin is a usage error.
    let mut group = texts.next_group().await?;
    if group.is_empty() {
        return Err(Failure::usage(anyhow::anyhow!(
            "stdin holds no text to embed (`-` reads one text per line)"
        )));
    }
    let (Embedding { backend, chunker }, model) = embed_backend(args).await?;
    messages::follow(&backend.notices());
    let window = backend.info().chunk_window();
    let mut out = std::io::stdout().lock();
    let mut usage = crate::types::Usage::default();
    let mut dimensions = 0;
    let mut embedded = 0usize;
    while !group.is_empty() {
        let before_work = embedded == 0;
        if let Some(window) = window {
            for text in &group {
                within_window(chunker.as_ref(), text, window)
                    .map_err(|e| Failure::found(before_work, e))?;
            }
        }
        let refs: Vec<&str> = group.iter().map(|t| t.text.as_str()).collect();
        let vectors = backend.embed(&refs, 0).await.map_err(Failure::failed)?;
        usage += vectors.usage;
        dimensions = vectors.dimensions;
        // Begun with the first vectors, so an error before them prints nothing.
        if args.json && before_work {
            // JSON whose strings are scrubbed, not its text (see `put_json`).
            let head = format!(
                "{{\"backend\":{},\"model\":{},\"embeddings\":[",
                json!(backend.info().kind.to_string()),
                crate::secret::scrub_json(&json!(model))
            );
            put_json(&mut out, &head)?;
        }
        for (i, (row, text)) in vectors.rows().zip(&refs).enumerate() {
            if args.json {
                let row = serde_json::to_string(row).map_err(Failure::failed)?;
                let line = format!("{}{row}", if embedded + i == 0 { "" } else { "," });
                put_json(&mut out, &line)?;
                continue;
            }
            let head: Vec<String> = row.iter().take(4).map(|v| format!("{v:.6}")).collect();
            let line = format!(
                "{}\t{}\t[{}, …]\t{}\n",
                embedded + i,
                vectors.dimensions,
                head.join(", "),
                preview(text, 60)
            );
            put(&mut out, &line)?;
        }
        out.flush().or_else(super::closed_stdout)?;
        embedded += group.len();
        group = texts
            .next_group()
            .await
            .map_err(|e| Failure::failed(e.error))?;
    }
    if args.json {
        let tail = format!(
            "],\"dimensions\":{dimensions},\"usage\":{}}}\n",
            json!(usage)
        );
        put_json(&mut out, &tail)?;
    } else if backend.info().kind == crate::backend::BackendKind::Local {
        messages::say(&format!(
            "{} of {dimensions} dimensions from the local model {model}, which bills nothing",
            crate::display::counted(embedded as u64, "vector")
        ));
    } else {
        messages::say(&format!(
            "{} of {dimensions} dimensions, {} prompt tokens billed",
            crate::display::counted(embedded as u64, "vector"),
            usage.prompt_tokens
        ));
    }
    Ok(Exit::Success)
}

/// Writes JSON to stdout as it is: its strings were scrubbed, and its
/// numbers hold no secret. Scrubbed as text, a dummy key such as `1` was
/// taken out of the vectors' numbers, and the output was no JSON.
fn put_json(out: &mut impl Write, json: &str) -> Result<(), Failure> {
    out.write_all(json.as_bytes())
        .context("writing to stdout")
        .map_err(Failure::failed)
}

/// Writes `text` to stdout, scrubbed of every secret.
fn put(out: &mut impl Write, text: &str) -> Result<(), Failure> {
    out.write_all(crate::secret::scrub(text).as_bytes())
        .context("writing to stdout")
        .map_err(Failure::failed)
}

/// A text to embed and where it came from, for errors.
struct Text {
    text: String,
    /// `stdin line 7`, or `text 2` of those given.
    place: String,
}

/// The texts given, or with `-` alone, stdin's lines (blank ones skipped),
/// read a group at a time.
enum Texts {
    Given(std::vec::IntoIter<Text>),
    Stdin(Option<StdinLines>),
}

/// Stdin and the number of the last line read from it.
struct StdinLines {
    reader: std::io::BufReader<std::io::Stdin>,
    line: u64,
}

impl Texts {
    fn new(given: &[String]) -> Result<Self, Failure> {
        if !given.iter().any(|t| t == "-") {
            let texts: Vec<Text> = given
                .iter()
                .enumerate()
                .map(|(i, text)| Text {
                    text: text.clone(),
                    place: format!("text {}", i + 1),
                })
                .collect();
            return Ok(Texts::Given(texts.into_iter()));
        }
        if given.len() > 1 {
            return Err(Failure::usage(anyhow::anyhow!(
                "`-` reads every text from stdin, one per line: give it alone"
            )));
        }
        Ok(Texts::Stdin(Some(StdinLines {
            reader: std::io::BufReader::new(std::io::stdin()),
            line: 0,
        })))
    }

    /// The next texts to send together: at most [`EMBED_GROUP`] of them and
    /// [`EMBED_GROUP_BYTES`] (or one longer text); none at the end. Stdin is
    /// read off the async runtime; a problem with it is a usage error.
    async fn next_group(&mut self) -> Result<Vec<Text>, Failure> {
        match self {
            Texts::Given(texts) => Ok(texts.by_ref().take(EMBED_GROUP).collect()),
            Texts::Stdin(stdin) => {
                let Some(mut lines) = stdin.take() else {
                    return Ok(Vec::new());
                };
                let (lines, group) = tokio::task::spawn_blocking(move || {
                    let group = lines.read_group();
                    (lines, group)
                })
                .await
                .map_err(|e| Failure::failed(anyhow::anyhow!("reading stdin stopped: {e}")))?;
                *stdin = Some(lines);
                group.map_err(Failure::usage)
            }
        }
    }
}

/// Why a line of stdin cannot be embedded.
#[derive(Debug, thiserror::Error)]
enum LineError {
    #[error("stdin line {line}: more than {}, the most a line may hold", crate::bounded::describe(*limit))]
    TooLong { line: u64, limit: u64 },
    #[error("stdin line {line}: not valid UTF-8 (first bad byte at offset {offset})")]
    Utf8 { line: u64, offset: usize },
    #[error("reading stdin: {0}")]
    Io(#[from] std::io::Error),
}

impl StdinLines {
    fn read_group(&mut self) -> Result<Vec<Text>, LineError> {
        use crate::bounded::{read_line, BoundedError, MAX_LINE_BYTES};
        let mut group = Vec::new();
        let mut bytes = 0;
        while group.len() < EMBED_GROUP && bytes < EMBED_GROUP_BYTES {
            let mut line = Vec::new();
            let read =
                read_line(&mut self.reader, &mut line, MAX_LINE_BYTES).map_err(|e| match e {
                    BoundedError::TooLarge { limit } => LineError::TooLong {
                        line: self.line + 1,
                        limit,
                    },
                    BoundedError::Io(e) => LineError::Io(e),
                })?;
            if read == 0 {
                break;
            }
            self.line += 1;
            if line.last() == Some(&b'\n') {
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
            }
            let text = String::from_utf8(line).map_err(|e| LineError::Utf8 {
                line: self.line,
                offset: e.utf8_error().valid_up_to(),
            })?;
            if !text.trim().is_empty() {
                bytes += text.len();
                group.push(Text {
                    text,
                    place: format!("stdin line {}", self.line),
                });
            }
        }
        Ok(group)
    }
}

/// Bytes of text counted at once when checking a text against the window:
/// a long line costs time in proportion to the window, and no more memory
/// than this, however long it is.
const COUNTED_BYTES: usize = 64 * 1024;

/// Checks that `text` fits the model's `window` (in tokens of text, as the
/// model counts them), before it is sent: a longer text would be cut or
/// refused by the model. Counts a piece at a time, cut at a space where
/// the tokenizers cut anyway, and stops once past the window.
fn within_window(chunker: &dyn Chunker, text: &Text, window: u64) -> anyhow::Result<()> {
    let mut counted: u64 = 0;
    let mut rest = text.text.as_str();
    while !rest.is_empty() {
        let piece = &rest[..piece_end(rest, COUNTED_BYTES)];
        counted += chunker.count_tokens(piece) as u64;
        rest = &rest[piece.len()..];
        if counted > window {
            let tokens = if rest.is_empty() {
                format!("{counted} tokens")
            } else {
                format!("at least {counted} tokens")
            };
            anyhow::bail!(
                "{}: {tokens}, more than the model's window of {window} tokens takes; \
                 nothing was sent for it",
                text.place
            );
        }
    }
    Ok(())
}

/// Where a piece of at most `size` bytes of `text` ends: at its end, else
/// before the last space in its second half, else at a character boundary.
fn piece_end(text: &str, size: usize) -> usize {
    if text.len() <= size {
        return text.len();
    }
    let mut limit = size;
    while !text.is_char_boundary(limit) {
        limit -= 1;
    }
    let half = limit / 2;
    text.as_bytes()[half..limit]
        .iter()
        .rposition(|b| *b == b' ')
        .map(|at| half + at)
        .filter(|&at| at > 0)
        .unwrap_or(limit)
}

/// The service's backend (the job engine's: the same retries and checks,
/// and the model's window as the service lists it), or the local model;
/// each with what counts tokens as it does; and the model's name.
async fn embed_backend(args: &EmbedArgs) -> Result<(Embedding, String), Failure> {
    if args.local {
        let embedding = crate::backend::local::local_backend(args.model.clone()).await?;
        let model = embedding.backend.info().model.clone();
        return Ok((embedding, model));
    }
    let model = args.model.clone().unwrap_or_default();
    let client = client_from_env()?;
    let retry = RetryPolicy::with_max_retries(COMMAND_RETRIES);
    let discovery = crate::client::discover(&client, &model, &retry)
        .await
        .map_err(|e| match e {
            crate::client::DiscoveryError::UnknownModel { model, error } => Failure::failed(
                anyhow::anyhow!("unknown model {model:?} (--model): {error}"),
            ),
            other => Failure::failed(other),
        })?;
    for warning in &discovery.warnings {
        messages::warn(warning);
    }
    let backend = ApiBackend::new(
        client,
        ApiSettings {
            retry,
            ..ApiSettings::new(model.clone())
        },
        discovery.model.as_ref(),
    );
    // Counted as a job counts without `chunking.tokenizer`.
    let chunker = TokenChunker::for_config(&ChunkingConfig::default()).map_err(Failure::failed)?;
    let embedding = Embedding {
        backend: std::sync::Arc::new(backend),
        chunker: std::sync::Arc::new(chunker),
    };
    Ok((embedding, model))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn text(text: String) -> Text {
        Text {
            text,
            place: "stdin line 4".to_string(),
        }
    }

    /// Pieces end before a space, where cl100k starts a token anyway, so
    /// counting a piece at a time gives the count of the whole.
    #[test]
    fn a_text_counted_a_piece_at_a_time_counts_as_a_whole() {
        let chunker = TokenChunker::for_config(&ChunkingConfig::default()).unwrap();
        let words = [
            "alpha",
            "beta,",
            "gamma.",
            "δέλτα",
            "epsilon",
            "42",
            "(zeta)",
        ];
        let long: String = (0..40_000)
            .map(|i| words[i % words.len()])
            .collect::<Vec<_>>()
            .join(" ");
        assert!(long.len() > 3 * COUNTED_BYTES);
        let whole = chunker.count_tokens(&long) as u64;
        assert!(within_window(&chunker, &text(long.clone()), whole).is_ok());
        let error = within_window(&chunker, &text(long.clone()), whole - 1).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "stdin line 4: {whole} tokens, more than the model's window of {} tokens \
                 takes; nothing was sent for it",
                whole - 1
            )
        );
        // Counting stops a piece past the window.
        let error = within_window(&chunker, &text(long), 10).unwrap_err();
        assert!(error.to_string().contains("at least"), "{error}");
    }

    #[test]
    fn pieces_end_at_a_space_or_a_character_boundary() {
        assert_eq!(piece_end("short", 64), 5);
        assert_eq!(piece_end("aaaa bbbb cccc", 12), 9);
        // No space in the second half: cut at the last boundary within size.
        let accents = "é".repeat(10);
        assert_eq!(piece_end(&accents, 7), 6);
        assert_eq!(piece_end(&"x".repeat(100), 10), 10);
    }
}
