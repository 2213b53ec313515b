//! A chunk the model refused as over its window, cut again to fit instead
//! of quarantined: the refusal's limit (OpenAI, TEI and vLLM say it) scaled
//! by the server's count of the chunk over the local one, less a margin.
//! The pieces are cut by the run's own chunker at that size, so the same
//! refusal cuts the same pieces, with the same ids, in every run.

use std::sync::{Arc, Mutex};

use crate::backend::LearnedWindow;
use crate::chunk::Chunker;
use crate::client::window_refusal;
use crate::types::{Chunk, Document};

/// Cuts refused chunks, and keeps the smallest window their refusals taught.
pub(super) struct Rechunker {
    chunker: Arc<dyn Chunker>,
    learned: Mutex<Option<LearnedWindow>>,
}

impl Rechunker {
    pub(super) fn new(chunker: Arc<dyn Chunker>) -> Rechunker {
        Rechunker {
            chunker,
            learned: Mutex::new(None),
        }
    }

    /// The smallest window a refusal taught during the run.
    pub(super) fn learned(&self) -> Option<LearnedWindow> {
        *self
            .learned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `chunk` cut in pieces that fit the window `message` states, ids
    /// `{chunk id}.{n}`; `None` when the message states none, or counts
    /// the chunk within it, or the chunk cannot be cut smaller. Each cut is
    /// to at most 9/10 of the chunk, so a piece refused again is cut again
    /// smaller, and the cutting ends.
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
        let size = window.tokens.min(local - 1);
        let narrower = self
            .chunker
            .narrower(usize::try_from(size).unwrap_or(usize::MAX))?;
        {
            let mut learned = self
                .learned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if learned.is_none_or(|l| size < l.tokens) {
                *learned = Some(LearnedWindow {
                    tokens: size,
                    ..window
                });
            }
        }
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
        };
        let chunker: Arc<dyn Chunker> = Arc::new(TokenChunker::cl100k(&config).unwrap());
        let refused = chunk(&"word ".repeat(150), chunker.as_ref());
        let local = u64::from(refused.token_count);
        let rechunker = Rechunker::new(Arc::clone(&chunker));
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
}
