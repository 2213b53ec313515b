//! Packing chunks into requests.
//!
//! A [`Batcher`] fills requests in input order up to the service's limits on
//! inputs and tokens per request, so that every request is as large as the
//! limits allow and no chunk is lost, duplicated or reordered.

use crate::job::BackendConfig;
use crate::types::Chunk;

/// Chunks sent together in one embedding request.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub chunks: Vec<Chunk>,
    /// The sum of the chunks' `token_count`.
    pub tokens: u64,
}

impl Batch {
    /// A batch of `chunks`, with its token count computed from them.
    #[must_use]
    pub fn new(chunks: Vec<Chunk>) -> Self {
        let tokens = total_tokens(&chunks);
        Batch { chunks, tokens }
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Splits a request the service found too large into two, the first
    /// holding `len / 2` rounded up, in the original order.
    ///
    /// # Errors
    ///
    /// A batch of fewer than two chunks cannot be split, and comes back
    /// unchanged: the caller decides what to do with a lone chunk the service
    /// rejects.
    pub fn split_in_half(mut self) -> Result<(Batch, Batch), Batch> {
        if self.chunks.len() < 2 {
            return Err(self);
        }
        let second = self.chunks.split_off(self.chunks.len().div_ceil(2));
        Ok((Batch::new(self.chunks), Batch::new(second)))
    }
}

fn total_tokens(chunks: &[Chunk]) -> u64 {
    chunks.iter().map(|c| u64::from(c.token_count)).sum()
}

/// Groups chunks, in order, into batches of at most `max_inputs` chunks and
/// `max_tokens` tokens.
///
/// A chunk of more than `max_tokens` tokens goes alone in its own batch: the
/// service decides whether it is too large.
#[derive(Debug)]
pub struct Batcher {
    max_inputs: usize,
    max_tokens: u64,
    pending: Vec<Chunk>,
    pending_tokens: u64,
}

impl Batcher {
    /// A batcher for requests of at most `max_inputs` chunks (at least one)
    /// and `max_tokens` tokens.
    #[must_use]
    pub fn new(max_inputs: usize, max_tokens: u64) -> Self {
        let max_inputs = max_inputs.max(1);
        Batcher {
            max_inputs,
            max_tokens,
            pending: Vec::with_capacity(max_inputs.min(1024)),
            pending_tokens: 0,
        }
    }

    /// The batcher for a job's `[backend]`: `max_inputs_per_request` and
    /// `max_tokens_per_request`, as a run packs its requests.
    #[must_use]
    pub fn for_backend(config: &BackendConfig) -> Self {
        Batcher::new(
            config.shared.max_inputs_per_request,
            config.shared.max_tokens_per_request as u64,
        )
    }

    /// Adds a chunk. Returns the batch filled so far if this chunk would take
    /// it past either limit; the chunk then starts the next batch.
    pub fn push(&mut self, chunk: Chunk) -> Option<Batch> {
        let tokens = u64::from(chunk.token_count);
        let full = !self.pending.is_empty()
            && (self.pending.len() >= self.max_inputs
                || self.pending_tokens.saturating_add(tokens) > self.max_tokens);
        let batch = if full { self.take() } else { None };
        self.pending.push(chunk);
        self.pending_tokens += tokens;
        batch
    }

    /// The last, partly filled batch, if any chunks are left.
    pub fn finish(&mut self) -> Option<Batch> {
        self.take()
    }

    /// Chunks held back for the next batch.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn take(&mut self) -> Option<Batch> {
        if self.pending.is_empty() {
            return None;
        }
        let capacity = self.max_inputs.min(1024);
        let chunks = std::mem::replace(&mut self.pending, Vec::with_capacity(capacity));
        let tokens = std::mem::take(&mut self.pending_tokens);
        Some(Batch { chunks, tokens })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    fn chunk(index: usize, token_count: u32) -> Chunk {
        let text = format!("chunk {index}");
        Chunk {
            id: format!("doc#{index}"),
            doc_id: Arc::from("doc"),
            source: Arc::from("doc.txt"),
            chunk_index: u32::try_from(index).unwrap(),
            byte_start: 0,
            byte_end: text.len() as u64,
            content_hash: crate::types::content_hash(&text),
            text,
            token_count,
            metadata: None,
        }
    }

    fn ids(batch: &Batch) -> Vec<&str> {
        batch.chunks.iter().map(|c| c.id.as_str()).collect()
    }

    fn run(batcher: &mut Batcher, chunks: Vec<Chunk>) -> Vec<Batch> {
        let mut batches: Vec<Batch> = chunks.into_iter().filter_map(|c| batcher.push(c)).collect();
        batches.extend(batcher.finish());
        batches
    }

    #[test]
    fn fills_batches_up_to_either_limit() {
        let mut batcher = Batcher::new(3, 100);
        let chunks = [10, 20, 30, 40, 60, 50, 1, 1]
            .into_iter()
            .enumerate()
            .map(|(i, t)| chunk(i, t))
            .collect();
        let batches = run(&mut batcher, chunks);
        let shapes: Vec<(Vec<&str>, u64)> = batches.iter().map(|b| (ids(b), b.tokens)).collect();
        assert_eq!(
            shapes,
            [
                (vec!["doc#0", "doc#1", "doc#2"], 60),
                (vec!["doc#3", "doc#4"], 100),
                (vec!["doc#5", "doc#6", "doc#7"], 52),
            ]
        );
        assert_eq!(batcher.finish(), None);
    }

    #[test]
    fn an_oversized_chunk_goes_alone() {
        let mut batcher = Batcher::new(8, 100);
        let chunks = [10, 500, 0, 10, 101]
            .into_iter()
            .enumerate()
            .map(|(i, t)| chunk(i, t))
            .collect();
        let batches = run(&mut batcher, chunks);
        let shapes: Vec<Vec<&str>> = batches.iter().map(ids).collect();
        assert_eq!(
            shapes,
            [
                vec!["doc#0"],
                vec!["doc#1"],
                vec!["doc#2", "doc#3"],
                vec!["doc#4"],
            ]
        );
    }

    #[test]
    fn nothing_in_nothing_out() {
        let mut batcher = Batcher::new(4, 100);
        assert_eq!(batcher.finish(), None);
        assert_eq!(batcher.pending(), 0);
    }

    #[test]
    fn a_single_chunk_cannot_be_split() {
        let batch = Batch::new(vec![chunk(0, 7)]);
        assert_eq!(batch.clone().split_in_half(), Err(batch));
        let empty = Batch::new(Vec::new());
        assert_eq!(empty.clone().split_in_half(), Err(empty));
    }

    #[test]
    fn splitting_gives_the_first_half_the_odd_chunk() {
        let batch = Batch::new((0..5).map(|i| chunk(i, 10 + i as u32)).collect());
        assert_eq!(batch.tokens, 60);
        let (first, second) = batch.split_in_half().unwrap();
        assert_eq!(ids(&first), ["doc#0", "doc#1", "doc#2"]);
        assert_eq!(first.tokens, 33);
        assert_eq!(ids(&second), ["doc#3", "doc#4"]);
        assert_eq!(second.tokens, 27);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn batches_keep_the_input_within_the_limits(
            tokens in prop::collection::vec(0u32..600, 0..300),
            max_inputs in 1usize..20,
            max_tokens in 1u64..2_000,
        ) {
            let input: Vec<Chunk> = tokens.iter().enumerate().map(|(i, &t)| chunk(i, t)).collect();
            let batches = run(&mut Batcher::new(max_inputs, max_tokens), input.clone());

            for (i, batch) in batches.iter().enumerate() {
                prop_assert!(!batch.is_empty());
                prop_assert!(batch.len() <= max_inputs);
                prop_assert_eq!(batch.tokens, total_tokens(&batch.chunks));
                prop_assert!(batch.tokens <= max_tokens || batch.len() == 1, "{:?}", batch.tokens);
                // Batches are as full as the limits allow.
                if let Some(next) = batches.get(i + 1) {
                    let next_tokens = u64::from(next.chunks[0].token_count);
                    prop_assert!(
                        batch.len() == max_inputs || batch.tokens + next_tokens > max_tokens
                    );
                }
            }
            let output: Vec<Chunk> = batches.into_iter().flat_map(|b| b.chunks).collect();
            prop_assert_eq!(output, input);
        }

        #[test]
        fn splitting_keeps_every_chunk(tokens in prop::collection::vec(0u32..600, 0..60)) {
            let input: Vec<Chunk> = tokens.iter().enumerate().map(|(i, &t)| chunk(i, t)).collect();
            let batch = Batch::new(input.clone());
            match batch.clone().split_in_half() {
                Ok((first, second)) => {
                    prop_assert_eq!(first.len(), input.len().div_ceil(2));
                    prop_assert!(!second.is_empty());
                    prop_assert_eq!(first.tokens + second.tokens, batch.tokens);
                    prop_assert_eq!(first.tokens, total_tokens(&first.chunks));
                    let output: Vec<Chunk> = first.chunks.into_iter().chain(second.chunks).collect();
                    prop_assert_eq!(output, input);
                }
                Err(unchanged) => {
                    prop_assert!(input.len() < 2);
                    prop_assert_eq!(unchanged, batch);
                }
            }
        }
    }
}
