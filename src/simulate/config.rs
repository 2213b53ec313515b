//! What the simulator serves and which faults it injects.

use std::collections::HashSet;
use std::time::Duration;

use super::capacity::CapacityConfig;
use super::quota::QuotaConfig;
use super::window::ServerWindow;

/// Everything a [`Simulator`](super::Simulator) needs: models, keys, limits and faults.
///
/// `SimConfig::default()` serves the four models of the service, accepts any
/// non-empty key and injects no faults.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Models served, in listing order.
    pub models: Vec<ModelSpec>,
    /// Known keys. Empty: any non-empty bearer key is accepted and sees every model.
    pub keys: Vec<KeySpec>,
    /// Fixed delay before every embeddings and chat request is handled. Not a fault.
    pub latency_ms: u64,
    /// Time an embeddings request takes to compute, per input, as on a slow
    /// CPU server. The answer is billed when computed, even if the client
    /// has given up waiting by then.
    pub latency_per_input_ms: u64,
    /// The path the API's routes sit under: `/v1` (the default), or `""`
    /// for routes at the root, as infinity serves them by default.
    pub url_prefix: String,
    /// Serve `GET /v1/models/{id}`. Without it the route answers a FastAPI
    /// 404 (`{"detail":"Not Found"}`), as infinity and llama-cpp-python do.
    pub model_route: bool,
    /// Serve `GET /v1/models` and `GET /v1/models/{id}` at all. Without
    /// them both are unknown URLs (404), as on TEI.
    pub models_routes: bool,
    /// Serve LiteLLM's `GET /v1/model/info`: each model's prices per token
    /// and window, in LiteLLM's shape.
    pub model_info: bool,
    /// Serve TEI's `GET /info` at the root: the first embedding model's id,
    /// window and the most inputs a request may hold, and refuse more inputs
    /// with TEI's 422.
    pub tei_info: bool,
    /// Describe models by `id`, `object`, `created` and `owned_by` only, without
    /// a context window or a price, as most servers list them.
    pub bare_listing: bool,
    /// Answer JSON numbers whatever `encoding_format` asks for, as
    /// llama-cpp-python's server does (it ignores the field).
    pub floats_only: bool,
    /// How the tokens reported in `usage` (and billed) are counted.
    pub billing: Billing,
    /// Most inputs one embeddings request may carry.
    pub max_inputs_per_request: Option<usize>,
    /// Most tokens (summed over the inputs) one embeddings request may carry.
    pub max_tokens_per_request: Option<u64>,
    /// Status for the two request-level too-large errors: 400, 413, or 422
    /// (with a FastAPI/pydantic body, as infinity answers too many inputs).
    pub too_large_status: u16,
    /// An input containing this text is rejected as longer than the context window.
    pub poison: Option<String>,
    /// Largest request body accepted; larger bodies get a 413.
    pub max_body_bytes: usize,
    /// Most embeddings requests served at once; more get a 429 with
    /// `Retry-After`, as a service with a concurrency limit answers.
    pub max_concurrent_requests: Option<usize>,
    /// Injected faults.
    pub faults: Faults,
    /// Requests and tokens per minute per key, as OpenAI enforces them.
    pub quota: QuotaConfig,
    /// A window every embedding model keeps in the server's own tokens,
    /// beyond which it truncates or refuses; unlisted.
    pub window: Option<ServerWindow>,
    /// A self-hosted server's workers and queue (off by default).
    pub capacity: CapacityConfig,
    /// The Batch API's clock, limits and faults.
    pub batches: BatchConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            port: 0,
            models: ModelSpec::defaults(),
            keys: Vec::new(),
            latency_ms: 0,
            latency_per_input_ms: 0,
            url_prefix: "/v1".to_string(),
            model_route: true,
            models_routes: true,
            model_info: false,
            tei_info: false,
            bare_listing: false,
            floats_only: false,
            billing: Billing::default(),
            max_inputs_per_request: None,
            max_tokens_per_request: None,
            too_large_status: 413,
            poison: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_concurrent_requests: None,
            faults: Faults::default(),
            quota: QuotaConfig::default(),
            window: None,
            capacity: CapacityConfig::default(),
            batches: BatchConfig::default(),
        }
    }
}

/// Default for [`SimConfig::max_body_bytes`]: 64 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// The most inputs TEI takes in a request by default (`max_client_batch_size`).
pub const TEI_BATCH_SIZE: usize = 32;

impl SimConfig {
    /// The most inputs one embeddings request may carry: as set, else TEI's
    /// default when the simulator answers as TEI.
    pub fn most_inputs(&self) -> Option<usize> {
        self.max_inputs_per_request
            .or(self.tei_info.then_some(TEI_BATCH_SIZE))
    }

    /// Checks the whole configuration and reports every problem at once, one per line.
    ///
    /// # Errors
    /// A message naming each invalid setting.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        if ![400, 413, 422].contains(&self.too_large_status) {
            problems.push(format!(
                "too_large_status must be 400, 413 or 422, got {}",
                self.too_large_status
            ));
        }
        let prefix = &self.url_prefix;
        if !(prefix.is_empty() || (prefix.starts_with('/') && !prefix.ends_with('/')))
            || prefix.starts_with("/_ledger")
        {
            problems.push(format!(
                "url_prefix must be empty or a path such as /v1 (no trailing /), got {prefix:?}"
            ));
        }
        if !(self.billing.factor.is_finite()
            && self.billing.factor > 0.0
            && self.billing.factor <= 1000.0)
        {
            problems.push(format!(
                "bill_factor must be more than 0 and at most 1000, got {}",
                self.billing.factor
            ));
        }
        if self.max_inputs_per_request == Some(0) {
            problems.push("max_inputs_per_request must be at least 1".to_string());
        }
        if self.max_tokens_per_request == Some(0) {
            problems.push("max_tokens_per_request must be at least 1".to_string());
        }
        if self.poison.as_deref() == Some("") {
            problems.push("poison must not be empty".to_string());
        }
        if self.max_body_bytes == 0 {
            problems.push("max_body_bytes must be at least 1".to_string());
        }
        self.capacity.problems(&mut problems);
        self.batches.problems(&mut problems);
        let mut ids = HashSet::new();
        for model in &self.models {
            if model.id.is_empty() {
                problems.push("a model id must not be empty".to_string());
            } else if !ids.insert(model.id.as_str()) {
                problems.push(format!("model '{}' is defined twice", model.id));
            }
            if let ModelKind::Embedding { dimensions: 0 } = model.kind {
                problems.push(format!(
                    "model '{}' must have at least 1 dimension",
                    model.id
                ));
            }
            if model.context_window == 0 {
                problems.push(format!(
                    "model '{}' must have a context window of at least 1 token",
                    model.id
                ));
            }
        }
        let mut keys = HashSet::new();
        for key in &self.keys {
            if key.key.is_empty() {
                problems.push("a key must not be empty".to_string());
            } else if !keys.insert(key.key.as_str()) {
                // The key itself is not repeated: configuration errors may end up in logs.
                problems.push("the same key is configured twice".to_string());
            }
            for model in key.models.iter().flatten() {
                if !ids.contains(model.as_str()) {
                    problems.push(format!("a key is limited to unknown model '{model}'"));
                }
            }
        }
        problems.extend(self.faults.problems());
        problems.extend(self.quota.problems());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }

    pub(crate) fn model(&self, id: &str) -> Option<&ModelSpec> {
        self.models.iter().find(|m| m.id == id)
    }
}

/// How the tokens of an embeddings request are counted for `usage` and the bill.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Billing {
    pub count: TokenCount,
    /// Each input's count is multiplied by this and rounded up.
    pub factor: f64,
}

impl Default for Billing {
    fn default() -> Self {
        Billing {
            count: TokenCount::Cl100k,
            factor: 1.0,
        }
    }
}

/// What a service counts as an input's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenCount {
    /// `cl100k_base` tokens, as the hosted models count (and embedjob by default).
    Cl100k,
    /// UTF-8 bytes divided by 4, rounded up, as OpenAI's request cap counts.
    Bytes,
}

/// What a model does with a request's `dimensions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DimensionsParam {
    /// Truncates its vectors to the length asked for and renormalises them
    /// (Matryoshka models, as OpenAI's v3 models do).
    Truncate,
    /// Answers 400, as vLLM does for models not trained for it.
    Refuse,
    /// Ignores it and sends its own length, as some servers do.
    Ignore,
}

/// One model the simulator serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub id: String,
    pub kind: ModelKind,
    /// What an embeddings request's `dimensions` does.
    pub dimensions_param: DimensionsParam,
    /// Largest input, in tokens, for one text (embeddings) or one conversation (chat).
    pub context_window: u32,
    pub modalities: Vec<String>,
    /// Price per 1000 input tokens.
    pub input_per_1k: f64,
    /// Price per 1000 output tokens.
    pub output_per_1k: f64,
}

/// What a model does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// Serves `/v1/embeddings` with vectors of this length.
    Embedding { dimensions: usize },
    /// Serves `/v1/chat/completions`.
    Chat,
}

impl ModelSpec {
    /// An embedding model with the given vector length, a context window of
    /// 8192 tokens and a price of 0.0001 per 1000 input tokens, that refuses
    /// `dimensions` as vLLM does.
    pub fn embedding(id: impl Into<String>, dimensions: usize) -> ModelSpec {
        ModelSpec {
            id: id.into(),
            kind: ModelKind::Embedding { dimensions },
            dimensions_param: DimensionsParam::Refuse,
            context_window: 8192,
            modalities: vec!["text".to_string()],
            input_per_1k: 0.0001,
            output_per_1k: 0.0,
        }
    }

    /// The four models of the service: `svc-embed-1`, `svc-embed-1-l`, `svc-base`, `svc-pro`.
    pub fn defaults() -> Vec<ModelSpec> {
        let text = || vec!["text".to_string()];
        vec![
            ModelSpec {
                dimensions_param: DimensionsParam::Truncate,
                ..ModelSpec::embedding("svc-embed-1", 1024)
            },
            ModelSpec {
                input_per_1k: 0.00013,
                dimensions_param: DimensionsParam::Truncate,
                ..ModelSpec::embedding("svc-embed-1-l", 3072)
            },
            ModelSpec {
                id: "svc-base".to_string(),
                kind: ModelKind::Chat,
                dimensions_param: DimensionsParam::Refuse,
                context_window: 128_000,
                modalities: text(),
                input_per_1k: 0.0005,
                output_per_1k: 0.0015,
            },
            ModelSpec {
                id: "svc-pro".to_string(),
                kind: ModelKind::Chat,
                dimensions_param: DimensionsParam::Refuse,
                context_window: 128_000,
                modalities: vec!["text".to_string(), "vision".to_string()],
                input_per_1k: 0.003,
                output_per_1k: 0.015,
            },
        ]
    }

    /// The vector length, for an embedding model.
    pub fn dimensions(&self) -> Option<usize> {
        match self.kind {
            ModelKind::Embedding { dimensions } => Some(dimensions),
            ModelKind::Chat => None,
        }
    }
}

/// An accepted API key and the models it may see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpec {
    pub key: String,
    /// `None`: the key sees every model.
    pub models: Option<Vec<String>>,
}

impl KeySpec {
    pub(crate) fn sees(&self, model: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|models| models.iter().any(|m| m == model))
    }
}

/// Fault injection. Every embeddings or chat request that passes validation
/// draws once from one seeded generator and gets at most one fault; each
/// `rate_*` is that fault's probability.
#[derive(Clone, Debug, PartialEq)]
pub struct Faults {
    /// Seed of the generator, so that a run's faults can be replayed.
    pub seed: u64,
    /// 429 with `Retry-After` and `retry-after-ms`.
    pub rate_429: f64,
    /// Value of `Retry-After` on a 429.
    pub retry_after_seconds: u64,
    /// 500 with an error body.
    pub rate_500: f64,
    /// 503 with an error body.
    pub rate_503: f64,
    /// The connection dies before any body byte.
    pub rate_drop: f64,
    /// Half the body is sent, then the connection dies (a chat stream ends without `[DONE]`).
    pub rate_truncate: f64,
    /// A normal response after `slow_ms`.
    pub rate_slow: f64,
    /// Delay of a slow response.
    pub slow_ms: u64,
    /// Embeddings only: items in a shuffled order, indices still correct.
    pub rate_shuffle: f64,
    /// Embeddings only: one vector one element short.
    pub rate_wrong_dimensions: f64,
    /// Embeddings only: one value written as the bare token `NaN`.
    pub rate_nan: f64,
    /// A 200 whose body is an error object, as some gateways answer; not billed.
    pub rate_error_200: f64,
    /// A bare 429 (no `Retry-After`) whose `x-ratelimit-*` headers claim the
    /// whole quota is left, as a server that lies about its limits sends.
    pub rate_lying_429: f64,
    /// Every 429 to an embeddings request says `Retry-After: 0` and
    /// `retry-after-ms: 0` (come back at once), whatever the wait.
    pub zero_retry_after: bool,
    /// Most faults injected in total; `None`: no limit.
    pub limit: Option<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            seed: 0,
            rate_429: 0.0,
            retry_after_seconds: 1,
            rate_500: 0.0,
            rate_503: 0.0,
            rate_drop: 0.0,
            rate_truncate: 0.0,
            rate_slow: 0.0,
            slow_ms: 1000,
            rate_shuffle: 0.0,
            rate_wrong_dimensions: 0.0,
            rate_nan: 0.0,
            rate_error_200: 0.0,
            rate_lying_429: 0.0,
            zero_retry_after: false,
            limit: None,
        }
    }
}

impl Faults {
    /// Each fault's name (as recorded in the ledger) and probability, in drawing order.
    pub(crate) fn rates(&self) -> [(&'static str, f64); 11] {
        [
            ("429", self.rate_429),
            ("500", self.rate_500),
            ("503", self.rate_503),
            ("drop", self.rate_drop),
            ("truncate", self.rate_truncate),
            ("slow", self.rate_slow),
            ("shuffle", self.rate_shuffle),
            ("wrong_dimensions", self.rate_wrong_dimensions),
            ("nan", self.rate_nan),
            ("error_200", self.rate_error_200),
            ("lying_429", self.rate_lying_429),
        ]
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut sum = 0.0;
        for (name, rate) in self.rates() {
            if !(0.0..=1.0).contains(&rate) {
                problems.push(format!("rate_{name} must be between 0 and 1, got {rate}"));
            } else {
                sum += rate;
            }
        }
        // A little slack so that rates like 0.1 + 0.2 + 0.7 are not refused for rounding.
        if sum > 1.0 + 1e-9 {
            problems.push(format!(
                "the fault rates add up to {sum}, more than 1: a request gets at most one fault"
            ));
        }
        problems
    }
}

/// The largest file the Batch API takes: 200 MB.
pub const MAX_BATCH_FILE_BYTES: u64 = 200 * 1_000_000;
/// The most lines of a batch's input file.
pub const MAX_BATCH_LINES: usize = 50_000;
/// The most embedding inputs across all lines of one batch.
pub const MAX_BATCH_INPUTS: u64 = 50_000;

/// How the Batch API behaves: its clock, limits and faults.
///
/// Faults that name "the first N batches" count batches in the order they
/// were created since the simulator started, dropped creations included.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchConfig {
    /// How long a batch takes from creation to `completed`: a tenth
    /// validating, eight tenths in progress (its lines done evenly over that
    /// time), a tenth finalizing.
    pub duration: Duration,
    /// The enqueued-token quota of each model: a batch whose tokens, with
    /// those of the model's batches not yet finished, would pass it fails
    /// with `token_limit_exceeded`.
    pub enqueued_tokens: Option<u64>,
    /// The first N batches fail validation.
    pub fail_validation: u64,
    /// Probability that a line fails with a 500 (not billed), drawn from `--seed`.
    pub line_failures: f64,
    /// A batch expires this long after its creation: the lines done by
    /// then in its output file, the rest `batch_expired` in its error file.
    pub expire_after: Option<Duration>,
    /// Only the first N batches expire; `None`: every batch.
    pub expire_first: Option<u64>,
    /// The first N batches stay `in_progress`, half their lines done, until cancelled.
    pub stuck: u64,
    /// Output lines in the input's order; otherwise shuffled, as OpenAI
    /// promises no order.
    pub in_order: bool,
    /// The first N `POST /v1/batches` create the batch, then drop the connection unanswered.
    pub create_drop: u64,
    /// The first N `POST /v1/files` store the file, then drop the connection unanswered.
    pub upload_drop: u64,
    /// Bytes of padding in each output line (an unknown field), to make lines long.
    pub line_padding: usize,
    /// The largest file accepted.
    pub max_file_bytes: u64,
    /// The most lines of one batch.
    pub max_lines: usize,
    /// The most embedding inputs of one batch.
    pub max_inputs: u64,
    /// The most bytes of files kept at once; an upload beyond it is refused.
    pub max_stored_bytes: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            duration: Duration::from_secs(1),
            enqueued_tokens: None,
            fail_validation: 0,
            line_failures: 0.0,
            expire_after: None,
            expire_first: None,
            stuck: 0,
            in_order: false,
            create_drop: 0,
            upload_drop: 0,
            line_padding: 0,
            max_file_bytes: MAX_BATCH_FILE_BYTES,
            max_lines: MAX_BATCH_LINES,
            max_inputs: MAX_BATCH_INPUTS,
            max_stored_bytes: 10 * 1024 * 1024 * 1024,
        }
    }
}

impl BatchConfig {
    pub(crate) fn problems(&self, problems: &mut Vec<String>) {
        if !(0.0..=1.0).contains(&self.line_failures) {
            problems.push(format!(
                "batch_line_failures must be between 0 and 1, got {}",
                self.line_failures
            ));
        }
        for (name, value) in [
            ("batch_max_lines", self.max_lines as u64),
            ("batch_max_inputs", self.max_inputs),
            ("batch_max_file_bytes", self.max_file_bytes),
        ] {
            if value == 0 {
                problems.push(format!("{name} must be at least 1"));
            }
        }
    }

    /// Whether the batch created `seq`-th (from 0) expires.
    pub(crate) fn expires(&self, seq: u64) -> Option<Duration> {
        self.expire_after
            .filter(|_| self.expire_first.is_none_or(|first| seq < first))
    }
}
