//! What batch mode (`backend.mode = "batch"`) needs of the service backend:
//! its client, the request's settings, and the batch price.

use std::time::Duration;

use crate::client::Client;

/// A service backend's Batch API settings, for the pipeline's batch stages.
#[derive(Clone)]
pub struct BatchService {
    pub client: Client,
    pub model: String,
    /// `dimensions` to send with every request, as the sync path sends it.
    pub dimensions: Option<usize>,
    /// The length every vector must have, when known before the first.
    pub expected_dimensions: Option<usize>,
    pub completion_window: String,
    /// Price per 1000 input tokens in batch mode, when known.
    pub input_per_1k: Option<f64>,
    /// Price per 1000 input tokens of a synchronous request, when known.
    pub sync_input_per_1k: Option<f64>,
    /// `backend.batch_max_enqueued_tokens`.
    pub max_enqueued_tokens: Option<u64>,
    /// The first interval between polls of `run --wait`.
    pub poll: Duration,
}

/// The batch price: `set` (the job's, else the listing's), else half the
/// synchronous price (as OpenAI prices its Batch API).
#[must_use]
pub fn batch_price(set: Option<f64>, sync: Option<f64>) -> Option<f64> {
    set.or(sync.map(|p| p / 2.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_price_is_the_jobs_else_half_the_synchronous_one() {
        assert_eq!(batch_price(None, Some(0.02)), Some(0.01));
        assert_eq!(batch_price(Some(0.015), Some(0.02)), Some(0.015));
        assert_eq!(batch_price(None, None), None);
    }
}
