//! `kind = "api"`: an OpenAI-style service. Its parameters, their checks,
//! its part of a split job, and how it builds itself: the key and the
//! model checked with the service (`client::discover`) before any work.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::window::ModelCount;
use super::{ApiBackend, ApiSettings};
use crate::backend::{fitted_chunking, BackendKind, Embedding, EmbeddingBackend, EmbeddingKind};
use crate::chunk::{Chunker, TokenChunker};
use crate::client::{discover, ApiKey, Client, ClientConfig, DiscoveryError};
use crate::exit::Failure;
use crate::job::{
    BackendParams, BackendShared, ChunkingConfig, Concurrency, Job, KindTable, Shard,
};
use crate::rate::RetryPolicy;

pub const DEFAULT_API_KEY_ENV: &str = "EMBEDJOB_API_KEY";

/// `backend.stall_timeout_seconds` when the job does not set it.
pub const DEFAULT_STALL_TIMEOUT_SECONDS: u64 = 600;
/// The longest `backend.stall_timeout_seconds`: a week.
pub const MAX_STALL_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;

/// The range of `backend.quota_window_seconds`: a millisecond to a day,
/// the longest reset the headers are believed for.
pub const MIN_QUOTA_WINDOW_SECONDS: f64 = 0.001;
pub const MAX_QUOTA_WINDOW_SECONDS: f64 = 86_400.0;

/// How vectors travel in an embeddings response (`backend.encoding_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncodingFormat {
    /// Ask for base64, take floats if they come, and ask for floats for the
    /// rest of the run if the service refuses the parameter.
    #[default]
    Auto,
    /// JSON numbers: the parameter is not sent.
    Float,
    /// Little-endian `f32`s in base64, as OpenAI sends them; a refusal stops the run.
    Base64,
}

impl fmt::Display for EncodingFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EncodingFormat::Auto => "auto",
            EncodingFormat::Float => "float",
            EncodingFormat::Base64 => "base64",
        })
    }
}

/// `kind = "api"`: an OpenAI-style service.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ApiParams {
    pub base_url: Option<String>,
    /// The path the API's routes sit under (`/v1` when absent; `""` for
    /// servers that serve them at the root, as infinity does by default).
    pub api_path: Option<String>,
    /// The model's context window, in tokens, for servers that do not list
    /// it; it takes precedence over the listing.
    pub context_window: Option<u64>,
    /// The price per 1000 input tokens, for servers that do not list it; it
    /// takes precedence over the listing.
    pub input_per_1k: Option<f64>,
    /// The price per 1000 output tokens (chat completions), likewise.
    pub output_per_1k: Option<f64>,
    pub encoding_format: EncodingFormat,
    /// The environment variable that holds the API key (never the key itself).
    pub api_key_env: String,
    /// 0 = no client-side limit.
    pub requests_per_minute: u32,
    /// 0 = no client-side limit.
    pub tokens_per_minute: u64,
    pub max_retries: usize,
    /// The service answers under another model name than the one asked for
    /// (an alias, a gateway); accepted with a warning instead of refused.
    pub server_renames_models: bool,
    /// The run stops (exit 4, resumable) when nothing has succeeded for this
    /// many seconds while the service's quota refuses or holds back requests.
    pub stall_timeout_seconds: u64,
    /// When the service lists no window and the job sets none, a few
    /// requests before the run find where the model stops reading.
    pub probe_window: bool,
    /// How long a use stays in the service's quota if it is a sliding
    /// window (60 for a quota per minute); unset, the answers tell it.
    pub quota_window_seconds: Option<f64>,
    /// `sync`: requests answered at once; `batch`: the service's Batch API,
    /// at its batch price, collected by a later run.
    pub mode: Mode,
    /// The batch's completion window, as the service names it.
    pub batch_completion_window: String,
    /// The price per 1000 input tokens in batch mode, over the listing's.
    pub batch_input_per_1k: Option<f64>,
    /// The most tokens the job keeps enqueued in batches at once.
    pub batch_max_enqueued_tokens: Option<u64>,
    /// How often `run --wait` asks about the batches at first.
    pub batch_poll_seconds: u64,
}

/// `backend.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Sync,
    Batch,
}

/// `backend.batch_poll_seconds` when the job does not set it.
pub const DEFAULT_BATCH_POLL_SECONDS: u64 = 30;
/// The longest `backend.batch_poll_seconds`: an hour.
pub const MAX_BATCH_POLL_SECONDS: u64 = 3600;
/// The completion windows the Batch API offers.
pub const BATCH_COMPLETION_WINDOWS: &[&str] = &["24h"];

impl Default for ApiParams {
    fn default() -> Self {
        ApiParams {
            base_url: None,
            api_path: None,
            context_window: None,
            input_per_1k: None,
            output_per_1k: None,
            encoding_format: EncodingFormat::Auto,
            api_key_env: DEFAULT_API_KEY_ENV.to_string(),
            requests_per_minute: 0,
            tokens_per_minute: 0,
            max_retries: 8,
            server_renames_models: false,
            stall_timeout_seconds: DEFAULT_STALL_TIMEOUT_SECONDS,
            probe_window: true,
            quota_window_seconds: None,
            mode: Mode::Sync,
            batch_completion_window: "24h".to_string(),
            batch_input_per_1k: None,
            batch_max_enqueued_tokens: None,
            batch_poll_seconds: DEFAULT_BATCH_POLL_SECONDS,
        }
    }
}

pub struct Kind;

impl crate::job::Kind<dyn BackendParams> for Kind {
    fn name(&self) -> &'static str {
        "api"
    }

    fn keys(&self) -> &'static [&'static str] {
        &[
            "base_url",
            "api_path",
            "context_window",
            "input_per_1k",
            "output_per_1k",
            "encoding_format",
            "api_key_env",
            "requests_per_minute",
            "tokens_per_minute",
            "max_retries",
            "server_renames_models",
            "stall_timeout_seconds",
            "probe_window",
            "quota_window_seconds",
            "mode",
            "batch_completion_window",
            "batch_input_per_1k",
            "batch_max_enqueued_tokens",
            "batch_poll_seconds",
        ]
    }

    fn parse(&self, table: &mut KindTable<'_>) -> Option<Box<dyn BackendParams>> {
        let params: ApiParams = table.deserialize()?;
        Some(Box::new(params))
    }
}

impl EmbeddingKind for Kind {
    fn build<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Embedding, Failure>> {
        Box::pin(build(job))
    }

    fn info_kind(&self) -> BackendKind {
        BackendKind::Api
    }
}

impl BackendParams for ApiParams {
    fn kind(&self) -> &'static str {
        "api"
    }

    fn clone_box(&self) -> Box<dyn BackendParams> {
        Box::new(self.clone())
    }

    fn problems(
        &self,
        shared: &BackendShared,
        chunking: Option<&ChunkingConfig>,
        p: &mut Vec<String>,
    ) {
        self.own_problems(shared, p);
        if let (Some(window), Some(c)) = (self.context_window, chunking) {
            if (c.max_tokens as u64) > window {
                p.push(format!(
                    "`chunking.max_tokens` ({}) is larger than `backend.context_window` ({window})",
                    c.max_tokens
                ));
            }
        }
    }

    /// The job's `requests_per_minute` and `tokens_per_minute` are the
    /// whole job's: each shard takes its part.
    fn split(&mut self, shard: Shard, problems: &mut Vec<String>) {
        let count = shard.count;
        let share = |key: &str, total: u64, problems: &mut Vec<String>| {
            if total > 0 && total < u64::from(count) {
                problems.push(format!(
                    "`backend.{key}` is {total} for the whole job: split {count} ways, \
                     a shard would get less than 1"
                ));
            }
            total / u64::from(count)
        };
        let requests = share(
            "requests_per_minute",
            u64::from(self.requests_per_minute),
            problems,
        );
        self.requests_per_minute = u32::try_from(requests).unwrap_or(u32::MAX);
        self.tokens_per_minute = share("tokens_per_minute", self.tokens_per_minute, problems);
    }

    fn per_minute_limits(&self) -> Option<(u32, u64)> {
        Some((self.requests_per_minute, self.tokens_per_minute))
    }
}

impl ApiParams {
    /// `quota_window_seconds` as a length (checked to be one by the job's problems).
    fn quota_window(&self) -> Option<Duration> {
        self.quota_window_seconds
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
    }

    fn own_problems(&self, b: &BackendShared, p: &mut Vec<String>) {
        if let Some(path) = &self.api_path {
            let trimmed = path.trim();
            if !(trimmed.is_empty() || trimmed.starts_with('/'))
                || trimmed.contains(['?', '#', ' '])
                || trimmed.contains("//")
            {
                p.push(format!(
                    "`backend.api_path` {path:?} must be empty or a path such as \"/v1\""
                ));
            }
        }
        if self.context_window == Some(0) {
            p.push("`backend.context_window` must be at least 1".to_string());
        }
        if let Some(seconds) = self
            .quota_window_seconds
            .filter(|s| !(MIN_QUOTA_WINDOW_SECONDS..=MAX_QUOTA_WINDOW_SECONDS).contains(s))
        {
            p.push(format!(
                "`backend.quota_window_seconds` must be between {MIN_QUOTA_WINDOW_SECONDS} and \
                 {MAX_QUOTA_WINDOW_SECONDS} (a day), not {seconds}"
            ));
        }
        if !(1..=MAX_STALL_TIMEOUT_SECONDS).contains(&self.stall_timeout_seconds) {
            p.push(format!(
                "`backend.stall_timeout_seconds` must be between 1 and {}, not {}",
                MAX_STALL_TIMEOUT_SECONDS, self.stall_timeout_seconds
            ));
        }
        self.batch_problems(p);
        for (key, price) in [
            ("input_per_1k", self.input_per_1k),
            ("output_per_1k", self.output_per_1k),
            ("batch_input_per_1k", self.batch_input_per_1k),
        ] {
            if let Some(price) = price.filter(|p| !p.is_finite() || *p < 0.0) {
                p.push(format!(
                    "`backend.{key}` must be a price of 0 or more, not {price}"
                ));
            }
        }
        if self.max_retries > crate::job::MAX_RETRIES {
            p.push(format!(
                "`backend.max_retries` must be at most {}, not {}",
                crate::job::MAX_RETRIES,
                self.max_retries
            ));
        }
        match &self.base_url {
            None => p.push("`backend.base_url` is required for kind \"api\"".to_string()),
            Some(url) => {
                let credentials = crate::secret::UrlCredentials::of(url);
                let shown = crate::secret::shown_url(url);
                if credentials.any(true) {
                    // Registered first: nothing may print them from here on.
                    credentials.register(true);
                    p.push(format!(
                        "`backend.base_url` {shown:?} holds credentials (not shown) in {}: \
                         remove them; the API key belongs in the variable named by \
                         `backend.api_key_env`",
                        credentials.places()
                    ));
                } else if let Err(e) = reqwest::Url::parse(url) {
                    p.push(format!("`backend.base_url` {shown:?} is not a URL: {e}"));
                }
            }
        }
        if b.model.as_deref().is_none_or(str::is_empty) {
            p.push("`backend.model` is required for kind \"api\"".to_string());
        }
        if self.api_key_env.is_empty() {
            p.push("`backend.api_key_env` must name an environment variable".to_string());
        } else if std::env::var(&self.api_key_env).map_or(true, |k| k.trim().is_empty()) {
            p.push(format!(
                "the API key is missing: set the environment variable {} (named by `backend.api_key_env`)",
                self.api_key_env
            ));
        }
    }
}

impl ApiParams {
    fn batch_problems(&self, p: &mut Vec<String>) {
        if !BATCH_COMPLETION_WINDOWS.contains(&self.batch_completion_window.as_str()) {
            p.push(format!(
                "`backend.batch_completion_window` must be one of {}, not {:?}",
                BATCH_COMPLETION_WINDOWS.join(", "),
                self.batch_completion_window
            ));
        }
        if self.batch_max_enqueued_tokens == Some(0) {
            p.push("`backend.batch_max_enqueued_tokens` must be at least 1".to_string());
        }
        if !(1..=MAX_BATCH_POLL_SECONDS).contains(&self.batch_poll_seconds) {
            p.push(format!(
                "`backend.batch_poll_seconds` must be between 1 and {MAX_BATCH_POLL_SECONDS}, not {}",
                self.batch_poll_seconds
            ));
        }
    }
}

/// The windows an earlier run of the job learned for `model`, as its
/// output records them (a Parquet file's footer, a table's metadata), or
/// else as the checkpoint's newest part does, else, when neither exists, as
/// the last run's summary does: a run stopped before its end (the budget, a
/// signal) leaves no output, one stopped before it kept anything (a window
/// learned from a refusal, which is not billed, then a stall) no part
/// either, and probing again on the next run was billed again (28,569 units
/// against infinity) and could find another window, which changes the
/// chunks and refuses the checkpoint. None when none can be read yet; the
/// sink then reports the output.
///
/// Also whether the earlier run kept anything (an output or a checkpoint
/// part), with a window recorded or not: chunks it cut are not cut anew.
async fn earlier_window(job: &Job, model: &str) -> (crate::backend::RecordedWindow, bool) {
    let tokenizer = crate::backend::tokenizer_name(&job.chunking);
    let metadata = crate::sink::recorded(&job.output, job.shard)
        .await
        .unwrap_or_default();
    let recorded = crate::backend::RecordedWindow::of_output(&metadata, model, tokenizer);
    if recorded != crate::backend::RecordedWindow::default() {
        return (recorded, true);
    }
    let location = crate::state::StateLocation::for_job(job);
    let no_output = metadata.is_empty();
    let (part, summary) = tokio::task::spawn_blocking(move || {
        let part = crate::state::newest_part_metadata(&location);
        // The summary's only where nothing was kept: it may give the window
        // chunks refused mid-run were cut to, and chunks of kept vectors cut
        // anew to it would not be reused (nor the checkpoint, made under
        // another window).
        let summary = (no_output && part.is_empty())
            .then(|| crate::state::last_summary(&location))
            .flatten();
        (part, summary)
    })
    .await
    .unwrap_or_default();
    let kept = !no_output || !part.is_empty();
    let recorded = match summary {
        Some(summary) => crate::backend::RecordedWindow::of_summary(&summary, model, tokenizer),
        None => crate::backend::RecordedWindow::of_output(&part, model, tokenizer),
    };
    (recorded, kept)
}

/// Whether a listed window of `listed` tokens, counted by the model's own
/// tokenizer, may hold fewer of the job's tokens than the chunks it lets the
/// job cut: the job counts in an encoding, not as the model does
/// (`crate::job::counts_as`), and the window is less than twice those
/// chunks (a model's count of a text is seldom more than twice an
/// encoding's). A server that lists 512 and truncates there read
/// `cl100k_base` chunks of 512 only in part: 15 of the chunks of
/// `tests/it/window.rs`'s prose. Chunks set larger than the window are
/// refused before any work (`fitted_chunking`).
fn may_overflow(job: &Job, model: &str, listed: u64) -> bool {
    let tokenizer = crate::backend::tokenizer_name(&job.chunking);
    let chunks = job.chunking_for(Some(listed)).max_tokens as u64;
    crate::job::named_encoding(tokenizer)
        && !crate::job::counts_as(model, tokenizer)
        && chunks <= listed
        && listed < chunks.saturating_mul(2)
}

/// A listed window is counted in the model's own tokens, chunks in the
/// job's tokenizer: where the two counts may differ enough for the chunks
/// to overflow the window ([`may_overflow`]) and the probe does not check
/// it, the run says so.
fn units_warning(job: &Job, model: &str, listed: u64) -> String {
    let tokenizer = crate::backend::tokenizer_name(&job.chunking);
    format!(
        "{}; chunks are counted in {tokenizer} tokens, which may be fewer for the same text: \
         set {}or `backend.context_window` to the window in {tokenizer} tokens",
        super::window::lists(model, Some(listed)),
        super::window::OWN_TOKENIZER
    )
}

/// What a run knows of the model's window before it chunks, and what it
/// must still find out.
struct WindowPlan {
    /// A listed window the chunks may overflow, in the model's own count.
    unchecked: Option<u64>,
    /// What an earlier run learned, to cut the chunks as it did.
    earlier: crate::backend::RecordedWindow,
    /// Whether the probe looks for the window: what it says when it finds none.
    probe: Option<String>,
    /// The listed window the probe checks, if that is what it looks for.
    checked: Option<u64>,
}

/// The window the job sets, or the service lists (`listed`), and what the
/// run must find of it: nothing, what an earlier run learned, or what the
/// probe finds. Pushes the warnings that say what stays unknown.
async fn plan_window(
    job: &Job,
    api: &ApiParams,
    model: &str,
    listed: Option<u64>,
    warnings: &mut Vec<String>,
) -> WindowPlan {
    let window = api.context_window.or(listed);
    let unchecked = listed.filter(|&w| may_overflow(job, model, w));
    let unknown = format!(
        "the context window of model {model} is unknown (the service does not list it and \
         `backend.context_window` is not set): a server may silently truncate chunks longer \
         than the model takes, so keep `chunking.max_tokens` within it"
    );
    let (earlier, kept) = if window.is_none() || unchecked.is_some() {
        earlier_window(job, model).await
    } else {
        (crate::backend::RecordedWindow::default(), false)
    };
    // A window learned, or, where none is listed, a text at least as long
    // as the chunks found read whole.
    let remembered = earlier.chunks.is_some()
        || earlier.pieces.is_some()
        || (window.is_none() && earlier.read_whole_covers(job.chunking.max_tokens as u64));
    if window.is_none() && !remembered && !api.probe_window {
        warnings.push(unknown.clone());
    }
    // The probe checks a listed window the chunks may overflow where it
    // sets the chunk size, for a new output: chunks an earlier run cut under
    // it are not cut anew, which would refuse its output, and chunks the job
    // sets are its to choose (a smaller window found would refuse them).
    let checked = unchecked
        .filter(|_| api.probe_window && !remembered && !kept && !job.chunk_sizes_set.max_tokens);
    if let Some(listed) = unchecked.filter(|_| checked.is_none() && !remembered) {
        warnings.push(units_warning(job, model, listed));
    }
    let probe = match checked {
        Some(listed) => Some(units_warning(job, model, listed)),
        None => (window.is_none() && api.probe_window && !remembered).then_some(unknown),
    };
    WindowPlan {
        unchecked,
        earlier,
        probe,
        checked,
    }
}

/// The most inputs a request may hold as the service states it, when that
/// is fewer than `backend.max_inputs_per_request`, said in a warning: the
/// requests are made that small from the first, instead of learning it from
/// a refusal.
fn stated_inputs(
    stated: Option<usize>,
    b: &BackendShared,
    warnings: &mut Vec<String>,
) -> Option<usize> {
    let most = stated.filter(|&n| n < b.max_inputs_per_request)?;
    warnings.push(format!(
        "the service takes at most {most} inputs a request (GET /info, \
         `max_client_batch_size`): requests hold at most {most}, not \
         `backend.max_inputs_per_request` = {} (set it to {most} or fewer to say so)",
        b.max_inputs_per_request
    ));
    Some(most)
}

/// The most requests in flight: the job's (`backend.concurrency`, or
/// `auto`'s ceiling), or fewer when the server says it takes fewer at once
/// (TEI's `max_concurrent_requests`, more getting a 429), split among
/// `sharing` shards of the job, which share the server. A fixed concurrency
/// lowered so is said in a warning; `auto`'s ceiling is lowered quietly,
/// and the summary reports the concurrency it settled on.
fn stated_in_flight(
    stated: Option<usize>,
    sharing: u32,
    b: &BackendShared,
    warnings: &mut Vec<String>,
) -> usize {
    let configured = b.most_in_flight();
    let Some(stated) = stated else {
        return configured;
    };
    let part = (stated / usize::try_from(sharing).unwrap_or(usize::MAX).max(1)).max(1);
    if part >= configured {
        return configured;
    }
    if let Concurrency::Fixed(n) = b.concurrency {
        let shards = if sharing > 1 {
            format!(", {part} for each of the job's {sharing} shards")
        } else {
            String::new()
        };
        warnings.push(format!(
            "the service takes at most {stated} requests at once (GET /info, \
             `max_concurrent_requests`): at most {part} are sent at once{shards}, not \
             `backend.concurrency` = {n} (set it to {part} or fewer to say so)"
        ));
    }
    part
}

/// Batch mode's settings: the request's, and the batch price.
fn batch_service(
    api: &ApiParams,
    b: &BackendShared,
    client: Client,
    info: &crate::backend::BackendInfo,
    listed: Option<f64>,
) -> super::BatchService {
    super::BatchService {
        client,
        model: info.model.clone(),
        dimensions: b.dimensions,
        expected_dimensions: info.dimensions,
        completion_window: api.batch_completion_window.clone(),
        input_per_1k: super::batch_price(api.batch_input_per_1k.or(listed), info.input_per_1k),
        sync_input_per_1k: info.input_per_1k,
        max_enqueued_tokens: api.batch_max_enqueued_tokens,
        poll: Duration::from_secs(api.batch_poll_seconds),
    }
}

/// In batch mode, the backend gets the Batch API to submit to, priced by
/// the job, else the listing's batch price. A synchronous run knows that
/// price too, for what batches of an earlier run were billed.
fn batch_mode_and_price(
    backend: &mut ApiBackend,
    (api, b): (&ApiParams, &BackendShared),
    client: Client,
    listed: Option<&crate::client::Model>,
) {
    let listed_batch = listed
        .and_then(|m| m.pricing)
        .and_then(|p| p.batch_input_per_1k);
    if api.mode == Mode::Batch {
        let service = batch_service(api, b, client, backend.info(), listed_batch);
        backend.for_batch(service);
    } else {
        let price = super::batch_price(
            api.batch_input_per_1k.or(listed_batch),
            backend.info().input_per_1k,
        );
        backend.batches_priced_at(price);
    }
}

/// Checks the key and the model with the service, and makes the chunker
/// that counts as `chunking.tokenizer` says.
async fn build(job: &Job) -> Result<Embedding, Failure> {
    let b = &job.backend.shared;
    let api = job.backend.get::<ApiParams>().cloned().unwrap_or_default();
    let model = b.model.clone().unwrap_or_default();
    let key = std::env::var(&api.api_key_env).unwrap_or_default();
    let mut config = ClientConfig::new(api.base_url.clone().unwrap_or_default(), ApiKey::new(key));
    config.timeout =
        crate::job::seconds_in_range(Some(b.timeout_seconds)).unwrap_or(Duration::from_secs(60));
    config.api_path.clone_from(&api.api_path);
    let timeout = config.timeout;
    let client = Client::new(config).map_err(Failure::usage)?;
    let retry = RetryPolicy::with_max_retries(api.max_retries);
    let discovery = discover(&client, &model, &retry)
        .await
        .map_err(|e| match e {
            DiscoveryError::Unreachable(_) => Failure::failed(e),
            _ => Failure::usage(e),
        })?;
    let mut warnings = discovery.warnings;
    let max_inputs = stated_inputs(discovery.max_inputs, b, &mut warnings);
    let sharing = job.shard.map_or(1, |shard| shard.count);
    let concurrency = stated_in_flight(discovery.max_in_flight, sharing, b, &mut warnings);
    let listed = discovery.model.as_ref();
    let listed_window = listed
        .and_then(|m| m.context_window)
        .filter(|_| api.context_window.is_none());
    let plan = plan_window(job, &api, &model, listed_window, &mut warnings).await;
    let special_tokens = crate::chunk::special_tokens(&job.chunking).map_err(Failure::usage)?;
    let settings = ApiSettings {
        special_tokens,
        dimensions: b.dimensions,
        concurrency,
        adaptive: b.concurrency == Concurrency::Auto,
        timeout: Some(timeout),
        requests_per_minute: api.requests_per_minute,
        tokens_per_minute: api.tokens_per_minute,
        max_tokens_per_request: b.max_tokens_per_request as u64,
        retry,
        encoding: api.encoding_format,
        context_window: api.context_window,
        input_per_1k: api.input_per_1k,
        output_per_1k: api.output_per_1k,
        listed_price_source: discovery.price_source.clone(),
        warnings,
        renames_models: api.server_renames_models,
        stall_timeout: Duration::from_secs(api.stall_timeout_seconds),
        sharing,
        quota_window: api.quota_window(),
        max_inputs,
        ..ApiSettings::new(model)
    };
    let batch_client = client.clone();
    let mut backend = ApiBackend::new(client, settings, listed);
    batch_mode_and_price(&mut backend, (&api, b), batch_client, listed);
    let chunker_for = |chunking: &ChunkingConfig| {
        TokenChunker::for_config(chunking).map_err(|e| {
            let tokenizer = chunking.tokenizer.as_deref();
            if tokenizer.is_some_and(|t| !crate::job::named_tokenizer(t)) {
                Failure::usage(e)
            } else {
                Failure::failed(e)
            }
        })
    };
    // Chunks cut as the earlier run cut them, to reuse what it paid for:
    // no probe, which could find another window.
    if plan.probe.is_none() && listed_window.is_none() && api.context_window.is_none() {
        backend.remember_read_whole(plan.earlier.read_whole);
    }
    if let Some(chunks) = plan.earlier.chunks {
        backend.remember_window(chunks, &job.chunking, plan.unchecked);
    } else if let Some(pieces) = plan.earlier.pieces {
        backend.remember_pieces(pieces, &job.chunking, plan.unchecked);
    } else if let Some(unknown) = plan.probe {
        let unfitted = job.chunking_for(None);
        let counter = chunker_for(&unfitted)?;
        let count = |text: &str| counter.count_tokens(text);
        let model = ModelCount::of_job(&unfitted, &count, counter.special_tokens());
        let max_cost = job.budget.max_cost;
        // The probe measures the server's count on the job's own text.
        let (source, bytes) = (
            job.source.clone(),
            super::window::piece_bytes(unfitted.max_tokens),
        );
        let pieces = tokio::task::spawn_blocking(move || crate::source::sample(&source, bytes))
            .await
            .unwrap_or_default();
        let chunks = (unfitted.max_tokens, pieces.as_slice());
        let probed = backend
            .probe_window((&count, model), chunks, max_cost)
            .await;
        backend.learn_window(probed, &unfitted, &unknown, plan.checked);
    }
    let chunking = ChunkingConfig {
        wordpieces: backend.wordpieces(),
        ..fitted_chunking(job, backend.info())?
    };
    let chunker = chunker_for(&chunking)?;
    Ok(Embedding {
        backend: Arc::new(backend),
        chunker: Arc::new(chunker),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(concurrency: Concurrency) -> BackendShared {
        BackendShared {
            concurrency,
            ..BackendShared::default()
        }
    }

    #[test]
    fn the_servers_most_requests_at_once_caps_the_jobs_split_among_its_shards() {
        let mut warnings = Vec::new();
        let auto = shared(Concurrency::Auto);
        // TEI's default of 512 is above auto's ceiling of 64.
        assert_eq!(stated_in_flight(Some(512), 1, &auto, &mut warnings), 64);
        assert_eq!(stated_in_flight(None, 4, &auto, &mut warnings), 64);
        assert!(warnings.is_empty(), "{warnings:?}");
        // Auto's ceiling is lowered quietly; four shards take a quarter each.
        assert_eq!(stated_in_flight(Some(16), 1, &auto, &mut warnings), 16);
        assert_eq!(stated_in_flight(Some(16), 4, &auto, &mut warnings), 4);
        assert_eq!(stated_in_flight(Some(3), 8, &auto, &mut warnings), 1);
        assert!(warnings.is_empty(), "{warnings:?}");
        // A fixed concurrency above it is lowered with a warning.
        let fixed = shared(Concurrency::Fixed(8));
        assert_eq!(stated_in_flight(Some(8), 1, &fixed, &mut warnings), 8);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(stated_in_flight(Some(12), 3, &fixed, &mut warnings), 4);
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("at most 12 requests at once")
                && warnings[0].contains("4 for each of the job's 3 shards")
                && warnings[0].contains("`backend.concurrency` = 8"),
            "{warnings:?}"
        );
    }
}
