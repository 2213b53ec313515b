//! What the simulator received and what it billed.

use std::collections::{BTreeMap, HashMap};

/// Counters of everything the simulator saw, so that tests can check what a
/// client sent and what it paid for.
///
/// Only embeddings responses delivered intact and valid are billed: a normal,
/// slow or shuffled response. Billing happens when the response is produced, as
/// a real service would bill, whether or not the client reads it.
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
    /// Faults by name: the injected ones and `too_large` rejections.
    pub faults: BTreeMap<String, u64>,
    /// Hex SHA-256 of each billed input text, and how many times it was billed.
    pub texts: HashMap<String, u64>,
}

impl Ledger {
    pub(crate) fn record_fault(&mut self, name: &str) {
        *self.faults.entry(name.to_string()).or_insert(0) += 1;
    }

    /// Bills one embeddings request: its tokens and each input's hash.
    pub(crate) fn bill(&mut self, tokens: u64, text_hashes: Vec<String>) {
        self.billed_requests += 1;
        self.prompt_tokens += tokens;
        self.total_tokens += tokens;
        for hash in text_hashes {
            *self.texts.entry(hash).or_insert(0) += 1;
        }
    }
}
