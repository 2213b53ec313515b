//! What the simulator received and what it billed.

use std::collections::{BTreeMap, HashMap};

use super::capacity::CapacityStats;

/// Counters of everything the simulator saw, so that tests can check what a
/// client sent and what it paid for.
///
/// An embeddings response is billed once it is computed, as a real service
/// bills, whether or not the client reads it, and whether or not its vectors
/// are valid: a normal, slow or shuffled response, and one with a short or a
/// NaN vector. A refused request, a dropped or cut-off one, and an error in a
/// 200 body are not billed.
///
/// `texts` grows with the number of distinct texts billed; it is the only
/// state of the simulator that is not bounded. Leave it out of
/// `GET /_ledger` with `?texts=false`, and empty it with `POST /_ledger/reset`.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Ledger {
    /// Every HTTP request to `/v1/*`.
    pub requests: u64,
    /// `POST /v1/embeddings` received, whatever the outcome.
    pub embedding_requests: u64,
    /// Embeddings responses billed.
    pub billed_requests: u64,
    /// `POST /v1/chat/completions` received, whatever the outcome.
    pub chat_requests: u64,
    /// Tokens of billed embeddings requests.
    pub prompt_tokens: u64,
    /// Tokens of billed embeddings requests.
    pub total_tokens: u64,
    /// Tokens of billed embeddings requests as a server that pads computes
    /// them: each request's inputs times its longest input's tokens.
    pub padded_tokens: u64,
    /// Faults by name: the injected ones and `too_large` rejections.
    pub faults: BTreeMap<String, u64>,
    /// Hex SHA-256 of each billed input text, and how many times it was billed.
    pub texts: HashMap<String, u64>,
    /// Hex SHA-256 of each billed input text the model read only the start
    /// of (a window that truncates), and how many times.
    pub partly_read: HashMap<String, u64>,
    /// Billed requests by their number of inputs.
    pub billed_sizes: BTreeMap<u64, u64>,
    /// Embeddings requests refused by the quota (429), by the limit that
    /// refused them: `requests`, `tokens` or `insufficient_quota`.
    pub refused: BTreeMap<String, u64>,
    /// The most refusals of one key's quota in a row, with no request admitted between.
    pub longest_refusal_run: u64,
    /// The most embeddings requests in flight at once before the first
    /// embeddings answer left: whether a client starts with a full window.
    pub in_flight_before_first_answer: u64,
    /// Embeddings requests computed (and billed) after their client had
    /// hung up, as a server that does not notice computes them.
    pub computed_after_hangup: u64,
    /// The texts of those requests.
    pub texts_after_hangup: u64,
    /// Batches created through `POST /v1/batches`, dropped answers included.
    pub batches_created: u64,
    /// Of them, those whose answer was dropped (`--batch-create-drop`).
    pub batch_creates_dropped: u64,
    /// Uploads stored whose answer was dropped (`--batch-upload-drop`).
    pub batch_uploads_dropped: u64,
    /// Lines of batches completed and billed (also counted in `billed_requests`).
    pub batch_lines_billed: u64,
    /// Tokens of those lines, billed at the batch price (also counted in `prompt_tokens`).
    pub batch_tokens: u64,
    /// Lines of batches that failed (error file), not billed.
    pub batch_lines_failed: u64,
    /// Lines of batches that expired unprocessed (`batch_expired`), not billed.
    pub batch_lines_expired: u64,
    /// What the capacity model saw, when it is on.
    pub capacity: Option<CapacityStats>,
    /// Refusals in a row so far, by key.
    #[serde(skip)]
    pub refusal_runs: HashMap<String, u64>,
}

impl Ledger {
    /// Counts a quota's answer to `key`: a refusal by `limit`, or an admission.
    pub(crate) fn record_quota(&mut self, key: &str, refused: Option<&str>) {
        match refused {
            Some(limit) => {
                *self.refused.entry(limit.to_string()).or_insert(0) += 1;
                if self.refusal_runs.len() >= 4096 && !self.refusal_runs.contains_key(key) {
                    self.refusal_runs.clear();
                }
                let run = self.refusal_runs.entry(key.to_string()).or_insert(0);
                *run += 1;
                self.longest_refusal_run = self.longest_refusal_run.max(*run);
            }
            None => {
                self.refusal_runs.remove(key);
            }
        }
    }

    /// Distinct texts billed more than once.
    pub fn texts_billed_twice(&self) -> usize {
        self.texts.values().filter(|&&n| n > 1).count()
    }

    /// Requests the quota refused, all limits together.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }

    pub(crate) fn record_fault(&mut self, name: &str) {
        *self.faults.entry(name.to_string()).or_insert(0) += 1;
    }

    /// Bills one completed line of a batch, as [`Ledger::bill`] bills a request.
    pub(crate) fn bill_batch_line(
        &mut self,
        tokens: u64,
        text_hashes: Vec<String>,
        partly_read: Vec<String>,
    ) {
        self.batch_lines_billed += 1;
        self.batch_tokens += tokens;
        self.bill(tokens, text_hashes, partly_read);
    }

    /// Bills one embeddings request: its tokens and each input's hash;
    /// `partly_read` are those of its inputs the model read only the start of.
    pub(crate) fn bill(&mut self, tokens: u64, text_hashes: Vec<String>, partly_read: Vec<String>) {
        for hash in partly_read {
            *self.partly_read.entry(hash).or_insert(0) += 1;
        }
        self.billed_requests += 1;
        self.prompt_tokens += tokens;
        self.total_tokens += tokens;
        *self
            .billed_sizes
            .entry(text_hashes.len() as u64)
            .or_insert(0) += 1;
        for hash in text_hashes {
            *self.texts.entry(hash).or_insert(0) += 1;
        }
    }
}
