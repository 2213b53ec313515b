//! The `embedjob simulate` flags, as typed, and the [`SimConfig`] built from them.

use super::capacity::CapacityConfig;
use super::config::{BatchConfig, MAX_BATCH_FILE_BYTES, MAX_BATCH_INPUTS, MAX_BATCH_LINES};
use super::config::{Billing, DimensionsParam, Faults, KeySpec, ModelSpec, SimConfig, TokenCount};
use super::quota::{QuotaConfig, QuotaReset, QuotaWindow};
use super::window::ServerWindow;

/// Serve a simulator of the model service on 127.0.0.1, with fault injection.
#[derive(clap::Args, Debug, Clone)]
pub struct SimulateOptions {
    /// Port to listen on, on 127.0.0.1 (0 picks a free port; the base URL is printed on stdout)
    #[arg(long, default_value_t = 0)]
    pub port: u16,

    /// Accept this API key, optionally limited to some models (repeatable; none: accept any key)
    #[arg(long = "key", value_name = "KEY[=MODEL,MODEL...]")]
    pub keys: Vec<String>,

    /// Also serve an embedding model returning vectors of this length (repeatable);
    /// `:matryoshka` shortens them on `dimensions`, `:ignores-dimensions` ignores it,
    /// and without either `dimensions` gets a 400, as vLLM answers
    #[arg(
        long = "model",
        value_name = "ID=DIMS[:matryoshka|:ignores-dimensions]"
    )]
    pub models: Vec<String>,

    /// Delay every embeddings and chat request by this many milliseconds
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub latency_ms: u64,

    /// Take this many milliseconds per input to compute an embeddings request,
    /// billing it even when the client has stopped waiting, as a slow CPU server does
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub latency_per_input_ms: u64,

    /// Serve the routes under this path instead of /v1 ("" for the root, as infinity does)
    #[arg(long, value_name = "PREFIX", default_value = "/v1")]
    pub url_prefix: String,

    /// Answer GET /v1/models/{id} with FastAPI's 404, as infinity and llama-cpp-python do
    #[arg(long)]
    pub no_model_route: bool,

    /// Serve neither GET /v1/models nor GET /v1/models/{id}, as TEI does
    #[arg(long)]
    pub no_models_routes: bool,

    /// Serve LiteLLM's GET /v1/model/info: the models' prices per token and windows
    #[arg(long)]
    pub model_info: bool,

    /// Serve TEI's GET /info (the model's window, the most inputs a request), and
    /// refuse more inputs with TEI's 422
    #[arg(long)]
    pub tei_info: bool,

    /// List models without context window and price, as most servers do
    #[arg(long)]
    pub bare_listing: bool,

    /// Answer JSON floats whatever encoding_format asks for, as llama-cpp-python's server does
    #[arg(long)]
    pub floats_only: bool,

    /// Count billed tokens as cl100k tokens or as UTF-8 bytes / 4
    #[arg(long, value_name = "cl100k|bytes", default_value = "cl100k")]
    pub bill_by: String,

    /// Multiply each input's billed tokens by this (rounded up)
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub bill_factor: f64,

    /// Compute embeddings requests on this many workers, as a self-hosted
    /// server does: more wait in a queue, and each is computed and billed
    /// even when its client has hung up
    #[arg(long, value_name = "K")]
    pub capacity: Option<usize>,

    /// With --capacity: the milliseconds a request takes on a worker
    #[arg(long, value_name = "MS", default_value_t = 10.0)]
    pub service_ms: f64,

    /// With --capacity: the milliseconds a request takes per 1000 tokens, on top of --service-ms
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    pub service_ms_per_1k_tokens: f64,

    /// With --capacity: count a request's tokens for its time as a server that
    /// pads computes them, each input at the length of the request's longest
    #[arg(long)]
    pub padded: bool,

    /// With --capacity: requests waiting for a worker beyond which more get a 503
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub queue_limit: usize,

    /// With --capacity: after this many embeddings requests, the workers
    /// become --capacity-then (another client arrives, or leaves)
    #[arg(long, value_name = "N")]
    pub capacity_change_after: Option<u64>,

    /// The workers after --capacity-change-after
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub capacity_then: usize,

    /// Answer 429 to embeddings requests beyond this many at once
    #[arg(long, value_name = "N")]
    pub max_concurrent_requests: Option<usize>,

    /// Reject embeddings requests with more inputs than this
    #[arg(long, value_name = "N")]
    pub max_inputs_per_request: Option<usize>,

    /// Reject embeddings requests with more tokens than this, summed over the inputs
    #[arg(long, value_name = "N")]
    pub max_tokens_per_request: Option<u64>,

    /// Status of a too-many-inputs or too-many-tokens rejection: 400, 413, or 422
    /// (too many inputs then gets FastAPI's pydantic body, as infinity sends)
    #[arg(long, value_name = "STATUS", default_value_t = 413)]
    pub too_large_status: u16,

    /// Reject any input containing this text as longer than the model's context window
    #[arg(long, value_name = "SUBSTRING")]
    pub poison: Option<String>,

    /// Seed of the fault generator, so that a run's faults can be replayed
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Probability of a 429 with Retry-After
    #[arg(long = "rate-429", value_name = "P", default_value_t = 0.0)]
    pub rate_429: f64,

    /// Retry-After of a 429, in seconds
    #[arg(long, value_name = "SECONDS", default_value_t = 1)]
    pub retry_after_seconds: u64,

    /// Probability of a 500
    #[arg(long = "rate-500", value_name = "P", default_value_t = 0.0)]
    pub rate_500: f64,

    /// Probability of a 503
    #[arg(long = "rate-503", value_name = "P", default_value_t = 0.0)]
    pub rate_503: f64,

    /// Probability that the connection drops before any body byte
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub rate_drop: f64,

    /// Probability that the body is cut off half way
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub rate_truncate: f64,

    /// Probability of a normal response delayed by --slow-ms
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub rate_slow: f64,

    /// Delay of a slow response, in milliseconds
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub slow_ms: u64,

    /// Probability that embeddings come back in a shuffled order (indices still correct)
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub rate_shuffle: f64,

    /// Probability that one vector comes back one element short
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub rate_wrong_dimensions: f64,

    /// Probability that one vector value comes back as the bare token NaN
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub rate_nan: f64,

    /// Probability of a 200 whose body is an error object, as some gateways answer
    #[arg(long = "rate-error-200", value_name = "P", default_value_t = 0.0)]
    pub rate_error_200: f64,

    /// Probability of a bare 429 (no Retry-After) whose x-ratelimit headers claim
    /// the whole quota is left, as a server that lies about its limits sends
    #[arg(long = "rate-lying-429", value_name = "P", default_value_t = 0.0)]
    pub rate_lying_429: f64,

    /// Say `Retry-After: 0` (come back at once) on every 429 to an embeddings request
    #[arg(long)]
    pub zero_retry_after: bool,

    /// Allow each key this many embeddings requests per minute (refused ones count too),
    /// with x-ratelimit headers on every response, as OpenAI does
    #[arg(long, value_name = "N")]
    pub requests_per_minute: Option<u64>,

    /// Allow each key this many billed tokens per minute, as OpenAI does
    #[arg(long, value_name = "N")]
    pub tokens_per_minute: Option<u64>,

    /// The length of the quotas' minute, in milliseconds (shorter for tests and benchmarks)
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    pub quota_window_ms: u64,

    /// How the quotas count their minute: a bucket refilling continuously, or
    /// a sliding window of the uses made in the last minute
    #[arg(long, value_name = "bucket|sliding", default_value = "bucket")]
    pub quota_window: String,

    /// What a sliding window's x-ratelimit-reset tells: the time until its
    /// oldest use leaves it, or until it is whole again (OpenAI's wording:
    /// "until the rate limit resets to its initial state")
    #[arg(long, value_name = "oldest|whole", default_value = "oldest")]
    pub quota_reset: String,

    /// Enforce the quotas without sending x-ratelimit headers, as many gateways do
    #[arg(long)]
    pub no_ratelimit_headers: bool,

    /// Start each key's quotas used up rather than whole
    #[arg(long)]
    pub quota_start_empty: bool,

    /// After this many embeddings requests admitted, answer every request with
    /// a 429 `insufficient_quota` (the account is out of credit)
    #[arg(long, value_name = "N")]
    pub insufficient_quota_after: Option<u64>,

    /// Keep an unlisted window of TOKENS (the server's own word pieces) for
    /// every embedding model: read only its first tokens, or refuse in the
    /// words of OpenAI (400), TEI (422), vLLM (400) or llama.cpp's server
    /// (500 for a physical batch, 400 for a slot's context; `llamacpp-bare`
    /// without the numbers, as older builds); `:wordpiece` counts as
    /// bert-base-uncased does (all-MiniLM, BGE, E5), [CLS] and [SEP] included;
    /// `:tokenizer=PATH` as a model's own tokenizer.json does, the special
    /// tokens it adds included
    #[arg(
        long,
        value_name = "TOKENS:truncate|openai|tei|vllm|llamacpp|llamacpp-context|llamacpp-bare[:wordpiece|:tokenizer=PATH]"
    )]
    pub window: Option<String>,

    /// Inject at most this many faults in total
    #[arg(long, value_name = "N")]
    pub fault_limit: Option<u64>,

    /// Batch API: seconds from a batch's creation to `completed` (a tenth validating,
    /// eight tenths in progress, a tenth finalizing)
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    pub batch_seconds: f64,

    /// Batch API: each model's enqueued-token quota; a batch that would pass it
    /// fails with `token_limit_exceeded`
    #[arg(long, value_name = "N")]
    pub batch_enqueued_tokens: Option<u64>,

    /// Batch API: the first N batches fail validation
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub batch_fail_validation: u64,

    /// Batch API: probability that a line fails with a 500 (drawn from --seed)
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub batch_line_failures: f64,

    /// Batch API: a batch expires this many seconds after its creation, the lines
    /// done by then in its output file and the rest `batch_expired`
    #[arg(long, value_name = "S")]
    pub batch_expire_after: Option<f64>,

    /// Batch API: with --batch-expire-after, only the first N batches expire
    #[arg(long, value_name = "N")]
    pub batch_expire_first: Option<u64>,

    /// Batch API: the first N batches stay in_progress, half their lines done, until cancelled
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub batch_stuck: u64,

    /// Batch API: write output lines in the input's order (by default they are shuffled)
    #[arg(long)]
    pub batch_in_order: bool,

    /// Batch API: the first N `POST /v1/batches` create the batch, then drop the
    /// connection without an answer
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub batch_create_drop: u64,

    /// Batch API: the first N `POST /v1/files` store the file, then drop the
    /// connection without an answer
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub batch_upload_drop: u64,

    /// Batch API: pad each output line with this many bytes (in a field the
    /// client does not know), to test the client's bound on a line
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub batch_line_padding: usize,

    /// Batch API: the most lines of a batch
    #[arg(long, value_name = "N", default_value_t = MAX_BATCH_LINES)]
    pub batch_max_lines: usize,

    /// Batch API: the most embedding inputs of a batch
    #[arg(long, value_name = "N", default_value_t = MAX_BATCH_INPUTS)]
    pub batch_max_inputs: u64,

    /// Batch API: the largest input file, in bytes
    #[arg(long, value_name = "BYTES", default_value_t = MAX_BATCH_FILE_BYTES)]
    pub batch_max_file_bytes: u64,
}

impl SimulateOptions {
    /// Builds and validates the configuration.
    ///
    /// # Errors
    /// Every invalid flag, one per line.
    pub fn to_config(&self) -> Result<SimConfig, String> {
        let mut problems = Vec::new();
        let mut models = ModelSpec::defaults();
        for spec in &self.models {
            match parse_model(spec) {
                Ok(model) => {
                    // A flag naming a default model replaces it.
                    models.retain(|m| m.id != model.id);
                    models.push(model);
                }
                Err(problem) => problems.push(problem),
            }
        }
        let keys = self
            .keys
            .iter()
            .filter_map(|spec| parse_key(spec).map_err(|p| problems.push(p)).ok())
            .collect();
        let count = match self.bill_by.as_str() {
            "cl100k" => TokenCount::Cl100k,
            "bytes" => TokenCount::Bytes,
            other => {
                problems.push(format!("--bill-by {other}: expected cl100k or bytes"));
                TokenCount::Cl100k
            }
        };
        let quota = self.quota(&mut problems);
        let config = SimConfig {
            port: self.port,
            models,
            keys,
            latency_ms: self.latency_ms,
            latency_per_input_ms: self.latency_per_input_ms,
            url_prefix: self.url_prefix.clone(),
            model_route: !self.no_model_route,
            models_routes: !self.no_models_routes,
            model_info: self.model_info,
            tei_info: self.tei_info,
            bare_listing: self.bare_listing,
            floats_only: self.floats_only,
            billing: Billing {
                count,
                factor: self.bill_factor,
            },
            max_inputs_per_request: self.max_inputs_per_request,
            max_tokens_per_request: self.max_tokens_per_request,
            max_concurrent_requests: self.max_concurrent_requests,
            too_large_status: self.too_large_status,
            poison: self.poison.clone(),
            faults: Faults {
                seed: self.seed,
                rate_429: self.rate_429,
                retry_after_seconds: self.retry_after_seconds,
                rate_500: self.rate_500,
                rate_503: self.rate_503,
                rate_drop: self.rate_drop,
                rate_truncate: self.rate_truncate,
                rate_slow: self.rate_slow,
                slow_ms: self.slow_ms,
                rate_shuffle: self.rate_shuffle,
                rate_wrong_dimensions: self.rate_wrong_dimensions,
                rate_nan: self.rate_nan,
                rate_error_200: self.rate_error_200,
                rate_lying_429: self.rate_lying_429,
                zero_retry_after: self.zero_retry_after,
                limit: self.fault_limit,
            },
            quota,
            window: self
                .window
                .as_deref()
                .and_then(|spec| ServerWindow::parse(spec).map_err(|p| problems.push(p)).ok()),
            capacity: CapacityConfig {
                workers: self.capacity,
                base: milliseconds(self.service_ms, "--service-ms", &mut problems),
                per_1k_tokens: milliseconds(
                    self.service_ms_per_1k_tokens,
                    "--service-ms-per-1k-tokens",
                    &mut problems,
                ),
                padded: self.padded,
                queue: self.queue_limit,
                change_after: self.capacity_change_after,
                then: self.capacity_then,
            },
            batches: self.batch_config(&mut problems),
            ..SimConfig::default()
        };
        if let Err(more) = config.validate() {
            problems.extend(more.lines().map(flag_names));
        }
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// `--quota-window`: a bucket or a sliding window, or a problem.
fn quota_window(name: &str, problems: &mut Vec<String>) -> QuotaWindow {
    match name {
        "bucket" => QuotaWindow::Bucket,
        "sliding" => QuotaWindow::Sliding,
        other => {
            problems.push(format!(
                "--quota-window {other}: expected bucket or sliding"
            ));
            QuotaWindow::Bucket
        }
    }
}

/// A duration typed in milliseconds, or a problem; at most an hour.
fn milliseconds(ms: f64, flag: &str, problems: &mut Vec<String>) -> std::time::Duration {
    if ms.is_finite() && (0.0..=3_600_000.0).contains(&ms) {
        std::time::Duration::from_secs_f64(ms / 1000.0)
    } else {
        problems.push(format!(
            "{flag} {ms}: expected milliseconds from 0 to 3600000"
        ));
        std::time::Duration::ZERO
    }
}

/// Names the flags the user typed rather than the configuration fields.
fn flag_names(line: &str) -> String {
    const FIELDS: [&str; 27] = [
        "batch_line_failures",
        "batch_max_lines",
        "batch_max_inputs",
        "batch_max_file_bytes",
        "capacity_then",
        "queue_limit",
        // Not the start of capacity_then, which is named already.
        "capacity must",
        "requests_per_minute",
        "tokens_per_minute",
        "quota_window_ms",
        "too_large_status",
        "url_prefix",
        "bill_factor",
        "rate_error_200",
        "rate_lying_429",
        "max_inputs_per_request",
        "max_tokens_per_request",
        "poison",
        "rate_429",
        "rate_500",
        "rate_503",
        "rate_drop",
        "rate_truncate",
        "rate_slow",
        "rate_shuffle",
        "rate_wrong_dimensions",
        "rate_nan",
    ];
    FIELDS.iter().fold(line.to_string(), |line, field| {
        line.replace(field, &format!("--{}", field.replace('_', "-")))
    })
}

fn parse_model(spec: &str) -> Result<ModelSpec, String> {
    let (id, dims) = spec
        .split_once('=')
        .ok_or_else(|| format!("--model {spec}: expected ID=DIMS, e.g. my-embed=768"))?;
    let (dims, dimensions_param) = match dims.split_once(':') {
        None => (dims, DimensionsParam::Refuse),
        Some((dims, "matryoshka")) => (dims, DimensionsParam::Truncate),
        Some((dims, "ignores-dimensions")) => (dims, DimensionsParam::Ignore),
        Some((_, other)) => {
            return Err(format!(
                "--model {spec}: '{other}' is not matryoshka or ignores-dimensions"
            ))
        }
    };
    let id = id.trim();
    if id.is_empty() {
        return Err(format!("--model {spec}: the model id is empty"));
    }
    let dims: usize = dims
        .trim()
        .parse()
        .map_err(|_| format!("--model {spec}: '{dims}' is not a vector length"))?;
    if dims == 0 {
        return Err(format!(
            "--model {spec}: the vector length must be at least 1"
        ));
    }
    Ok(ModelSpec {
        dimensions_param,
        ..ModelSpec::embedding(id, dims)
    })
}

fn parse_key(spec: &str) -> Result<KeySpec, String> {
    // Messages never repeat the key itself.
    let (key, models) = match spec.split_once('=') {
        Some((key, models)) => {
            let models: Vec<String> = models
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect();
            if models.is_empty() {
                return Err("--key KEY=MODELS: the model list is empty".to_string());
            }
            (key, Some(models))
        }
        None => (spec, None),
    };
    if key.is_empty() {
        return Err("--key: the key is empty".to_string());
    }
    Ok(KeySpec {
        key: key.to_string(),
        models,
    })
}

impl SimulateOptions {
    /// The quotas the flags set.
    fn quota(&self, problems: &mut Vec<String>) -> QuotaConfig {
        let reset = match self.quota_reset.as_str() {
            "oldest" => QuotaReset::Oldest,
            "whole" => QuotaReset::Whole,
            other => {
                problems.push(format!("--quota-reset {other}: expected oldest or whole"));
                QuotaReset::Oldest
            }
        };
        QuotaConfig {
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
            window: std::time::Duration::from_millis(self.quota_window_ms),
            kind: quota_window(&self.quota_window, problems),
            reset,
            headers: !self.no_ratelimit_headers,
            insufficient_after: self.insufficient_quota_after,
            start_empty: self.quota_start_empty,
        }
    }

    /// The Batch API's part of the configuration.
    fn batch_config(&self, problems: &mut Vec<String>) -> BatchConfig {
        BatchConfig {
            duration: seconds(self.batch_seconds, "--batch-seconds", problems),
            enqueued_tokens: self.batch_enqueued_tokens,
            fail_validation: self.batch_fail_validation,
            line_failures: self.batch_line_failures,
            expire_after: self
                .batch_expire_after
                .map(|s| seconds(s, "--batch-expire-after", problems)),
            expire_first: self.batch_expire_first,
            stuck: self.batch_stuck,
            in_order: self.batch_in_order,
            create_drop: self.batch_create_drop,
            upload_drop: self.batch_upload_drop,
            line_padding: self.batch_line_padding,
            max_lines: self.batch_max_lines,
            max_inputs: self.batch_max_inputs,
            max_file_bytes: self.batch_max_file_bytes,
            ..BatchConfig::default()
        }
    }
}

/// A duration typed in seconds, or a problem; at most a day, the completion window.
fn seconds(s: f64, flag: &str, problems: &mut Vec<String>) -> std::time::Duration {
    if s.is_finite() && (0.0..=86_400.0).contains(&s) {
        std::time::Duration::from_secs_f64(s)
    } else {
        problems.push(format!("{flag} {s}: expected seconds from 0 to 86400"));
        std::time::Duration::ZERO
    }
}
