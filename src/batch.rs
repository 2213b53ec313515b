//! Packing chunks into requests.
//!
//! A [`Batcher`] fills requests up to the service's limits on inputs and
//! tokens per request, so that every request is as large as the limits allow
//! and no chunk is lost or duplicated. [`Batcher::new`] keeps the input's
//! order; [`Batcher::by_length`], what a run uses, looks [`LOOKAHEAD`]
//! requests' worth of chunks ahead and packs chunks of about the same length
//! together: a server that pads (infinity, TEI, sentence-transformers, the
//! local model) computes every input of a batch at the length of its longest,
//! so a request of similar lengths costs it less than one of mixed lengths.
//! Its look-ahead starts at one request's worth and doubles, so that the
//! first request leaves as soon as one request's worth is chunked, not
//! [`LOOKAHEAD`] requests' worth.

use crate::job::BackendConfig;
use crate::types::Chunk;

/// Requests' worth of chunks [`Batcher::by_length`] holds to sort by length:
/// each request then holds chunks from one eighth of the lengths seen, and
/// the memory held stays a few requests'.
pub const LOOKAHEAD: usize = 8;

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

    /// Its first chunk alone, and the rest when there is any, in the
    /// original order.
    #[must_use]
    pub fn split_first(mut self) -> (Batch, Option<Batch>) {
        if self.chunks.len() < 2 {
            return (self, None);
        }
        let rest = self.chunks.split_off(1);
        (Batch::new(self.chunks), Some(Batch::new(rest)))
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

/// Groups chunks into batches of at most `max_inputs` chunks and
/// `max_tokens` tokens: in input order, or by length within a look-ahead.
///
/// A chunk of more than `max_tokens` tokens goes alone in its own batch: the
/// service decides whether it is too large.
#[derive(Debug)]
pub struct Batcher {
    max_inputs: usize,
    max_tokens: u64,
    /// Requests' worth of chunks held before packing them by length; 1
    /// packs in input order.
    ahead: usize,
    /// The look-ahead being filled, by length: 1 for the first, which
    /// leaves whole, then doubling up to `ahead`.
    filling: usize,
    pending: Vec<Chunk>,
    pending_tokens: u64,
}

impl Batcher {
    /// A batcher for requests of at most `max_inputs` chunks (at least one)
    /// and `max_tokens` tokens, filled in input order.
    #[must_use]
    pub fn new(max_inputs: usize, max_tokens: u64) -> Self {
        let max_inputs = max_inputs.max(1);
        Batcher {
            max_inputs,
            max_tokens,
            ahead: 1,
            filling: 1,
            pending: Vec::with_capacity(max_inputs.min(1024)),
            pending_tokens: 0,
        }
    }

    /// A batcher that holds up to [`LOOKAHEAD`] requests' worth of chunks
    /// (by count or by tokens, whichever is reached first), sorts them by
    /// token count and sends every request it fills; the chunks of the last,
    /// partly filled one wait for the next look-ahead, so requests stay as
    /// full as in input order.
    ///
    /// The first look-ahead is one request's worth and leaves whole, so the
    /// first request waits for no more chunking than in input order; the
    /// next are 2, 4, … up to [`LOOKAHEAD`] requests' worth. A look-ahead of
    /// `a` requests' worth sends `a − 1` requests at least (the first, one).
    #[must_use]
    pub fn by_length(max_inputs: usize, max_tokens: u64) -> Self {
        Batcher {
            ahead: LOOKAHEAD,
            ..Batcher::new(max_inputs, max_tokens)
        }
    }

    /// The batcher for a job's `[backend]`: `max_inputs_per_request` and
    /// `max_tokens_per_request`, as a run packs its requests (by length).
    #[must_use]
    pub fn for_backend(config: &BackendConfig) -> Self {
        Batcher::by_length(
            config.shared.max_inputs_per_request,
            config.shared.max_tokens_per_request as u64,
        )
    }

    /// Adds a chunk. Returns the batches it completes: in input order, the
    /// batch filled so far when this chunk would take it past either limit
    /// (the chunk then starts the next); by length, the requests packed from
    /// a full look-ahead.
    pub fn push(&mut self, chunk: Chunk) -> Vec<Batch> {
        let tokens = u64::from(chunk.token_count);
        if self.ahead <= 1 {
            let full = !self.pending.is_empty()
                && (self.pending.len() >= self.max_inputs
                    || self.pending_tokens.saturating_add(tokens) > self.max_tokens);
            let batch = if full { self.take() } else { None };
            self.pending.push(chunk);
            self.pending_tokens += tokens;
            return batch.into_iter().collect();
        }
        self.pending.push(chunk);
        self.pending_tokens = self.pending_tokens.saturating_add(tokens);
        let ahead = self.filling;
        if self.pending.len() < ahead.saturating_mul(self.max_inputs)
            && self.pending_tokens < (ahead as u64).saturating_mul(self.max_tokens)
        {
            return Vec::new();
        }
        let mut batches = self.pack();
        self.filling = ahead.saturating_mul(2).min(self.ahead);
        // The last request waits for more chunks of its length: at most one
        // request's worth stays. The first look-ahead sends its first
        // request and keeps what the last chunk took past it, as in input
        // order.
        let kept = if ahead > 1 {
            batches.pop().into_iter().collect()
        } else {
            batches.split_off(batches.len().min(1))
        };
        for batch in kept {
            self.pending.extend(batch.chunks);
            self.pending_tokens = self.pending_tokens.saturating_add(batch.tokens);
        }
        batches
    }

    /// The batches of every chunk still held: the last, partly filled one
    /// in input order; all of the look-ahead, packed, by length.
    pub fn finish(&mut self) -> Vec<Batch> {
        if self.ahead <= 1 {
            return self.take().into_iter().collect();
        }
        self.pack()
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

    /// Every chunk held, shortest first (ties in input order), packed into
    /// requests within the limits.
    fn pack(&mut self) -> Vec<Batch> {
        let mut held = std::mem::take(&mut self.pending);
        self.pending_tokens = 0;
        held.sort_by_key(|chunk| chunk.token_count);
        let mut in_order = Batcher::new(self.max_inputs, self.max_tokens);
        let mut batches: Vec<Batch> = held
            .into_iter()
            .flat_map(|chunk| in_order.push(chunk))
            .collect();
        batches.extend(in_order.finish());
        batches
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
        let mut batches: Vec<Batch> = chunks.into_iter().flat_map(|c| batcher.push(c)).collect();
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
        assert!(batcher.finish().is_empty());
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
        assert!(batcher.finish().is_empty());
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

    /// What a server that pads computes: each request's inputs at the
    /// length of its longest.
    fn padded(batches: &[Batch]) -> u64 {
        let longest = |b: &Batch| b.chunks.iter().map(|c| c.token_count).max().unwrap_or(0);
        batches
            .iter()
            .map(|b| b.len() as u64 * u64::from(longest(b)))
            .sum()
    }

    #[test]
    fn by_length_packs_chunks_of_one_length_together() {
        // Long and short chunks alternate: in input order every request of
        // two holds one of each and pads the short one to 100 tokens.
        let requests = 4 * LOOKAHEAD;
        let lengths = (0..2 * requests).map(|i| if i % 2 == 0 { 100 } else { 1 });
        let chunks: Vec<Chunk> = lengths.enumerate().map(|(i, t)| chunk(i, t)).collect();
        let in_order = run(&mut Batcher::new(2, 1000), chunks.clone());
        assert_eq!(padded(&in_order), requests as u64 * 2 * 100);

        let mut batcher = Batcher::by_length(2, 1000);
        let mut left = Vec::new();
        let mut look_aheads = Vec::new();
        for chunk in chunks {
            let sent = batcher.push(chunk);
            if !sent.is_empty() {
                look_aheads.push(sent.len());
            }
            left.extend(sent);
        }
        // The first request leaves alone, then a look-ahead of 2, 4 and 8
        // requests' worth sends all but its last request.
        assert_eq!(look_aheads[..4], [1, 1, 3, LOOKAHEAD - 1]);
        assert!(look_aheads[4..].iter().all(|&n| n == LOOKAHEAD - 1));
        left.extend(batcher.finish());
        assert_eq!(left.len(), requests);
        // Sorted, each look-ahead mixes the lengths in one request at most.
        let mixed = left
            .iter()
            .filter(|b| {
                b.chunks
                    .iter()
                    .any(|c| c.token_count != b.chunks[0].token_count)
            })
            .count();
        assert!(mixed <= look_aheads.len() + 1, "{mixed} mixed requests");
        let tokens = requests as u64 * (1 + 100);
        assert_eq!(padded(&left), tokens + mixed as u64 * (100 - 1));
        assert!(padded(&left) < padded(&in_order) * 2 / 3);
    }

    #[test]
    fn by_length_sends_the_first_request_once_it_is_full() {
        let mut batcher = Batcher::by_length(4, 1000);
        let left: Vec<Batch> = (0..3)
            .flat_map(|i| batcher.push(chunk(i, 10 - i as u32)))
            .collect();
        assert!(left.is_empty());
        let first = batcher.push(chunk(3, 7));
        let shapes: Vec<Vec<&str>> = first.iter().map(ids).collect();
        assert_eq!(shapes, [vec!["doc#3", "doc#2", "doc#1", "doc#0"]]);
        assert_eq!(batcher.pending(), 0);

        // Full by tokens: one request leaves, the rest stays for the next.
        let mut batcher = Batcher::by_length(8, 100);
        assert!(batcher.push(chunk(0, 60)).is_empty());
        let first = batcher.push(chunk(1, 50));
        let shapes: Vec<Vec<&str>> = first.iter().map(ids).collect();
        assert_eq!(shapes, [vec!["doc#1"]]);
        assert_eq!(batcher.pending(), 1);
        let rest = batcher.finish();
        assert_eq!(rest.iter().map(ids).collect::<Vec<_>>(), [vec!["doc#0"]]);
    }

    #[test]
    fn by_length_holds_a_short_input_until_the_end() {
        let mut batcher = Batcher::by_length(4, 1000);
        let left: Vec<Batch> = (0..9).flat_map(|i| batcher.push(chunk(i, 10))).collect();
        let shapes: Vec<Vec<&str>> = left.iter().map(ids).collect();
        assert_eq!(shapes, [vec!["doc#0", "doc#1", "doc#2", "doc#3"]]);
        // The second look-ahead, of two requests' worth, is not full.
        let batches = batcher.finish();
        let shapes: Vec<Vec<&str>> = batches.iter().map(ids).collect();
        assert_eq!(
            shapes,
            [vec!["doc#4", "doc#5", "doc#6", "doc#7"], vec!["doc#8"]]
        );
        assert!(batcher.finish().is_empty());
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
        fn by_length_keeps_every_chunk_within_the_limits_and_the_look_ahead(
            tokens in prop::collection::vec(0u32..600, 0..300),
            max_inputs in 1usize..20,
            max_tokens in 1u64..2_000,
        ) {
            let input: Vec<Chunk> = tokens.iter().enumerate().map(|(i, &t)| chunk(i, t)).collect();
            let mut batcher = Batcher::by_length(max_inputs, max_tokens);
            let mut batches = Vec::new();
            for c in input.clone() {
                let left = batcher.push(c);
                // One look-ahead's requests leave together, shortest first,
                // each as full as the limits allow.
                for pair in left.windows(2) {
                    let last = pair[0].chunks.iter().map(|c| c.token_count).max();
                    prop_assert!(last <= pair[1].chunks.iter().map(|c| c.token_count).min());
                    let next = u64::from(pair[1].chunks[0].token_count);
                    prop_assert!(pair[0].len() == max_inputs || pair[0].tokens + next > max_tokens);
                }
                batches.extend(left);
                // Memory: never more than the look-ahead.
                prop_assert!(batcher.pending() <= LOOKAHEAD * max_inputs);
                prop_assert!(batcher.pending_tokens < LOOKAHEAD as u64 * max_tokens + 600);
            }
            batches.extend(batcher.finish());
            prop_assert_eq!(batcher.pending(), 0);
            for batch in &batches {
                prop_assert!(!batch.is_empty());
                prop_assert!(batch.len() <= max_inputs);
                prop_assert_eq!(batch.tokens, total_tokens(&batch.chunks));
                prop_assert!(batch.tokens <= max_tokens || batch.len() == 1, "{:?}", batch.tokens);
            }
            let mut output: Vec<Chunk> = batches.into_iter().flat_map(|b| b.chunks).collect();
            output.sort_by_key(|c| c.chunk_index);
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
