//! What a run was billed: every response that carried usage, whether its
//! vectors were kept, discarded, or never reached the writer; and what the
//! finished output records of it, for the runs after it.

use super::dispatch::Dispatched;
use super::summary::Bill;
use crate::backend::{BackendInfo, BackendStats};
use crate::contract::{
    CONTEXT_WINDOW_KEY, DISCARDED_TOKENS_KEY, FINGERPRINT_KEY, INPUT_KEY, JOB_KEY,
    LOCAL_TOKENS_KEY, SHARD_KEY, TOKEN_RATIO_KEY,
};
use crate::state::{Billed, Fingerprint};
use crate::store::Earlier;
use crate::types::{OutputMetadata, Usage};

/// The run's bill, and the part of it no vector sent to the writer carries
/// (requests whose vectors were all discarded, or whose answers came after
/// the run gave up on them), for the checkpoint.
pub(super) fn reckon(dispatched: &Dispatched, stats: &BackendStats) -> (Bill, Billed) {
    let unseen_usage = stats.billed.saturating_sub(dispatched.usage);
    let unseen = Billed {
        usage: unseen_usage,
        requests: stats.requests.saturating_sub(dispatched.batches),
        discarded_tokens: unseen_usage.prompt_tokens,
    };
    let bill = Bill {
        usage: dispatched.usage + unseen.usage,
        discarded_tokens: dispatched.discarded.prompt_tokens + unseen.discarded_tokens,
        ratio: token_ratio(
            dispatched.usage.saturating_sub(dispatched.discarded),
            dispatched.local_tokens,
        ),
        probed: stats.window_probe.map_or(0, |p| p.tokens),
    };
    (bill, unseen)
}

/// `billed` tokens over `local` ones, when there are some.
pub(super) fn token_ratio(billed: Usage, local: u64) -> Option<f64> {
    (local > 0 && billed.prompt_tokens > 0).then(|| billed.prompt_tokens as f64 / local as f64)
}

/// A run that finished, as its output's metadata records it.
pub(super) struct Ending<'a> {
    /// The job's name, recorded so `inspect` can tell datasets apart.
    pub job: &'a str,
    pub info: &'a BackendInfo,
    pub fingerprint: &'a Fingerprint,
    pub bill: &'a Bill,
    pub dispatched: &'a Dispatched,
    pub earlier: &'a Earlier,
    /// Requests this run made.
    pub requests: u64,
    /// The ratio the output this run replaces recorded.
    pub previous_ratio: Option<f64>,
    /// The shard the run embedded, if it embedded one.
    pub shard: Option<crate::job::Shard>,
    /// A shard's record of the whole input it read.
    pub input: Option<String>,
    /// The window the run learned, as JSON, when it learned one.
    pub window: Option<String>,
}

/// The metadata of a finished output: what this run and the unfinished runs
/// it took over from were billed, what of it paid for discarded vectors, and
/// the ratio of billed to local tokens the next estimate scales by.
pub(super) fn output_metadata(e: &Ending<'_>) -> OutputMetadata {
    let usage = e.bill.usage + e.earlier.usage;
    let discarded = e.bill.discarded_tokens + e.earlier.discarded_tokens;
    let local = e.dispatched.local_tokens + e.earlier.local_tokens;
    let kept = usage.saturating_sub(Usage {
        prompt_tokens: discarded,
        completion_tokens: 0,
        total_tokens: discarded,
    });
    let mut extra: std::collections::BTreeMap<String, String> = [
        (FINGERPRINT_KEY.to_string(), e.fingerprint.to_json()),
        (JOB_KEY.to_string(), e.job.to_string()),
        (DISCARDED_TOKENS_KEY.to_string(), discarded.to_string()),
        (LOCAL_TOKENS_KEY.to_string(), local.to_string()),
    ]
    .into();
    // A run that sent nothing keeps the ratio the last one learned.
    if let Some(ratio) = token_ratio(kept, local).or(e.previous_ratio) {
        extra.insert(TOKEN_RATIO_KEY.to_string(), ratio.to_string());
    }
    if let Some(shard) = e.shard {
        extra.insert(SHARD_KEY.to_string(), shard.to_string());
    }
    if let Some(input) = &e.input {
        extra.insert(INPUT_KEY.to_string(), input.clone());
    }
    if let Some(window) = &e.window {
        extra.insert(CONTEXT_WINDOW_KEY.to_string(), window.clone());
    }
    if let Some(price) = e.dispatched.batch.as_ref().and(e.info.input_per_1k) {
        extra.insert(
            crate::contract::BATCH_PRICE_KEY.to_string(),
            price.to_string(),
        );
    }
    OutputMetadata {
        model: e.info.model.clone(),
        // The vectors' length, set by the writer; the model's when it wrote none.
        dimensions: e.info.dimensions.unwrap_or(0),
        backend: e.info.kind.to_string(),
        usage,
        requests: e.requests + e.earlier.requests,
        cost: output_cost(e, usage),
        extra,
    }
}

/// What `usage`, the output's, cost: each token at the price of the way it
/// was sent. The parts of collected batches are at the batch price; the
/// rest (the runs' window probes, in batch mode, and the vectors of
/// synchronous runs) at the synchronous one.
fn output_cost(e: &Ending<'_>, usage: Usage) -> Option<f64> {
    let batches = e.earlier.batch_tokens;
    let other = if e.dispatched.batch.is_some() {
        usage.prompt_tokens.saturating_sub(batches)
    } else {
        batches
    };
    e.info.cost_with_other(usage, other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_no_vector_carries_is_billed_and_discarded() {
        let usage = |n| Usage {
            prompt_tokens: n,
            completion_tokens: 0,
            total_tokens: n,
        };
        let dispatched = Dispatched {
            usage: usage(100),
            discarded: usage(10),
            local_tokens: 45,
            batches: 4,
            ..Dispatched::default()
        };
        let stats = BackendStats {
            requests: 7,
            billed: usage(130),
            ..BackendStats::default()
        };
        let (bill, unseen) = reckon(&dispatched, &stats);
        assert_eq!(bill.usage, usage(130));
        assert_eq!(bill.discarded_tokens, 40);
        assert_eq!(bill.ratio, Some(2.0), "90 kept tokens over 45 local ones");
        assert_eq!(
            unseen,
            Billed {
                usage: usage(30),
                requests: 3,
                discarded_tokens: 30,
            }
        );
        // A local model bills what its vectors carry, and nothing unseen.
        let (bill, unseen) = reckon(&dispatched, &BackendStats::default());
        assert_eq!(bill.usage, usage(100));
        assert_eq!(unseen, Billed::default());
    }
}
