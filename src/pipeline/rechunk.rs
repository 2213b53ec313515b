//! A chunk the model refused as over its window, cut again to fit instead
//! of quarantined: the refusal's limit (OpenAI, TEI and vLLM say it) scaled
//! by the server's count of the chunk over the local one, less a margin.
//!
//! The first refusal of a run sets the window (or the output records one
//! from an earlier run): every chunk over it is cut to it by the run's own
//! chunker, the refused ones and, before they are sent, those read after it
//! whose vector is not at hand (see `Classifier::fit`). So the next run,
//! chunking as this one did, cuts the same pieces, with the same ids and
//! texts, and reuses their vectors. A chunk refused within the window (the
//! server counts its text more densely), or a piece refused again, is cut
//! to its own refusal's fit.

use std::sync::{Arc, Mutex};

use crate::backend::LearnedWindow;
use crate::chunk::Chunker;
use crate::client::window_refusal;
use crate::types::{Chunk, Document};

/// Cuts chunks over the window refusals taught, and keeps that window.
pub struct Rechunker {
    chunker: Arc<dyn Chunker>,
    learned: Mutex<Option<LearnedWindow>>,
}

impl Rechunker {
    /// Cuts with `chunker` (the run's), to the window an earlier run cut
    /// refused chunks to, when its output records one.
    pub fn new(chunker: Arc<dyn Chunker>, recorded: Option<LearnedWindow>) -> Rechunker {
        Rechunker {
            chunker,
            learned: Mutex::new(recorded),
        }
    }

    /// The window chunks over it are cut to: the first refusal's of the run,
    /// or the one an earlier run recorded.
    pub fn learned(&self) -> Option<LearnedWindow> {
        *self
            .learned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes the window an earlier run cut refused chunks to, as its output
    /// records it, unless a refusal of this run came first.
    pub(super) fn remember(&self, window: LearnedWindow) {
        self.learned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert(window);
    }

    /// `chunk` cut in pieces that fit the window `message` states, ids
    /// `{chunk id}.{n}`; `None` when the message states none, or counts
    /// the chunk within it, or the chunk cannot be cut smaller. A chunk over
    /// the run's window is cut to it, one within it to at most 9/10 of
    /// itself: a piece refused again is cut again smaller, and the cutting ends.
    pub(super) fn pieces(&self, chunk: &Chunk, message: &str) -> Option<Vec<Chunk>> {
        let refusal = window_refusal(message)?;
        // A count within the limit says nothing of the window: the refusal
        // is about something else, and cutting would not end.
        let given = refusal.given.filter(|&given| given > refusal.limit)?;
        let local = u64::from(chunk.token_count);
        if local < 2 {
            return None;
        }
        let window = LearnedWindow::from_refusal(refusal.limit, Some(given), local);
        // Smaller than the chunk, whatever the server said, so that cutting ends.
        let own = window.tokens.min(local - 1);
        let learned = *self
            .learned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert(LearnedWindow {
                tokens: own,
                ..window
            });
        // Over the run's window, cut to it, as the next run cuts before sending.
        let size = if local > learned.tokens {
            learned.tokens
        } else {
            own
        };
        self.cut_to(chunk, size)
    }

    /// `chunk` cut to the window refusals taught, when it is over it: the
    /// pieces a refusal of it cuts.
    pub fn cut(&self, chunk: &Chunk) -> Option<Vec<Chunk>> {
        let window = self.learned()?;
        if u64::from(chunk.token_count) <= window.tokens {
            return None;
        }
        self.cut_to(chunk, window.tokens)
    }

    /// `chunk` cut by the run's chunker to `size` tokens, in more than one piece.
    fn cut_to(&self, chunk: &Chunk, size: u64) -> Option<Vec<Chunk>> {
        let narrower = self
            .chunker
            .narrower(usize::try_from(size).unwrap_or(usize::MAX))?;
        let document = Document {
            doc_id: chunk.doc_id.to_string(),
            source: Arc::clone(&chunk.source),
            text: chunk.text.clone(),
            metadata: chunk.metadata.clone(),
        };
        let pieces: Vec<Chunk> = narrower
            .chunk(&document)
            .into_iter()
            .enumerate()
            .map(|(n, piece)| Chunk {
                id: format!("{}.{n}", chunk.id),
                doc_id: Arc::clone(&chunk.doc_id),
                chunk_index: chunk.chunk_index,
                byte_start: chunk.byte_start + piece.byte_start,
                byte_end: chunk.byte_start + piece.byte_end,
                ..piece
            })
            .collect();
        (pieces.len() > 1).then_some(pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::TokenChunker;
    use crate::job::ChunkingConfig;

    fn chunk(text: &str, chunker: &dyn Chunker) -> Chunk {
        let document = Document {
            doc_id: "doc".to_string(),
            source: Arc::from("doc.txt"),
            text: text.to_string(),
            metadata: None,
        };
        let mut chunks = chunker.chunk(&document);
        assert_eq!(chunks.len(), 1);
        chunks.pop().unwrap()
    }

    #[test]
    fn a_refused_chunk_is_cut_to_the_window_scaled_by_the_servers_count() {
        let config = ChunkingConfig {
            tokenizer: None,
            max_tokens: 200,
            overlap_tokens: 0,
            markdown: Some(false),
            wordpieces: None,
        };
        let chunker: Arc<dyn Chunker> = Arc::new(TokenChunker::cl100k(&config).unwrap());
        let refused = chunk(&"word ".repeat(150), chunker.as_ref());
        let local = u64::from(refused.token_count);
        let rechunker = Rechunker::new(Arc::clone(&chunker), None);
        // The server counts twice as many tokens as we do, and takes 100:
        // 50 of ours, less a tenth.
        let message = format!(
            "This model's maximum context length is 100 tokens. However, you requested {} \
             tokens in the input for embedding generation.",
            local * 2
        );
        let pieces = rechunker.pieces(&refused, &message).unwrap();
        assert!(pieces.len() >= 3, "{}", pieces.len());
        for (n, piece) in pieces.iter().enumerate() {
            assert_eq!(piece.id, format!("{}.{n}", refused.id));
            assert!(piece.token_count <= 45, "{}", piece.token_count);
            assert_eq!(piece.doc_id, refused.doc_id);
            let start = usize::try_from(piece.byte_start - refused.byte_start).unwrap();
            let end = usize::try_from(piece.byte_end - refused.byte_start).unwrap();
            assert_eq!(&refused.text[start..end], piece.text);
        }
        assert_eq!(rechunker.learned().unwrap().tokens, 45);
        assert_eq!(rechunker.learned().unwrap().server_tokens, Some(100));
        // The same refusal cuts the same pieces.
        assert_eq!(rechunker.pieces(&refused, &message).unwrap(), pieces);
        // A message without a window, or a chunk of one token, is not cut.
        assert!(rechunker.pieces(&refused, "too long").is_none());
        let one = chunk("word", chunker.as_ref());
        assert!(rechunker.pieces(&one, &message).is_none());
        // A refusal that counts the chunk within the window, or does not
        // count it, is about something else.
        for other in [
            "maximum context length is 99999 tokens, however you requested 9 tokens",
            "maximum context length is 100 tokens, however you requested 100 tokens",
            "maximum context length is 100 tokens",
        ] {
            assert!(rechunker.pieces(&refused, other).is_none(), "{other}");
        }
    }

    #[test]
    fn the_next_run_cuts_the_pieces_a_refusal_cut_without_a_refusal() {
        let config = ChunkingConfig {
            tokenizer: None,
            max_tokens: 200,
            overlap_tokens: 20,
            markdown: Some(false),
            wordpieces: None,
        };
        let chunker: Arc<dyn Chunker> = Arc::new(TokenChunker::cl100k(&config).unwrap());
        let refused = chunk(&"word ".repeat(150), chunker.as_ref());
        let local = u64::from(refused.token_count);
        let refusal = |factor: u64| {
            format!(
                "maximum context length is 100 tokens, however you requested {} tokens",
                local * factor
            )
        };
        let rechunker = Rechunker::new(Arc::clone(&chunker), None);
        // Nothing refused yet: nothing is cut before it is sent.
        assert!(rechunker.cut(&refused).is_none());
        let pieces = rechunker.pieces(&refused, &refusal(2)).unwrap();
        let learned = rechunker.learned().unwrap();
        assert_eq!(rechunker.cut(&refused).unwrap(), pieces);
        // A later refusal that counts more densely keeps the run's window,
        // so that every chunk over it is cut to it, as the next run cuts.
        assert_eq!(rechunker.pieces(&refused, &refusal(4)).unwrap(), pieces);
        assert_eq!(rechunker.learned(), Some(learned));
        // A chunk within the window is not cut; refused, it is cut to its
        // own refusal's fit.
        let within = chunk(&"word ".repeat(30), chunker.as_ref());
        assert!(u64::from(within.token_count) <= learned.tokens);
        assert!(rechunker.cut(&within).is_none());
        let message = format!(
            "maximum context length is 10 tokens, however you requested {} tokens",
            within.token_count * 2
        );
        let small = rechunker.pieces(&within, &message).unwrap();
        // 10 of its tokens, 5 of ours, less a tenth (nothing of 5).
        assert!(small.iter().all(|p| p.token_count <= 5), "{small:?}");
        // The next run, given the window the output recorded, cuts the same
        // pieces before anything is sent.
        let next = Rechunker::new(Arc::clone(&chunker), Some(learned));
        assert_eq!(next.cut(&refused).unwrap(), pieces);
    }
}
